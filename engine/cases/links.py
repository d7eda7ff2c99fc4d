"""Links between cases: the points (merchants, terminals) that fraud entities share before their
first fraud — a *common point of compromise* — and, from one case, the other entities that visited
the same points in the same days.

Which field is a point comes from the spec: ``link_points`` (e.g. ``["terminal"]`` in
``handbook.toml``, ``["merchant"]`` in ``tabformer.toml``); the first is the default, any other
categorical field may be named. Nothing here knows a column name.

Definitions (naive UTC; time is counted in whole calendar days):

* **Fraud entity**: an entity with a known fraud label (``label == 1``) and/or whose case an analyst
  disposed ``confirmed_fraud`` (:func:`confirmed_from_store`). Its **onset** is its first
  labelled fraud, else the confirmed case's highest-scored transaction.
* **Window** of a fraud entity: the ``window_days`` days before its onset day and the onset day
  itself (``include_onset=False``: without the onset day). Default :data:`WINDOW_DAYS` = 7 days.
  The onset day counts by default because at a compromised terminal the fraud happens *at* the
  point (Handbook scenario 2: every transaction at the terminal is a fraud for 28 days); with
  skimming the point is visited before the fraud. On the Handbook a longer window dilutes the
  signal with the many terminals a customer uses anyway (README: precision@20 for 1..30 days).
* A **clean** visit-day: entity ``e`` visited point ``P`` on day ``d`` and ``e`` has no onset
  within ``window_days`` after ``d`` (no onset at all, or ``d < onset day - window_days``).

For each point ``P`` (:func:`rank_points`), an observed-versus-expected comparison (indirect
standardisation, as a standardised incidence ratio):

* ``a`` = ``fraud_visit_days``: (fraud entity, day) pairs with a visit to ``P`` in the entity's window;
* ``E`` = ``expected_visit_days`` = ``sum over fraud entities f, days d in f's window of
  r_P(d)``, where ``r_P(d)`` = (clean visit-days at ``P`` on day ``d``) / (entities clean on day
  ``d``): how many visit-days to ``P`` the fraud entities would have had had they used ``P`` like
  the entities without fraud on the same days. Computed as ``sum over clean visit-days (P, d) of
  cover(d) / n_clean(d)`` (``cover(d)``: fraud windows containing ``d``), with bincounts;
* ``lift`` = ``(a + k) / (E + k)`` with ``k`` = :data:`PRIOR` pseudo-counts, so a point with one or
  two fraud visits and a tiny expectation is not ranked first by chance;
* ``p_value`` = ``P(X >= a)`` for ``X ~ Poisson(E)``, one-sided (the Poisson approximation of a
  sum of rare visits; computed as ``scipy.special.gammainc(a, E)``, equal to
  ``scipy.stats.poisson.sf(a - 1, E)``).

Points are ranked by ``lift`` (highest first; ties: smaller ``p_value``, more fraud entities);
only points visited by at least ``min_fraud_entities`` (default 2) distinct fraud entities in their
windows are ranked: a point one fraud entity visited links no cases. Vectorised pandas/numpy (the
1.75M-row Handbook file: a few seconds, ``bench`` figures in the README).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import pandas as pd

from engine.trust.common_point import fraud_onsets  # noqa: F401  (the pure part lives in trust: re-exported)

#: default window: whole days before the onset day (the onset day counts too unless include_onset=False)
WINDOW_DAYS = 7
#: pseudo-counts added to observed and expected visit-days in the lift
PRIOR = 1.0
#: a point must be shared by at least this many fraud entities to be ranked
MIN_FRAUD_ENTITIES = 2

RANKING_COLUMNS = ["rank", "point", "fraud_entities", "fraud_visit_days", "expected_visit_days", "lift", "p_value",
                   "first_onset", "last_onset"]
LINKED_COLUMNS = ["entity_id", "shared_points", "points", "n_visits", "first_visit", "last_visit", "fraud_entity",
                  "onset", "max_probability", "case_id", "case_state"]


def point_field(spec: Any, name: str | None = None) -> str:
    """The point field: ``name`` if given (a categorical field of ``spec``), else the spec's first
    ``link_points``.

    Raises:
        ValueError: ``name`` is not a categorical field, or no name given and the spec has no
            ``link_points``.
    """
    cats = [f.name for f in spec.fields if getattr(f.kind, "value", f.kind) == "categorical"]
    if name is None:
        points = list(getattr(spec, "link_points", []) or [])
        if not points:
            raise ValueError(f"spec {spec.name!r}: no link_points; name a categorical field ({cats}) as the point")
        name = points[0]
    if name not in cats:
        raise ValueError(f"point field {name!r}: not a categorical field of spec {spec.name!r} ({cats})")
    return name


def _check_frame(frame: pd.DataFrame, point: str) -> None:
    missing = [c for c in ("entity_id", "transaction_id", "timestamp", point) if c not in frame]
    if missing:
        raise ValueError(f"frame: missing columns {missing} (expected a canonical frame, engine.data.io)")


def confirmed_from_store(store: Any, model_sha256: str, source_id: str) -> dict[str, str]:
    """``{entity_id: max_transaction_id}`` of the cases of one model and data source in state
    ``confirmed_fraud`` (a pending four-eyes proposal does not count)."""
    q = store.queue(model_sha256, 0.0, source_id=source_id, state="confirmed_fraud")
    return {str(e): str(t) for e, t in zip(q["entity_id"], q["max_transaction_id"])}


def case_states(store: Any, model_sha256: str, source_id: str) -> pd.DataFrame:
    """Every case of one model and data source: ``entity_id``, ``case_id``, ``state``."""
    q = store.queue(model_sha256, 0.0, source_id=source_id)
    return pd.DataFrame({"entity_id": q["entity_id"].astype(str), "case_id": q["case_id"], "state": q["state"]})


def _days(t: pd.Series | np.ndarray, day0: pd.Timestamp) -> np.ndarray:
    return ((pd.to_datetime(pd.Series(t)) - day0) // pd.Timedelta(days=1)).to_numpy(dtype=np.int64)


@dataclass
class PointRanking:
    """Result of :func:`rank_points`.

    Attributes:
        table: one row per ranked point, :data:`RANKING_COLUMNS`: ``fraud_entities`` (distinct
            fraud entities that visited it in their window), ``fraud_visit_days`` (``a``),
            ``expected_visit_days`` (``E``), ``lift``, ``p_value``, ``first_onset`` /
            ``last_onset`` of those fraud entities.
        point_field: the field the points are values of. window_days, include_onset, prior,
            min_fraud_entities: the settings. n_fraud_entities / n_other_entities: entities with and
            without an onset.
        onsets: entity_id -> onset of the fraud entities.
    """

    table: pd.DataFrame
    point_field: str
    window_days: int
    include_onset: bool
    prior: float
    min_fraud_entities: int
    n_fraud_entities: int
    n_other_entities: int
    onsets: pd.Series = field(repr=False, default_factory=lambda: pd.Series(dtype="datetime64[ns]"))

    def top(self, k: int) -> list[str]:
        """The first ``k`` ranked points."""
        return self.table["point"].head(k).tolist()


def rank_points(frame: pd.DataFrame, spec: Any, *, point: str | None = None, onsets: pd.Series | None = None,
                confirmed: Mapping[str, str] | None = None, window_days: int = WINDOW_DAYS,
                include_onset: bool = True, prior: float = PRIOR,
                min_fraud_entities: int = MIN_FRAUD_ENTITIES) -> PointRanking:
    """Rank the points fraud entities visited in the days before their first fraud by how much more
    often they visited them than entities without fraud did on the same days (module docstring).

    Args:
        frame: canonical frame (engine.data.io contract).
        spec: its dataset spec (gives the point field, :func:`point_field`).
        point: the point field (default: the spec's first ``link_points``).
        onsets: entity_id -> onset; default :func:`fraud_onsets` of ``frame`` and ``confirmed``.
        confirmed: ``{entity_id: transaction_id}`` of cases disposed confirmed fraud.
        window_days: whole days before the onset day (>= 0). include_onset: the onset day counts.
        prior: pseudo-counts ``k`` >= 0 of the lift. min_fraud_entities: >= 1.
    Returns:
        :class:`PointRanking` (an empty table when no point is shared by enough fraud entities,
        or there are no fraud entities).
    Raises:
        ValueError: bad settings, missing columns, or see :func:`point_field`.
    """
    from scipy.special import gammainc

    if int(window_days) != window_days or window_days < 0 or (window_days == 0 and not include_onset):
        raise ValueError(f"window_days: expected whole days >= 0 (>= 1 without the onset day), got {window_days!r}")
    if prior < 0 or min_fraud_entities < 1:
        raise ValueError(f"prior must be >= 0 and min_fraud_entities >= 1, got {prior!r}, {min_fraud_entities!r}")
    W = int(window_days)
    pf = point_field(spec, point)
    _check_frame(frame, pf)
    if onsets is None:
        onsets = fraud_onsets(frame, confirmed)
    onsets = onsets[onsets.index.isin(frame["entity_id"].unique())]
    n_all = int(frame["entity_id"].nunique())
    n_f, n_o = int(len(onsets)), n_all - int(len(onsets))
    empty = pd.DataFrame({c: [] for c in RANKING_COLUMNS})
    if not len(frame) or not n_f:
        return PointRanking(empty, pf, W, bool(include_onset), float(prior), int(min_fraud_entities), n_f, n_o, onsets)
    day0 = pd.Timestamp(frame["timestamp"].min()).normalize()
    # one row per (entity, point, day) visited, as integer codes
    e_codes, entities = pd.factorize(frame["entity_id"])
    p_codes, points = pd.factorize(frame[pf].astype(str))
    day = _days(frame["timestamp"], day0)
    n_days = int(day.max()) + 1
    key = np.sort((e_codes.astype(np.int64) * len(points) + p_codes) * n_days + day)
    key = key[np.r_[True, key[1:] != key[:-1]]]  # sorted unique (np.unique's hash path is slower here)
    d = key % n_days
    codes = (key // n_days) % len(points)
    ent = key // n_days // len(points)
    on_day = pd.Series(_days(onsets.to_numpy(), day0), index=onsets.index)
    o = pd.Series(entities).map(on_day).to_numpy(dtype=np.float64)[ent]  # NaN: no onset
    last = o if include_onset else o - 1
    in_window = (d >= o - W) & (d <= last)
    clean = np.isnan(o) | (d < o - W)
    # how many fraud windows cover each day; how many entities are clean on each day
    od = on_day.to_numpy()
    lo, hi = np.clip(od - W, 0, n_days), np.clip((od if include_onset else od - 1) + 1, 0, n_days)
    cover = np.cumsum(np.bincount(lo, minlength=n_days + 1) - np.bincount(hi, minlength=n_days + 1))[:n_days]
    n_clean = n_o + (len(od) - np.searchsorted(np.sort(od), np.arange(n_days) + W, side="right"))
    weight = np.where(clean, cover[d] / np.maximum(n_clean[d], 1), 0.0)
    E = np.bincount(codes, weights=weight, minlength=len(points))
    a = np.bincount(codes[in_window], minlength=len(points))
    fv = pd.DataFrame({"p": codes[in_window], "e": ent[in_window]})
    fv["onset"] = pd.Series(entities[fv["e"].to_numpy()]).map(onsets).to_numpy()
    per = fv.groupby("p", sort=False).agg(fraud_entities=("e", "nunique"), first_onset=("onset", "min"),
                                          last_onset=("onset", "max")).reset_index()
    idx = per["p"].to_numpy()
    per.insert(0, "point", np.asarray(points)[idx])
    per["fraud_visit_days"] = a[idx].astype(np.int64)
    per["expected_visit_days"] = E[idx]
    per = per[per["fraud_entities"] >= int(min_fraud_entities)].reset_index(drop=True)
    k = float(prior)
    with np.errstate(divide="ignore", invalid="ignore"):
        per["lift"] = (per["fraud_visit_days"] + k) / (per["expected_visit_days"] + k)
    # P(X >= a), X ~ Poisson(E): the regularised lower incomplete gamma P(a, E) (a >= 1 here)
    per["p_value"] = gammainc(per["fraud_visit_days"].to_numpy(np.float64), per["expected_visit_days"].to_numpy())
    per = per.sort_values(["lift", "p_value", "fraud_entities", "point"], ascending=[False, True, False, True],
                          kind="stable", na_position="last").reset_index(drop=True)
    per.insert(0, "rank", np.arange(1, len(per) + 1))
    return PointRanking(table=per[RANKING_COLUMNS], point_field=pf, window_days=W,
                        include_onset=bool(include_onset), prior=k, min_fraud_entities=int(min_fraud_entities),
                        n_fraud_entities=n_f, n_other_entities=n_o, onsets=onsets)


@dataclass
class CaseLinks:
    """Result of :func:`case_links`: what links one case to others.

    Attributes:
        entity_id: the case's entity. point_field: the point field.
        window_start / window_end: the case's window ``[start, end)`` (naive UTC, midnights): the
            ``window_days`` days before the anchor's day and that day.
        anchor: what the window ends at: ``"first fraud"`` (the entity's onset) or ``"query"``.
        window_days: the setting.
        points: one row per point the entity visited in its window: ``point``, ``n_visits``,
            ``linked_entities`` (other entities there in the window), and ``rank``, ``lift``,
            ``p_value`` from the ranking when the point is ranked (else NA).
        linked: one row per other entity, :data:`LINKED_COLUMNS`: ``shared_points`` (how many of
            the case's points it visited in the window), ``points`` (which, joined with ", "),
            ``n_visits`` there, first/last visit, ``fraud_entity`` (bool), ``onset``,
            ``max_probability`` (its highest fraud probability, if scores were given),
            ``case_id`` / ``case_state`` (if case states were given). Most shared points first,
            then known fraud, then highest probability.
        edges: ``entity_id``, ``point``, ``n_visits`` of every (entity, point) visit in the window,
            the case's own entity included: the network.
    """

    entity_id: str
    point_field: str
    window_start: pd.Timestamp
    window_end: pd.Timestamp
    anchor: str
    window_days: int
    points: pd.DataFrame
    linked: pd.DataFrame
    edges: pd.DataFrame


def case_links(frame: pd.DataFrame, spec: Any, entity_id: str, *, point: str | None = None,
               onsets: pd.Series | None = None, at: Any = None, window_days: int = WINDOW_DAYS,
               include_onset: bool = True, ranking: PointRanking | None = None, scores: pd.DataFrame | None = None,
               cases: pd.DataFrame | None = None, max_entities: int | None = None) -> CaseLinks:
    """The other entities that visited the case's points in the case's window.

    The window is the day of the anchor and the ``window_days`` days before it: the anchor is the
    entity's onset when it is a fraud entity (``onsets``; default :func:`fraud_onsets` of the
    labels), else ``at`` (e.g. the query transaction's time; default the entity's last
    transaction). With ``include_onset=False`` the onset day is left out of a fraud entity's own
    visits (the other entities' visits are counted over the whole window).

    Args:
        frame, spec, point, window_days: as :func:`rank_points`.
        entity_id: the case's entity.
        at: a time (``pd.Timestamp`` or ISO text, naive UTC) the window ends at for an entity
            without onset.
        ranking: a :class:`PointRanking` whose rank, lift and p-value are joined to the points.
        scores: scored frame (``entity_id``, ``probability``) for ``max_probability``.
        cases: ``entity_id``, ``case_id``, ``state`` (:func:`case_states`) for the case states.
        max_entities: keep the first this many linked entities (``None``: all).
    Returns:
        :class:`CaseLinks` (empty tables when the entity visited no point in its window).
    Raises:
        KeyError: no such entity. ValueError: see :func:`point_field`.
    """
    pf = point_field(spec, point)
    _check_frame(frame, pf)
    ent = str(entity_id)
    mine = frame["entity_id"].to_numpy() == ent
    if not mine.any():
        raise KeyError(f"entity {ent!r} not found")
    if onsets is None:
        onsets = fraud_onsets(frame)
    W = int(window_days)
    own_t = frame.loc[mine, "timestamp"]
    if ent in onsets.index:
        day, anchor = pd.Timestamp(onsets[ent]).normalize(), "first fraud"
    else:
        day, anchor = (pd.Timestamp(at) if at is not None else pd.Timestamp(own_t.max())).normalize(), "query"
    start, end = day - pd.Timedelta(days=W), day + pd.Timedelta(days=1)  # [start, end)
    own_end = day if (anchor == "first fraud" and not include_onset) else end
    own_in = (own_t >= start) & (own_t < own_end)
    own = frame.loc[mine].loc[own_in.to_numpy()]
    pts = own[pf].astype(str)
    case_points = pd.DataFrame({"point": pts.to_numpy()}).groupby("point").size().rename("n_visits").reset_index()
    t = frame["timestamp"].to_numpy()
    in_time = np.flatnonzero((t >= start.to_datetime64()) & (t < end.to_datetime64()) & ~mine)  # cheap test first
    near = frame.iloc[in_time]
    near_p = near[pf].astype(str)
    hit = near_p.isin(set(case_points["point"])).to_numpy()
    e = pd.DataFrame({"entity_id": near["entity_id"].to_numpy()[hit], "point": near_p.to_numpy()[hit],
                      "timestamp": near["timestamp"].to_numpy()[hit]})
    edges = e.groupby(["entity_id", "point"], sort=False).agg(
        n_visits=("timestamp", "size"), first_visit=("timestamp", "min"), last_visit=("timestamp", "max")).reset_index()
    linked = edges.groupby("entity_id", sort=False).agg(
        shared_points=("point", "nunique"), points=("point", lambda s: ", ".join(sorted(s))),
        n_visits=("n_visits", "sum"), first_visit=("first_visit", "min"), last_visit=("last_visit", "max"),
    ).reset_index()
    linked["fraud_entity"] = linked["entity_id"].isin(onsets.index)
    linked["onset"] = linked["entity_id"].map(onsets)
    if scores is not None and len(linked):
        mp = scores.loc[scores["entity_id"].isin(set(linked["entity_id"]))].groupby("entity_id")["probability"].max()
        linked["max_probability"] = linked["entity_id"].map(mp)
    else:
        linked["max_probability"] = np.nan
    if cases is not None and len(linked):
        cs = cases.drop_duplicates("entity_id").set_index(cases["entity_id"].astype(str).drop_duplicates())
        linked["case_id"] = linked["entity_id"].map(cs["case_id"]).astype("Int64")
        linked["case_state"] = linked["entity_id"].map(cs["state"])
    else:
        linked["case_id"] = pd.array([pd.NA] * len(linked), dtype="Int64")
        linked["case_state"] = pd.Series([None] * len(linked), dtype=object)
    linked = linked.sort_values(["shared_points", "fraud_entity", "max_probability", "entity_id"],
                                ascending=[False, False, False, True], kind="stable",
                                na_position="last").reset_index(drop=True)[LINKED_COLUMNS]
    if max_entities is not None:
        linked = linked.head(int(max_entities))
    n_linked = edges.groupby("point")["entity_id"].nunique()
    case_points["linked_entities"] = case_points["point"].map(n_linked).fillna(0).astype(np.int64)
    if ranking is not None and ranking.point_field == pf:
        rt = ranking.table.set_index("point")
        for col in ("rank", "lift", "p_value"):
            case_points[col] = case_points["point"].map(rt[col])
        case_points["rank"] = case_points["rank"].astype("Int64")
    case_points = case_points.sort_values(["linked_entities", "point"], ascending=[False, True],
                                          kind="stable").reset_index(drop=True)
    own_edges = case_points[["point", "n_visits"]].assign(entity_id=ent)
    keep = edges[edges["entity_id"].isin(set(linked["entity_id"]))]
    all_edges = pd.concat([own_edges[["entity_id", "point", "n_visits"]], keep[["entity_id", "point", "n_visits"]]],
                          ignore_index=True)
    return CaseLinks(entity_id=ent, point_field=pf, window_start=start, window_end=end, anchor=anchor, window_days=W,
                     points=case_points, linked=linked, edges=all_edges)


def link_graph(links: CaseLinks) -> Any:
    """The case's network as a :class:`networkx.Graph`: one node per entity (``kind="entity"``,
    ``case=True`` for the case's own) and per point (``kind="point"``), node ids
    ``("entity", id)`` / ``("point", value)``; an edge per visit pair, ``weight`` = visits."""
    import networkx as nx

    g = nx.Graph()
    g.add_node(("entity", links.entity_id), kind="entity", case=True, fraud_entity=None, state=None,
               probability=None)
    info = links.linked.set_index("entity_id") if len(links.linked) else None
    for r in links.points.itertuples():
        g.add_node(("point", r.point), kind="point", rank=getattr(r, "rank", None), lift=getattr(r, "lift", None))
    for r in links.edges.itertuples():
        node = ("entity", r.entity_id)
        if node not in g:
            row = info.loc[r.entity_id] if info is not None and r.entity_id in info.index else None
            g.add_node(node, kind="entity", case=False,
                       fraud_entity=None if row is None else bool(row["fraud_entity"]),
                       state=None if row is None or pd.isna(row["case_state"]) else str(row["case_state"]),
                       probability=None if row is None or pd.isna(row["max_probability"]) else float(row["max_probability"]))
        g.add_edge(node, ("point", r.point), weight=int(r.n_visits))
    return g


def case_reason_codes(ctx, explanations, frame: pd.DataFrame, *, point: str | None = None,
                      confirmed: Mapping[str, str] | None = None, **kw) -> list:
    """:func:`engine.trust.reasons.reason_codes` of a query context with link data: the visit
    facts of the query's entity (:func:`engine.trust.common_point.context_visit_facts` over
    ``frame``, other entities' labels plus ``confirmed`` dispositions, never the query entity's
    own) feed the ``common_point`` reason.

    Args:
        ctx: the query context. explanations: ``{method: Explanation}`` of it.
        frame: the canonical frame the context was built from (all entities).
        point: the point field (default: the spec's first ``link_points``; none: no link reason).
        confirmed: ``{entity_id: transaction_id}`` of confirmed-fraud cases (:func:`confirmed_from_store`).
        kw: passed to ``reason_codes`` (``top_k``, ``max_reasons``, ...).
    Returns:
        list of :class:`engine.trust.reasons.Reason`.
    Raises:
        ValueError: as ``reason_codes``; a ``point`` that is not a categorical field.
    """
    from engine.trust.common_point import context_visit_facts
    from engine.trust.reasons import reason_codes

    spec = ctx.bundle.spec
    if point is not None or getattr(spec, "link_points", None):
        pf = point_field(spec, point)
        facts = context_visit_facts(frame, ctx, point=pf, onsets=fraud_onsets(frame, confirmed))
    else:
        facts = None
    return reason_codes(ctx, explanations, links=facts, **kw)


__all__ = ["CaseLinks", "case_reason_codes", "LINKED_COLUMNS", "MIN_FRAUD_ENTITIES", "PRIOR", "PointRanking", "RANKING_COLUMNS",
           "WINDOW_DAYS", "case_links", "case_states", "confirmed_from_store", "fraud_onsets", "link_graph",
           "point_field", "rank_points"]
