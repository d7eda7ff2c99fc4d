"""Dashboard state: launch settings, session-state keys and the caches around engine calls.

Caching (keys are the function arguments):

* the model bundle: ``st.cache_resource`` keyed by model path (+ checkpoint mtime), shared by all
  sessions, never copied;
* a data source and its scores: ``st.cache_resource`` keyed by (path, spec, content sha256,
  max_rows[, model sha256]) — large frames, shared read-only instead of copied per rerun;
* per-case results (explanations of one query): ``st.cache_data`` keyed by (data sha256, spec,
  model sha256, transaction id, parameters).

Session-state keys (the single source of truth; widgets write them through callbacks):
``source`` (dict path/spec/label/max_rows), ``model_path`` (str, "" = demo model), ``entity_id``,
``query_id``; the Case page's transaction table: ``tx_sort`` (its order) and ``tx_table_gen``
(see :func:`set_query`, :func:`tx_table_key`).
What-if (owner: dashboard/components/trust.py): ``whatif_edits`` (dict query transaction id ->
list of ``engine.trust.whatif.Edit.to_dict()`` dicts, applied in order; read by the export) and
``whatif_result`` (dict query transaction id -> last what-if score); see that module's docstring.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from engine.cases import view as cv
from engine.serve import paths as sp

ENTITY, QUERY, SOURCE, MODEL = "entity_id", "query_id", "source", "model_path"
#: Case page transaction table: the sort choice (a key of engine.cases.timeline_table.TX_SORTS) and
#: the table generation (bumped when the query changes other than through the table)
TX_SORT, TX_GEN = "tx_sort", "tx_table_gen"
log = logging.getLogger("fraudlens.dashboard")


def _log_level_from_env() -> None:
    """``$FRAUDLENS_LOG_LEVEL`` (e.g. ``INFO``): the ``fraudlens`` loggers of this server print at
    that level to stderr, with millisecond times (which explanation came from where: the browser
    bench reads them). Unset: Python's default (warnings and errors only)."""
    level = os.environ.get("FRAUDLENS_LOG_LEVEL", "").strip().upper()
    root = logging.getLogger("fraudlens")
    if not level or getattr(root, "_fraudlens_handler", False):
        return
    try:
        root.setLevel(level)
    except ValueError:
        log.warning("FRAUDLENS_LOG_LEVEL=%r is not a logging level; ignored", level)
        return
    h = logging.StreamHandler()
    h.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d %(name)s %(levelname)s %(message)s", "%H:%M:%S"))
    root.addHandler(h)
    root._fraudlens_handler = True


_log_level_from_env()


# ------------------------------------------------------------------------------------ settings
@dataclass
class Settings:
    """Launch settings: ``--data/--spec/--model/--max-rows`` after ``--`` (``streamlit run
    dashboard/app.py -- --data FILE``), else env ``FRAUDLENS_DATA/_SPEC/_MODEL/_MAX_ROWS``, else
    the demo data with the demo spec and the demo model."""

    data: str | None
    spec: str | None
    model: str | None
    max_rows: int | None


