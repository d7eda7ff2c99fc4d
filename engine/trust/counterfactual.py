"""Counterfactuals: what is the smallest change that clears this flag?

Two questions, both answered with the what-if engine (:func:`engine.trust.whatif.what_if`: the
edited history is re-encoded and re-scored exactly as whole-file scoring of the edited file would
score it, no retraining), against the review threshold in force (a probability):

* :func:`removal_counterfactual` — the fewest earlier transactions to remove so that the query's
  fraud probability falls below the threshold. Search:

  1. **greedy**: the earlier transactions of the query's context in attribution order (default
     method: the first of SHAP, occlusion, Integrated Gradients present, as
     :data:`engine.trust.reasons.RANKING_METHODS`), most fraud-pushing first — those with a
     positive attribution, then the others (two redundant causes can each have an occlusion of
     about 0) — are removed one at a time, re-scoring after each, until the probability is below
     the threshold (at most ``max_removals``);
  2. **pruning**: each removed transaction, last removed first, is put back if the flag stays
     cleared without it (passes repeated until none can be); the result is *1-minimal*: putting
     back any one of its transactions raises the probability to the threshold or above
     (``necessary`` in the result);
  3. **exact search** when it is small: if every subset of the context's earlier transactions
     smaller than the result can be re-scored within ``exact_budget`` evaluations, they all are
     (smallest first) and the first that clears replaces it; then ``exact`` is true: no smaller
     set of the context's earlier transactions clears the flag. Otherwise the result is greedy:
     an **upper bound** on the fewest.

  Removing a transaction re-cuts the context window as whole-file scoring would (an older
  transaction may enter it); only transactions of the query's context are candidates.

* :func:`amount_counterfactual` — the largest amount in ``[0, amount]`` at which the query's
  probability is below the threshold: the amount is changed on a grid of ``grid`` steps from the
  amount down to 0, then bisected between the largest grid amount that clears the flag and the
  grid amount above it, to ``tol`` currency units. The score need not be monotone in the amount:
  the result is the largest such amount *found* on the grid and refined by bisection; its
  probability is re-scored and below the threshold. "No amount clears it" when no grid amount
  does (nor 0).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from engine.explain.base import Explanation
from engine.model.checkpoint import ModelBundle
from engine.trust.reasons import RANKING_METHODS
from engine.trust.whatif import Edit, _relevant_rows, what_if

#: most transactions the greedy search removes before giving up
MAX_REMOVALS = 20
#: most re-scores spent on the exact search below the greedy result
EXACT_BUDGET = 64
#: amount grid steps and bisection tolerance (currency units)
AMOUNT_GRID, AMOUNT_TOL = 8, 0.01


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@dataclass
class RemovalCounterfactual:
    """Result of :func:`removal_counterfactual`.

    Attributes:
        query_transaction_id: the query. threshold: the review threshold (probability).
        original_probability: the query's fraud probability as scored.
        found: a set was found that brings it below ``threshold`` (also true, with nothing
            removed, when it is below already).
        removed: the transaction ids to remove (context order) — empty when not found.
        probability: the query's probability with ``removed`` removed (re-scored); the original
            when not found.
        exact: no smaller set of the context's earlier transactions clears it (searched); false
            = greedy, an upper bound on the fewest.
        necessary: ``{transaction_id: probability with every other of removed removed}``: each is
            >= threshold (1-minimal).
        greedy_path: ``[(transaction_id, probability after removing it and those before)]`` of the
            greedy phase. method: the attribution ranking the candidates. n_candidates: earlier
            transactions with a positive attribution. evaluations: re-scores spent.
        text: one sentence for the analyst.
    """

    query_transaction_id: str
    threshold: float
    original_probability: float
    found: bool
    removed: list[str]
    probability: float
    exact: bool
    necessary: dict[str, float] = field(default_factory=dict)
    greedy_path: list[tuple[str, float]] = field(default_factory=list)
    method: str | None = None
    n_candidates: int = 0
    evaluations: int = 0
    text: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (plain numbers, lists and dicts)."""
        return asdict(self)


