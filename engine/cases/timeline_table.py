"""The Case page's transaction picker and table, fast on a long card.

A TabFormer card has 9,391 transactions and ~400 flagged ones: per-option scans of the timeline
(:func:`engine.cases.view.option_label` per id) and per-cell styling cost seconds per page run.
Here: the picker's labels in one pass (:func:`option_labels`) and the table orders the analyst
can choose (:data:`TX_SORTS`, :func:`sort_timeline`), applied on the server so a chosen order is
kept in session state across reruns (a row selection reruns the page).
"""

from __future__ import annotations

import pandas as pd

from engine.cases.redact import mask_card_number


def option_labels(timeline: pd.DataFrame, transaction_ids: list[str]) -> dict[str, str]:
    """``{transaction_id: option_label(timeline, transaction_id)}`` for many ids in one pass over
    the timeline (``option_label`` per id scans the whole timeline each time: with a 9,391-row
    card and ~400 flagged options that was ~0.5 s per page run). Ids not in the timeline get
    their masked id, as there."""
    tid = timeline["transaction_id"].astype(str).to_numpy()
    first: dict[str, int] = {}
    for i, t in enumerate(tid):
        first.setdefault(t, i)
    prob = timeline["probability"].to_numpy(dtype=float)
    flag = timeline["flagged"].to_numpy(dtype=bool)
    when = timeline["when"].astype(str).to_numpy()
    lab = timeline["label"].to_numpy() if "label" in timeline else None
    out = {}
    for t in transaction_ids:
        i = first.get(str(t))
        if i is None:
            out[t] = mask_card_number(str(t))
            continue
        fraud = " · known fraud" if lab is not None and not pd.isna(lab[i]) and int(lab[i]) == 1 else ""
        out[t] = f"{'▲' if flag[i] else '·'} {prob[i]:.3f} · {when[i]}{fraud}"
    return out


#: the Case page's transaction-table orders: key -> (label, columns, ascending); ties keep time order;
#: ``{word}`` in a label is the words rule's "probability" or "score" (dashboard.components.lead.word)
TX_SORTS: dict[str, tuple[str, list[str], list[bool]]] = {
    "time": ("Time, oldest first", ["timestamp"], [True]),
    "time_desc": ("Time, newest first", ["timestamp"], [False]),
    "score": ("Fraud {word}, highest first", ["probability"], [False]),  # {word}: probability or score
    "amount": ("Amount, largest first", ["amount"], [False]),
}


def sort_timeline(timeline: pd.DataFrame, by: str = "time") -> pd.DataFrame:
    """``timeline`` (:func:`entity_timeline`, time order) in the table order ``by`` (a key of
    :data:`TX_SORTS`; stable, so ties stay in time order; NaN last), index reset.

    Raises:
        ValueError: an unknown ``by``.
    """
    if by not in TX_SORTS:
        raise ValueError(f"sort: expected one of {sorted(TX_SORTS)}, got {by!r}")
    _, cols, asc = TX_SORTS[by]
    if by == "time":
        return timeline.reset_index(drop=True)
    return timeline.sort_values(cols, ascending=asc, kind="stable", na_position="last").reset_index(drop=True)


__all__ = ["TX_SORTS", "option_labels", "sort_timeline"]
