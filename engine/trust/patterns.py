"""Pattern reasons: facts that name a known fraud pattern across the history and the query.

Two patterns, each a fact computed from the data (every number in its ``numbers``) and weighed by
a measured contribution, never by its position in the history:

* ``test_then_purchase`` (**card testing before a cash-out**): one or more *small charges* (a
  positive amount at most :data:`~engine.trust.reasons.SMALL_CHARGE_RATIO` x the entity's median
  earlier purchase, over at least :data:`~engine.trust.reasons.MEDIAN_MIN_PURCHASES` of
  them) at merchants new to the entity, at most :data:`TEST_MAX_BETWEEN` transactions
  before the query in its context, and the query
  is a large purchase (at least :data:`~engine.trust.reasons.AMOUNT_RATIO` x that median) that is
  card-not-present (online) or at a merchant new to the entity. A small charge is kept only when
  removing it from the history lowers the model's logit (its *deletion effect*, the operation
  behind occlusion and the deletion curves: ``f(x) - f(x without it)``, measured with the model,
  no estimate); the reason needs the joint deletion effect of the kept charges ``> 0``. Its
  weight = that joint deletion effect + the query's field attribution on the fields the query part
  rests on (amount, amount_vs_history, recent_activity; use_chip when online; merchant and
  first_seen when the merchant is new) from the per-field explanation, as query reasons are
  weighed. It states the query's amount / online / new-merchant facts, so those query reasons
  and the plain ``small_charges`` history reason are dropped when it fires (no fact twice).
* ``common_point`` (**common point of compromise**): the entity visited point ``P`` (the spec's
  ``link_points`` field: merchant, terminal) and other entities that visited ``P`` around that
  visit later had fraud far more often than the entities active in the same days
  (:func:`engine.trust.common_point.visit_facts`, computed from *other* entities' labels /
  dispositions only, passed in as plain dicts). The model sees one entity's history, so the
  evidence is external: the weight is the log rate ratio at the lower 95 % bound of the visitors'
  fraud rate, ``ln(p_low / r0)`` (:func:`common_point_weight`; ``k`` of ``n`` visitors with later
  fraud, base rate ``r0``), a log relative risk on the same log-odds scale as the logit
  attributions (for rare outcomes log RR ~ log OR); only visits with ``p_adjusted <=``
  :data:`COMMON_POINT_P` are reasons. (Until 2026-12-01 it was the shrunk ``ln((k + 1) / (n r0 +
  1))``: 1.35 for 3 of 3 visitors against a 1.2 % base rate, below even the lower bound, 3.19.)

Sources: card testing ("test charges before large card-not-present purchases") and common point
of purchase / compromise analysis are the standard patterns described in Visa's *What To Do If
Compromised* (2023) and the Fraud Detection Handbook (Le Borgne et al. 2022, §3.2 scenarios 2-3).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch

from engine.model.calibration import probability_word

#: a common point is a reason when its multiple-testing adjusted p-value is at most this
COMMON_POINT_P = 0.05
#: a small charge counts when at most this many transactions lie between it and the query ("shortly before")
TEST_MAX_BETWEEN = 20
#: query reasons / history reasons a ``test_then_purchase`` reason states (dropped when it fires; the
#: query's ``query_new_values`` is rebuilt without the merchant, which the pattern states)
ABSORBED = ("query_amount", "query_online", "small_charges")


def deletion_effects(ctx, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """``[G]`` float64: ``f(x) - f(x without group g)`` in logits for each group of earlier
    positions (one batched forward pass of ``ctx.logits``; the query is never removed)."""
    present = torch.ones(len(groups) + 1, ctx.T, dtype=torch.bool)
    for i, g in enumerate(groups):
        present[i + 1, list(g)] = False
    lg = ctx.logits(present).detach().cpu().numpy().astype(np.float64)
    return lg[0] - lg[1:]


def test_then_purchase(f, ctx) -> None:
    """Add the ``test_then_purchase`` reason to ``f.out`` when the pattern holds (module doc);
    ``f`` is the :class:`engine.trust.reasons._Facts` of ``ctx``."""
    from engine.trust.reasons import (AMOUNT_RATIO, MEDIAN_MIN_PURCHASES, SMALL_CHARGE_RATIO, _is_online, _plural,
                                      first_seen, span_text)

    rows, q = f.rows, f.q
    if q < 1 or "merchant" not in rows:
        return
    amt = rows["amount"].to_numpy(np.float64)
    before = amt[:q][amt[:q] > 0]
    if len(before) < MEDIAN_MIN_PURCHASES:  # no habit to compare with
        return
    med = float(np.median(before))
    if med <= 0 or amt[q] < AMOUNT_RATIO * med:
        return
    new_m = first_seen(rows["merchant"].astype(str).to_numpy(), f.missing.get("merchant", "<empty>"))
    online = bool(_is_online(rows)[q])
    if not (online or new_m[q]):
        return
    cand = [p for p in range(max(0, q - 1 - TEST_MAX_BETWEEN), q) if 0 < amt[p] <= SMALL_CHARGE_RATIO * med and new_m[p]]
    if not cand:
        return
    single = deletion_effects(ctx, [[p] for p in cand])
    keep = [p for p, d in zip(cand, single) if d > 0]
    if not keep:
        return
    joint = float(deletion_effects(ctx, [keep])[0])
    if joint <= 0:
        return
    qfields = ["amount", "amount_vs_history", "recent_activity"] + (["use_chip"] if online else []) + \
        (["merchant", "first_seen"] if new_m[q] else [])
    idx = [f.fnames.index(x) for x in qfields if x in f.fnames]
    wq = float(f.fq[idx].sum()) if f.fq is not None and idx else float("nan")
    weight = joint + (wq if math.isfinite(wq) else 0.0)
    if weight <= 0:
        return
    logit = float(ctx.score_logit())
    p_with, p_without = (float(x) for x in ctx.bundle.probability(np.array([logit, logit - joint])))
    first = min(keep)
    minutes = f.minutes_before_query(first)
    n_between = q - first - 1
    ratio = amt[q] / med
    what = ("online purchase" if online else "purchase") + (" at a merchant new to the " + f.noun if new_m[q] else "")
    charges = ", ".join(f.money(amt[p]) for p in keep)
    n = len(keep)
    text = (f"{n} small {_plural(n, 'charge')} ({charges}) at {_plural(n, 'a merchant', 'merchants')} new to the "
            f"{f.noun}, {span_text(minutes)} ({n_between} {_plural(n_between, 'transaction')}) before this "
            f"{f.money(amt[q])} {what} ({ratio:.1f}x the {f.noun}'s median purchase of {f.money(med)}); without "
            f"{'it' if n == 1 else 'them'} the fraud {probability_word(ctx.bundle.meta)} would be {p_without:.2f} (now "
            f"{p_with:.2f})")
    numbers = {"n_small": n, "amounts": [float(amt[p]) for p in keep], "span_minutes": minutes,
               "n_between": int(n_between), "query_amount": float(amt[q]), "median_before": med,
               "n_before": int(len(before)), "ratio": float(ratio), "online": online, "new_merchant": bool(new_m[q]),
               "max_share_of_median": SMALL_CHARGE_RATIO, "deletion_logit": joint, "query_field_weight": wq,
               "probability_with": p_with, "probability_without": p_without,
               "weight_known": int(math.isfinite(wq))}
    from engine.trust.reasons import new_values_reason

    f.out = [r for r in f.out if r.kind not in ABSORBED and r.kind != "query_new_values"]
    # the query's other new values, if any; first_seen is already weighed in the pattern when the merchant is new
    new_values_reason(f, skip=frozenset({"merchant", "terminal"}), weigh_first_seen=not new_m[q])
    f.pattern("test_then_purchase", text, [*keep, q], ["amount", "merchant", "first_seen", *qfields], numbers,
              weight)


def common_point_weight(k: int, n: int, base_rate: float) -> float:
    """Weight (log-odds scale) of a common point: ``ln(p_low / r0)``, where ``p_low`` is the lower
    bound of the two-sided 95 % Clopper-Pearson interval of the visitors' later-fraud rate ``k / n``
    (Clopper & Pearson 1934, Biometrika 26:404) and ``r0`` the base rate of the entities active in
    those days: the smallest log rate ratio the visits support at that level (for rare outcomes
    log RR ~ log OR, the scale of the logit attributions). 0 when ``k = 0``; <= 0 means no support.

    Raises:
        ValueError: ``k`` outside ``[0, n]`` or a base rate outside ``(0, 1)``.
    """
    from scipy.stats import beta

    if not 0 <= k <= n or not 0 < base_rate < 1:
        raise ValueError(f"expected 0 <= k <= n and 0 < base_rate < 1, got k={k}, n={n}, base_rate={base_rate}")
    if k == 0:
        return 0.0
    return math.log(float(beta.ppf(0.025, k, n - k + 1)) / base_rate)


def common_point(f, facts: Sequence[dict[str, Any]] | None) -> None:
    """Add a ``common_point`` reason per visit fact (at most one: the smallest adjusted p-value)
    whose ``p_adjusted <=`` :data:`COMMON_POINT_P` and whose visit is in the context (module doc).
    ``facts``: dicts of :func:`engine.trust.common_point.visit_facts`."""
    from engine.trust.reasons import _pct, _plural

    ok = [x for x in (facts or []) if x["p_adjusted"] <= COMMON_POINT_P and x["transaction_id"] in f.ids[:f.q]]
    if not ok:
        return
    x = min(ok, key=lambda d: (d["p_adjusted"], -d["rate_ratio"]))
    k, n, r0 = int(x["n_later_fraud"]), int(x["n_visitors"]), float(x["base_rate"])
    weight = common_point_weight(k, n, r0)
    if weight <= 0:
        return
    pos = f.ids.index(x["transaction_id"])
    label = str(x["point_field"]).replace("_", " ")
    others = f"other {f.noun}s"
    text = (f"on {x['visit_time']:%Y-%m-%d} the {f.noun} used {label} {x['point']}; {k} of the {n} {others} "
            f"that used it within {x['window_days']} days of that visit had fraud in the {x['follow_days']} days "
            f"after ({_pct(k / n)}, against {100 * r0:.1f}% of the {x['n_active']} {others} active in those days; "
            f"p = {x['p_adjusted']:.2g} after testing {x['n_tested']} {_plural(int(x['n_tested']), 'visit')})")
    numbers = {kk: x[kk] for kk in ("point_field", "point", "n_visitors", "n_later_fraud", "n_active",
                                    "n_active_fraud", "base_rate", "rate_ratio", "p_value", "p_adjusted", "n_tested",
                                    "window_days", "follow_days")}
    numbers.update({"visit_time": str(x["visit_time"]), "log_rate_ratio_lower95": weight})
    f.pattern("common_point", text, [pos], [str(x["point_field"])], numbers, weight)


__all__ = ["ABSORBED", "COMMON_POINT_P", "TEST_MAX_BETWEEN", "common_point", "common_point_weight", "deletion_effects",
           "test_then_purchase"]
