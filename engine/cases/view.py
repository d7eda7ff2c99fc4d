"""Engine-side data preparation for the case dashboard (no Streamlit here).

The dashboard calls these functions (never torch): load a source through a spec, load a model,
score, rank entities, build one entity's timeline, explain one query transaction and lay out the
explanations as display tables. Everything returned for display is *display-safe*: card-number-
like text is masked with :func:`engine.cases.redact.mask_card_number`; raw ids stay in the id columns
(``entity_id``, ``transaction_id``) for look-ups and are masked in the ``entity`` /
``transaction`` display columns.

Typical flow::

    src = load_source("demo_data/transactions.csv", "demo")
    bundle = load_model("assets/demo_model")
    scores = score_source(bundle, src.frame)
    ranking = rank_entities(scores, bundle.threshold)
    tl = entity_timeline(src.frame, scores, ranking.entity_id[0], bundle.threshold)
    q = default_query(tl)
    expls = explain_query(bundle, src.frame, q)
    ctx = context_table(expls, src.frame, scores, currency="USD")
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from engine.data.io import file_sha256
from engine.cases.accuracy import estimate_parts
from engine.cases.fmt import format_gap
from engine.cases.figures import METHOD_TITLES, format_amount, transaction_labels
from engine.cases.redact import (  # noqa: F401 - masking lives with the other redaction rules; re-exported
    CARD_WORDS,
    is_card_field,
    mask_card_fields,
    mask_field_value,
    mask_card_number,
    mask_frame,
)
from engine.cases.thresholds import (  # noqa: F401 - the one source of thresholds and bands, re-exported
    BAND_LABELS,
    decision_band,
    thresholds_in_force,
)

if TYPE_CHECKING:
    from engine.model.checkpoint import ModelBundle
    from engine.explain.base import Explanation
    from engine.data.spec import DatasetSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_DATA = REPO_ROOT / "demo_data" / "transactions.csv"
#: the explanation methods, in the order the dashboard shows them
METHODS = ("attention", "attention_rollout", "integrated_gradients", "shap", "occlusion")
#: short column names for per-method values in display tables
METHOD_COLUMNS = {
    "integrated_gradients": "IG (logit)",
    "shap": "SHAP (logit)",
    "occlusion": "occlusion (logit)",
    "attention": "attention (weight)",
    "attention_rollout": "rollout (weight)",
}
_CORE = ("row_number", "transaction_id", "entity_id", "timestamp", "amount", "label")


def demo_spec_name() -> str:
    """``"demo"`` if that built-in spec exists, else ``"tabformer"`` (same columns but the two
    ground-truth columns)."""
    from engine.data.spec import builtin_specs

    return "demo" if "demo" in builtin_specs() else "tabformer"


#: SHA-256 (hex) of a file's bytes: the cache identity of a data file (one implementation:
#: :func:`engine.data.io.file_sha256`)
file_identity = file_sha256


def mask(text: Any) -> Any:
    """:func:`engine.cases.redact.mask_card_number` (re-exported for the dashboard)."""
    return mask_card_number(text)


# ------------------------------------------------------------------------------ source + model
@dataclass
class Source:
    """A data file read through a spec.

    Attributes:
        frame: canonical frame (see :mod:`engine.data.io`).
        rejected: rejected rows (file, row_number, column, value, reason).
        rows_read: data records read.
        path: the file. spec: the spec it was read with. file_sha256: content hash.
    """

    frame: pd.DataFrame
    rejected: pd.DataFrame
    rows_read: int
    path: Path
    spec: "DatasetSpec"
    file_sha256: str = ""

    def summary(self) -> str:
        return (f"rows read {self.rows_read:,} = accepted {len(self.frame):,} "
                f"+ rejected {len(self.rejected):,}")

    @property
    def currency(self) -> str:
        return self.spec.amount.currency or ""


def load_source(path: str | Path, spec: "str | Path | DatasetSpec", max_rows: int | None = None,
                file_sha256: str | None = None) -> Source:
    """Read ``path`` with ``spec`` (a built-in name, a TOML path or a DatasetSpec).

    Raises:
        FileNotFoundError / ValueError: from :func:`engine.data.spec.load_spec` and
            :func:`engine.data.io.read_transactions` (missing file or columns, bad spec).
    """
    from engine.data.io import read_transactions
    from engine.data.spec import DatasetSpec, load_spec

    sp = spec if isinstance(spec, DatasetSpec) else load_spec(spec)
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file")
    kw = {"max_rows": max_rows} if max_rows is not None else {}
    res = read_transactions(p, sp, label_required=False, **kw)  # a production file has no label yet
    return Source(frame=res.frame, rejected=res.rejected, rows_read=res.rows_read, path=p, spec=sp,
                  file_sha256=file_sha256 if file_sha256 is not None else file_identity(p))


def load_model(path: str | Path | None = None) -> "ModelBundle":
    """Load a checkpoint directory (``None`` or ``""``: the demo model in ``assets/demo_model``)."""
    from engine.model.checkpoint import load_checkpoint

    return load_checkpoint(path or None)


def default_model_dir() -> Path:
    from engine.model.checkpoint import ASSET_MODEL_DIR

    return ASSET_MODEL_DIR


def score_source(bundle: "ModelBundle", frame: pd.DataFrame, threshold: float | None = None) -> pd.DataFrame:
    """:func:`engine.model.scoring.score_frame` (frame order) with a boolean ``flagged`` column
    (probability >= ``threshold``, default the checkpoint's review threshold; pass the one
    :func:`thresholds_in_force` gives)."""
    from engine.model.scoring import score_frame

    s = score_frame(bundle, frame)
    s["flagged"] = s["probability"].to_numpy() >= (bundle.threshold if threshold is None else float(threshold))
    return s


def non_finite_score_count(e: BaseException) -> int | None:
    """How many transactions got a NaN or infinite score if ``e`` is the scorer's
    :class:`engine.model.scoring.NonFiniteScoreError` (an error, never "not flagged"); else
    ``None``. Imports nothing: an error of the scorer means its module is loaded."""
    import sys

    scoring = sys.modules.get("engine.model.scoring")
    if scoring is None or not isinstance(e, scoring.NonFiniteScoreError):
        return None
    return len(e.rows)


# ------------------------------------------------------------------------------------ ranking
def rank_entities(scores: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """Entities ranked by their highest transaction score.

    Returns:
        One row per entity, highest ``max_probability`` first (ties: higher highest logit when
        ``scores`` has a ``logit`` column, then more flagged, then later last seen): ``entity_id``
        (raw), ``entity`` (masked for display), ``max_probability``, ``n_transactions``,
        ``n_flagged`` (>= threshold), ``known_frauds`` (label == 1; NA without labels),
        ``first_seen``, ``last_seen``, ``top_transaction_id`` (first by :func:`score_order`).
    """
    s = scores
    if not len(s):
        return pd.DataFrame(columns=["entity_id", "entity", "max_probability", "n_transactions", "n_flagged",
                                     "known_frauds", "first_seen", "last_seen", "top_transaction_id"])
    if "logit" in s:  # ties of probability: the higher logit, then the latest (as default_query)
        top = s.iloc[score_order(s)].drop_duplicates("entity_id")
        top_idx = pd.Series(top.index, index=top["entity_id"].to_numpy()).reindex(pd.unique(s["entity_id"]))
    else:
        top_idx = s["probability"].fillna(-1.0).groupby(s["entity_id"], sort=False).idxmax()
    g = s.assign(_flag=(s["probability"] >= threshold)).groupby("entity_id", sort=False)
    out = pd.DataFrame(
        {
            "max_probability": g["probability"].max(),
            "n_transactions": g.size(),
            "n_flagged": g["_flag"].sum().astype(int),
            "first_seen": g["timestamp"].min(),
            "last_seen": g["timestamp"].max(),
        }
    )
    if "label" in s:
        out["known_frauds"] = s["label"].fillna(0).astype(int).groupby(s["entity_id"], sort=False).sum()
        out.loc[s["label"].notna().groupby(s["entity_id"], sort=False).sum() == 0, "known_frauds"] = np.nan
        out["known_frauds"] = out["known_frauds"].astype("Int64")
    else:
        out["known_frauds"] = pd.array([pd.NA] * len(out), dtype="Int64")
    out["top_transaction_id"] = s.loc[top_idx.to_numpy(), "transaction_id"].to_numpy()
    out = out.reset_index()
    out.insert(1, "entity", out["entity_id"].map(mask_card_number))
    # a step calibration map ties whole blocks of probabilities: the highest logit orders them
    out["_max_logit"] = (out["entity_id"].map(s["logit"].astype("float64").groupby(s["entity_id"], sort=False).max())
                         if "logit" in s else 0.0)
    out = out.sort_values(["max_probability", "_max_logit", "n_flagged", "last_seen"], ascending=False,
                          kind="stable", na_position="last")
    return out.reset_index(drop=True)[["entity_id", "entity", "max_probability", "n_transactions", "n_flagged",
                                       "known_frauds", "first_seen", "last_seen", "top_transaction_id"]]


# ----------------------------------------------------------------------------------- timeline
def entity_timeline(frame: pd.DataFrame, scores: pd.DataFrame, entity_id: str, threshold: float,
                    currency: str = "") -> pd.DataFrame:
    """One entity's transactions in time order, scored, display-safe.

    Returns:
        Columns: ``transaction_id`` (raw), ``transaction`` (masked), ``when`` (label: time ·
        amount), ``timestamp``, ``amount``, ``probability``, ``logit``, ``flagged``, ``label``
        (if known), then the spec's fields and passthrough columns (text masked).

    Raises:
        KeyError: no such entity.
    """
    m = frame["entity_id"].to_numpy() == str(entity_id)
    if not m.any():
        raise KeyError(f"entity {entity_id!r} not found")
    rows = frame.loc[m]
    sc = scores.loc[m, ["logit", "probability"]]
    out = pd.DataFrame(
        {
            "transaction_id": rows["transaction_id"].astype(str).to_numpy(),
            "timestamp": rows["timestamp"].to_numpy(),
            "amount": rows["amount"].to_numpy(),
            "probability": sc["probability"].to_numpy(),
            "logit": sc["logit"].to_numpy(),
        }
    )
    out.insert(1, "transaction", out["transaction_id"].map(mask_card_number))
    out.insert(2, "when", transaction_labels(out["timestamp"], out["amount"], currency))
    out["flagged"] = out["probability"].to_numpy() >= threshold
    if "label" in rows:
        out["label"] = rows["label"].to_numpy()
    rest = [c for c in rows.columns if c not in _CORE]
    for c in rest:
        out[c] = rows[c].to_numpy()
    out = mask_card_fields(out)  # merchant ids are not PANs
    return out.sort_values(["timestamp"], kind="stable").reset_index(drop=True)


def score_order(frame: pd.DataFrame) -> np.ndarray:
    """Row positions ``[N]`` int64 of ``frame``, riskiest first: by ``probability`` (NaN as -1), ties by
    ``logit`` when present (NaN lowest; a step calibration map ties whole blocks), then the later row.
    Chooses a case's opening transaction (default_query, rank_entities, the precompute's order)."""
    n = len(frame)
    p = frame["probability"].fillna(-1.0).to_numpy(np.float64)
    lg = (frame["logit"].astype("float64").fillna(-np.inf).to_numpy() if "logit" in frame else np.zeros(n))
    return np.lexsort((-np.arange(n), -lg, -p))


def default_query(timeline: pd.DataFrame) -> str | None:
    """The highest-scored transaction of a timeline (ties of probability: the higher logit when the
    timeline has a ``logit`` column, then the latest); ``None`` if empty."""
    return str(timeline["transaction_id"].iloc[score_order(timeline)[0]]) if len(timeline) else None


def query_options(timeline: pd.DataFrame, current: str | None = None, min_options: int = 10) -> list[str]:
    """Transaction ids for the "flagged transactions" picker: flagged ones by probability (highest
    first; ties by the higher logit when the timeline has one); if fewer than ``min_options`` are
    flagged, topped up with the next highest scored; ``current`` is always included."""
    keys = ["probability", "logit"] if "logit" in timeline else ["probability"]
    t = timeline.sort_values(keys, ascending=False, kind="stable", na_position="last")
    ids = t.loc[t["flagged"], "transaction_id"].tolist()
    if len(ids) < min_options:
        ids += [i for i in t["transaction_id"].tolist() if i not in set(ids)][: min_options - len(ids)]
    if current is not None and current not in ids and current in set(timeline["transaction_id"]):
        ids.append(current)
    return ids


def option_label(timeline: pd.DataFrame, transaction_id: str) -> str:
    """``"▲ 0.912 · 04 May 2023 13:04 · $123.45"`` (▲ = flagged) for pickers."""
    r = timeline.loc[timeline["transaction_id"] == transaction_id]
    if not len(r):
        return mask_card_number(str(transaction_id))
    r = r.iloc[0]
    mark = "▲" if r["flagged"] else "·"
    fraud = " · known fraud" if "label" in r and not pd.isna(r["label"]) and int(r["label"]) == 1 else ""
    return f"{mark} {r['probability']:.3f} · {r['when']}{fraud}"


# -------------------------------------------------------------------------------- explanations
def entity_rows(frame: pd.DataFrame, transaction_id: str) -> pd.DataFrame:
    """The canonical rows of the entity that ``transaction_id`` belongs to (its whole history,
    frame order, index reset): all a query's context needs.

    Raises:
        KeyError: unknown transaction id.
    """
    tid = str(transaction_id)
    hit = np.flatnonzero(frame["transaction_id"].astype(str).to_numpy() == tid)
    if not len(hit):
        raise KeyError(f"transaction_id {tid!r} not found")
    ent = frame["entity_id"].iloc[int(hit[0])]
    return frame.loc[frame["entity_id"].to_numpy() == ent].reset_index(drop=True)


def explain_query(bundle: "ModelBundle", frame: pd.DataFrame, transaction_id: str,
                  methods: tuple[str, ...] | None = None, **params) -> dict[str, "Explanation"]:
    """All explanations of one query: :func:`engine.explain.explain_transaction`.

    Only the query's entity is passed on (its history is all the context needs), which keeps the
    work per case small. ``methods`` / ``params`` are forwarded when the explainer accepts them.

    Raises:
        ImportError: the explainers are not available.
        KeyError: unknown transaction id.
    """
    from engine import explain as ex

    fn = getattr(ex, "explain_transaction", None)
    if fn is None:
        raise ImportError("engine.explain.explain_transaction is not available")
    tid = str(transaction_id)
    sub = entity_rows(frame, tid)
    from engine.explain.reference import attach_reference

    attach_reference(bundle, frame)  # IG's typical transaction: from the checkpoint or this data, not one entity
    sig = inspect.signature(fn)
    takes_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    kw = dict(params)
    if methods is not None:
        kw["methods"] = methods
    kw = {k: v for k, v in kw.items() if takes_kw or k in sig.parameters}
    out = fn(bundle, sub, tid, **kw)
    order = {m: i for i, m in enumerate(METHODS)}
    return dict(sorted(out.items(), key=lambda kv: order.get(kv[0], len(order))))


def context_rows(expls: dict[str, "Explanation"], frame: pd.DataFrame) -> pd.DataFrame:
    """Canonical-frame rows of the query's context (time order, query last)."""
    e = next(iter(expls.values()))
    ids = [str(t) for t in e.transaction_ids]
    sub = frame.loc[frame["entity_id"].to_numpy() == str(e.entity_id)]
    sub = sub.set_index(sub["transaction_id"].astype(str))
    return sub.loc[ids].reset_index(drop=True)


