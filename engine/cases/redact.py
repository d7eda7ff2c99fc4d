"""Redaction and output-encoding helpers for anything that leaves fraudlens (CSV, HTML, PDF).

* :func:`mask_card_number` - PAN-like digit runs -> first 6 / last 4 digits visible.
* :func:`pseudonymise` - stable keyed pseudonym (HMAC-SHA256) for an entity id.
* :func:`neutralise_csv_cell` / :func:`neutralise_csv_frame` - CSV (formula) injection defence,
  per OWASP: https://owasp.org/www-community/attacks/CSV_Injection (defined in
  :mod:`engine.data.csv_writer`, the one CSV writer, and re-exported here)
* :func:`escape_markdown` - text for a Streamlit markdown context (backslash escapes).
* :func:`escape_markup` - text for HTML (and fpdf2's ``write_html``), per the OWASP XSS
  Prevention Cheat Sheet:
  https://cheatsheetseries.owasp.org/cheatsheets/Cross_Site_Scripting_Prevention_Cheat_Sheet.html
"""

from __future__ import annotations

import hashlib
import hmac
import html
import re
import unicodedata
from typing import Any

import pandas as pd

# the CSV rule lives in the lowest layer (one writer for every CSV); re-exported here for compatibility
from engine.data.csv_writer import (  # noqa: F401
    CSV_FORMULA_TRIGGERS,
    OWASP_CSV_INJECTION_URL,
    neutralise_csv_cell,
    neutralise_csv_frame,
    show_controls,
)

OWASP_XSS_PREVENTION_URL = (
    "https://cheatsheetseries.owasp.org/cheatsheets/Cross_Site_Scripting_Prevention_Cheat_Sheet.html"
)

# 12-19 digits, with up to two separators (space, dash, dot, slash, underscore) between digits, not part of
# a longer digit run
_SEP = r"(?:[ .\-/_]{1,2})?"
_CARD_RE = re.compile(r"(?<![0-9])[0-9](?:" + _SEP + r"[0-9]){11,18}(?![0-9])")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# zero-width characters between two digits (they hide a card number from a pattern, not from a reader)
_ZW_BETWEEN = re.compile(r"(?<=\d)[\u200b-\u200d\u2060\ufeff]+(?=\d)")


def _ascii_digits(text: str) -> str:
    """``text`` with every decimal digit in ASCII (full-width "４１１１" -> "4111") and zero-width
    characters between digits removed, so no written form of a card number escapes the patterns."""
    if text.isascii():
        return text
    text = _ZW_BETWEEN.sub("", text)
    return re.sub(r"\d", lambda m: str(unicodedata.decimal(m.group(), 0)), text)


def _mask_match(m: re.Match[str]) -> str:
    return _mask_digits(m.group(0))


def _mask_digits(run: str) -> str:
    """``run`` with all digits but the first 6 and the last 4 written as ``*`` (separators kept)."""
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

    A run is 12-19 digits, with up to two separators (space, dash, dot, slash, underscore) between
    digits (kept: ``"4111-1111-1111-1111"`` -> ``"4111-11**-****-1111"``), and not part of a longer
    digit run; full-width and other scripts' digits and zero-width characters between digits are
    read as ASCII digits first (the masked text is then written in ASCII digits).
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
    norm = _ascii_digits(text)
    out = _CARD_RE.sub(_mask_match, norm)
    return text if out == norm else out  # other scripts' digits kept as written unless a number was masked


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


#: every ASCII punctuation character: CommonMark lets each be backslash-escaped
_MD_SPECIAL = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
#: U+2060 WORD JOINER: invisible, no line break; splits what GFM would turn into a link
WORD_JOINER = "\u2060"
# GFM autolink literals are found in the *text* after parsing (remark-gfm's find-and-replace), so
# backslash escapes do not stop them: "http(s):", "www." and "x@y" get a word joiner instead.
_AUTOLINK_RE = re.compile(r"(?i)(?<=http)(?=:)|(?<=https)(?=:)|(?<=www)(?=\.)|(?<=@)(?=[\w-])")


def escape_markdown(text: Any) -> str:
    """Untrusted text for a Streamlit markdown context (``st.markdown``, ``st.caption``, ``st.info``
    / ``warning`` / ``error`` / ``success``, ``st.title`` / ``subheader``, widget labels and
    ``help=``, expander labels, ``st.metric`` labels), shown as the literal text.

    Every ASCII punctuation character gets a backslash (CommonMark backslash escapes), so no
    markdown construct can form: no link or image (``[a](u)``, ``![x](u)``), no emphasis, code,
    heading, list or table, no raw HTML (``<img ...>`` stays text), no Streamlit directive
    (``:red[...]``, ``:material/...:``) and no ``$...$`` math. GFM's autolink literals are found
    in the text *after* parsing, where the escapes are gone, so an invisible U+2060 word joiner
    goes between ``http`` / ``https`` and ``:``, between ``www`` and ``.``, and after ``@``
    (e-mail links): the text reads the same and nothing becomes a link. Line breaks become
    spaces (the text stays on its line), C0 control characters are removed, as in
    :func:`escape_markup`, and bidi controls (U+202E, U+2066-U+2069, ...) and C1 characters are
    shown as ``\\u202e`` / ``\\x9b`` (:func:`engine.data.csv_writer.show_controls`).
    ``None`` -> ``""``; other values use ``str()``. Use ``st.text`` / ``st.code`` for long text.
    """
    if text is None:
        return ""
    s = _CONTROL_RE.sub("", str(text)).replace("\r\n", " ").replace("\r", " ").replace("\n", " ")
    s = show_controls(s)  # bidi controls (U+202E: the rest of the line shown reversed) as visible text
    s = _AUTOLINK_RE.sub(WORD_JOINER, s)
    return "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in s)


