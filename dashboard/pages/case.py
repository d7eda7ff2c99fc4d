"""Case: one entity's transactions over time, and why the model scored one of them as it did."""

from __future__ import annotations

import time
from functools import partial

import streamlit as st

from dashboard import components as comp
from dashboard import state, timing
from dashboard.components import deeplink
from dashboard.components import lead as lead_ui
from dashboard.components import tx_table as tx_ui
from dashboard.components.safe import csv_download, error_text, md
from engine.cases.fmt import format_gap, format_threshold
from engine.cases import timeline_table as tt
from engine.cases import view as cv
from engine.cases import figures as fig
from engine.explain.base import ATTENTION_CAVEAT
from engine.serve import access as ac

state.ensure_entrypoint()
ss = st.session_state
timer = timing.SectionTimer("case")
PLOTLY_CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["lasso2d", "toImage"]}

if not ac.can(comp.signed_in(), ac.VIEW_CASES):  # admins: no case data, the refusal as on Cases and Queue
    st.title("Case")
    comp.access.deny(ac.VIEW_CASES)
    st.stop()

try:
    loaded = state.load_all()
except Exception as e:  # noqa: BLE001
    st.title("Case")
    st.error(md(state.load_or_explain_error(e)), icon=":material/error:")
    st.page_link("pages/cases.py", label="Choose data and model on Cases", icon=":material/folder_open:")
    st.stop()

timer.mark("load data, model and scores")
ranking, thr, currency = loaded.ranking, loaded.threshold, loaded.source.currency
WORD = lead_ui.word(loaded)  # "probability" only for a calibrated model, else "score"
thresholds = loaded.thresholds  # in force: stored for the model, else the checkpoint's (one source)
if not len(ranking):
    st.title("Case")
    st.info("The data has no scored transactions.")
    st.stop()

# ------------------------------------------------------------------------------------- entity
entity_ids = ranking["entity_id"].tolist()
link_problem = deeplink.restore(loaded)  # once per session: the case in the address (a reload, a bookmark)
if ss.get(state.ENTITY) not in set(entity_ids):
    state.set_entity(entity_ids[0])  # default: the highest-ranked entity
entity = ss[state.ENTITY]
max_p = dict(zip(ranking["entity_id"], ranking["max_probability"]))

# Everything slow is computed before anything of the case is drawn: the title of a new case then
# appears together with its reasons, never above the previous case's (no stale content).
tl = state.get_timeline(loaded, entity)
ids = tl["transaction_id"].tolist()
tx_ui.apply_selection(entity, tl)  # a row selected in the transaction table: its id is the query, now
if ss.get(state.QUERY) not in set(ids):
    state.set_query(cv.default_query(tl))  # default: the highest-scored transaction
query = ss[state.QUERY]
comp.sync_cases(loaded)  # once per process and source (cached): the entity's case exists before it is linked
deeplink.publish((comp.case_for_entity(loaded, entity) or {}).get("id"), query)
timer.mark("timeline")
try:
    expls, expl_error = state.get_explanations(loaded, query), None
except Exception as e:  # noqa: BLE001 - shown where the explanations go
    expls, expl_error = None, e
if expl_error is None:
    try:
        lead_ui.case_lead(loaded, query)  # cached: render_lead below only draws
    except Exception:  # noqa: BLE001 - render_lead says why
        pass
timer.mark("explanations and lead (computed or cached)")

head, pick = st.columns([3, 2], vertical_alignment="bottom")
# the title is filled after the reasons box below is drawn: a browser that shows the new case's
# title never shows the previous case's reasons under it (deltas arrive one by one)
title_slot = head.empty()
options = entity_ids[:500] if entity in set(entity_ids[:500]) else entity_ids[:500] + [entity]
ss["case_entity_pick"] = entity
pick.selectbox(
    f"Entity (ranked by max fraud {WORD})", options, key="case_entity_pick",
    format_func=lambda e: f"{cv.mask(e)} · max {max_p.get(e, float('nan')):.3f}",
    on_change=lambda: state.set_entity(ss["case_entity_pick"]),
)

