"""Model: the model card of the loaded checkpoint (what it is, how it was trained, how well it did)."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dashboard import components as comp
from dashboard import state
from dashboard.components.safe import md
from engine.cases import view as cv
from engine.cases import figures as fig
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
m = st.columns(4)
m[0].metric("Review threshold", f"{now['review']:.3f}",
            help=f"fraud probability at or above which a transaction is flagged for review · {md(now['source'])}; "
                 f"checkpoint: {th.get('review', card['threshold']):.3f} (max F1 on validation)")
m[1].metric("Decline threshold", f"{now['decline']:.3f}",
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