def _gap_text(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def field_value_texts(row: pd.Series, field_names: list[str], currency: str = "",
                      prev_timestamp=None) -> list[str]:
    """Display text of a canonical row's value for each model field (masked): the amount with
    its currency, hour / weekday from the timestamp, the gap to ``prev_timestamp`` for
    ``time_since_prev`` ("first" without one), raw text otherwise."""
    out = []
    for f in field_names:
        if f == "amount":
            v = format_amount(float(row["amount"]), currency)
        elif f == "hour":
            v = f"{pd.Timestamp(row['timestamp']).hour:02d}h"
        elif f == "weekday":
            v = pd.Timestamp(row["timestamp"]).day_name()[:3]
        elif f == "time_since_prev":
            v = ("first" if prev_timestamp is None or pd.isna(prev_timestamp) else
                 _gap_text((pd.Timestamp(row["timestamp"]) - pd.Timestamp(prev_timestamp)).total_seconds()))
        elif f in row.index:
            v = str(row[f]) if str(row[f]) != "" else "none"
        elif f == "amount_vs_history":  # derived from the amount and the entity's earlier ones
            v = f"{format_amount(float(row['amount']), currency)} vs earlier"
        else:
            v = "—"  # a field the model derives, not a column of the row
        v = str(mask_field_value(f, v))  # masked first: a cut card number would escape the rule (review finding)
        out.append(v if len(v) <= 24 else v[:23] + "…")
    return out


def context_labels(rows: pd.DataFrame, currency: str = "") -> list[str]:
    """Time · amount labels of context rows, the query (last) marked."""
    return transaction_labels(rows["timestamp"], rows["amount"], currency, query_last=True)


def context_table(expls: dict[str, "Explanation"], frame: pd.DataFrame, scores: pd.DataFrame | None = None,
                  currency: str = "") -> pd.DataFrame:
    """The raw rows of the query's context with their attributions, display-safe.

    Returns:
        One row per context transaction (time order, query last): ``position`` (0-based, query =
        T-1), ``query`` (bool), ``when``, ``transaction``, ``timestamp``, ``amount``, one column
        per method (see :data:`METHOD_COLUMNS`), ``probability`` (its own score, if ``scores``),
        ``label``, then the fields and passthrough columns.
    """
    rows = context_rows(expls, frame)
    T = len(rows)
    out = pd.DataFrame(
        {
            "position": np.arange(T),
            "query": np.arange(T) == T - 1,
            "when": context_labels(rows, currency),
            "transaction": rows["transaction_id"].astype(str).map(mask_card_number).to_numpy(),
            "transaction_id": rows["transaction_id"].astype(str).to_numpy(),
            "timestamp": rows["timestamp"].to_numpy(),
            "amount": rows["amount"].to_numpy(),
        }
    )
    for m in METHOD_COLUMNS:  # attributions first, then attention weights
        if m in expls:
            out[METHOD_COLUMNS[m]] = expls[m].values
    if scores is not None:
        p = scores.set_index(scores["transaction_id"].astype(str))["probability"]
        out["probability"] = p.reindex(out["transaction_id"]).to_numpy()
    if "label" in rows:
        out["label"] = rows["label"].to_numpy()
    for c in rows.columns:
        if c not in _CORE:
            out[c] = rows[c].to_numpy()
    return mask_card_fields(out)  # merchant ids are not PANs


def attribution_table(expl: "Explanation", labels: list[str] | None = None, top: int | None = None) -> pd.DataFrame:
    """``when``, ``value`` (+ ``share`` of total |value|, + ``standard_error`` when the method
    has one) for one explanation, largest |value| first; ``top`` keeps the first rows."""
    labs = labels if labels is not None else [mask_card_number(t) for t in expl.transaction_ids]
    v = expl.values
    tot = float(np.abs(v).sum()) or 1.0
    df = pd.DataFrame({"when": labs, "value": v, "share": np.abs(v) / tot,
                       "query": np.arange(len(v)) == len(v) - 1})
    if getattr(expl, "standard_errors", None) is not None:
        df.insert(2, "standard_error", expl.standard_errors)
    df = df.reindex(df["value"].abs().sort_values(ascending=False, kind="stable").index).reset_index(drop=True)
    return df.head(top) if top else df


@dataclass
class QuerySummary:
    """What the analyst reads first about one query."""

    transaction_id: str
    when: str
    probability: float
    logit: float
    threshold: float
    flagged: bool
    known_label: int | None
    context_length: int
    convergence: dict[str, float] = field(default_factory=dict)  # method -> delta (logit)
    reference_logit: dict[str, float] = field(default_factory=dict)
    elapsed_s: dict[str, float] = field(default_factory=dict)


def query_summary(expls: dict[str, "Explanation"], timeline: pd.DataFrame, transaction_id: str,
                  threshold: float) -> QuerySummary:
    """Score, threshold, decision, convergence deltas and timings for one query."""
    r = timeline.loc[timeline["transaction_id"] == str(transaction_id)].iloc[0]
    e = next(iter(expls.values()), None)
    logit = float(e.score_logit) if e is not None else float(r["logit"])
    prob = 1.0 / (1.0 + math.exp(-logit))
    lab = None
    if "label" in r and not pd.isna(r["label"]):
        lab = int(r["label"])
    return QuerySummary(
        transaction_id=str(transaction_id),
        when=str(r["when"]),
        probability=prob,
        logit=logit,
        threshold=float(threshold),
        flagged=prob >= threshold,
        known_label=lab,
        context_length=len(e.transaction_ids) if e is not None else 0,
        convergence={m: float(x.convergence_delta) for m, x in expls.items() if x.convergence_delta is not None},
        reference_logit={m: float(x.reference_logit) for m, x in expls.items() if x.reference_logit is not None},
        elapsed_s={m: float(x.elapsed_s) for m, x in expls.items()},
    )


def method_caption(expl: "Explanation") -> str:
    """One short line under a chart: units, convergence / reference, run time (parameters and
    baseline are in :func:`method_details`)."""
    unit = ("contribution to the fraud logit (log-odds): + towards fraud, − towards legitimate"
            if expl.units == "logit" else expl.units)
    parts = [unit]
    if expl.convergence_delta is not None:
        parts.append(f"convergence delta {format_gap(expl.convergence_delta)} logit")  # never "-0.0000"
    parts += estimate_parts(expl)
    if expl.reference_logit is not None:
        parts.append(f"reference logit {expl.reference_logit:+.3f}")
    parts.append(f"computed in {expl.elapsed_s:.1f} s")
    return " · ".join(parts)


def method_details(expl: "Explanation") -> str:
    """Markdown for a "how to read" popover: units, baseline, parameters, cost, caveats (and, for
    SHAP, the accuracy and the imposed additivity)."""
    title = METHOD_TITLES.get(expl.method, expl.method)
    lines = [f"**{title}** — units: {expl.units}; {'signed' if expl.signed else 'non-negative'}."]
    if expl.baseline:
        lines.append(f"**Baseline.** {expl.baseline}")
    params = expl.params or {}
    short = {k: v for k, v in params.items() if k not in ("caveat", "cost")
             and (isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) <= 40))}
    if short:
        lines.append("**Parameters.** " + ", ".join(f"`{k}={v}`" for k, v in short.items()))
    for k in ("cost", "caveat"):
        v = params.get(k)
        if isinstance(v, str):
            lines.append(f"**{k.capitalize()}.** {v}")
    ex = expl.extras or {}
    if "additivity_gap" in ex:
        lines.append("**Accuracy.** " + "; ".join(estimate_parts(expl)) + ". Error bars: ±2 standard errors.")
        lines.append(f"**Additivity (imposed by the estimator).** The values add up to score − base value "
                     f"(gap {ex['additivity_gap']:+.1e} logit) by construction, whatever the sampling error: "
                     "this is not an accuracy check; the standard errors are.")
    return "\n\n".join(lines)


