"""Case page, top of the transaction: what the analyst reads first.

:func:`render_lead` shows, above every per-method chart and without a toggle:

* the reason codes of the query (:func:`engine.trust.reasons.reason_codes`), history reasons
  citing the earlier transactions, query reasons about the flagged transaction itself;
* the key evidence sentence (:func:`engine.trust.evidence.key_evidence`): "Without these 8
  earlier transactions the score would be 0.12 (now 0.91)", with the time and amount of each
  evidence transaction;
* one sentence on whether the attribution methods agree (:mod:`engine.trust.agreement`), stated
  once instead of one box per disagreeing pair.

The words rule (as ``probability_word`` of the model's calibration module): a number is called a
"probability" only when the checkpoint carries a calibration map (``bundle.calibrated``), else a
"score". :func:`word` gives the word for the loaded model; :func:`logit_reading` turns a logit
attribution into that reading ("+0.80 logit ≈ score 0.50 → 0.69").

Caching: ``st.cache_data`` keyed by (data sha256, spec, max_rows, model sha256, transaction id);
the explanations come from :func:`dashboard.state.get_explanations` (the precomputed cache first).
Nothing here imports torch.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from dashboard import state
from dashboard.components.safe import error_text, md
from engine.cases import view as cv

#: evidence transactions at most (the "without these N transactions" sentence)
EVIDENCE_K = 8
#: Spearman rho at or above which every pair of methods is said to agree
AGREE_RHO = 0.5
log = logging.getLogger("fraudlens.dashboard")


def word(loaded: Any) -> str:
    """``"probability"`` when the loaded model is calibrated, else ``"score"`` (words rule)."""
    b = loaded.bundle
    return "probability" if bool(getattr(b, "calibrated", False)) else "score"


def output(loaded: Any, logit: float) -> float:
    """The model's output for one logit: calibrated probability or sigmoid score in [0, 1]."""
    b = loaded.bundle
    if hasattr(b, "probability"):
        return float(np.asarray(b.probability(np.asarray([float(logit)], dtype=np.float64)), dtype=np.float64)[0])
    return 1.0 / (1.0 + math.exp(-float(logit)))


def logit_reading(loaded: Any, logit: float, attribution: float) -> str:
    """A logit attribution read on the output scale: ``"+0.80 logit: score 0.50 → 0.69"`` — the
    output of the query's logit without the attribution and with it (one transaction's share,
    read alone; attributions are additive in logits, not in probabilities)."""
    w = word(loaded)
    return (f"{attribution:+.2f} logit: {w} {output(loaded, logit - attribution):.2f} → "
            f"{output(loaded, logit):.2f}")


def reason_reading(loaded: Any, logit: float, reason: Any) -> str:
    """The parenthesis after a reason: ``" · +0.80 logit: score 0.50 → 0.69"`` (its weight read on
    the output scale, :func:`logit_reading`), or ``" · weight +0.80 logit"`` when the sentence
    states its own measured "without them ... would be" value (``numbers["probability_without"]``):
    the additive reading of a weight that also counts the query's fields gave a second, different
    "without" number in one sentence (analyst trial); ``""`` for a reason without a weight."""
    w = float(getattr(reason, "weight", float("nan")))
    if not math.isfinite(w):
        return ""
    if "probability_without" in (getattr(reason, "numbers", None) or {}):
        return f" · weight {w:+.2f} logit"
    return f" · {logit_reading(loaded, logit, w)}"


@dataclass
class Lead:
    """What :func:`render_lead` shows for one query (plain, picklable).

    Attributes:
        logit: the query's logit. reasons: :class:`engine.trust.reasons.Reason` list.
        evidence: :class:`engine.trust.evidence.KeyEvidence` or None (no earlier transaction).
        agreement: {"n_methods", "min_rho", "pairs_below", "bound"} or None.
        rows: the context rows (time order, query last). error: why reasons could not be built.
    """

    logit: float
    reasons: list = field(default_factory=list)
    evidence: Any = None
    agreement: dict | None = None
    rows: pd.DataFrame | None = None
    error: str = ""



def _agreement(expls: dict) -> dict | None:
    from engine.trust.agreement import method_agreement

    try:
        a = method_agreement(expls)
    except (ValueError, KeyError):
        return None
    if a is None:
        return None
    rho = getattr(a, "spearman", None)
    vals = []
    if isinstance(rho, pd.DataFrame):
        m = rho.to_numpy(dtype=np.float64)
        vals = [m[i, j] for i in range(len(m)) for j in range(i + 1, len(m)) if np.isfinite(m[i, j])]
    n_methods = len(rho) if isinstance(rho, pd.DataFrame) else 0
    below = int(len(a.disagreements)) if getattr(a, "disagreements", None) is not None else 0
    return {"n_methods": n_methods, "min_rho": float(min(vals)) if vals else float("nan"),
            "pairs_below": below, "n_pairs": len(vals), "bound": float(getattr(a, "bound", AGREE_RHO))}