# ---- what the analyst reads first: reasons, key evidence, agreement (dashboard/components/lead.py) ----
if expl_error is None:
    lead_ui.render_lead(loaded, query, currency, when=str(tl.iloc[ids.index(query)]["when"]))
title_slot.title(f"Case {md(cv.mask(entity))}")
if link_problem:
    st.warning(md(link_problem), icon=":material/link_off:")
timer.mark("lead drawn")
pause_s = timing.lead_pause_s()
if expl_error is None and pause_s > 0:  # the reasons go out and are painted before the rest
    time.sleep(pause_s)

r = ranking.loc[ranking["entity_id"] == entity].iloc[0]
m = st.columns(5)
m[0].metric("Transactions", f"{len(tl):,}")
m[1].metric("Flagged", f"{int(tl['flagged'].sum()):,}", help=f"fraud {WORD} ≥ review threshold {format_threshold(thr)}")
m[2].metric("Known frauds", "—" if "label" not in tl or tl["label"].isna().all() else f"{int(tl['label'].fillna(0).sum()):,}")
m[3].metric(f"Max fraud {WORD}", f"{r['max_probability']:.3f}")
m[4].metric("Review threshold", format_threshold(thr), help=f"{WORD} at or above which a transaction is flagged · "
            + md(thresholds["source"]))

# ------------------------------------------------------------------------------ query selection

st.subheader("Timeline")
y_mode = st.segmented_control("Vertical axis", ["probability", "amount"], default="probability",
                              format_func={"probability": f"Fraud {WORD}", "amount": "Amount"}.get,
                              key="tl_y", label_visibility="collapsed") or "probability"
hover = [f.name for f in loaded.source.spec.fields if f.name in tl][:6]
# a long history is drawn as the window around the explained transaction unless the analyst asks for all
# (every transaction stays in the table below); one preference for every case of the session
show_all = len(tl) > tt.TIMELINE_MAX_POINTS and bool(ss.get("tl_all", False))
win = tt.timeline_window(tl, query, max_points=len(tl) if show_all else tt.TIMELINE_MAX_POINTS)
win_ids = win.rows["transaction_id"].tolist()
chart_key = f"tl_{entity}_{y_mode}_{query}_{win.start}_{win.stop}"
st.plotly_chart(
    fig.timeline_figure(win.rows, thr, y=y_mode, query_id=query, currency=currency, hover_columns=hover),
    key=chart_key, on_select=partial(state.on_query_chart_select, chart_key, win_ids), selection_mode="points",
    config=PLOTLY_CONFIG,
)
st.caption(f"Colour and size: fraud {WORD} · ★ the transaction being explained · ring: known fraud · "
           "click a point to explain it.")
if len(tl) > tt.TIMELINE_MAX_POINTS:
    w1, w2 = st.columns([4, 1], vertical_alignment="center")
    if win.complete:
        w1.caption(f"All {len(tl):,} transactions drawn.")
    else:
        first, last = (str(win.rows["timestamp"].iloc[i])[:16] for i in (0, -1))
        hidden = (f"; outside it: {win.hidden_flagged:,} flagged, {win.hidden_frauds:,} known frauds"
                  if "label" in tl else f"; outside it: {win.hidden_flagged:,} flagged")
        w1.caption(md(f"Drawn: the {len(win.rows):,} of {len(tl):,} transactions around the explained one "
                      f"({first} – {last}){hidden}. The table below lists all of them."))
    w2.toggle("Show all", key="tl_all", help=f"Draw all {len(tl):,} transactions (slower to draw).")

c1, c2 = st.columns([3, 2], vertical_alignment="bottom")
qopts = cv.query_options(tl, query)
qlabels = tt.option_labels(tl, qopts)  # one pass over the timeline (not one scan per option)
ss["case_query_pick"] = query
c1.selectbox("Flagged transactions (▲ ≥ threshold), highest first", qopts, key="case_query_pick",
             format_func=lambda t: qlabels.get(t) or cv.mask(t),
             on_change=lambda: state.set_query(ss["case_query_pick"]))
tx_ui.render_sort_control(c2, WORD)  # kept in session state: a row selection keeps the order
st.caption(f"{len(tl):,} transactions below; select a row to explain it (the selected row is the transaction "
           "explained).")
