"""Model: the model card of the loaded checkpoint (what it is, how it was trained, how well it did)
and the model at a glance: calibration (reliability diagram, ECE), the operating point with a
threshold slider on the precision-recall curve, global importance over flagged cases, and drift
(population stability index per field) between the training period and the loaded data.

Words: "probability" only for a calibrated model; otherwise "score"."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dashboard import components as comp
from dashboard import state
from dashboard.components.safe import md
from engine.cases.fmt import format_threshold
from engine.cases import view as cv
from engine.cases import figures as fig
from engine.cases import model_figures as mfig
from engine.cases import model_glance as mg
from engine.serve import access as ac

state.ensure_entrypoint()
ss = st.session_state
if not ac.can(comp.signed_in(), ac.VIEW_CASES):  # admins: no model card, the refusal as on Cases and Queue
    st.title("Model")
    comp.access.deny(ac.VIEW_CASES)
    st.stop()
try:
    bundle = state.session_bundle()  # signed-in role and model path checked
except Exception as e:  # noqa: BLE001
    st.title("Model")
    st.error(md(state.load_or_explain_error(e)), icon=":material/error:")
    st.page_link("pages/cases.py", label="Choose a model on Cases", icon=":material/folder_open:")
    st.stop()

card = cv.model_card(bundle)
st.title(f"Model {md(card['name'])}")
st.caption(f"sha256 {md(card['sha256'])} · created {md(card['created_at'] or 'unknown')} · "
           f"{md(card['path'] or 'not saved')}")

th = card["thresholds"]  # the checkpoint's, chosen on validation
now = state.thresholds_now(bundle)  # in force (stored for the model, else the checkpoint's): as every page
calib = mg.calibration_view(bundle.meta)
WORD = calib["word"]  # "probability" only for a calibrated model
op = calib["operating_point"]
tgt = op.get("target") or {}
chosen = (f"target {tgt['kind'].replace('_', ' ')} {tgt['value']:g} on validation" if tgt else "max F1 on validation")
m = st.columns(4)
m[0].metric("Review threshold", format_threshold(now['review']),
            help=f"fraud {WORD} at or above which a transaction is flagged for review · {md(now['source'])}; "
                 f"checkpoint: {format_threshold(th.get('review', card['threshold']))} ({md(chosen)})")
m[1].metric("Decline threshold", format_threshold(now['decline']),
            help=f"{md(now['source'])}; checkpoint: "
                 + (f"{th['decline']:.3f} (lowest threshold with validation precision ≥ 0.8)" if "decline" in th else "—"))
m[2].metric("Parameters", f"{card['n_parameters']:,}")
m[3].metric("Best epoch", card["best_epoch"] if card["best_epoch"] is not None else "—")

st.subheader("Metrics")
mdf = card["metrics"]
if len(mdf):
    keep = [c for c in ("period", "n", "n_fraud", "auc_roc", "average_precision", "threshold", "precision",
                        "recall", "f1", "alerts") if c in mdf]
    st.dataframe(
        mdf[keep], hide_index=True,
        column_config={
            "period": "Period", "n": st.column_config.NumberColumn("Transactions", format="%d"),
            "n_fraud": st.column_config.NumberColumn("Frauds", format="%d"),
            "auc_roc": st.column_config.NumberColumn("AUC ROC", format="%.4f"),
            "average_precision": st.column_config.NumberColumn("Average precision", format="%.4f"),
            "threshold": st.column_config.NumberColumn("Threshold", format="%.3f"),
            "precision": st.column_config.NumberColumn("Precision", format="%.3f"),
            "recall": st.column_config.NumberColumn("Recall", format="%.3f"),
            "f1": st.column_config.NumberColumn("F1", format="%.3f"),
            "alerts": st.column_config.NumberColumn("Alerts", format="%d"),
        },
    )
    split = card["split"]
    if split:
        st.caption(f"Time split: train < {md(split.get('train_end', '?'))} ≤ validation < {md(split.get('val_end', '?'))} "
                   "≤ test. Metrics at the review threshold.")
else:
    st.info("This checkpoint carries no metrics.")
if len(card["history"]):
    st.plotly_chart(fig.training_history_figure(card["history"], title="Training history"), key="history",
                    config={"displaylogo": False})



# ------------------------------------------------------------------------- the model at a glance
st.header("The model at a glance")
st.subheader("Calibration")
test_cal = calib["test"]
if calib["calibrated"]:
    article = "an" if str(calib["method"])[:1] in "aeiou" else "a"  # "an isotonic", "a platt"
    st.caption(f"Outputs are calibrated fraud probabilities: {article} {md(calib['method'])} map from the logit, fitted on the "
               f"validation period after model choice ({md(calib['choice'].get('rule', ''))}). ECE: expected "
               "calibration error over 10 equal-width bins.")
else:
    st.warning("This model has no calibration map: its outputs are **scores** (the sigmoid of the logit), not "
               "probabilities; a score of 0.8 does not mean 80 % of such transactions are fraud. Retrain with "
               "`fraudlens train` to fit one.", icon=":material/warning:")
try:
    loaded = state.load_all()
except Exception as e:  # noqa: BLE001 - the model card stands without data
    loaded = None
    st.info(md(f"No loaded data for the figures below: {state.load_or_explain_error(e)}"))
loaded_cal = mg.loaded_calibration(loaded.scores) if loaded is not None else None
MALFORMED = (TypeError, ValueError, KeyError, IndexError, AttributeError)  # unvalidated records of a checkpoint


def _calibration_figures() -> None:
    cm = st.columns(4)
    for i, (kind, label) in enumerate((("score", "uncalibrated score"), ("probability", "calibrated probability"))):
        t = test_cal.get(kind)
        if t:
            cm[i].metric(f"Test ECE · {label}", f"{t['ece']:.4f}",
                         help=f"sum of the {label}s {t['sum_probability']:,.1f} for {t['n_fraud']:,} frauds on test "
                              f"(ratio {t['sum_over_frauds'] or 0:.2f}; 1 = as many expected as observed)")
    if loaded_cal is not None:
        cm[2].metric(f"Loaded data ECE · {WORD}", f"{loaded_cal['ece']:.4f}",
                     help=f"{loaded_cal['n_fraud']:,} labelled frauds; sum of the {WORD}s {loaded_cal['sum_probability']:,.1f}")
    tables = {f"test · {label}": test_cal[kind]["reliability"]
              for kind, label in (("score", "uncalibrated score"), ("probability", "calibrated probability"))
              if test_cal.get(kind)}
    eces = {f"test · {label}": test_cal[kind]["ece"]
            for kind, label in (("score", "uncalibrated score"), ("probability", "calibrated probability"))
            if test_cal.get(kind)}
    if loaded_cal is not None:
        tables[f"loaded data · {WORD}"] = loaded_cal["reliability"]
        eces[f"loaded data · {WORD}"] = loaded_cal["ece"]
    if tables:
        st.plotly_chart(mfig.reliability_figure(tables, ece=eces, title="Reliability diagram"), key="reliability",
                        config={"displaylogo": False})
    else:
        st.caption("No reliability figures: the checkpoint records none and the loaded data has no labels.")


try:
    _calibration_figures()
except MALFORMED as e:
    st.warning(f"The checkpoint's calibration record is malformed ({type(e).__name__}); not shown.")

st.subheader("Operating point")


def _operating_point_table() -> None:
    v, te = op.get("validation") or {}, op.get("test") or {}
    iv = te.get("interval") or {}

    def _ci(k: str, f: str) -> str:
        x, r = te.get(k), iv.get(k)
        return "—" if x is None else format(x, f) + (f" [{format(r[0], f)}, {format(r[1], f)}]" if r else "")

    rows = [{"period": "validation", "precision": f"{v['precision']:.3f}" if v.get("precision") is not None else "—",
             "recall": f"{v['recall']:.3f}" if v.get("recall") is not None else "—",
             "alerts_per_day": f"{v['alerts_per_day']:.1f}" if v.get("alerts_per_day") is not None else "—"}]
    if te:
        rows.append({"period": f"test ({te['level']:.0%} interval over {te['n_entities']:,} entities)",
                     "precision": _ci("precision", ".3f"), "recall": _ci("recall", ".3f"),
                     "alerts_per_day": _ci("alerts_per_day", ".1f")})
    st.caption(f"Review threshold {op.get('review', 0):.4f} on the {md(op.get('units', WORD))}, chosen for "
               f"{md(chosen)}{'' if op.get('met', True) else ' (not met)'}.")
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="op_table",
                 column_config={"period": st.column_config.TextColumn("Period"),
                                "precision": st.column_config.TextColumn("Precision"),
                                "recall": st.column_config.TextColumn("Recall"),
                                "alerts_per_day": st.column_config.TextColumn("Alerts / day")})
    for w in (op.get("warning"), op.get("precision_warning")):
        if w:
            st.warning(md(str(w)), icon=":material/warning:")


if op:
    try:
        _operating_point_table()
    except MALFORMED as e:
        st.warning(f"The checkpoint's operating-point record is malformed ({type(e).__name__}); not shown.")


@st.fragment
def _threshold_explorer() -> None:
    """PR curve + threshold slider; a fragment, so moving the slider reruns only this part."""
    curve = mg.operating_curve(loaded.scores) if loaded is not None else mg.operating_curve(pd.DataFrame())
    where = "the loaded labelled data"
    if not len(curve):
        curve, where = mg.stored_curve(bundle.meta), "the test period (stored with the model; the loaded data has no labels)"
    if not len(curve):
        st.caption("No precision-recall curve: the loaded data has no labels of both classes and the checkpoint "
                   "stores no test curve.")
        return
    t = st.slider(f"Threshold on the {WORD}", 0.0, 1.0, float(now["review"]), step=0.001, format="%.3f",
                  key="pr_threshold", help="Explore only: the thresholds in force are set on the Queue page.")
    if loaded is not None and where.startswith("the loaded"):
        at = mg.operating_at(loaded.scores, t)
    else:
        above = curve[curve["threshold"] >= t]
        pt = above.loc[above["threshold"].idxmin()] if len(above) else None
        at = {"alerts_per_day": float(pt["alerts_per_day"]) if pt is not None else 0.0,
              "precision": float(pt["precision"]) if pt is not None else None,
              "recall": float(pt["recall"]) if pt is not None else 0.0}
    c = st.columns(3)
    c[0].metric("Alerts per day", f"{at['alerts_per_day']:,.1f}")
    c[1].metric("Precision", "—" if at["precision"] is None else f"{at['precision']:.3f}")
    c[2].metric("Recall", "—" if at["recall"] is None else f"{at['recall']:.3f}")
    st.plotly_chart(mfig.pr_curve_figure(curve, t, word=WORD, title=f"Precision-recall on {where}"),
                    key="pr_curve", config={"displaylogo": False})


_threshold_explorer()

st.subheader("What drives flags")
if loaded is None:
    st.caption("Load data to compute the importance over its flagged cases.")
else:
    n_flag = int(loaded.scores["flagged"].sum())
    st.caption(f"Mean |Integrated Gradients attribution| (logit) per field over the highest-{WORD} flagged cases, "
               f"with its probability reading (points of {WORD} the field's attribution adds), and the history "
               f"patterns (reason codes) those cases cite. {n_flag:,} transactions are flagged at the review threshold.")
    n_cases = st.number_input("Flagged cases to explain", 1, mg.MAX_IMPORTANCE_CASES, min(10, max(1, n_flag)),
                              key="imp_cases")
    imp_key = ("importance", loaded.key, float(loaded.threshold), int(n_cases))
    if n_flag and st.button("Compute importance", key="imp_go", icon=":material/insights:"):
        with st.spinner("Explaining flagged cases…"):
            ss[str(imp_key)] = mg.global_importance(bundle, loaded.source.frame, loaded.scores, loaded.threshold,
                                                    n_cases=int(n_cases))
    imp = ss.get(str(imp_key))
    if imp is not None:
        st.plotly_chart(mfig.importance_figure(imp["fields"], word=WORD,
                                               title=f"Fields over {imp['n_cases']} flagged cases"),
                        key="importance", config={"displaylogo": False})
        if len(imp["patterns"]):
            st.dataframe(imp["patterns"], hide_index=True, key="patterns", column_config={
                "pattern": st.column_config.TextColumn("History pattern"),
                "cases": st.column_config.NumberColumn("Cases citing it", format="%d"),
                "share": st.column_config.NumberColumn("Share of cases", format="percent"),
                "mean_weight_logit": st.column_config.NumberColumn("Mean weight (logit)", format="%.3f"),
                "probability_reading": st.column_config.NumberColumn(f"≈ {WORD} points", format="%.3f")})

st.subheader("Drift: training period vs loaded data")
if loaded is not None:
    drift = mg.drift_table(bundle.meta, loaded.source.frame)
    if len(drift):
        st.caption("Population stability index per field: < 0.1 stable, 0.1–0.25 moderate shift, ≥ 0.25 major "
                   "shift (training-period deciles / top 20 categories stored with the model).")
        st.plotly_chart(mfig.psi_figure(drift, title="PSI per field"), key="psi", config={"displaylogo": False})
        st.dataframe(drift, hide_index=True, key="psi_table", column_config={
            "field": st.column_config.TextColumn("Field"), "kind": st.column_config.TextColumn("Kind"),
            "psi": st.column_config.NumberColumn("PSI", format="%.4f"),
            "reading": st.column_config.TextColumn("Reading"),
            "largest_change": st.column_config.TextColumn("Largest change (training → loaded)"),
            "rows": st.column_config.NumberColumn("Loaded rows", format="%d")})
    else:
        st.caption("This checkpoint stores no training-period field statistics (retrain to record them).")


def _kv(d: dict, key: str) -> None:
    st.dataframe(pd.DataFrame({"setting": list(d), "value": [str(v) for v in d.values()]}), hide_index=True,
                 key=key, column_config={"setting": st.column_config.TextColumn("Setting"),
                                         "value": st.column_config.TextColumn("Value")})


c1, c2 = st.columns(2, gap="large")
with c1:
    st.subheader("Architecture")
    _kv(card["architecture"], "arch")
    train_only = {k: v for k, v in card["train_config"].items() if k not in card["architecture"]}
    if train_only:
        st.subheader("Training")
        _kv(train_only, "train_cfg")
    with st.expander("Full model configuration (JSON)"):
        st.code(json.dumps(card["config"]), language="json", wrap_lines=True)
with c2:
    st.subheader("Training data")
    td = card["training_data"]
    if td:
        _kv(td, "train_data")
    else:
        st.caption("Not recorded in this checkpoint.")
    st.subheader(f"Spec {md(card['spec_name'])}")
    st.caption("Input fields: " + md(", ".join(card["field_names"])))
    with st.expander("Spec (TOML)"):
        st.code(card["spec_toml"], language="toml")
    st.subheader("Versions")
    _kv(card["versions"], "versions")
