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
from typing import Any, Callable

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

# what a card number is written with between its digit groups, up to two in a row (security review: a
# no-break space, an en dash or a comma hid a number from both rules): any Unicode white space (``\s``:
# space, tab, newline, no-break U+00A0, U+2000-U+200A, thin U+202F, U+205F, ideographic U+3000), . / _ ,
# : +, the hyphens, dashes and minus signs (- U+00AD soft hyphen, U+2010-U+2015, U+2212, small U+FE63,
# full-width U+FF0D), the full-width forms of + , . / : _ and the zero-width characters (next to another
# separator, where _ZW_BETWEEN does not remove them)
_SEP_CHARS = (r"\s.\-/_,:+\u00ad\u2010-\u2015\u2212\ufe63\uff0d\uff0b\uff0c\uff0e\uff0f\uff1a\uff3f"
              r"\u200b-\u200d\u2060\ufeff")
_SEP = r"(?:[" + _SEP_CHARS + r"]{1,2})?"
# a date with its time, year first ("2019-01-01 00:00:18", "2024/01/31 23:59"), is kept as written: with the
# colon and the space as separators its 12 or 14 digits would read as a card number (timestamps in notes,
# the audit log and exported fields), and no card number is written so: none has 12 or 14 digits and starts
# with 19 or 20 (UATP: 1, 15 digits; enRoute 2014 / 2149: 15; Mir 2200-2204 and Mastercard 2221-2720: 16-19)
_DATETIME_RE = re.compile(r"(?<![0-9])(?:19|20)[0-9]{2}([-/.])(?:0[1-9]|1[0-2])\1(?:0[1-9]|[12][0-9]|3[01])"
                          r"[ T](?:[01][0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9])?(?![0-9])")
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


#: fewest digits of each group of a card number written in groups (4-4-4-4, 4-6-5, 4-4-4-4-3): groups of
#: 1-2 digits are never joined, so dates ("31/01/2024 14:05"), times, amounts ("123.45, 678.90"), IP
#: addresses and "4111111111111111:0" entity ids are not read as one number (a review: they were)
MIN_GROUP_DIGITS = 3
_RUN_RE = re.compile(r"[0-9](?:" + _SEP + r"[0-9])*")  # digits with separators between them
_GROUP_RE = re.compile(r"[0-9]+")


def _mask_stretches(run: str, min_digits: int, accept: Callable[[str], bool] | None = None) -> str:
    """``run`` (digits with separators between them) with every card-number-like part masked: each
    stretch of whole digit groups (a separator-free run is one group) holding ``min_digits``-19
    digits, and passing ``accept`` if given, has all but its first 6 and last 4 digits written as
    ``*``. Every such stretch, not only the first or the longest: with newlines, commas and colons
    as separators a run can hold a card number after other digits, or several card numbers, and a
    cut taken from the left showed up to 8 of a card number's middle digits. A run of at most 19
    digits is masked as one number (a stretch's middle lies inside the run's)."""
    groups = [(m.start(), m.end()) for m in _GROUP_RE.finditer(run)]
    starts, n = [], 0  # digit index of each group's first digit
    for a, b in groups:
        starts.append(n)
        n += b - a
    hide = [False] * n
    for i in range(len(groups)):
        for j in range(i, len(groups)):
            first, end = starts[i], starts[j] + groups[j][1] - groups[j][0]
            if end - first > 19:
                break
            if j > i and groups[j][1] - groups[j][0] < MIN_GROUP_DIGITS or (
                    j == i + 1 and groups[i][1] - groups[i][0] < MIN_GROUP_DIGITS):
                break  # a card number is written in groups of 3-6 digits: dates, times, amounts are not joined
            if end - first >= min_digits and (accept is None or accept(run[groups[i][0]:groups[j][1]])):
                hide[first + 6:end - 4] = [True] * (end - 4 - first - 6)
    if not any(hide):
        return run
    out, k = [], 0
    for ch in run:
        if "0" <= ch <= "9":
            out.append("*" if hide[k] else ch)
            k += 1
        else:
            out.append(ch)
    return "".join(out)


def _outside_datetimes(text: str, mask: Callable[[str], str]) -> str:
    """``text`` with ``mask`` applied to the parts between its dates with times (kept as written,
    see _DATETIME_RE); they also end a run, so a card number written right after one is masked whole."""
    parts, pos = [], 0
    for m in _DATETIME_RE.finditer(text):
        parts += [mask(text[pos:m.start()]), m.group(0)]
        pos = m.end()
    return "".join(parts + [mask(text[pos:])])


def mask_card_number(text: Any) -> Any:
    """Mask every card-number-like digit run in ``text``, keeping at most the first 6 and last 4
    digits (PCI DSS display rule): ``"4111111111111111"`` -> ``"411111******1111"``.

    Digits with up to two separators between them form a run (separators kept:
    ``"4111-1111-1111-1111"`` -> ``"4111-11**-****-1111"``): any white space (tab, newline, no-break
    and thin spaces, U+3000), ``. / _ , : +``, hyphens, dashes and minus signs (soft hyphen,
    U+2010-U+2015, U+2212, U+FE63, U+FF0D) and the full-width forms of ``+ , . / : _``; full-width
    and other scripts' digits and zero-width characters between digits are read as ASCII digits
    first (the masked text is then written in ASCII digits). Every stretch of whole digit groups
    of a run that holds 12-19 digits may be a card number and has all but its first 6 and last 4
    digits masked, so a card number next to other digits ("order 12345, 4111 1111 1111 1111") shows
    no more than that either; groups of 1-2 digits are never joined with others
    (:data:`MIN_GROUP_DIGITS`: dates, times, amounts and "4111111111111111:0" are not one
    number). There is no Luhn check: long numeric ids, compact timestamps
    (``"20240101123000"``) and lists of 3+ digit numbers with 12-19 digits in all are masked too -
    over-masking is the safe side. A date with its time, year first (``"2019-01-01 00:00:18"``),
    is kept as written (no card number is written so), and so is a single group of more than 19
    digits.

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
    out = _outside_datetimes(norm, lambda part: _RUN_RE.sub(lambda m: _mask_stretches(m.group(0), 12), part))
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


def mask_luhn_pans(text: Any) -> Any:
    """Mask only the digit runs that could be card numbers: every stretch of whole digit groups of
    a run (digits with separators between them, as :func:`mask_card_number` reads them) that holds
    13-19 digits and passes the Luhn check, first 6 / last 4 of it kept ("ref 12 4111111111111111"
    masks the card number, not the 12; "4111111111111111, 5500005555555559" both). A random 19-digit
    merchant id passes in 1 case of 10 and is then masked too (the safe side); the other 9 are
    shown whole, and so are lists of small numbers ("12, 34, 56") and dates with times
    (``"2019-01-01 00:00:18"``). A Python ``int`` is converted to text first; anything else is
    returned unchanged."""
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str):
        return text
    norm = _ascii_digits(text)
    out = _outside_datetimes(norm, lambda part: _RUN_RE.sub(lambda m: _mask_stretches(m.group(0), 13, luhn_valid),
                                                           part))
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
