"""Common point of compromise, per visit: did the other entities that used the same merchant /
terminal around this entity's visit later have fraud more often than the entities active then?

Pure pandas over a canonical frame (no case store, no model), so the reason codes
(:mod:`engine.trust.patterns`, ``common_point``) and the planted-cause bench can use it;
:mod:`engine.cases.links` wraps it with the case store's dispositions.

Definitions (naive UTC; whole calendar days), for a query entity ``e`` at time ``t_q``:

* **Visits tested**: ``e``'s transactions before ``t_q`` and at most ``lookback_days`` before it
  (optionally only those of the query's context), one per (point, day); a missing point value is
  skipped.
* **Onsets** of the *other* entities (:func:`fraud_onsets`: first labelled fraud, else a case
  disposed confirmed fraud). **The query entity's own labels and dispositions are never used**:
  it is removed from the onsets and from every count.
* For a visit to point ``P`` on day ``d``, window ``[d - W, d + W]`` (``W = window_days``):
  ``n`` = other entities with a transaction at ``P`` in the window (**visitors**), ``k`` =
  visitors whose onset falls in ``(first visit in the window, first visit + follow_days]``
  (**later fraud**); ``n_active`` = other entities with any transaction in the window, of which
  ``n_active_fraud`` had an onset within ``follow_days`` after their first transaction in the
  window. Base rate ``r0 = (n_active_fraud + 0.5) / (n_active + 1)`` (a Jeffreys-style
  pseudo-count, so a window without frauds gives a small positive rate, not 0).
* ``rate_ratio = (k / n) / r0``; ``p_value = P(X >= k)``, ``X ~ Binomial(n, r0)``, one-sided
  (``scipy.special.bdtrc(k - 1, n, r0)`` = ``scipy.stats.binom.sf(k - 1, n, r0)``); ``p_adjusted = min(1, p_value * n_tested)``
  (Bonferroni over the ``n_tested`` visits that had at least one other visitor).

This is the observed-versus-expected comparison of :func:`engine.cases.links.rank_points`, but for
one entity's visits rather than for all fraud entities at once.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

#: +- days around a visit in which other entities' visits to the same point count
WINDOW_DAYS = 7
#: a visitor's fraud counts when its onset is at most this many days after its visit
FOLLOW_DAYS = 60
#: visits at most this many days before the query are tested
LOOKBACK_DAYS = 60


def fraud_onsets(frame: pd.DataFrame, confirmed: Mapping[str, str] | None = None, *,
                 use_labels: bool = True) -> pd.Series:
    """The onset (first fraud time) of every fraud entity.

    Args:
        frame: canonical frame (``entity_id``, ``transaction_id``, ``timestamp``, optional ``label``).
        confirmed: ``{entity_id: transaction_id}`` of the cases disposed ``confirmed_fraud`` (the
            transaction is the case's highest-scored one; :func:`engine.cases.links.confirmed_from_store`).
        use_labels: count entities with a ``label == 1`` transaction as fraud entities.
    Returns:
        ``pd.Series`` entity_id -> onset (``datetime64[ns]``), name ``onset``: the first labelled
        fraud when there is one, else the confirmed case's transaction time. Entities of
        ``confirmed`` not in ``frame`` are skipped.
    """
    empty = pd.Series([], dtype="datetime64[ns]", index=pd.Index([], name="entity_id", dtype=object))
    lab = conf = empty
    if use_labels and "label" in frame:
        is_fraud = frame["label"].fillna(0).to_numpy(dtype=np.int64) == 1
        lab = frame.loc[is_fraud].groupby("entity_id", sort=False)["timestamp"].min()
    if confirmed:
        want = pd.DataFrame({"entity_id": [str(k) for k in confirmed],
                             "transaction_id": [str(v) for v in confirmed.values()]})
        have = pd.DataFrame({"entity_id": frame["entity_id"].to_numpy(),
                             "transaction_id": frame["transaction_id"].astype(str).to_numpy(),
                             "timestamp": frame["timestamp"].to_numpy()})
        conf = have.merge(want, on=["entity_id", "transaction_id"]).groupby("entity_id")["timestamp"].min()
    s = lab.combine_first(conf) if len(conf) else lab  # a labelled first fraud wins
    s = s.astype("datetime64[ns]")
    s.name, s.index.name = "onset", "entity_id"
    return s.sort_index()


class _ActiveWindows:
    """Per window ``[d - W, d + W]``: other entities active in it and how many of them had an
    onset within ``follow`` after their first transaction in it. An entities x days matrix of
    first times per day, min-filtered over ``2W + 1`` days (one pass for every window). Times are
    whole milliseconds after ``day0`` (exact in float64, which scipy's filter computes in)."""

    _NONE = 2 ** 52  # "no transaction": above every time (ms after day0), exact as a float

    def __init__(self, near: pd.DataFrame, day0: pd.Timestamp, n_days: int, W: int, onsets: pd.Series,
                 follow: pd.Timedelta):
        from scipy.ndimage import minimum_filter1d

        self.day0 = day0
        codes, ents = pd.factorize(near["entity_id"])
        day = ((near["timestamp"] - day0) // pd.Timedelta(days=1)).to_numpy(np.int64)
        ms = pd.Timedelta(milliseconds=1)
        t = ((near["timestamp"] - day0) // ms).to_numpy(np.int64)
        self.codes, self.day, self.t = codes.astype(np.int64), day, t  # per row of ``near``
        m = np.full((len(ents), max(int(n_days), int(day.max()) + 1 if len(day) else 1)), self._NONE, np.int64)
        np.minimum.at(m, (codes, day), t)
        self.first = minimum_filter1d(m, size=2 * W + 1, axis=1, mode="constant", cval=self._NONE)
        on = onsets.astype("datetime64[ns]").reindex(pd.Index(ents, dtype=object))  # NaT: no onset
        self.has = on.notna().to_numpy()
        self.on = np.where(self.has, ((on - day0) // ms).fillna(0).to_numpy(np.float64), 0).astype(np.int64)
        self.follow = int(follow // ms)

    def later(self, codes: np.ndarray, first: np.ndarray) -> int:
        """How many of the entities ``codes`` have an onset in ``(first, first + follow]`` (ms)."""
        return int((self.has[codes] & (self.on[codes] > first) & (self.on[codes] <= first + self.follow)).sum())

    def counts(self, d: pd.Timestamp) -> tuple[int, int]:
        """``(n_active, n_active_fraud)`` of the window around day ``d``."""
        j = int((d - self.day0) // pd.Timedelta(days=1))
        fa = self.first[:, j]
        act = fa != self._NONE
        return int(act.sum()), self.later(np.flatnonzero(act), fa[act])


def visit_facts(frame: pd.DataFrame, point: str, entity_id: str, until: Any, *,
                transaction_ids: Iterable[str] | None = None, onsets: pd.Series | None = None,
                confirmed: Mapping[str, str] | None = None, missing: str = "<empty>",
                window_days: int = WINDOW_DAYS, follow_days: int = FOLLOW_DAYS,
                lookback_days: int = LOOKBACK_DAYS) -> list[dict[str, Any]]:
    """One fact per tested visit of ``entity_id`` (module docstring), smallest ``p_value`` first.

    Args:
        frame: canonical frame (``entity_id``, ``transaction_id``, ``timestamp``, ``point``, ``label``).
        point: the point column (merchant, terminal: the spec's ``link_points``).
        entity_id: the query's entity. until: the query's time (visits strictly before it).
        transaction_ids: test only these of the entity's transactions (e.g. the query's context).
        onsets / confirmed: as :func:`fraud_onsets` (default: from ``frame``'s labels and
            ``confirmed``); the query entity is removed from them.
        missing: the point field's missing marker (never a point).
        window_days, follow_days, lookback_days: whole days >= 0 / >= 1 / >= 1.
    Returns:
        ``[dict]`` with ``point_field``, ``point``, ``transaction_id`` (the visit), ``visit_time``
        (``pd.Timestamp``), ``n_visitors``, ``n_later_fraud``, ``n_active``, ``n_active_fraud``,
        ``base_rate``, ``rate_ratio``, ``p_value``, ``p_adjusted``, ``n_tested``, ``window_days``,
        ``follow_days``; only visits with at least one other visitor.
    Raises:
        ValueError: a missing column, bad day settings.
    """
    from scipy.special import bdtrc  # binomial survival function (light import; = scipy.stats.binom.sf(k - 1, n, p))

    need = [c for c in ("entity_id", "transaction_id", "timestamp", point) if c not in frame]
    if need:
        raise ValueError(f"frame: missing columns {need} (expected a canonical frame, engine.data.io)")
    if window_days < 0 or follow_days < 1 or lookback_days < 1:
        raise ValueError(f"window_days >= 0, follow_days >= 1, lookback_days >= 1 expected, got "
                         f"{window_days!r}, {follow_days!r}, {lookback_days!r}")
    ent, t_q = str(entity_id), pd.Timestamp(until)
    if onsets is None:
        onsets = fraud_onsets(frame, confirmed)
    onsets = onsets[onsets.index != ent]  # never the query entity's own label
    W, follow = pd.Timedelta(days=int(window_days)), pd.Timedelta(days=int(follow_days))
    tv = frame["timestamp"].to_numpy()
    t_lo = (t_q - pd.Timedelta(days=lookback_days)).normalize() - W
    span = np.flatnonzero((tv >= t_lo.to_datetime64()) & (tv < (t_q.normalize() + W + pd.Timedelta(days=1)).to_datetime64()))
    part = frame.iloc[span]  # every row any window can reach (cheap datetime test before the entity test)
    mine = part["entity_id"].to_numpy() == ent
    own = part.loc[mine & (part["timestamp"] < t_q).to_numpy()
                   & (part["timestamp"] >= t_q - pd.Timedelta(days=lookback_days)).to_numpy()]
    if transaction_ids is not None:
        own = own[own["transaction_id"].astype(str).isin({str(t) for t in transaction_ids})]
    own = own[own[point].astype(str) != missing]
    if not len(own):
        return []
    own = own.assign(cp_point=own[point].astype(str), cp_day=own["timestamp"].dt.normalize())
    own = own.sort_values("timestamp").drop_duplicates(["cp_point", "cp_day"], keep="last")
    lo, hi = own["cp_day"].min() - W, own["cp_day"].max() + W + pd.Timedelta(days=1)
    pt_ = part["timestamp"]
    near = part.loc[~mine & (pt_ >= lo).to_numpy() & (pt_ < hi).to_numpy(), ["entity_id", "timestamp", point]]
    active = _ActiveWindows(near, lo, (hi - lo).days, int(window_days), onsets, follow)
    sel = np.flatnonzero(near[point].isin(set(own[point])).to_numpy())  # native dtype first, text on the few left
    by_point = pd.Series(np.arange(len(sel))).groupby(near[point].to_numpy()[sel].astype(str)).indices if len(sel) else {}
    out = []
    for r in own.itertuples():
        idx = by_point.get(r.cp_point)
        if idx is None:
            continue
        rows = sel[idx]
        j = int((r.cp_day - lo) // pd.Timedelta(days=1))
        rows = rows[(active.day[rows] >= j - window_days) & (active.day[rows] <= j + window_days)]
        if not len(rows):
            continue
        c, t = active.codes[rows], active.t[rows]
        o = np.lexsort((t, c))
        c, t = c[o], t[o]
        first = np.r_[True, c[1:] != c[:-1]]  # each visitor's first visit in the window
        c, t = c[first], t[first]
        n, k = int(len(c)), active.later(c, t)
        n_act, n_act_f = active.counts(r.cp_day)
        r0 = (n_act_f + 0.5) / (n_act + 1.0)
        out.append({"point_field": point, "point": r.cp_point, "transaction_id": str(r.transaction_id),
                    "visit_time": pd.Timestamp(r.timestamp), "n_visitors": n, "n_later_fraud": k,
                    "n_active": n_act, "n_active_fraud": n_act_f, "base_rate": float(r0),
                    "rate_ratio": float(k / n / r0), "p_value": float(bdtrc(k - 1, n, r0)),
                    "window_days": int(window_days), "follow_days": int(follow_days)})
    for x in out:
        x["n_tested"] = len(out)
        x["p_adjusted"] = min(1.0, x["p_value"] * len(out))
    return sorted(out, key=lambda x: (x["p_value"], -x["rate_ratio"]))


def context_visit_facts(frame: pd.DataFrame, ctx, *, point: str | None = None, **kw) -> list[dict[str, Any]]:
    """:func:`visit_facts` of the visits in a query context ``ctx``
    (:class:`engine.explain.context.QueryContext`); ``point`` defaults to the spec's first
    ``link_points`` (``[]`` when the spec has none). ``kw``: as :func:`visit_facts`."""
    spec = ctx.bundle.spec
    point = point or next(iter(getattr(spec, "link_points", []) or []), None)
    if point is None or point not in frame:
        return []
    missing = next((f.missing for f in getattr(spec, "fields", []) if f.name == point), "<empty>")
    until = pd.Timestamp(ctx.rows["timestamp"].iloc[-1])
    return visit_facts(frame, point, ctx.entity_id, until, transaction_ids=ctx.transaction_ids[:-1],
                       missing=missing, **kw)


__all__ = ["FOLLOW_DAYS", "LOOKBACK_DAYS", "WINDOW_DAYS", "context_visit_facts", "fraud_onsets", "visit_facts"]
