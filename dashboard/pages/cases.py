"""Open a case from data: choose the data and the model, then an entity from the ranking (highest score first)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import streamlit as st

from dashboard import state
from dashboard.components.safe import csv_download, md
from dashboard.components import access as comp_access
from engine.cases.fmt import format_threshold
from engine.cases import view as cv
from engine.cases import figures as fig
from engine.data.spec import builtin_specs
from engine.serve import access as ac
from engine.serve import paths as sp

state.ensure_entrypoint()
ss = st.session_state
st.title("Open a case from data")
st.caption("Choose the data file and the model, then open any entity from the ranking. Your assigned work is on "
           "the **Work queue** page.")

KINDS = {"demo": "Demo data", "path": "Data roots", "upload": "Upload"}
if comp_access.deny(ac.VIEW_CASES):
    st.stop()


ROOTS = sp.data_roots()


def _spec_picker(key: str, current: str) -> str:
    specs = builtin_specs() + [p for p in state.listed_files(tuple(map(str, ROOTS)), sp.SPEC_SUFFIXES)
                               if not Path(p).is_relative_to(cv.default_model_dir().resolve())]
    opts = specs if current in specs else specs + [current]
    return st.selectbox(
        "Spec", opts, index=opts.index(current), key=key,
        format_func=lambda s: s if s in builtin_specs() else sp.display_name(Path(s), ROOTS),
        help="A built-in spec, or a spec TOML file inside a data root (see `fraudlens inspect`).",
    )


# ------------------------------------------------------------------------------ data and model
src = ss[state.SOURCE]
_model_dir = Path(ss[state.MODEL]) if ss[state.MODEL] else cv.default_model_dir()
_missing = not Path(src["path"]).is_file() or not (_model_dir / "checkpoint.json").is_file()
with st.expander(f"Data: **{md(src['label'])}** (spec {md(src['spec'])}) · Model: **"
                 f"{'demo model' if not ss[state.MODEL] else md(Path(ss[state.MODEL]).name)}**",
                 expanded=_missing):
    c1, c2 = st.columns(2, gap="large")
    with c1:
        st.markdown("**Data source**")
        kind = st.radio("Source", list(KINDS), format_func=KINDS.get, horizontal=True,
                        index=list(KINDS).index(src.get("kind", "demo")), key="src_kind",
                        label_visibility="collapsed")
        new_src = None
        if kind == "demo":
            st.caption(f"`{cv.DEMO_DATA.relative_to(cv.REPO_ROOT)}` · spec `{cv.demo_spec_name()}` "
                       "(simulated cards with seeded fraud episodes)")
            new_src = state.demo_source(src.get("max_rows"))
        elif kind == "path":
            # a choice among the files inside the data roots, never a free-text server path
            files = state.listed_files(tuple(map(str, ROOTS)), sp.DATA_SUFFIXES)
            cur = src["path"] if src.get("kind") == "path" and src["path"] in files else None
            path = st.selectbox("File (CSV or Parquet) in the data roots", files, key="src_path",
                                index=files.index(cur) if cur else None, placeholder="choose a file",
                                format_func=lambda s: sp.display_name(Path(s), ROOTS),
                                help="Files under the folders the operator lists in FRAUDLENS_DATA_ROOTS "
                                     "(and the bundled demo data).")
            spec = _spec_picker("src_spec", src["spec"])
            if path:
                new_src = {"kind": "path", "path": path, "spec": spec, "label": Path(path).name,
                           "max_rows": src.get("max_rows")}
        else:
            up = st.file_uploader("Transactions file", type=["csv", "parquet", "pq", "gz"], key="src_upload")
            spec = _spec_picker("src_upload_spec", src["spec"] if src["spec"] in builtin_specs() else cv.demo_spec_name())
            if up is not None:
                try:
                    p = state.save_upload(up.name, up.getvalue())
                except ValueError as e:  # too large once decompressed, an unreadable Parquet footer
                    st.error(md(str(e)))
                else:
                    new_src = {"kind": "upload", "path": str(p), "spec": spec, "label": up.name,
                               "max_rows": src.get("max_rows")}
        same = new_src is not None and all(new_src.get(k) == src.get(k) for k in ("path", "spec"))
        if st.button("Use this data", disabled=new_src is None or same, key="src_apply") \
                and not comp_access.deny(ac.CHOOSE_DATA):
            ss[state.SOURCE] = new_src
            state.set_entity(None)
            st.rerun()
    with c2:
        st.markdown("**Model**")
        mkind = st.radio("Model", ["demo", "dir"], horizontal=True, key="model_kind",
                         format_func={"demo": "Demo model", "dir": "Checkpoint folder"}.get,
                         index=0 if not ss[state.MODEL] else 1, label_visibility="collapsed")
        if mkind == "demo":
            st.caption(f"`{cv.default_model_dir().relative_to(cv.REPO_ROOT)}`")
            new_model = ""
        else:
            dirs = [str(Path(p).parent) for p in state.listed_files(tuple(map(str, ROOTS)), ("checkpoint.json",))
                    if Path(p).parent != cv.default_model_dir().resolve()]
            if ss[state.MODEL] and ss[state.MODEL] not in dirs:
                dirs.append(ss[state.MODEL])  # the operator's launch model
            new_model = st.selectbox("Checkpoint folder in the data roots", dirs, key="model_dir",
                                     index=dirs.index(ss[state.MODEL]) if ss[state.MODEL] in dirs else None,
                                     placeholder="choose a checkpoint folder",
                                     format_func=lambda s: sp.display_name(Path(s), ROOTS),
                                     help="A folder with model.safetensors and checkpoint.json (written by "
                                          "`fraudlens train`) inside a data root.") or ss[state.MODEL]
        if st.button("Use this model", disabled=new_model == ss[state.MODEL], key="model_apply") \
                and not comp_access.deny(ac.CHOOSE_DATA):
            ss[state.MODEL] = new_model
            state.set_query(None)
            st.rerun()

# ------------------------------------------------------------------------------------ loading
try:
    loaded = state.load_all()
except Exception as e:  # noqa: BLE001 - show any load failure to the analyst
    st.error(md(state.load_or_explain_error(e)), icon=":material/error:")
    if not ss[state.MODEL] and not cv.default_model_dir().exists():
        st.info("The demo model is not installed. Train one (`fraudlens train --data demo_data/transactions.csv "
                "--spec demo --out assets/demo_model`) or choose a checkpoint folder above.")
    st.stop()

scores, ranking, thr = loaded.scores, loaded.ranking, loaded.threshold
n_flag = int(scores["flagged"].sum())
m = st.columns(4)
m[0].metric("Transactions scored", f"{len(scores):,}")
m[1].metric("Entities", f"{len(ranking):,}")
m[2].metric("Flagged transactions", f"{n_flag:,}", help=f"fraud probability ≥ review threshold {format_threshold(thr)}")
m[3].metric("Entities with a flag", f"{int((ranking['n_flagged'] > 0).sum()):,}")
st.caption(f"{loaded.source.summary()} · review threshold {format_threshold(thr)} (fraud probability) · "
           f"model `{loaded.bundle.short_sha}`")

# --------------------------------------------------------------------------------- the ranking
st.subheader("Entities by highest fraud probability")
only_flagged = st.toggle("Only entities with a flagged transaction", value=False, key="only_flagged")
view = ranking[ranking["n_flagged"] > 0] if only_flagged else ranking
view = view.reset_index(drop=True)
ids = view["entity_id"].tolist()  # the raw ids stay here: a selected row is mapped to its id by position
table_key = f"rank_{loaded.key[2][:12]}_{loaded.bundle.short_sha}_{only_flagged}"
#: the columns shown; only these are sent (security review: a column hidden with column_order still
#: travels to the browser, and the raw entity_id is a card number, top_transaction_id a raw id)
SHOWN = ["entity", "max_probability", "n_transactions", "n_flagged", "known_frauds", "last_seen"]


cur = ss.get(state.ENTITY)
st.dataframe(
    view[SHOWN],  # the same rows in the same order as ids
    key=table_key,
    on_select=partial(state.on_entity_table_select, table_key, ids),
    selection_mode="single-row",
    selection_default={"selection": {"rows": [ids.index(cur)]}} if cur in ids else None,
    hide_index=True,
    height=380,
    column_config={
        "entity": st.column_config.TextColumn("Entity", help="card / customer key (card numbers masked)"),
        "max_probability": st.column_config.ProgressColumn(
            "Max fraud probability", min_value=0.0, max_value=1.0, format="%.3f"),
        "n_transactions": st.column_config.NumberColumn("Transactions", format="%d"),
        "n_flagged": st.column_config.NumberColumn("Flagged", format="%d", help=f"probability ≥ {format_threshold(thr)}"),
        "known_frauds": st.column_config.NumberColumn("Known frauds", format="%d",
                                                      help="transactions labelled fraud in the file"),
        "last_seen": st.column_config.DatetimeColumn("Last seen", format="YYYY-MM-DD HH:mm"),
    },
)

cur = ss.get(state.ENTITY)
if cur is not None and cur in set(ranking["entity_id"]):
    r = ranking.loc[ranking["entity_id"] == cur].iloc[0]
    c1, c2 = st.columns([3, 1], vertical_alignment="center")
    c1.markdown(f"Selected **{md(cv.mask(cur))}** · max probability **{r['max_probability']:.3f}** · "
                f"{int(r['n_flagged'])} flagged of {int(r['n_transactions'])}")
    if c2.button("Open case →", type="primary", key="open_case", width="stretch"):
        st.switch_page("pages/case.py")
else:
    st.caption("Select a row to open a case.")
csv_download(view.drop(columns=["entity_id"]), "entities.csv", key="dl_ranking_csv", label="Download the ranking (CSV)")

with st.expander("Score distribution"):
    st.plotly_chart(fig.score_distribution(scores["probability"], thr), key="score_dist",
                    config={"displaylogo": False})

if len(loaded.source.rejected):
    with st.expander(f"Rejected rows ({len(loaded.source.rejected):,})"):
        st.dataframe(cv.mask_frame(loaded.source.rejected), hide_index=True, height=240)
        csv_download(loaded.source.rejected, "rejected_rows.csv", key="dl_rejected_csv")
