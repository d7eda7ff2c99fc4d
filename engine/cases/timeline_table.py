"""The Case page's transaction picker and table, fast on a long card.

A TabFormer card has 9,391 transactions and ~400 flagged ones: per-option scans of the timeline
(:func:`engine.cases.view.option_label` per id) and per-cell styling cost seconds per page run.
Here: the picker's labels in one pass (:func:`option_labels`) and the table orders the analyst
can choose (:data:`TX_SORTS`, :func:`sort_timeline`), applied on the server so a chosen order is
kept in session state across reruns (a row selection reruns the page). The timeline chart draws
the window around the explained transaction (:func:`timeline_window`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
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


#: the Case page's timeline chart draws at most this many transactions by default (the window
#: around the explained one, :func:`timeline_window`): a 9,391-transaction card's chart took seconds
#: to draw in headless Chromium on 2 cores (bench/results/browser.md); "Show all" draws every one
TIMELINE_MAX_POINTS = 1500
#: share of the window before the explained transaction (its history matters more than what follows)
TIMELINE_BEFORE_SHARE = 0.75


@dataclass(frozen=True)
class TimelineWindow:
    """The rows of an entity timeline the chart draws (:func:`timeline_window`).

    Attributes:
        rows: the drawn rows, a contiguous slice of the timeline in its order (index reset).
        start, stop: the slice's positions in the timeline, ``[start, stop)``.
        total: rows of the whole timeline.
        hidden_flagged, hidden_frauds: flagged transactions / known frauds outside the slice.
    """

    rows: pd.DataFrame
    start: int
    stop: int
    total: int
    hidden_flagged: int
    hidden_frauds: int

    @property
    def complete(self) -> bool:
        """True when every transaction is drawn."""
        return self.stop - self.start == self.total


def timeline_window(timeline: pd.DataFrame, query_id: str | None, max_points: int = TIMELINE_MAX_POINTS,
                    before_share: float = TIMELINE_BEFORE_SHARE) -> TimelineWindow:
    """At most ``max_points`` consecutive rows of ``timeline`` (time order) around ``query_id``:
    ``before_share`` of them before it, the rest after, shifted to stay inside the timeline (the
    latest rows when the query is absent or None). Counts the flagged rows (``flagged`` column)
    and known frauds (``label == 1``) left out, so the page can say what the window hides.

    Raises:
        ValueError: ``max_points < 1`` or ``before_share`` outside [0, 1].
    """
    if max_points < 1:
        raise ValueError(f"max_points: expected >= 1, got {max_points}")
    if not 0.0 <= before_share <= 1.0:
        raise ValueError(f"before_share: expected a share in [0, 1], got {before_share}")
    n = len(timeline)
    if n <= max_points:
        start, stop = 0, n
    else:
        ids = timeline["transaction_id"].astype(str).to_numpy()
        hit = np.flatnonzero(ids == str(query_id)) if query_id is not None else np.zeros(0, np.int64)
        q = int(hit[0]) if len(hit) else n - 1
        start = min(max(q - int(round(before_share * (max_points - 1))), 0), n - max_points)
        stop = start + max_points
    keep = np.zeros(n, bool)
    keep[start:stop] = True

    def hidden(mask: np.ndarray) -> int:
        return int((mask & ~keep).sum())

    flagged = timeline["flagged"].fillna(False).astype(bool).to_numpy() if "flagged" in timeline else np.zeros(n, bool)
    fraud = (timeline["label"].fillna(0).astype(float).to_numpy() == 1) if "label" in timeline else np.zeros(n, bool)
    return TimelineWindow(timeline.iloc[start:stop].reset_index(drop=True), start, stop, n, hidden(flagged),
                          hidden(fraud))


__all__ = ["TIMELINE_BEFORE_SHARE", "TIMELINE_MAX_POINTS", "TX_SORTS", "TimelineWindow", "option_labels",
           "sort_timeline", "timeline_window"]
