"""Which values the Case page masks: PAN-like text of card fields only.

Merchant ids, MCCs, cities and transaction ids are not card numbers (a TabFormer merchant id is a
19-digit number that :func:`engine.cases.redact.mask_card_number` would mask), so they are shown as
in the what-if form. A column is a *card field* when its name contains one of :data:`CARD_WORDS`;
its PAN-like digit runs are masked (first 6 / last 4 kept, PCI DSS display rule).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from engine.cases import view as cv

CARD_WORDS, is_card_field, mask_card_fields = cv.CARD_WORDS, cv.is_card_field, cv.mask_card_fields


def mask_value(field: str, value: Any) -> Any:
    """``value`` masked when ``field`` is a card field, else unchanged."""
    return cv.mask(value) if is_card_field(field) else value


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
                     "transaction": str(tid or "new"),
                     "values": ", ".join(f"{k}={mask_value(k, v)}" for k, v in vals.items())})
    return pd.DataFrame(rows, columns=["edit", "time", "amount", "transaction", "values"])
