"""Is a time split, or a file, fit to measure a fraud model on? Warnings with numbers and a fix.

A test period with one fraud episode (12 frauds on one card) gives an average precision that
says nothing about the next month; a file with five transactions per card gives the sequence
model no history to read. These checks say so before anyone reads the metrics:

* :func:`split_warnings`: validation or test holds fewer than :data:`MIN_FRAUDS` labelled
  frauds, or fewer than :data:`MIN_FRAUD_ENTITIES` entities with a fraud;
* :func:`propose_split_dates`: the latest ``(train_end, val_end)`` midnights that give both
  periods at least that many frauds and fraud entities, if the file allows it;
* :func:`history_warning`: the median number of transactions per entity is below the history
  the model is built for (``min_history``);
* :func:`date_outliers`: a few transactions dated far outside the file's dates (a 2099 or 1970
  typo), which stretch the default split and the model's time-gap inputs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: fewest labelled frauds a validation or test period should hold
MIN_FRAUDS = 30
#: fewest distinct entities with a labelled fraud a validation or test period should hold
MIN_FRAUD_ENTITIES = 5


def _fraud_rows(frame: pd.DataFrame) -> pd.DataFrame:
    if "label" not in frame:
        return frame.iloc[:0]
    y = frame["label"].to_numpy(dtype="float64", na_value=np.nan)
    return frame.loc[y == 1, ["entity_id", "timestamp"]]


def split_warnings(
    frame: pd.DataFrame,
    split: np.ndarray,
    *,
    min_frauds: int = MIN_FRAUDS,
    min_entities: int = MIN_FRAUD_ENTITIES,
) -> list[str]:
    """One sentence per period (validation = 1, test = 2) that is too thin to measure on.

    Args:
        frame: canonical frame with ``entity_id``, ``timestamp`` and ``label``.
        split: ``[N]`` int8 per row (0 train, 1 validation, 2 test).

    Returns:
        Warnings (empty when both periods hold at least ``min_frauds`` frauds over at least
        ``min_entities`` entities), each naming the counts.
    """
    out = []
    y = frame["label"].to_numpy(dtype="float64", na_value=np.nan) if "label" in frame else np.full(len(frame), np.nan)
    ents = frame["entity_id"].to_numpy()
    for code, name in ((1, "validation"), (2, "test")):
        fraud = (np.asarray(split) == code) & (y == 1)
        n, k = int(fraud.sum()), len(set(ents[fraud]))
        if n < min_frauds or k < min_entities:
            out.append(
                f"the {name} period holds {n} labelled fraud{'s' if n != 1 else ''} on {k} "
                f"entit{'ies' if k != 1 else 'y'} (fewer than {min_frauds} frauds or {min_entities} "
                f"entities): its metrics rest on too few cases to compare models"
            )
    return out


def propose_split_dates(
    frame: pd.DataFrame, *, min_frauds: int = MIN_FRAUDS, min_entities: int = MIN_FRAUD_ENTITIES
) -> tuple[pd.Timestamp, pd.Timestamp] | None:
    """The latest midnights ``(train_end, val_end)`` with enough frauds after each cut.

    The test period ``[val_end, end]`` and the validation period ``[train_end, val_end)`` each
    get at least ``min_frauds`` labelled frauds on at least ``min_entities`` entities, and the
    training period keeps at least as many. ``None`` when the file's frauds are too few for that.
    """
    fr = _fraud_rows(frame).sort_values("timestamp")
    if fr.empty:
        return None
    t = fr["timestamp"].to_numpy()
    e = fr["entity_id"].to_numpy()

    def cut_before(hi: int) -> int | None:
        """Largest index i < hi such that rows [i, hi) hold enough frauds and entities."""
        seen: set = set()
        for i in range(hi - 1, -1, -1):
            seen.add(e[i])
            if hi - i >= min_frauds and len(seen) >= min_entities:
                return i
        return None

    i_test = cut_before(len(t))
    if i_test is None:
        return None
    val_end = pd.Timestamp(t[i_test]).normalize()
    hi = int(np.searchsorted(t, np.datetime64(val_end), side="left"))
    i_val = cut_before(hi)
    if i_val is None:
        return None
    train_end = pd.Timestamp(t[i_val]).normalize()
    n_train = int(np.searchsorted(t, np.datetime64(train_end), side="left"))
    if n_train < min_frauds or not train_end < val_end:
        return None
    return train_end, val_end


def history_warning(frame: pd.DataFrame, min_history: int) -> str | None:
    """A sentence when the median entity has fewer transactions than ``min_history``.

    ``min_history`` is the history the model is built for (``ModelConfig.min_history``); below
    it most transactions are scored with little or no earlier context, and a sequence model has
    little to read (e.g. a random-row sample with about 5 transactions per customer).
    """
    if frame.empty:
        return None
    return history_warning_from_sizes(frame.groupby("entity_id", sort=False).size().to_numpy(), min_history)


def history_warning_from_sizes(sizes: np.ndarray, min_history: int) -> str | None:
    """:func:`history_warning` from ``[entities]`` transaction counts per entity (the
    partitioned scorer has the counts, not one frame)."""
    if len(sizes) == 0:
        return None
    med = float(np.median(sizes))
    if med >= min_history:
        return None
    return (
        f"the median entity has {med:g} transaction{'s' if med != 1 else ''} "
        f"({len(sizes):,} entities), fewer than the {min_history} earlier transactions the model is "
        "built for: most scores rest on little history (is this a random-row sample?)"
    )



class DateOutliers:
    """Transactions dated far outside a file's bulk of dates, gathered part by part.

    The bulk is the range left when the earliest and the latest 1 % of the timestamps (at least
    one each) are set aside; a transaction more than the bulk's span (at least 30 days) before
    or after it is an outlier: a typo such as 2099 or an
    epoch 0 that stretches the default time split (cut at 70 % / 85 % of the date range, so one
    2099 row leaves validation empty) and the time since the previous transaction.

    :meth:`add` takes one frame or one partition at a time (the partitioned scorer never holds the
    file at once): it keeps at most ``sample`` timestamps per part (a uniform sample, weighted by
    the part's size, for the quantiles; exact while a part is no larger) and the ``extremes``
    earliest and latest transactions of each part (the candidates, with their row numbers).
    Memory: O(parts x (sample + extremes)).
    """

    def __init__(self, sample: int = 100_000, extremes: int = 50, seed: int = 0):
        self.sample, self.extremes = sample, extremes
        self.rng = np.random.default_rng(seed)
        self.values: list[np.ndarray] = []   # int64 ns, per part
        self.weights: list[np.ndarray] = []  # float64, per part
        # per part: (candidate ns, their row numbers, the latest of the kept earliest, the earliest of the
        # kept latest, whether the part holds rows between them that were not kept)
        self.edges: list[tuple[np.ndarray, np.ndarray, int, int, bool]] = []

    def add(self, timestamp: np.ndarray | pd.Series, row_number: np.ndarray | pd.Series) -> None:
        """One part: ``timestamp`` ``[N]`` datetime64[ns] (naive UTC; NaT is ignored) and
        ``row_number`` ``[N]`` int64 (the file's record numbers)."""
        ns = np.asarray(pd.to_datetime(timestamp), dtype="datetime64[ns]").view(np.int64)
        rows = np.asarray(row_number, dtype=np.int64)
        ok = ns != np.iinfo(np.int64).min
        ns, rows = ns[ok], rows[ok]
        n = len(ns)
        if n == 0:
            return
        kept = ns if n <= self.sample else self.rng.choice(ns, self.sample, replace=False)
        self.values.append(kept)
        self.weights.append(np.full(len(kept), n / len(kept)))
        k = self.extremes
        if n <= 2 * k:  # every row is a candidate
            self.edges.append((ns, rows, 0, 0, False))
            return
        low = np.argpartition(ns, k - 1)[:k]
        high = np.argpartition(ns, n - k)[n - k:]
        pick = np.concatenate([low, high])
        self.edges.append((ns[pick], rows[pick], int(ns[low].max()), int(ns[high].min()), True))

    def _bulk(self) -> tuple[int, int]:
        v = np.concatenate(self.values)
        w = np.concatenate(self.weights)
        order = np.argsort(v, kind="stable")
        v, w = v[order], w[order]
        if np.all(w == 1.0):  # every value kept: order statistics, one row at least set aside each end
            k = max(1, int(0.01 * len(v))) if len(v) > 2 else 0
            return int(v[k]), int(v[len(v) - 1 - k])
        cw = (np.cumsum(w) - 0.5 * w) / w.sum()
        return int(np.interp(0.01, cw, v)), int(np.interp(0.99, cw, v))

    def warning(self, show: int = 3, hint: str = "fix or remove them, or pass --train-end / --val-end") -> str | None:
        """A sentence naming the outliers (at most ``show`` by row number) and ending with
        ``hint``, else None (fewer than 2 transactions, or none outside)."""
        if sum(len(v) for v in self.values) < 2:
            return None
        lo, hi = self._bulk()
        margin = max(hi - lo, int(pd.Timedelta(days=30).value))
        far_rows, far_ns, partial = [], [], False
        for ns, rows, low_last, high_first, more in self.edges:
            far = (ns < lo - margin) | (ns > hi + margin)
            far_rows.append(rows[far])
            far_ns.append(ns[far])
            # every kept extreme of one side is an outlier: the part may hold more of them
            partial |= more and (low_last < lo - margin or high_first > hi + margin)
        rows, ns = np.concatenate(far_rows), np.concatenate(far_ns)
        if len(rows) == 0:
            return None
        order = np.argsort(rows, kind="stable")
        rows, ns = rows[order], ns[order]
        n = len(rows)
        named = ", ".join(f"row {int(r)} at {pd.Timestamp(int(t))}" for r, t in zip(rows[:show], ns[:show]))
        count = f"{'at least ' if partial else ''}{n:,} transaction{'s are' if n != 1 else ' is'}"
        return (f"{count} dated far outside the file's dates ({pd.Timestamp(lo).date()} to "
                f"{pd.Timestamp(hi).date()} hold 98 % of them): {named}{' and more' if n > show else ''}; "
                f"such dates stretch the default time split and the time since the previous transaction: {hint}")


def date_outliers(frame: pd.DataFrame, *, show: int = 3,
                  hint: str = "fix or remove them, or pass --train-end / --val-end") -> str | None:
    """:class:`DateOutliers` of one frame (``timestamp``, ``row_number`` columns), exact: a
    sentence naming the transactions dated far outside the file's bulk of dates, else None."""
    d = DateOutliers(sample=max(len(frame), 1), extremes=max(len(frame), 1))
    d.add(frame["timestamp"], frame["row_number"])
    return d.warning(show=show, hint=hint)