# a plain frame, no pandas Styler (styling every cell of a 9,391-transaction card cost ~3 s of CPU per
# page run), under a key that a selection in the table does not change (dashboard/components/tx_table.py)
tx_ui.render_table(entity, tl, query, currency, WORD)
timer.mark("metrics, timeline chart and transaction table")

# --------------------------------------------------------------------------------- the query
qrow = tl.iloc[ids.index(query)]
st.divider()
st.subheader(f"Transaction {md(cv.mask(query))} · {md(qrow['when'])}")
if isinstance(expl_error, ImportError):
    st.info(f"Explanations are not available in this installation ({md(expl_error)}).")
    st.stop()
if expl_error is not None:
    st.error(f"Could not explain {md(cv.mask(query))}: {error_text(expl_error)}", icon=":material/error:")
    st.stop()

qs = cv.query_summary(expls, tl, query, thr)
q_out = lead_ui.output(loaded, qs.logit)  # calibrated probability, or the sigmoid score (words rule)

m = st.columns(6)
m[0].metric(f"Fraud {WORD}", f"{q_out:.3f}",
            delta=f"{q_out - thr:+.3f} vs threshold", delta_color="inverse")
m[1].metric("Logit", f"{qs.logit:+.3f}", help="log-odds of fraud; the model's raw output before "
            + ("calibration" if WORD == "probability" else "the sigmoid (score = 1 / (1 + e^−logit))"))
m[2].metric("Decision", cv.BAND_LABELS[cv.decision_band(q_out, thr, thresholds["decline"])],
            help=f"below review: {WORD} < {format_threshold(thr)} · review: {format_threshold(thr)} ≤ {WORD} < "
                 f"{format_threshold(thresholds['decline'])} · "
                 f"decline: {WORD} ≥ {format_threshold(thresholds['decline'])}")
m[3].metric("Known label", {None: "unknown", 1: "fraud", 0: "legitimate"}[qs.known_label])
ig_delta = qs.convergence.get("integrated_gradients")
m[4].metric("IG gap", "—" if ig_delta is None else format_gap(ig_delta),  # never "-0.0000"
            help="IG convergence delta: sum of IG attributions − (f(x) − f(baseline)), in logits; near 0 = "
                 "complete attribution")
m[5].metric("Context", f"{qs.context_length}",
            help="transactions of the history the model used for this score, the query included")

# ---- history effect (owner: dashboard/components/fields.py): the query alone vs with its history ----
from dashboard.components import fields as fields_ui  # noqa: E402

fields_ui.render_history_effect(loaded, query)
timer.mark("query metrics and history effect")
# ---- end history effect ----

ctx = cv.context_rows(expls, loaded.source.frame)
labels = cv.context_labels(ctx, currency)

# lazy tabs: only the open one runs and is drawn (each Plotly chart costs ~0.1-0.2 s of the browser's main thread on
# 2 cores, bench/results/browser.md); the choice is kept in session state across cases
tabs = st.tabs(["Attributions", "Fields", "Attention", "Context rows"], key="case_tabs", on_change="rerun")
with tabs[0]:
    if tabs[0].open is not False:  # None: tabs without state (all run)
        st.caption("How much each earlier transaction moved this score, in logits (log-odds): red pushed towards "
                   "fraud, blue towards legitimate. Agreement between methods is a sign the reading is robust.")
        if qs.context_length <= 1:
            st.info("This is the first transaction of the entity's history: there are no earlier transactions to "
                    "attribute the score to. See Fields for its own fields.")
        else:
            fields_ui.render_history_note(loaded, query)  # own fields already flag it: say so before the bars
        for method in ("integrated_gradients", "shap", "occlusion"):
            if method not in expls or qs.context_length <= 1:
                continue
            e = expls[method]
            st.plotly_chart(fig.attribution_bars(e, labels=labels, include_query=False), key=f"bars_{method}",
                            config=PLOTLY_CONFIG)
            c, p = st.columns([6, 1], vertical_alignment="center")
            c.caption(cv.method_caption(e))
            with p.popover("How to read"):
                st.markdown(cv.method_details(e))
