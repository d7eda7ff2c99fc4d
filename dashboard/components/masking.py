"""Which values the Case page masks (:func:`engine.cases.redact.mask_field_value`, the rule the
report uses too): a *card field* (its name contains one of :data:`CARD_WORDS`) has its PAN-like
digit runs masked (first 6 / last 4 kept, PCI DSS display rule); any other field (merchant ids,
MCCs, cities, transaction ids) only its 13-19 digit runs that pass the Luhn check, so a TabFormer
merchant id (a 19-digit number) reads whole 9 times in 10 while a card number in the wrong column
is still masked.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from engine.cases import view as cv

CARD_WORDS, is_card_field, mask_card_fields = cv.CARD_WORDS, cv.is_card_field, cv.mask_card_fields


def mask_value(field: str, value: Any) -> Any:
    """``value`` masked by the one field rule (:func:`engine.cases.view.mask_field_value`): a card
    field's card-number-like runs, elsewhere only Luhn-valid ones."""
    return cv.mask_field_value(field, value)


__all__ = ["CARD_WORDS", "edits_table", "is_card_field", "mask_card_fields", "mask_value"]


def edits_table(loaded: Any, edits: list[dict[str, Any]]) -> pd.DataFrame:
    """The what-if edits as a display table: edit, the edited transaction's time and amount
    (the original row's; an added transaction: its own values), transaction id, values (card
    fields masked)."""
    fr = loaded.source.frame
    ids = fr["transaction_id"].astype(str)
    rows = []
    for e in edits:
        tid = e.get("transaction_id")
        vals = dict(e.get("values") or {})
        hit = fr.loc[ids.to_numpy() == str(tid)] if tid else fr.iloc[0:0]
        t = vals.get("timestamp", hit["timestamp"].iloc[0] if len(hit) else None)
        a = vals.get("amount", hit["amount"].iloc[0] if len(hit) and "amount" in hit else None)
        rows.append({"edit": e["op"], "time": pd.to_datetime(t, utc=True, errors="coerce") if t is not None else pd.NaT,
                     "amount": pd.to_numeric(a, errors="coerce") if a is not None else float("nan"),
                     "transaction": cv.mask(str(tid)) if tid else "new",  # ids as displayed everywhere
                     "values": ", ".join(f"{k}={mask_value(k, v)}" for k, v in vals.items())})
    return pd.DataFrame(rows, columns=["edit", "time", "amount", "transaction", "values"])