def build_lead(bundle: Any, frame: pd.DataFrame, transaction_id: str, expls: dict) -> Lead:
    """The :class:`Lead` of ``transaction_id`` from its explanations ``expls`` (``{method:
    Explanation}``) over the loaded ``frame``: reasons (with the common point of compromise),
    key evidence, agreement. No ``st.*`` call: the background precompute builds leads ahead of
    the page (:func:`dashboard.precompute.precompute_job`). Raises like
    :func:`engine.explain.context.build_context`."""
    from engine.explain.context import build_context
    from engine.trust.evidence import key_evidence
    from engine.cases.links import case_reason_codes
    from engine.trust.reasons import RANKING_METHODS

    ctx = build_context(bundle, cv.entity_rows(frame, transaction_id), str(transaction_id))
    out = Lead(logit=float(ctx.score_logit()), rows=ctx.rows.reset_index(drop=True).copy())
    try:
        out.reasons = list(case_reason_codes(ctx, expls, frame))  # + common point of compromise
    except ValueError as e:
        out.error = str(e)
    method = next((m for m in RANKING_METHODS if m in expls), None)
    if ctx.T > 1 and method is not None:
        out.evidence = key_evidence(ctx, expls[method], top_k=EVIDENCE_K)
        out.agreement = _agreement(expls)
    return out


@st.cache_data(show_spinner=False, max_entries=128)
def _lead(data_sha: str, spec: str, max_rows: int | None, model_sha: str, transaction_id: str,
          _loaded: Any) -> Lead:
    expls = dict(state.get_explanations(_loaded, transaction_id))
    return build_lead(_loaded.bundle, _loaded.source.frame, transaction_id, expls)


def case_lead(loaded: Any, transaction_id: str) -> Lead:
    """The :class:`Lead` of one query: built ahead by the background precompute (the lead store of
    :func:`dashboard.precompute.lead_store`), else built now and cached per (data sha256, spec,
    max_rows, model sha256, transaction id). Raises like :func:`dashboard.state.get_explanations`."""
    path, spec, sha, max_rows, model_path, model_sha = loaded.key
    from dashboard.precompute import lead_store

    ahead = lead_store(sha, spec, max_rows, model_sha).get(str(transaction_id))
    if ahead is not None:
        log.info("lead of %s: built ahead", transaction_id)
        return ahead
    log.info("lead of %s: built now", transaction_id)
    return _lead(sha, spec, max_rows, model_sha, str(transaction_id), loaded)


def _two(a: float, b: float) -> tuple[str, str]:
    """``a``, ``b`` with the fewest decimals (2 to 6; at least 2 significant digits of the smaller
    one) that tell them apart ("0.00 (now 0.00)" said nothing), else 2 significant digits."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return f"{a:.2f}", f"{b:.2f}"
    small = min((abs(v) for v in (a, b) if v), default=1.0)
    first = 2 if small >= 0.01 else 1 - math.floor(math.log10(small))  # 2 significant digits
    if first > 6:
        return f"{a:.2g}", f"{b:.2g}"
    for d in range(first, 7):
        if f"{a:.{d}f}" != f"{b:.{d}f}":
            return f"{a:.{d}f}", f"{b:.{d}f}"
    return f"{a:.{first}f}", f"{b:.{first}f}"  # equal to 6 decimals: "1.00 (now 1.00)", never "1 (now 1)"


def evidence_sentence(ev: Any, w: str, review: float | None = None) -> str:
    """ "Without these 8 earlier transactions the score would be 0.12 (now 0.91): below the review
    threshold 0.50, so not flagged." — numbers from :class:`engine.trust.evidence.KeyEvidence`
    (``output_*``, shown with the decimals that tell them apart), ``w`` its word, ``review`` the
    review threshold in force (same units; None: no threshold clause)."""
    n = len(ev.transaction_ids)
    these = "this earlier transaction" if n == 1 else f"these {n} earlier transactions"
    without, now = _two(float(ev.output_without), float(ev.output_with))
    s = f"Without {these} the {w} would be {without} (now {now})"
    if review is None or not math.isfinite(float(review)):
        return s + "."
    from engine.cases.fmt import format_threshold

    r = format_threshold(review)
    was, still = float(ev.output_with) >= float(review), float(ev.output_without) >= float(review)
    if was and not still:
        return s + f": below the review threshold {r}, so it would not be flagged."
    if was:
        return s + f": still at or above the review threshold {r}, so it would still be flagged."
    if still:
        return s + f": at or above the review threshold {r}, so without them it would be flagged."
    return s + f" (review threshold {r}: not flagged either way)."


def flag_heading(loaded: Any, output_now: float) -> str:
    """"Why it was flagged" for a query whose output (:func:`output` of its logit: the probability
    the thresholds apply to) is at or above the review threshold in force, else "What drives its
    probability (not flagged: ...)": a case page opened on an unflagged transaction said it was
    flagged."""
    if math.isfinite(output_now) and output_now >= float(loaded.threshold):
        return "Why it was flagged"
    from engine.cases.fmt import format_threshold

    return f"What drives its {word(loaded)} (not flagged: below the review threshold {format_threshold(loaded.threshold)})"


def agreement_sentence(a: dict | None) -> str:
    """One sentence on the methods' agreement (stated once, with what it means)."""
    if not a or a.get("n_pairs", 0) == 0:
        return ""
    if a["pairs_below"] == 0:
        return (f"The {a['n_methods']} attribution methods rank the earlier transactions alike (lowest Spearman "
                f"ρ {a['min_rho']:+.2f}): the evidence above does not depend on the method chosen.")
    return (f"{a['pairs_below']} of {a['n_pairs']} method pairs rank the earlier transactions differently "
            f"(lowest Spearman ρ {a['min_rho']:+.2f}, below {a['bound']:.2f}): read the evidence with care and "
            "compare the charts below; the Trust checks show which method survives removal tests.")


