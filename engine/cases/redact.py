"""Redaction and output-encoding helpers for anything that leaves fraudlens (CSV, HTML, PDF).

* :func:`mask_card_number` - PAN-like digit runs -> first 6 / last 4 digits visible.
* :func:`pseudonymise` - stable keyed pseudonym (HMAC-SHA256) for an entity id.
* :func:`neutralise_csv_cell` / :func:`neutralise_csv_frame` - CSV (formula) injection defence,
  per OWASP: https://owasp.org/www-community/attacks/CSV_Injection
* :func:`escape_markup` - text for HTML (and fpdf2's ``write_html``), per the OWASP XSS
  Prevention Cheat Sheet:
  https://cheatsheetseries.owasp.org/cheatsheets/Cross_Site_Scripting_Prevention_Cheat_Sheet.html
"""

from __future__ import annotations

import hashlib
import hmac
import html
import re
from typing import Any

import pandas as pd

OWASP_CSV_INJECTION_URL = "https://owasp.org/www-community/attacks/CSV_Injection"
OWASP_XSS_PREVENTION_URL = (
    "https://cheatsheetseries.owasp.org/cheatsheets/Cross_Site_Scripting_Prevention_Cheat_Sheet.html"
)

# 12-19 digits, single spaces or dashes allowed between digits, not part of a longer digit run.
_CARD_RE = re.compile(r"(?<![0-9])[0-9](?:[ -]?[0-9]){11,18}(?![0-9])")
#: First characters that make a spreadsheet treat a cell as a formula (OWASP list, plus NUL
#: from OWASP ASVS 5.0 V1.2.10).
CSV_FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r", "\x00")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _mask_match(m: re.Match[str]) -> str:
    run = m.group(0)
    n_digits = sum(ch.isdigit() for ch in run)
    out, i = [], 0
    for ch in run:
        if ch.isdigit():
            out.append(ch if i < 6 or i >= n_digits - 4 else "*")
            i += 1
        else:
            out.append(ch)
    return "".join(out)


def mask_card_number(text: Any) -> Any:
    """Mask every card-number-like digit run in ``text``, keeping at most the first 6 and last 4
    digits (PCI DSS display rule): ``"4111111111111111"`` -> ``"411111******1111"``.

    A run is 12-19 digits, optionally separated by single spaces or dashes (separators are kept:
    ``"4111-1111-1111-1111"`` -> ``"4111-11**-****-1111"``), and not part of a longer digit run.
    There is no Luhn check: any such run is masked, so long numeric ids and compact timestamps
    (``"20240101123000"``) are masked too - over-masking is the safe side. Runs longer than 19
    digits are left alone.

    Args:
        text: a string; a Python ``int`` is converted to its decimal text first. Anything else
            (``None``, floats, NaN) is returned unchanged.

    Returns:
        The masked text (``str``), or ``text`` unchanged if it is not a string or int.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str):
        return text
    return _CARD_RE.sub(_mask_match, text)


def pseudonymise(entity_id: Any, salt: str | bytes, *, length: int = 16) -> str:
    """A stable pseudonym for ``entity_id``: HMAC-SHA256 keyed with ``salt``, first ``length``
    lowercase hex characters (default 16 = 64 bits).

    The same (entity_id, salt) always gives the same pseudonym, so joins across exports still
    work; without the salt the mapping cannot be recomputed by brute force over small id spaces
    (card numbers, customer numbers). Keep the salt secret and per deployment; rotating it
    changes every pseudonym. ``entity_id`` is converted with ``str()`` (so ``12`` == ``"12"``).

    Raises ``ValueError`` for an empty salt or ``length`` outside 8..64.
    """
    if isinstance(salt, str):
        salt = salt.encode("utf-8")
    if not isinstance(salt, bytes) or not salt:
        raise ValueError("pseudonymise: salt must be a non-empty str or bytes")
    if not 8 <= int(length) <= 64:
        raise ValueError(f"pseudonymise: length must be 8..64 hex characters, got {length}")
    digest = hmac.new(salt, str(entity_id).encode("utf-8"), hashlib.sha256).hexdigest()
    return digest[: int(length)]


def neutralise_csv_cell(value: Any) -> Any:
    """Make one CSV cell safe to open in a spreadsheet (CSV / formula injection).

    Per OWASP (https://owasp.org/www-community/attacks/CSV_Injection): a *string* starting with
    ``=``, ``+``, ``-``, ``@``, tab (0x09) or carriage return (0x0D) - and NUL (0x00, OWASP
    ASVS 5.0 V1.2.10) - gets a leading single quote, so the spreadsheet shows it as text
    instead of evaluating it (``"=HYPERLINK(...)"`` -> ``"'=HYPERLINK(...)"``; a string
    ``"-5"`` becomes ``"'-5"``).

    Only the first character is tested (the OWASP rule): ``" =x"`` and ``"a=b"`` are unchanged,
    and an already-quoted ``"'=x"`` is not quoted twice.

    Non-strings are returned unchanged - numbers stay numbers (a negative amount ``-12.5`` as a
    float stays the float ``-12.5``), as do ``None``, NaN, bools, timestamps. Quoting of embedded
    quotes, commas and newlines (the other half of the OWASP advice) is the CSV writer's job:
    use ``csv`` / ``DataFrame.to_csv`` (RFC 4180 quoting), never string concatenation.
    """
    if isinstance(value, str) and value.startswith(CSV_FORMULA_TRIGGERS):
        return "'" + value
    return value


def neutralise_csv_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` with :func:`neutralise_csv_cell` applied to every cell of its
    object/string columns (and to string column names). Numeric columns are untouched.
    OWASP: https://owasp.org/www-community/attacks/CSV_Injection
    """
    out = frame.copy()
    for col in out.columns:
        if out[col].dtype == object or pd.api.types.is_string_dtype(out[col].dtype):
            out[col] = out[col].map(neutralise_csv_cell)
    out.columns = [neutralise_csv_cell(c) for c in out.columns]
    return out


def escape_markup(text: Any) -> str:
    """Escape untrusted text for HTML element content and quoted attributes, and for fpdf2's
    ``write_html``: ``& < > " '`` become entities (OWASP XSS Prevention Cheat Sheet, output
    encoding for HTML contexts:
    https://cheatsheetseries.owasp.org/cheatsheets/Cross_Site_Scripting_Prevention_Cheat_Sheet.html
    ). C0 control characters other than tab, newline and carriage return are removed (they are
    invalid in HTML/XML and can break PDF text). ``None`` -> ``""``; other values use ``str()``.

    Not enough for URLs, JavaScript or CSS contexts. For fpdf2 ``cell``/``multi_cell`` plain
    text no escaping is needed, but never pass untrusted text with ``markdown=True``.
    """
    if text is None:
        return ""
    return html.escape(_CONTROL_RE.sub("", str(text)), quote=True)
