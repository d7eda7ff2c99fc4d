"""The currency of an amount column, guessed by ``fraudlens inspect`` from the column's name
(ISO 4217 codes: amt_eur, Betrag GBP) or the currency signs in its cells (R$, C$, €, £, ...)."""

from __future__ import annotations

#: ISO 4217 codes a column name may carry (amt_eur, amount_usd, Betrag EUR)
_CURRENCY_CODES = {"usd", "eur", "gbp", "chf", "jpy", "cny", "inr", "brl", "mxn", "cad", "aud", "nzd", "sek", "nok",
                   "dkk", "pln", "czk", "huf", "ron", "zar", "sgd", "hkd", "krw", "idr", "rub", "ars", "cop"}
#: dollar prefixes of other currencies, longest first (R$1,25 is Brazilian, never US)
_DOLLAR_PREFIXES = (("CA$", "CAD"), ("AU$", "AUD"), ("NZ$", "NZD"), ("MX$", "MXN"), ("HK$", "HKD"),
                    ("US$", "USD"), ("R$", "BRL"), ("C$", "CAD"), ("A$", "AUD"), ("S$", "SGD"))
_CURRENCY_SYMBOLS = {"€": "EUR", "£": "GBP", "₹": "INR", "₩": "KRW"}
#: symbols more than one currency writes: guessed, always with a note
_AMBIGUOUS = {"$": "USD", "¥": "JPY"}


def guess_currency(name: str, tokens: set[str], cells: list[str]) -> tuple[str | None, str | None]:
    """``(ISO 4217 code, note)`` of the amount: from its column name's tokens (amt_eur -> EUR),
    else from the one currency sign its cells carry (R$ -> BRL, C$ -> CAD, € -> EUR; a bare "$"
    -> USD and "¥" -> JPY with a note, as other currencies write them too); ``(None, note)`` when
    neither says, or the cells carry several. ``tokens``: the column name's lower-case word
    tokens (:func:`engine.data.inspect._tokens`); ``cells``: a sample of its non-empty text cells."""
    codes = {t for t in tokens if t in _CURRENCY_CODES}
    if len(codes) == 1:
        return codes.pop().upper(), None
    seen: set[str] = set()
    bare: set[str] = set()
    for t in cells:
        rest = t
        for pre, code in _DOLLAR_PREFIXES:
            if pre in rest.upper():
                seen.add(code)
                rest = rest.upper().replace(pre, "")
        seen.update(code for sym, code in _CURRENCY_SYMBOLS.items() if sym in rest)
        if "$" in rest:
            bare.add("$")
        if "¥" in rest:
            bare.add("¥")
    for sym in bare:
        seen.add(_AMBIGUOUS[sym])
    if len(seen) != 1:
        return None, (f"amount {name!r}: the cells carry several currencies ({', '.join(sorted(seen))}); USD "
                      "assumed (reports show it): check [amount] currency" if seen else
                      f"amount {name!r}: no currency in its name or cells; USD assumed (reports show it): "
                      "check [amount] currency")
    code = seen.pop()
    if bare and code in _AMBIGUOUS.values():
        sym = next(iter(bare))
        return code, (f"amount {name!r}: {sym!r} read as {code} (other currencies write {sym} too): check "
                      "[amount] currency")
    return code, None