def mask_frame(df: pd.DataFrame, skip: tuple[str, ...] = ("entity_id", "transaction_id")) -> pd.DataFrame:
    """Copy of ``df`` with card-number-like text masked in every text column but ``skip``, and
    their bidi controls (U+202E and the like: a merchant name shown reversed) and C0/C1 control
    characters shown as visible ``\\uNNNN`` / ``\\xNN`` text
    (:func:`engine.data.csv_writer.show_controls`). ``skip`` columns keep their raw text (look-ups)."""
    out = df.copy()
    for c in out.columns:
        if c in skip:
            continue
        if pd.api.types.is_object_dtype(out[c]) or pd.api.types.is_string_dtype(out[c]):
            out[c] = out[c].map(lambda v: show_controls(mask_card_number(v)) if isinstance(v, (str, int))
                                and not isinstance(v, bool) else v)
    return out


#: column-name parts that make a column a card field (its PAN-like values are masked in tables);
#: ``cc_num`` is the card-number column of the widely used Kaggle credit-card fraud simulations
CARD_WORDS = ("card", "pan", "account_number", "cc_num", "ccnum", "cc_number")


def luhn_valid(digits: str) -> bool:
    """The Luhn (mod 10) check every card number passes (ISO/IEC 7812-1, Annex B):
    ``"4111111111111111"`` -> True. Non-digits are ignored."""
    ds = [int(c) for c in digits if c.isdigit()]
    total = 0
    for i, d in enumerate(reversed(ds)):
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return bool(ds) and total % 10 == 0


_RUN_RE = re.compile(r"[0-9](?:" + _SEP + r"[0-9])*")  # digits with separators between them
_GROUP_RE = re.compile(r"[0-9]+")


def _mask_luhn_run(run: str) -> str:
    """``run`` (digits with separators between them) with its card-number-like part masked: the longest
    stretch of whole digit groups (a separator-free run is one group) holding 13-19 digits that
    passes the Luhn check ("ref 12 4111111111111111" masks the card number, not the 12)."""
    groups = [(m.start(), m.end()) for m in _GROUP_RE.finditer(run)]
    best = None
    for i in range(len(groups)):
        n = 0
        for j in range(i, len(groups)):
            n += groups[j][1] - groups[j][0]
            if n > 19:
                break
            if n >= 13 and luhn_valid(run[groups[i][0]:groups[j][1]]):
                a, b = groups[i][0], groups[j][1]
                if best is None or b - a > best[1] - best[0]:
                    best = (a, b)
    if best is None:
        return run
    a, b = best
    return run[:a] + _mask_digits(run[a:b]) + run[b:]


def mask_luhn_pans(text: Any) -> Any:
    """Mask only the digit runs that could be card numbers: 13-19 digits, whole digit groups of a
    run with separators as :func:`mask_card_number` reads them, that pass the Luhn check (first 6
    / last 4 kept). A random 19-digit merchant id passes in 1 case of 10 and is then
    masked too (the safe side); the other 9 are shown whole. A Python ``int`` is converted to text
    first; anything else is returned unchanged."""
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str):
        return text
    norm = _ascii_digits(text)
    out = _RUN_RE.sub(lambda m: _mask_luhn_run(m.group(0)), norm)
    return text if out == norm else out


def is_card_field(name: Any) -> bool:
    """True when column ``name`` holds card numbers: it contains one of :data:`CARD_WORDS`, "pan"
    as a word of its own ("pan", "masked_pan", "PAN hash"; not "company" or "span")."""
    n = str(name).lower()
    words = re.split(r"[^a-z0-9]+", n)
    return "pan" in words or any(w in n for w in CARD_WORDS if w != "pan")


def mask_field_value(field: Any, value: Any) -> Any:
    """One rule for a transaction field's value wherever it is shown or exported (tables, the
    what-if form, the report's transaction details): a card field (:func:`is_card_field`) has every
    card-number-like run masked (:func:`mask_card_number`); any other field (merchant, MCC, city,
    transaction id) only its Luhn-valid 13-19 digit runs (:func:`mask_luhn_pans`), so a merchant
    id reads whole while a card number that landed in another column is still masked."""
    return mask_card_number(value) if is_card_field(field) else mask_luhn_pans(value)


#: key columns a page looks rows up by: kept raw by :func:`mask_card_fields` (shown through :func:`mask_card_number`)
RAW_KEY_COLUMNS = ("entity_id", "transaction_id")


def mask_card_fields(df: pd.DataFrame, skip: tuple[str, ...] = RAW_KEY_COLUMNS) -> pd.DataFrame:
    """Copy of ``df`` masked by :func:`mask_field_value` per column (text and integer columns; an
    integer column is turned into text only when one of its values is masked), control characters
    shown as text (:func:`engine.data.csv_writer.show_controls`). ``skip`` columns keep their raw
    values: the page looks rows up by them (review finding: a Luhn-valid 16-digit transaction id was
    masked in the timeline and no longer found)."""
    out = df.copy()
    for c in out.columns:
        if c in skip:
            continue
        col = out[c]
        if pd.api.types.is_object_dtype(col) or pd.api.types.is_string_dtype(col):
            out[c] = col.map(lambda v, c=c: show_controls(mask_field_value(c, v)) if isinstance(v, (str, int))
                             and not isinstance(v, bool) else v)
        elif pd.api.types.is_integer_dtype(col) and not pd.api.types.is_bool_dtype(col):
            masked = col.map(lambda v, c=c: mask_field_value(c, int(v)) if pd.notna(v) else v)
            if (masked.astype(str) != col.astype(str)).any():
                out[c] = masked
    return out