@dataclass
class AmountCounterfactual:
    """Result of :func:`amount_counterfactual`.

    Attributes:
        query_transaction_id, threshold, original_probability: as :class:`RemovalCounterfactual`.
        original_amount: the query's amount (currency of the spec).
        found: an amount in ``[0, original_amount]`` was found at which the probability is below
            ``threshold`` (also true when it is below already: then ``amount`` is the original).
        amount: that amount (``None`` when not found). probability: the probability at ``amount``
            (re-scored), else the lowest probability seen on the grid.
        grid: ``[(amount, probability)]`` of the grid scan. evaluations: re-scores spent.
        text: one sentence for the analyst.
    """

    query_transaction_id: str
    threshold: float
    original_amount: float
    original_probability: float
    found: bool
    amount: float | None
    probability: float
    grid: list[tuple[float, float]] = field(default_factory=list)
    evaluations: int = 0
    text: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (plain numbers, lists and dicts)."""
        return asdict(self)


class _Scorer:
    """Re-scores the query under edits (what-if engine), on the rows it needs, counting calls."""

    def __init__(self, bundle: ModelBundle, frame: pd.DataFrame, query: str):
        tid = frame["transaction_id"].astype(str).to_numpy()
        hit = np.flatnonzero(tid == str(query))
        if not len(hit):
            raise KeyError(f"transaction_id {query!r} not found")
        ent = frame["entity_id"].iloc[int(hit[0])]
        # the entity's rows and the rows sharing an aggregate key with them: what what_if cuts
        # from the whole frame on every call, cut once (same rows, same score)
        self.frame = _relevant_rows(frame, ent, bundle.spec, [])
        self.bundle, self.query, self.calls = bundle, str(query), 0
        self._cache: dict[tuple, float] = {}

    def probability(self, edits: Sequence[Edit]) -> float:
        key = tuple((e.op, e.transaction_id, tuple(sorted(e.values.items()))) for e in edits)
        if key not in self._cache:
            self.calls += 1
            res = what_if(self.bundle, self.frame, self.query, list(edits), methods=())
            self._cache[key] = _sigmoid(res.logit)
        return self._cache[key]


def _removals(ids: Sequence[str]) -> list[Edit]:
    return [Edit("remove", t) for t in sorted(ids)]


def removal_counterfactual(
    bundle: ModelBundle,
    frame: pd.DataFrame,
    query_transaction_id: str,
    threshold: float,
    explanations: Mapping[str, Explanation] | None = None,
    *,
    method: str | None = None,
    max_removals: int = MAX_REMOVALS,
    exact_budget: int = EXACT_BUDGET,
    describe: Callable[[str], str] | None = None,
) -> RemovalCounterfactual:
    """The fewest earlier transactions to remove so the query's probability falls below
    ``threshold`` (module docstring: greedy, pruning, exact search when small).

    Args:
        bundle: the model bundle. frame: the canonical frame the query was scored in.
        query_transaction_id: the query. threshold: review threshold, a probability in (0, 1].
        explanations: ``{method: Explanation}`` of the query's context (default: occlusion is
            computed, :func:`engine.explain.explain_all`).
        method: the attribution ranking the candidates (default: the first of
            :data:`engine.trust.reasons.RANKING_METHODS` present).
        max_removals: the greedy phase stops after this many. exact_budget: most re-scores for
            the exact search (0: never).
        describe: transaction id -> text used in the sentence (default: the id).
    Returns:
        :class:`RemovalCounterfactual`.
    Raises:
        KeyError: unknown query. ValueError: threshold outside (0, 1], or ``method`` absent.
    """
    from engine.explain import explain_all
    from engine.explain.context import build_context

    if not 0 < float(threshold) <= 1:
        raise ValueError(f"threshold: expected a probability in (0, 1], got {threshold!r}")
    thr = float(threshold)
    sc = _Scorer(bundle, frame, query_transaction_id)
    qid = sc.query
    ctx = build_context(bundle, sc.frame, qid)
    p0 = _sigmoid(ctx.score_logit())
    name = describe or (lambda t: t)
    base = dict(query_transaction_id=qid, threshold=thr, original_probability=p0)
    if p0 < thr:
        return RemovalCounterfactual(**base, found=True, removed=[], probability=p0, exact=True,
                                     text=f"Already below the review threshold ({p0:.3f} < {thr:.3f}).")
    if explanations is None:
        explanations = explain_all(ctx, ("occlusion",))
    if method is None:
        method = next((m for m in RANKING_METHODS if m in explanations), None)
    if method is None or method not in explanations:
        raise ValueError(f"method: expected one of {list(explanations)} with attributions, got {method!r}")
    e = explanations[method]
    if list(e.transaction_ids) != list(ctx.transaction_ids):
        raise ValueError(f"explanations[{method!r}]: explains another context")
    v = np.asarray(e.values, dtype=np.float64)
    earlier = list(ctx.transaction_ids[:-1])
    q = len(earlier)
    order = [int(j) for j in np.lexsort((-np.arange(q), -v[:q]))] if q else []
    cands = [earlier[j] for j in order if v[j] > 0]
    rest = [earlier[j] for j in order if not v[j] > 0]  # tried after the positive ones (redundant causes)

    # 1. greedy
    removed: list[str] = []
    path: list[tuple[str, float]] = []
    p = p0
    for t in (cands + rest)[: int(max_removals)]:
        removed.append(t)
        p = sc.probability(_removals(removed))
        path.append((t, p))
        if p < thr:
            break
    if p >= thr:
        n = len(removed)
        return RemovalCounterfactual(
            **base, found=False, removed=[], probability=p0, exact=False, greedy_path=path, method=method,
            n_candidates=len(cands), evaluations=sc.calls,
            text=(("No removal clears it: even removing all " if n == q else "No removal found that clears it: "
                   "removing the first ") + f"{n} earlier {'transaction' if n == 1 else 'transactions'}"
                  + (" of the context" if n == q else f" in {_title(method)} order")
                  + f" leaves the probability at {p:.3f}, at or above the review threshold {thr:.3f}." if n else
                  "No removal clears it: there is no earlier transaction in the context."))
    # 2. pruning: put back what is not needed, last removed first, until nothing more can be put back
    # (the score need not be monotone in the removals, so a pass is repeated after any change)
    changed = True
    while changed and len(removed) > 1:
        changed = False
        for t in list(reversed(removed)):
            trial = [x for x in removed if x != t]
            if trial and sc.probability(_removals(trial)) < thr:
                removed, changed = trial, True
    # 3. exact search below the greedy size, when affordable
    exact = len(removed) == 1
    if not exact and exact_budget > 0:
        need = sum(math.comb(q, k) for k in range(1, len(removed)))  # subsets smaller than the result
        if need <= int(exact_budget):
            best = None
            for k in range(1, len(removed)):
                for combo in itertools.combinations(earlier, k):
                    if sc.probability(_removals(combo)) < thr:
                        best = list(combo)
                        break
                if best is not None:
                    break
            if best is not None:
                removed = best
            exact = True
    pos = {t: i for i, t in enumerate(ctx.transaction_ids)}
    removed = sorted(removed, key=pos.__getitem__)
    p_final = sc.probability(_removals(removed))
    necessary = {t: sc.probability(_removals([x for x in removed if x != t])) for t in removed}
    n = len(removed)
    which = ", ".join(name(t) for t in removed[:6]) + (f" and {n - 6} more" if n > 6 else "")
    how = ("the fewest: no smaller set of the context's earlier transactions does" if exact else
           f"found greedily in {_title(method)} order, so at most this many are needed; none of them can be kept")
    text = (f"Removing {n} earlier {'transaction' if n == 1 else 'transactions'} ({which}) brings the probability "
            f"from {p0:.3f} to {p_final:.3f}, below the review threshold {thr:.3f} ({how}).")
    return RemovalCounterfactual(**base, found=True, removed=removed, probability=p_final, exact=exact,
                                 necessary=necessary, greedy_path=path, method=method, n_candidates=len(cands),
                                 evaluations=sc.calls, text=text)


def _title(method: str) -> str:
    return {"shap": "SHAP", "occlusion": "occlusion", "integrated_gradients": "Integrated Gradients"}.get(method, method)


def _money(x: float, currency: str) -> str:
    return f"{x:,.2f}" + (f" {currency}" if currency else "")


def amount_counterfactual(
    bundle: ModelBundle,
    frame: pd.DataFrame,
    query_transaction_id: str,
    threshold: float,
    *,
    grid: int = AMOUNT_GRID,
    tol: float = AMOUNT_TOL,
    max_iter: int = 30,
) -> AmountCounterfactual:
    """The largest amount in ``[0, amount]`` at which the query's probability is below
    ``threshold`` (module docstring: grid scan, then bisection).

    Args:
        bundle, frame, query_transaction_id, threshold: as :func:`removal_counterfactual`.
        grid: grid steps (>= 1) from the amount down to 0. tol: bisection stops when the bracket
            is narrower (currency units, > 0). max_iter: most bisection steps.
    Returns:
        :class:`AmountCounterfactual` (not found, with the reason in ``text``, for an amount <= 0).
    Raises:
        KeyError: unknown query. ValueError: threshold outside (0, 1], grid < 1 or tol <= 0.
    """
    if not 0 < float(threshold) <= 1:
        raise ValueError(f"threshold: expected a probability in (0, 1], got {threshold!r}")
    if int(grid) < 1 or not tol > 0:
        raise ValueError(f"grid must be >= 1 and tol > 0, got {grid!r}, {tol!r}")
    thr = float(threshold)
    sc = _Scorer(bundle, frame, query_transaction_id)
    qid = sc.query
    row = sc.frame.loc[sc.frame["transaction_id"].astype(str).to_numpy() == qid].iloc[0]
    amount = float(row["amount"])
    currency = (getattr(bundle.spec.amount, "currency", "") or "").strip()
    p0 = sc.probability([])
    base = dict(query_transaction_id=qid, threshold=thr, original_amount=amount, original_probability=p0)
    if p0 < thr:
        return AmountCounterfactual(**base, found=True, amount=amount, probability=p0, evaluations=sc.calls,
                                    text=f"Already below the review threshold ({p0:.3f} < {thr:.3f}).")
    if not amount > 0:
        return AmountCounterfactual(**base, found=False, amount=None, probability=p0, evaluations=sc.calls,
                                    text="No amount change applies: the query's amount is not positive (a refund or zero).")

    def prob(x: float) -> float:
        return sc.probability([Edit("change", qid, {"amount": round(float(x), 6)})])

    xs = [amount * i / int(grid) for i in range(int(grid) - 1, -1, -1)]
    seen: list[tuple[float, float]] = []
    hi, lo = amount, None
    for x in xs:
        px = prob(x)
        seen.append((x, px))
        if px < thr:
            lo = x
            break
        hi = x
    if lo is None:
        low = min(px for _, px in seen)
        return AmountCounterfactual(
            **base, found=False, amount=None, probability=low, grid=seen, evaluations=sc.calls,
            text=(f"No amount clears it: at every amount from {_money(amount, currency)} down to 0 "
                  f"({int(grid)} steps) the probability stays at or above the review threshold {thr:.3f} "
                  f"(lowest {low:.3f})."))
    p_lo = prob(lo)
    for _ in range(int(max_iter)):  # invariant: prob(lo) < thr <= prob(hi)
        if hi - lo <= tol:
            break
        mid = (lo + hi) / 2
        pm = prob(mid)
        if pm < thr:
            lo, p_lo = mid, pm
        else:
            hi = mid
    lo = math.floor(lo * 100) / 100 if lo >= 0.01 else lo  # a whole cent at or below the bracket's low end
    p_lo = prob(lo)
    if p_lo >= thr:  # rounding crossed a non-monotone step: keep the bracket end, which was re-scored
        lo = max(x for x, px in seen if px < thr)
        p_lo = prob(lo)
    return AmountCounterfactual(
        **base, found=True, amount=lo, probability=p_lo, grid=seen, evaluations=sc.calls,
        text=(f"At {_money(lo, currency)} instead of {_money(amount, currency)} the probability would be "
              f"{p_lo:.3f}, below the review threshold {thr:.3f} (the largest such amount found: a scan of "
              f"{int(grid)} steps, then bisection to {tol:g})."))


__all__ = ["AMOUNT_GRID", "AMOUNT_TOL", "AmountCounterfactual", "EXACT_BUDGET", "MAX_REMOVALS",
           "RemovalCounterfactual", "amount_counterfactual", "removal_counterfactual"]
