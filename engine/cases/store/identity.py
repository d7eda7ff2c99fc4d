"""Who is who: the one rule the case store uses whenever it compares people.

Two names are the same person when their :func:`person_key` is equal. The key is, in order:

1. Unicode NFKC normalisation (full-width ``ａ`` -> ``a``, ligatures, compatibility forms);
2. every *format* character removed (Unicode category ``Cf``: zero-width space / joiner /
   non-joiner, word joiner, BOM, bidi controls, soft hyphen), and every whitespace run
   collapsed to one space, with leading / trailing whitespace removed;
3. a *confusable skeleton*: each non-ASCII character that the Unicode confusables table
   (Unicode TR39 data, through the maintained ``confusable_homoglyphs`` package) lists as a
   lookalike of an ASCII letter or digit becomes that ASCII character (Cyrillic ``а`` ->
   ``a``, Greek ``Μ`` -> ``M``, Cyrillic ``і`` -> ``i``);
4. ``str.casefold`` (``Alice`` == ``alice`` == ``ALICE``, ``ß`` == ``ss``), then step 3 and
   the casefold once more, so small and capital lookalikes both map.
   ASCII characters are kept as they are (``alice`` and ``a1ice`` stay two people: both are
   plain ASCII and an identity provider or credentials file tells them apart).

:data:`SYSTEM_ACTOR` (``"system"``, the actor of scoring) is reserved: :func:`is_reserved`
is true for it and for every name with the same key (``System``, ``ѕуѕtеm`` with Cyrillic
letters, ``sys\\u200btem``), and the store refuses such names for analysts.
"""

from __future__ import annotations

import functools
import re
import unicodedata

SYSTEM_ACTOR = "system"
_WS_RE = re.compile(r"\s+")


@functools.lru_cache(maxsize=1)
def _ascii_lookalikes() -> dict[str, str]:
    """Non-ASCII character -> the ASCII letter/digit it looks like (from the TR39 data)."""
    from confusable_homoglyphs import confusables

    table: dict[str, str] = {}
    for ch, glyphs in confusables.confusables_data.items():
        if len(ch) != 1 or ch.isascii():
            continue
        for g in glyphs:
            c = g["c"].replace("\u200e", "").replace("\u200f", "")
            if len(c) == 1 and c.isascii() and c.isalnum():
                table[ch] = c
                break
    return table


def _skeleton_char(ch: str) -> str:
    if ch.isascii():
        return ch
    return _ascii_lookalikes().get(ch, ch)


@functools.lru_cache(maxsize=4096)
def person_key(name: str) -> str:
    """The comparison key of a person's name (see the module docstring for the steps).

    ``person_key("Alice") == person_key("аlice")`` (Cyrillic ``а``) ``==
    person_key("ali\\u200bce")``. Raises ``TypeError`` if ``name`` is not text. The key of a
    name made only of invisible characters is ``""``.
    """
    if not isinstance(name, str):
        raise TypeError(f"a person's name must be text, got {type(name).__name__}")
    text = unicodedata.normalize("NFKC", name)
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    text = _WS_RE.sub(" ", text).strip()
    for _ in range(2):  # before and after casefolding: capital and small lookalikes both map
        text = "".join(_skeleton_char(ch) for ch in text)
        text = unicodedata.normalize("NFKC", text).casefold()
    return text


def same_person(a: str | None, b: str | None) -> bool:
    """True if both names are given and have the same :func:`person_key`."""
    return a is not None and b is not None and person_key(a) == person_key(b)


def is_reserved(name: str) -> bool:
    """True if ``name`` is (a lookalike of) the reserved :data:`SYSTEM_ACTOR`."""
    return person_key(name) == person_key(SYSTEM_ACTOR)