with tabs[1]:
    if tabs[1].open is not False:  # None: tabs without state (all run)
        fields_ui.render_fields(loaded, query)  # validated per-field values of the query + cell-level values
        e = expls.get("integrated_gradients")
        if e is not None and e.field_values is not None and qs.context_length > 1:
            with st.expander("Integrated gradients over every transaction and field (typical-timeline baseline)"):
                full = st.toggle("Colour scale from the query row too", value=False, key="fields_scale_all",
                                 help="Off: colours are scaled to the earlier transactions so their pattern shows; "
                                      "the query row (boxed) may saturate. Hover for exact values.")
                st.plotly_chart(fig.field_heatmap(e, labels=labels, scale="all" if full else "history"),
                                key="fields_ig", config=PLOTLY_CONFIG)
                st.caption(f"Reference: the same timeline with every transaction's content typical (timing kept, so "
                           f"hour, weekday and time since previous get 0). Sum {e.values.sum():+.3f} logit = score "
                           f"{qs.logit:+.3f} − reference "
                           f"{e.reference_logit if e.reference_logit is not None else float('nan'):+.3f} "
                           f"(delta {format_gap(e.convergence_delta)}).")
with tabs[2]:
    if tabs[2].open is not False:  # None: tabs without state (all run)
        st.caption(ATTENTION_CAVEAT)
        from dashboard.components.attention import render_attention  # noqa: E402

        render_attention(expls, labels, PLOTLY_CONFIG)  # the query's row as bars; the T × T map optional
        ro = expls.get("attention_rollout")
        if ro is not None:
            st.caption(cv.method_caption(ro))
with tabs[3]:
    if tabs[3].open is not False:  # None: tabs without state (all run)
        table = cv.context_table(expls, loaded.source.frame, loaded.scores, currency)
        metric_cols = [c for c in cv.METHOD_COLUMNS.values() if c in table]
        st.dataframe(
            table.drop(columns=["transaction_id", "position"]).style.apply(
                lambda row: ["background-color: #ffe0b2" if row["query"] else "" for _ in row], axis=1
            ).format({c: ("{:+.4f}" if "logit" in c else "{:.4f}") for c in metric_cols}),
            hide_index=True, height=420,
            column_config={
                "query": st.column_config.CheckboxColumn("Query"),
                "when": st.column_config.TextColumn("When · amount"),
                "transaction": st.column_config.TextColumn("Transaction"),
                "timestamp": None,
                "amount": st.column_config.NumberColumn(f"Amount ({currency})", format="%.2f"),
                "probability": st.column_config.ProgressColumn(f"Own fraud {WORD}", min_value=0.0, max_value=1.0,
                                                               format="%.3f"),
                "label": st.column_config.NumberColumn("Known fraud", format="%d"),
            },
        )
        st.caption("The transactions the model saw for this score (time order, query last) with each method's "
                   "value; attributions in logits, attention as weights.")
        csv_download(table.drop(columns=["transaction_id"]), f"context-{query}.csv", key="dl_context_csv")
timer.mark("attribution, field, attention and context tabs")

# ---- Trust checks + what-if (owner: dashboard/components/trust.py; keep this block as is) ----
from dashboard.components import trust as trust_ui  # noqa: E402

trust_ui.render_case_trust(loaded, query, expls)
timer.mark("trust checks and what-if")
# ---- end trust checks + what-if ----

# ---- Links between cases (owner: dashboard/components/links.py) ----
from dashboard.components.links import render_case_links  # noqa: E402

render_case_links(loaded, entity, query)
timer.mark("links between cases")
# ---- end links between cases ----

# ---- Disposition, four-eyes and compliance exports (owner: dashboard/components/disposition.py) ----
from dashboard.components.disposition import render_case_panel  # noqa: E402

# the export carries the trust checks and the what-if edits in force (built in the script run when the
# analyst prepares the exports, cached)
render_case_panel(loaded, entity, expls, tl, trust=lambda: trust_ui.export_payload(loaded, query),
                  fields=lambda: fields_ui.export_payload(loaded, query))
timer.mark("disposition and exports")
timer.done()
# ---- end disposition and exports ----