# ----------------------------------------------------------------------------------- model card
def model_card(bundle: "ModelBundle") -> dict[str, Any]:
    """The model card as plain data for display.

    Returns a dict with ``name``, ``sha256``, ``path``, ``created_at``, ``threshold``,
    ``thresholds`` (dict), ``architecture`` (the scalar model settings), ``config`` (the full
    model config dict),
    ``train_config``, ``metrics`` (DataFrame, one row per period), ``training_data`` (dict),
    ``split`` (dict), ``spec_name``, ``spec_toml``, ``versions`` (dict), ``history`` (DataFrame),
    ``n_parameters``; ``best_epoch`` is a seed ensemble's per-member best epochs as ``"9 / 13"``.
    """
    meta = bundle.meta or {}
    cfg = bundle.config.to_dict()
    # the architecture in a few numbers; input-layout lists (indices, cardinalities) stay in "config"
    arch = {k: v for k, v in cfg.items() if isinstance(v, (int, float, str, bool)) or v is None}
    metrics = meta.get("metrics", {}) or {}
    mdf = pd.DataFrame({k: v for k, v in metrics.items() if isinstance(v, dict)}).T
    if len(mdf):
        mdf.index.name = "period"
        mdf = mdf.reset_index()
    td = dict(meta.get("training_data", {}) or {})
    if "path" in td:
        td["path"] = mask_card_number(str(td["path"]))
    return {
        "name": meta.get("name") or (bundle.path.name if bundle.path else "(unsaved model)"),
        "sha256": bundle.sha256,
        "path": str(bundle.path) if bundle.path else "",
        "created_at": meta.get("created_at", ""),
        "format": meta.get("format", ""),
        "threshold": bundle.threshold,
        "thresholds": dict(meta.get("thresholds", {}) or {}),
        "architecture": arch,
        "config": cfg,
        "train_config": dict(meta.get("train_config", {}) or {}),
        "metrics": mdf,
        "training_data": td,
        "split": dict(meta.get("split", {}) or {}),
        "best_epoch": " / ".join(map(str, be)) if isinstance(be := meta.get("best_epoch"), list) else be,
        "spec_name": bundle.spec.name,
        "spec_toml": bundle.spec.to_toml(),
        "versions": dict(meta.get("versions", {}) or {}),
        "history": pd.DataFrame(meta.get("history", []) or []),
        "n_parameters": int(bundle.model.n_parameters()),
        "field_names": list(bundle.model.cfg.field_names),
    }


def amount_text(amount: float, currency: str = "") -> str:
    return format_amount(amount, currency)
