"""Faithfulness of an explanation: does removing what it ranks first change the score?

For one query context (``T`` transactions, query last, ``P = T - 1`` earlier ones) and one
explanation:

* **Ranking.** The earlier transactions are ordered by the explanation's ``values`` in
  *descending* order (:func:`ranking_order`). For signed methods (Integrated Gradients, SHAP,
  occlusion) this ranks by value, not by magnitude: the transaction that pushed the score most
  *towards fraud* comes first and the ones that pushed towards legitimate come last, because
  the question is "which transactions make this a fraud alert". Unsigned methods (attention)
  rank by weight. Ties go to the more recent transaction. The query is never ranked: it cannot
  be removed (:mod:`engine.explain.removal`).
* **Removing** a transaction is the one removal rule of :mod:`engine.explain.removal`
  (:data:`~engine.explain.removal.REMOVAL_RULE`: presence mask ``False``, as if deleted from the
  context window; time-since-previous recomputed; no re-windowing). Every curve is scored in
  batched forward passes, all ``k`` at once, through
  :func:`~engine.explain.removal.presence_masks` / :func:`~engine.explain.removal.query_logits`.
* **Deletion curve** ``f(x without top-k)`` for ``k = 0..P`` (``k = 0``: nothing removed). The
  *drop* at ``k`` is ``f(x) - f(x without top-k)`` (logit; positive = the score fell).
* **AOPC** (area over the perturbation curve; Samek, Binder, Montavon, Lapuschkin & Müller
  2017, "Evaluating the visualization of what a deep neural network has learned", IEEE TNNLS,
  arXiv:1509.06321): here ``AOPC = mean_{k=1..K} [f(x) - f(x without top-k)]`` in logits,
  ``K = min(k_max, P)``. (Samek et al. average over ``k = 0..K`` including the always-zero
  ``k = 0`` term, i.e. their value is ours times ``K / (K + 1)``.) Higher = the ranking found the
  transactions the score depends on. Also called *comprehensiveness* (DeYoung et al. 2020,
  "ERASER", arXiv:1911.03429).
* **Reference orders**: *random* (the mean curve over ``n_random`` seeded permutations, and the
  mean of their AOPCs) and *attention* (the order of the ``"attention"`` explanation: last layer,
  mean over heads). A method whose AOPC is not above the random one's is no better than chance
  at finding what the score depends on.
* **Insertion / sufficiency**: keep only the top-``k`` earlier transactions (plus the query),
  remove all others: ``f(only top-k)`` for ``k = 0..P`` (``k = 0``: query alone; ``k = P``:
  ``f(x)``). *Sufficiency* ``= mean_{k=1..K} [f(x) - f(only top-k)]`` (DeYoung et al. 2020),
  logit; **lower** = fewer top transactions suffice to reproduce the score.

All scores are query **logits** (``probability`` columns give ``sigmoid``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import pandas as pd
from engine.explain.context import QueryContext
from engine.explain.base import Explanation
from engine.explain.removal import DEFAULT_BATCH_SIZE, REMOVAL_RULE, presence_masks, query_logits

DEFAULT_K = 10
DEFAULT_N_RANDOM = 5
CURVE_COLUMNS = ["k", "transaction_id", "position", "logit", "probability", "drop"]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def ranking_order(values: np.ndarray | Explanation, *, rank_by: str = "value") -> np.ndarray:
    """Positions ``[P]`` int64 of the earlier transactions (``0..T-2``), most important first.

    Args:
        values: ``[T]`` values over the context (query last; the query's entry is ignored) or an
            :class:`Explanation` (its ``values``).
        rank_by: ``"value"`` (default: descending value, most fraud-pushing first) or ``"abs"``
            (descending ``|value|``).
    Returns:
        ``[T-1]`` positions; ties broken towards the more recent transaction; NaN ranks last.
    Raises:
        ValueError: ``values`` not 1-D or ``rank_by`` unknown.
    """
    v = np.asarray(values.values if isinstance(values, Explanation) else values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"values: expected shape [T], got {v.shape}")
    if rank_by not in ("value", "abs"):
        raise ValueError(f"rank_by: expected 'value' or 'abs', got {rank_by!r}")
    s = v[:-1] if rank_by == "value" else np.abs(v[:-1])
    s = np.where(np.isnan(s), -np.inf, s)
    pos = np.arange(len(s))
    return np.lexsort((-pos, -s)).astype(np.int64)  # primary: -score; ties: later position first


def _cumulative_keep(P: int, order: np.ndarray, k_max: int, insertion: bool) -> np.ndarray:
    """``[k_max+1, P]`` bool coalitions: row ``k`` removes (deletion) / keeps only (insertion)
    the first ``k`` players of ``order``."""
    in_top = np.zeros((k_max + 1, P), dtype=bool)
    for k in range(1, k_max + 1):
        in_top[k] = in_top[k - 1]
        in_top[k, order[k - 1]] = True
    return in_top if insertion else ~in_top


def curve(ctx: QueryContext, order: np.ndarray, *, kind: str = "deletion", k_max: int | None = None,
          batch_size: int = DEFAULT_BATCH_SIZE, full_logit: float | None = None) -> pd.DataFrame:
    """Deletion or insertion curve of one removal order.

    Args:
        ctx: the query context.
        order: ``[P]`` positions of the earlier transactions, first removed/kept first.
        kind: ``"deletion"`` (row ``k``: top-``k`` removed) or ``"insertion"`` (row ``k``: only
            the top-``k`` earlier transactions kept, with the query).
        k_max: last ``k`` (default ``P``; capped at ``P``).
        full_logit: ``f(x)`` if already known (saves one forward pass).
    Returns:
        DataFrame, one row per ``k = 0..k_max``: ``k``, ``transaction_id`` (the ``k``-th of the
        order; ``None`` at ``k = 0``), ``position``, ``logit`` (query logit), ``probability``,
        ``drop = f(x) - logit`` (logit).
    Raises:
        ValueError: ``order`` is not a permutation of ``0..P-1`` or ``kind`` unknown.
    """
    P = ctx.T - 1
    order = np.asarray(order, dtype=np.int64)
    if sorted(order.tolist()) != list(range(P)):
        raise ValueError(f"order: expected a permutation of 0..{P - 1}, got {order.tolist()}")
    if kind not in ("deletion", "insertion"):
        raise ValueError(f"kind: expected 'deletion' or 'insertion', got {kind!r}")
    K = P if k_max is None else max(0, min(int(k_max), P))
    keep = _cumulative_keep(P, order, K, insertion=kind == "insertion")
    logits = query_logits(ctx, presence_masks(ctx, keep), batch_size=batch_size)
    f_x = float(query_logits(ctx, ctx.batch.present.clone())[0]) if full_logit is None else full_logit
    return pd.DataFrame({
        "k": np.arange(K + 1),
        "transaction_id": pd.Series([None] + [ctx.transaction_ids[j] for j in order[:K]], dtype=object),
        "position": np.concatenate([[-1], order[:K]]).astype(np.int64),
        "logit": logits,
        "probability": _sigmoid(logits),
        "drop": f_x - logits,
    })[CURVE_COLUMNS]


def aopc(drops: np.ndarray | pd.DataFrame, k_max: int = DEFAULT_K) -> float:
    """``mean_{k=1..K} drop_k`` (logit), ``K = min(k_max, len - 1)``; NaN when ``K = 0``.

    ``drops``: ``[k+1]`` drops indexed by ``k`` (``drops[0]`` ignored) or a curve DataFrame."""
    d = np.asarray(drops["drop"] if isinstance(drops, pd.DataFrame) else drops, dtype=np.float64)
    K = min(int(k_max), len(d) - 1)
    return float(np.mean(d[1 : K + 1])) if K >= 1 else float("nan")


@dataclass
class FaithfulnessResult:
    """Faithfulness of one method's explanation of one query (see the module docstring).

    Attributes:
        method: explanation method name.
        entity_id / query_transaction_id: the case.
        full_logit: ``f(x)``, the query logit with its whole context.
        alone_logit: ``f(query alone)``, every earlier context transaction removed.
        k_max: ``K``, the last ``k`` averaged by AOPC and sufficiency (``min(k_max, P)``).
        order: transaction ids of the earlier transactions, most important first.
        deletion / insertion: curves of this method's order (columns of :func:`curve`).
        random_deletion / random_insertion: mean over the random orders per ``k``: ``k``,
            ``logit`` (mean), ``logit_std``, ``probability`` (of the mean logit), ``drop`` (mean).
        attention_deletion / attention_insertion: curves of the attention order, or ``None``.
        aopc: deletion AOPC over ``k = 1..K`` (logit; higher = more faithful).
        aopc_random: mean AOPC of the random orders. aopc_attention: AOPC of the attention order.
        sufficiency: ``mean_{k=1..K} f(x) - f(only top-k)`` (logit; lower = more sufficient).
        sufficiency_random / sufficiency_attention: the same for the reference orders.
        params: ``rank_by``, ``n_random``, ``seed``, removal rule.
        elapsed_s: wall time of the curves of this method (the shared reference curves excluded).
    """

    method: str
    entity_id: str
    query_transaction_id: str
    full_logit: float
    alone_logit: float
    k_max: int
    order: list[str]
    deletion: pd.DataFrame
    insertion: pd.DataFrame
    random_deletion: pd.DataFrame
    random_insertion: pd.DataFrame
    attention_deletion: pd.DataFrame | None
    attention_insertion: pd.DataFrame | None
    aopc: float
    aopc_random: float
    aopc_attention: float | None
    sufficiency: float
    sufficiency_random: float
    sufficiency_attention: float | None
    params: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        """One flat row (see :func:`faithfulness_table`)."""
        return {
            "method": self.method, "entity_id": self.entity_id, "query_transaction_id": self.query_transaction_id,
            "k_max": self.k_max, "full_logit": self.full_logit, "alone_logit": self.alone_logit,
            "aopc": self.aopc, "aopc_random": self.aopc_random, "aopc_attention": self.aopc_attention,
            "aopc_minus_random": self.aopc - self.aopc_random,
            "sufficiency": self.sufficiency, "sufficiency_random": self.sufficiency_random,
            "sufficiency_attention": self.sufficiency_attention, "elapsed_s": self.elapsed_s,
        }


def _mean_curve(curves: list[pd.DataFrame]) -> pd.DataFrame:
    lg = np.stack([c["logit"].to_numpy() for c in curves])  # [n_random, K+1]
    dr = np.stack([c["drop"].to_numpy() for c in curves])
    m = lg.mean(0)
    return pd.DataFrame({"k": curves[0]["k"].to_numpy(), "logit": m, "logit_std": lg.std(0),
                         "probability": _sigmoid(m), "drop": dr.mean(0)})


def evaluate_faithfulness(
    ctx: QueryContext,
    explanations: Mapping[str, Explanation] | Explanation,
    *,
    k_max: int = DEFAULT_K,
    curve_max: int | None = None,
    n_random: int = DEFAULT_N_RANDOM,
    seed: int = 0,
    rank_by: str = "value",
    attention: Explanation | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> dict[str, FaithfulnessResult]:
    """Deletion / insertion curves, AOPC and sufficiency of every explanation of one query.

    Args:
        ctx: the query context the explanations were computed on.
        explanations: ``{method: Explanation}`` (e.g. from :func:`engine.explain.explain_all`)
            or one Explanation.
        k_max: ``K`` of AOPC / sufficiency (top 1..K), default 10.
        curve_max: last ``k`` of the stored curves (default ``P``: the whole curve;
            ``>= k_max`` is enforced). Smaller = fewer forward passes.
        n_random: random orders (seeds ``(seed, 0..n_random-1)``), default 5; ``>= 1``.
        seed: base seed of the random orders.
        rank_by: ``"value"`` (default) or ``"abs"``, see :func:`ranking_order`.
        attention: the explanation giving the attention order; default ``explanations
            ["attention"]`` if present, else computed (last layer, mean over heads).
        batch_size: presence masks per forward pass.
    Returns:
        ``{method: FaithfulnessResult}`` in the order of ``explanations``.
    Raises:
        ValueError: an explanation is of another context (transaction ids differ), ``k_max < 1``
            or ``n_random < 1``.
    """
    if isinstance(explanations, Explanation):
        explanations = {explanations.method: explanations}
    if k_max < 1:
        raise ValueError(f"k_max: expected >= 1, got {k_max}")
    if n_random < 1:
        raise ValueError(f"n_random: expected >= 1, got {n_random}")
    for m, e in explanations.items():
        if list(e.transaction_ids) != list(ctx.transaction_ids):
            raise ValueError(f"explanations[{m!r}]: explains another context (transaction ids differ from ctx)")
    P = ctx.T - 1
    K = min(k_max, P)
    cmax = P if curve_max is None else min(P, max(int(curve_max), K))
    full = ctx.batch.present.clone()  # [1, T]
    f_x = float(query_logits(ctx, full)[0])
    alone = float(query_logits(ctx, presence_masks(ctx, np.zeros((1, P), dtype=bool)))[0]) if P else f_x

    def curves(order):
        d = curve(ctx, order, kind="deletion", k_max=cmax, batch_size=batch_size, full_logit=f_x)
        i = curve(ctx, order, kind="insertion", k_max=cmax, batch_size=batch_size, full_logit=f_x)
        return d, i

    rand = [curves(np.random.default_rng([seed, r]).permutation(P)) for r in range(n_random)]
    rand_del, rand_ins = _mean_curve([d for d, _ in rand]), _mean_curve([i for _, i in rand])
    aopc_rand = float(np.mean([aopc(d, K) for d, _ in rand]))
    suff_rand = float(np.mean([aopc(i, K) for _, i in rand]))
    if attention is None:
        attention = explanations.get("attention")
    if attention is None:
        from engine.explain.attention import AttentionConfig, explain as explain_attention

        attention = explain_attention(ctx, AttentionConfig(return_matrices=False))
    att_del, att_ins = curves(ranking_order(attention))

    out: dict[str, FaithfulnessResult] = {}
    for m, e in explanations.items():
        t0 = time.perf_counter()
        order = ranking_order(e, rank_by=rank_by)
        d, i = (att_del, att_ins) if e is attention else curves(order)
        out[m] = FaithfulnessResult(
            method=m, entity_id=ctx.entity_id, query_transaction_id=ctx.query_transaction_id,
            full_logit=f_x, alone_logit=alone, k_max=K,
            order=[ctx.transaction_ids[j] for j in order],
            deletion=d, insertion=i, random_deletion=rand_del, random_insertion=rand_ins,
            attention_deletion=att_del, attention_insertion=att_ins,
            aopc=aopc(d, K), aopc_random=aopc_rand, aopc_attention=aopc(att_del, K),
            sufficiency=aopc(i, K), sufficiency_random=suff_rand, sufficiency_attention=aopc(att_ins, K),
            params={"rank_by": rank_by, "n_random": n_random, "seed": seed, "curve_max": cmax,
                    "removal_rule": REMOVAL_RULE, "units": "logit"},
            elapsed_s=time.perf_counter() - t0,
        )
    return out


def faithfulness_table(results: Mapping[str, FaithfulnessResult] | list[FaithfulnessResult]) -> pd.DataFrame:
    """One row per result (:meth:`FaithfulnessResult.summary`): method, case, ``k_max``,
    ``full_logit``, ``alone_logit``, ``aopc``, ``aopc_random``, ``aopc_attention``,
    ``aopc_minus_random``, ``sufficiency``, ``sufficiency_random``, ``sufficiency_attention``,
    ``elapsed_s``. All logits."""
    rs = list(results.values()) if isinstance(results, Mapping) else list(results)
    return pd.DataFrame([r.summary() for r in rs])


__all__ = ["DEFAULT_K", "DEFAULT_N_RANDOM", "FaithfulnessResult", "aopc", "curve", "evaluate_faithfulness",
           "faithfulness_table", "ranking_order"]