def render_lead(loaded: Any, query: str, currency: str, when: str = "") -> Lead | None:
    """Reasons, key evidence and agreement of ``query`` (``when``: its time · amount label) at
    the top of the case."""
    try:
        lead = case_lead(loaded, query)
    except Exception as e:  # noqa: BLE001
        st.warning(f"The reasons could not be built for {md(cv.mask(query))}: {error_text(e)}")
        return None
    w = word(loaded)
    box = st.container(border=True, key="case_lead")
    heading = flag_heading(loaded, output(loaded, lead.logit))
    box.markdown(f"#### {md(heading)}" + (f": {md(cv.mask(query))} · {md(when)}" if when else ""))
    if lead.reasons:
        for i, r in enumerate(lead.reasons):
            wt = reason_reading(loaded, lead.logit, r)
            box.markdown(f"{i + 1}\\. {md(cv.mask(r.text))}" + (f" *({md(wt[3:])})*" if wt else ""))
    else:
        box.caption("No reason code: no earlier transaction or field of this one pushed the "
                    f"{w} towards fraud in a pattern the reason rules describe.")
    ev = lead.evidence
    if ev is not None and ev.transaction_ids:
        box.markdown(f"**Key evidence.** {md(evidence_sentence(ev, w, loaded.threshold))}")
        rows = lead.rows
        ids = [str(t) for t in rows["transaction_id"]]
        pos = {t: i for i, t in enumerate(ids)}
        shown = [t for t in ev.transaction_ids if t in pos]
        tab = pd.DataFrame({  # most important first: the rank says so (the time column alone read as time order)
            "rank": list(range(1, len(shown) + 1)),
            "time": [pd.Timestamp(rows["timestamp"].iloc[pos[t]]) for t in ev.transaction_ids if t in pos],
            "amount": [float(rows["amount"].iloc[pos[t]]) if "amount" in rows else float("nan")
                       for t in ev.transaction_ids if t in pos],
            "transaction": [cv.mask(t) for t in ev.transaction_ids if t in pos],
        })
        box.dataframe(tab, hide_index=True, key="lead_evidence", height=min(36 * (len(tab) + 1), 250),
                      column_config={
                          "rank": st.column_config.NumberColumn("#", help="1 = the transaction whose removal moves "
                                                                "the score most", format="%d"),
                          "time": st.column_config.DatetimeColumn("Time (UTC)", format="YYYY-MM-DD HH:mm"),
                          "amount": st.column_config.NumberColumn(f"Amount ({currency})", format="%.2f"),
                          "transaction": st.column_config.TextColumn("Transaction")})
    elif ev is not None:
        box.caption(f"Key evidence: no earlier transaction pushed the {w} towards fraud beyond its error.")
    s = agreement_sentence(lead.agreement)
    if s:
        box.caption(md(s))
    return lead


__all__ = ["AGREE_RHO", "EVIDENCE_K", "Lead", "agreement_sentence", "build_lead", "case_lead", "evidence_sentence",
           "flag_heading", "logit_reading", "output", "reason_reading", "render_lead", "word"]