def parse_settings(argv: list[str] | None = None, env: dict[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ap.add_argument("--data")
    ap.add_argument("--spec")
    ap.add_argument("--model")
    ap.add_argument("--max-rows", type=int)
    try:
        ns, _ = ap.parse_known_args(argv)
    except SystemExit:  # a malformed value: fall back to env/defaults rather than die
        ns = argparse.Namespace(data=None, spec=None, model=None, max_rows=None)
    mr = ns.max_rows if ns.max_rows is not None else env.get("FRAUDLENS_MAX_ROWS")
    try:
        mr = int(mr) if mr not in (None, "") else None
    except ValueError:
        mr = None
    return Settings(
        data=ns.data or env.get("FRAUDLENS_DATA") or None,
        spec=ns.spec or env.get("FRAUDLENS_SPEC") or None,
        model=ns.model or env.get("FRAUDLENS_MODEL") or None,
        max_rows=mr,
    )


def ensure_entrypoint() -> None:
    """Call first in every page.

    With a ``pages/`` folder next to app.py, Streamlit treats the app as a legacy multipage app
    until app.py has called ``st.navigation`` once: on the first run after a server start whose
    URL is a page (``/case``) - and on every AppTest run - it runs the page script *without*
    app.py (no settings, no navigation). Here, in that case: switch the legacy mode off, run
    app.py in this same script run (its ``st.navigation`` then runs this page again, widget
    events intact), and stop the outer run.
    """
    try:
        from streamlit.runtime.pages_manager import PagesManager
    except ImportError:  # pragma: no cover - internal moved; fall back to plain defaults
        PagesManager = None
    if PagesManager is not None and PagesManager.uses_pages_directory:
        import runpy

        PagesManager.uses_pages_directory = False
        runpy.run_path(str(Path(__file__).with_name("app.py")), run_name="__main__")
        st.stop()
    from dashboard.components import access

    access.require_signed_in()  # normally done by app.py; never serve a page without it
    init_state(parse_settings(sys.argv[1:]))  # idempotent; normally done by app.py


def demo_source(max_rows: int | None = None) -> dict[str, Any]:
    return {"kind": "demo", "path": str(cv.DEMO_DATA), "spec": cv.demo_spec_name(), "label": "demo data",
            "max_rows": max_rows}


def init_state(settings: Settings) -> None:
    """Set the session defaults once per session from the launch settings."""
    ss = st.session_state
    if SOURCE not in ss:
        if settings.data:
            ss[SOURCE] = {"kind": "path", "path": settings.data, "spec": settings.spec or cv.demo_spec_name(),
                          "label": Path(settings.data).name, "max_rows": settings.max_rows}
        else:
            ss[SOURCE] = demo_source(settings.max_rows)
    if MODEL not in ss:
        ss[MODEL] = settings.model or ""
    ss.setdefault(ENTITY, None)
    ss.setdefault(QUERY, None)


def set_entity(entity_id: str | None) -> None:
    """Open another case: remember the entity, forget the query (it belongs to the old one)."""
    ss = st.session_state
    if ss.get(ENTITY) != entity_id:
        ss[ENTITY] = entity_id
        ss[QUERY] = None


def set_query(transaction_id: str | None, from_table: bool = False) -> None:
    """Explain ``transaction_id``. Unless the choice came from the transaction table itself
    (``from_table``), the table is drawn anew (:func:`tx_table_key` changes) so its selected row
    is the new query; a choice made in the table keeps the table (and the analyst's sort in it)."""
    ss = st.session_state
    if not from_table and ss.get(QUERY) != transaction_id:
        ss[TX_GEN] = int(ss.get(TX_GEN, 0)) + 1
    ss[QUERY] = transaction_id


def _get(obj: Any, name: str, default: Any = None) -> Any:
    """``obj[name]`` or ``obj.name`` (selection states are attribute dicts; tests use dicts)."""
    if obj is None:
        return default
    if isinstance(obj, dict) or hasattr(obj, "get"):
        try:
            return obj.get(name, default)
        except TypeError:
            pass
    return getattr(obj, name, default)


def selected_row_id(key: str, ids: list[str]) -> str | None:
    """The id of the row selected in the ``st.dataframe`` with widget ``key``, given the ids of
    its rows in the order they were passed (a position only means something for that table)."""
    rows = _get(_get(st.session_state.get(key), "selection"), "rows", []) or []
    if rows and 0 <= int(rows[0]) < len(ids):
        return ids[int(rows[0])]
    return None


def selected_point_id(key: str, ids: list[str]) -> str | None:
    """The id of the first point selected in the ``st.plotly_chart`` with widget ``key``; the
    points carry their row position in ``customdata[0]`` (see engine.cases.figures.timeline_figure)."""
    for p in _get(_get(st.session_state.get(key), "selection"), "points", []) or []:
        cd = _get(p, "customdata")
        if cd is None:
            continue
        try:
            pos = int(float(cd[0] if isinstance(cd, (list, tuple)) else cd))
        except (TypeError, ValueError):
            continue
        if 0 <= pos < len(ids):
            return ids[pos]
    return None


def on_entity_table_select(key: str, ids: list[str]) -> None:
    """Callback of the ranking table: open the selected entity."""
    e = selected_row_id(key, ids)
    if e is not None:
        set_entity(e)


def on_query_table_select(key: str, ids: list[str]) -> None:
    """Callback form for a transaction table: explain the selected transaction (the table is kept). The
    Case page converts its table's selection at the top of the run instead (components/tx_table.py)."""
    t = selected_row_id(key, ids)
    if t is not None:
        set_query(t, from_table=True)


def on_query_chart_select(key: str, ids: list[str]) -> None:
    """Callback of the timeline chart: explain the clicked transaction."""
    t = selected_point_id(key, ids)
    if t is not None:
        set_query(t)


# --------------------------------------------------------------------------------- file identity
@st.cache_data(show_spinner=False, max_entries=64)
def _file_sha(path: str, size: int, mtime_ns: int) -> str:
    return cv.file_identity(path)


def file_sha(path: str | Path) -> str:
    """Content sha256 of a file, recomputed only when its size or mtime changes."""
    st_ = os.stat(path)
    return _file_sha(str(path), st_.st_size, st_.st_mtime_ns)


@st.cache_resource(show_spinner=False)
def upload_area() -> sp.UploadArea:
    """This server's private upload folder (one per process; see engine.serve.paths.UploadArea)."""
    return sp.UploadArea()


def save_upload(name: str, data: bytes) -> Path:
    """Write an uploaded file into this server's private upload folder (0700) under a random
    name (suffix kept so the format is detected; never the uploaded name) and return its path.
    The same bytes in this process give the same path."""
    return upload_area().save(name, data)


@st.cache_data(show_spinner=False, ttl=30, max_entries=8)
def listed_files(roots: tuple[str, ...], suffixes: tuple[str, ...]) -> list[str]:
    """The files under ``roots`` ending with ``suffixes`` (engine.serve.paths.list_files), as
    strings; cached for 30 s so a large root is not walked on every rerun."""
    return [str(p) for p in sp.list_files([Path(r) for r in roots], suffixes)]


def _launch() -> Settings:
    return parse_settings(sys.argv[1:])


def _same(a: str | None, b: Path) -> bool:
    return bool(a) and Path(a).expanduser().resolve() == b


def check_data_path(path: str) -> Path:
    """``path`` resolved if the page may read it: inside a data root or this server's upload
    folder, or the file the operator launched the dashboard with. Raises
    :class:`engine.serve.paths.PathNotAllowed` / FileNotFoundError."""
    p = Path(path).expanduser().resolve()
    if _same(_launch().data, p) and p.is_file():
        return p
    return sp.check_path(p, sp.data_roots() + [upload_area().folder.resolve()])


def check_model_path(model_path: str) -> str:
    """``model_path`` if the page may load it ("" = demo model; the operator's launch model; a
    folder inside a data root). Raises :class:`engine.serve.paths.PathNotAllowed`."""
    if not model_path or _same(_launch().model, Path(model_path).expanduser().resolve()):
        return model_path
    sp.check_path(model_path, kind="dir")
    return model_path


def check_spec(spec: str) -> str:
    """``spec`` if it is a built-in spec name, the operator's launch spec, or a spec file inside a
    data root. Raises :class:`engine.serve.paths.PathNotAllowed` / FileNotFoundError."""
    from engine.data.spec import builtin_specs

    if spec in builtin_specs() or (_launch().spec == spec):
        return spec
    sp.check_path(spec)
    return spec


# ------------------------------------------------------------------------------------ caches
def _model_mtime(model_path: str) -> int:
    d = Path(model_path) if model_path else cv.default_model_dir()
    f = d / "checkpoint.json"
    return f.stat().st_mtime_ns if f.exists() else 0


@st.cache_resource(show_spinner="Loading the model…", max_entries=4)
def _bundle(model_path: str, mtime_ns: int):
    return cv.load_model(model_path or None)


def get_bundle(model_path: str):
    """The model bundle at ``model_path`` ("" = demo model). Raises like load_checkpoint."""
    return _bundle(model_path, _model_mtime(model_path))


def session_bundle():
    """The model bundle of this session's model, for a signed-in user whose role views cases and
    a model path the page may load (:func:`check_model_path`). Raises AccessDenied,
    PathNotAllowed, or like load_checkpoint."""
    from dashboard.components import access
    from engine.serve import access as ac

    ac.require(access.current(), ac.VIEW_CASES)
    return get_bundle(check_model_path(st.session_state[MODEL]))


#: between a spec file's path and its content sha256 in a cache key (no path holds a NUL)
_SPEC_SHA = "\x00sha256="


def spec_ref(spec: str) -> str:
    """The cache-key form of ``spec`` (the ``spec`` of every cache key): a built-in name as is; a
    spec file as its path + its content sha256 (rehashed when its size or mtime changes), so a
    spec edited in place is read again instead of served from the old one's caches."""
    from engine.data.spec import builtin_specs

    p = Path(spec).expanduser()
    return spec if spec in builtin_specs() or not p.is_file() else f"{spec}{_SPEC_SHA}{file_sha(p)}"


def spec_arg(ref: str) -> str:
    """The spec name or path of a :func:`spec_ref`."""
    return spec_parts(ref)[0]


def spec_parts(ref: str) -> tuple[str, str]:
    """``(spec name or path, content sha256 or "")`` of a :func:`spec_ref`."""
    name, _, sha = str(ref).partition(_SPEC_SHA)
    return name, sha


@st.cache_resource(show_spinner="Reading the data…", max_entries=4)
def _source(path: str, spec: str, sha: str, max_rows: int | None):
    return cv.load_source(path, spec_arg(spec), max_rows=max_rows, file_sha256=sha)


def get_source(src: dict[str, Any]):
    """The :class:`engine.cases.view.Source` for a source dict (path, spec, max_rows)."""
    return _source(src["path"], spec_ref(src["spec"]), file_sha(src["path"]), src.get("max_rows"))


@st.cache_resource(show_spinner="Scoring every transaction…", max_entries=4)
def _scores(path: str, spec: str, sha: str, max_rows: int | None, model_path: str, model_sha: str):
    source = _source(path, spec, sha, max_rows)
    return cv.score_source(get_bundle(model_path), source.frame)


@st.cache_resource(show_spinner=False, max_entries=8)
def _flagged(path: str, spec: str, sha: str, max_rows: int | None, model_path: str, model_sha: str,
             review: float):
    """The scores with ``flagged`` at the review threshold in force (the same frame when that is
    the checkpoint's)."""
    s = _scores(path, spec, sha, max_rows, model_path, model_sha)
    if review == get_bundle(model_path).threshold:
        return s
    return s.assign(flagged=s["probability"].to_numpy() >= review)


@st.cache_resource(show_spinner=False, max_entries=8)
def _ranking(path: str, spec: str, sha: str, max_rows: int | None, model_path: str, model_sha: str,
             review: float):
    return cv.rank_entities(_scores(path, spec, sha, max_rows, model_path, model_sha), review)


def thresholds_now(bundle: Any) -> dict[str, Any]:
    """The thresholds in force for ``bundle`` (:func:`engine.cases.view.thresholds_in_force`): the
    case store's when it exists (never created here), else the checkpoint's."""
    from engine.cases.store import default_db_path

    if not default_db_path().is_file():
        return cv.thresholds_in_force(bundle, None, db_path=default_db_path())
    from dashboard.components import get_store

    return cv.thresholds_in_force(bundle, get_store())


@dataclass
class Loaded:
    """What every page needs: source, bundle, scores, ranking and the cache key parts."""

    src: dict[str, Any]
    source: Any
    bundle: Any
    scores: Any
    ranking: Any
    key: tuple
    #: the thresholds in force (review, decline, source): the one source for every page and export
    thresholds: dict = None  # type: ignore[assignment]

    @property
    def threshold(self) -> float:
        """The review threshold in force (probability)."""
        return float((self.thresholds or {}).get("review", self.bundle.threshold))


def load_all() -> Loaded:
    """Load (cached) the current source + model, score and rank, for a signed-in user whose role
    views cases, from paths inside the data roots. Raises AccessDenied, PathNotAllowed, or on
    unreadable input."""
    from engine.serve import access as ac
    from dashboard.components import access

    ac.require(access.current(), ac.VIEW_CASES)
    ss = st.session_state
    src, model_path = ss[SOURCE], ss[MODEL]
    check_data_path(src["path"])  # every read of a server path goes through the data roots
    check_spec(src["spec"])
    bundle = get_bundle(check_model_path(model_path))
    sha, spec = file_sha(src["path"]), spec_ref(src["spec"])
    source = _source(src["path"], spec, sha, src.get("max_rows"))
    key = (src["path"], spec, sha, src.get("max_rows"), model_path, bundle.sha256)
    thr = thresholds_now(bundle)
    loaded = Loaded(src=src, source=source, bundle=bundle, scores=_flagged(*key, thr["review"]),
                    ranking=_ranking(*key, thr["review"]), key=key, thresholds=thr)
    try:
        start_precompute(loaded)  # once per data + model: explanations ready before a case opens
    except Exception as e:  # noqa: BLE001 - never blocks a page
        log.warning("precompute not started: %s", e)
    return loaded


def warm(settings: Settings) -> tuple:
    """Fill the shared caches (model bundle, source, scores, ranking) for the launch settings
    before the server starts (dashboard/launch.py); the cache key, as :func:`load_all` builds it.
    Raises like :func:`load_all`."""
    src = (demo_source(settings.max_rows) if not settings.data else
           {"path": settings.data, "spec": settings.spec or cv.demo_spec_name(), "max_rows": settings.max_rows})
    model_path = settings.model or ""
    bundle = get_bundle(model_path)
    sha = cv.file_identity(src["path"])
    key = (src["path"], spec_ref(src["spec"]), sha, src.get("max_rows"), model_path, bundle.sha256)
    _source(*key[:4])
    review = thresholds_now(bundle)["review"]
    _flagged(*key, review)  # the same cache entries load_all reads
    _ranking(*key, review)
    return key


@st.cache_data(show_spinner=False, max_entries=256)
def _timeline(path: str, spec: str, sha: str, max_rows: int | None, model_path: str, model_sha: str, entity: str,
              review: float):
    source = _source(path, spec, sha, max_rows)
    scores = _scores(path, spec, sha, max_rows, model_path, model_sha)
    return cv.entity_timeline(source.frame, scores, entity, review, source.currency)


def get_timeline(loaded: Loaded, entity_id: str):
    """One entity's display timeline (cached per data sha, spec, model sha, entity, review threshold)."""
    return _timeline(*loaded.key, str(entity_id), loaded.threshold)


#: seconds the background thread may spend explaining flagged transactions after a data load
#: (env ``FRAUDLENS_PRECOMPUTE_S``; 0 = off)
PRECOMPUTE_S_DEFAULT = 600.0


@st.cache_resource(show_spinner=False, max_entries=4)
def explanation_cache(data_dir: str):
    """The explanation cache (:class:`engine.cases.explain_cache.ExplanationCache`) in the
    fraudlens data dir (``$FRAUDLENS_DATA_DIR``, else the user data dir), one per process."""
    from engine.cases.explain_cache import ExplanationCache

    return ExplanationCache(Path(data_dir) / "explanations.sqlite")


def _cache():
    from engine.cases.store import default_db_path

    return explanation_cache(str(default_db_path().parent))


def _cache_ids(source: Any, max_rows: int | None, params: tuple) -> tuple[str, dict]:
    """(source id as the case store keys it, cache params: the explainer's + max_rows)."""
    from engine.cases.store import source_id
    from engine.data.spec import source_spec_key

    return source_id(source.file_sha256, source_spec_key(source.spec)), {**dict(params), "max_rows": max_rows}


@st.cache_data(show_spinner="Explaining the transaction…", max_entries=64)
def _explanations(data_sha: str, spec: str, max_rows: int | None, model_sha: str, transaction_id: str,
                  params: tuple, _path: str, _model_path: str):
    source = _source(_path, spec, data_sha, max_rows)
    sid, cparams = _cache_ids(source, max_rows, params)

    def compute():
        return cv.explain_query(get_bundle(_model_path), source.frame, transaction_id, **dict(params))

    try:
        cache = _cache()
        stored = cache.get(model_sha, sid, transaction_id, cparams)  # readable? (and read once)
    except Exception as e:  # noqa: BLE001 - an unreadable cache is a miss, never an error page
        log.warning("explanation cache unavailable: %s", e)
        return compute()
    if stored is not None:
        log.info("explanations of %s: stored", transaction_id)
        return stored
    from dashboard import precompute as pc

    waited = pc.wait_for_precompute(cache, model_sha, sid, transaction_id, cparams)
    if waited is not None:
        log.info("explanations of %s: waited for the precompute", transaction_id)
        return waited
    # stored -> read; being computed by the background precompute (or another session) -> wait for
    # that result; else computed here and stored: never the same transaction twice at once
    out, how = cache.get_or_compute(model_sha, sid, transaction_id, cparams, compute)
    log.info("explanations of %s: %s", transaction_id, how)
    return out


def get_explanations(loaded: Loaded, transaction_id: str, params: dict | None = None):
    """All explanations of one query: the stored ones (explanation cache, filled ahead by
    :func:`start_precompute`) else computed now and stored; cached in memory per data sha,
    spec, model sha, transaction, params."""
    path, spec, sha, max_rows, model_path, model_sha = loaded.key
    return _explanations(sha, spec, max_rows, model_sha, str(transaction_id),
                         tuple(sorted((params or {}).items())), path, model_path)


def precompute_budget_s() -> float:
    """``$FRAUDLENS_PRECOMPUTE_S`` seconds (default :data:`PRECOMPUTE_S_DEFAULT`; 0 = off)."""
    try:
        return max(0.0, float(os.environ.get("FRAUDLENS_PRECOMPUTE_S", PRECOMPUTE_S_DEFAULT)))
    except ValueError:
        return PRECOMPUTE_S_DEFAULT


def start_precompute(loaded: Loaded) -> dict[str, Any] | None:
    """Start (once per data sha, spec, model sha and review threshold; later calls return the same
    job) the background explanation of the flagged transactions, most risky first, within
    :func:`precompute_budget_s`. None when the budget is 0."""
    budget = precompute_budget_s()
    if budget <= 0:
        return None
    from engine.cases.store import default_db_path

    from dashboard import precompute as pc

    path, spec, sha, max_rows, model_path, model_sha = loaded.key
    return pc.precompute_job(sha, spec, max_rows, model_sha, float(loaded.threshold), budget, path, model_path,
                           str(default_db_path().parent))


def load_or_explain_error(e: Exception) -> str:
    """A one-line, actionable message for a load failure that never quotes a file: the cause
    class, the file name and the row / column (engine.serve.paths.safe_error); the full message
    goes to the server log."""
    log.warning("load failed: %s: %s", type(e).__name__, e)
    from engine.serve.access import AccessDenied

    if isinstance(e, (sp.PathNotAllowed, AccessDenied)):
        return f"Not allowed: {e}"
    src = st.session_state.get(SOURCE) or {}
    if isinstance(e, FileNotFoundError):
        return f"Not found: {e}"  # names a path (inside the roots), never a file's contents
    n_bad = cv.non_finite_score_count(e)
    if n_bad is not None:  # an error, never "not flagged"; the transaction ids go to the log only
        name = f" of {Path(str(src['path'])).name}" if src.get("path") else ""
        return (f"The model gave a NaN or infinite score for {n_bad:,} transaction(s){name}: the model "
                "or its input is broken, so no score is reported (the transaction ids are in the server log).")
    if isinstance(e, RuntimeError) and "state_dict" in str(e):
        return ("This checkpoint does not match this version of the model code (it was trained with an "
                "older one): retrain it with `fraudlens train`, or choose another checkpoint.")
    cols: tuple[str, ...] = ()
    try:
        from engine.data.spec import load_spec

        spec = load_spec(check_spec(src["spec"]))
        cols = tuple(spec.required_columns())
    except Exception:  # noqa: BLE001 - no spec names then
        pass
    return sp.safe_error(e, src.get("path"), cols)
