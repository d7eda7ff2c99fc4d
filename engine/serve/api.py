"""The scoring service's HTTP API (FastAPI): :func:`create_app`.

Routes:

* ``POST /v1/score`` - one transaction, a JSON object with the spec's raw column names
  (the request model is built from the spec, see :func:`transaction_model`); returns
  ``transaction_id``, ``entity_id``, ``probability`` (fraud probability in [0, 1]), ``logit``,
  ``decision`` (``below_review`` / ``review`` / ``decline``), ``reasons`` (``[{code, text}]``,
  facts of the entity's recent history), ``model_sha256``, ``latency_ms`` (server time from the
  request's arrival to the response, milliseconds), ``duplicate``, ``shadow``.
  Errors: 422 (malformed: ``detail[0].loc = ["body", column]``, ``msg`` = the reason, the file
  reader's wording), 409 (out of order, or a transaction id reused with other content), 401
  (token), 500 (non-finite score), 503 (history store unavailable).
* ``POST /v1/score/batch`` - ``{"transactions": [...]}`` (at most 1,000), scored in order, one
  durable commit; every item is in ``results`` or ``rejected`` (index, column, reason).
* ``GET /v1/explanations/{transaction_id}`` - the background explanation of a flagged transaction.
* ``GET /healthz`` (no token needed), ``GET /metrics`` (Prometheus text), ``GET /openapi.json``, ``/docs``.

Token: when the app is created with a token, every route but ``/healthz`` needs
``Authorization: Bearer <token>`` (compared with :func:`hmac.compare_digest`); otherwise 401.
"""

# no "from __future__ import annotations": FastAPI resolves the local request models from the annotations

import hmac
import json
import time
from typing import Any, Optional, Union

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field, create_model

from engine.data.spec import DatasetSpec
from engine.serve.record import aggregate_columns, required_keys
from engine.serve.service import MAX_BATCH, ScoringService, ServiceError

Cell = Optional[Union[str, int, float, bool]]
#: latency histogram buckets, seconds
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


def transaction_model(spec: DatasetSpec) -> type[BaseModel]:
    """The pydantic model of one transaction, the request schema of the OpenAPI document: one
    field per raw column the spec reads (by its raw name, as alias), required ones from
    :func:`engine.serve.record.required_keys`, the label and passthrough columns optional; values
    text, number, boolean or null. Unknown keys are ignored (as a file's unused columns). Requests
    are validated by :func:`engine.serve.record.canonical_row`, which applies these rules and the
    file reader's (one pass, no second parse)."""
    required = required_keys(spec)
    cols = list(dict.fromkeys(required + spec.required_columns()))
    fields: dict[str, Any] = {}
    desc = {f.column: f"{f.name} ({f.kind.value}) {f.description}".strip() for f in spec.fields}
    desc.update({c: "delayed aggregate from the caller's feature store (finite number)" for c in aggregate_columns(spec)})
    for i, c in enumerate(cols):
        default = ... if c in required else None
        fields[f"f{i}"] = (Cell, Field(default, alias=c, description=desc.get(c, "")))
    model = create_model(f"Transaction_{spec.name}", __config__=ConfigDict(extra="ignore", populate_by_name=False),
                         **fields)
    model.__doc__ = f"One transaction with the raw column names of spec {spec.name!r}."
    return model


class _Auth:
    """Pure ASGI middleware: the request start time for ``latency_ms``, and the bearer token."""

    def __init__(self, app, token: str | None):
        self.app, self.token = app, (token or "").encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope.setdefault("state", {})["t0"] = time.perf_counter()
            if self.token and scope["path"] != "/healthz":
                got = b""
                for k, v in scope["headers"]:
                    if k == b"authorization":
                        got = v
                        break
                scheme, _, cred = got.partition(b" ")
                if scheme.lower() != b"bearer" or not hmac.compare_digest(cred.strip(), self.token):
                    resp = JSONResponse({"detail": [{"loc": ["header", "Authorization"], "msg": "a valid bearer "
                                         "token is required", "type": "unauthorized"}]}, status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                    await resp(scope, receive, send)
                    return
        await self.app(scope, receive, send)


class _CacheCollector:
    """Prometheus collector of the service's cache and worker state (read at scrape time)."""

    def __init__(self, service: ScoringService):
        self.service = service

    def collect(self):
        s = self.service.cache.stats()
        for name, key, doc in (("cache_hits", "hits", "entity cache hits"),
                               ("cache_misses", "misses", "entity cache misses (rebuilt from history)"),
                               ("cache_evictions", "evictions", "entities evicted under the memory cap")):
            c = CounterMetricFamily(f"fraudlens_serve_{name}", doc)
            c.add_metric([], s[key])
            yield c
        for name, key, doc in (("cache_entities", "entities", "entities cached"),
                               ("cache_bytes", "bytes", "bytes cached (estimate)")):
            g = GaugeMetricFamily(f"fraudlens_serve_{name}", doc)
            g.add_metric([], s[key])
            yield g
        counts = self.service.counts
        for key, doc in (("scored", "transactions scored and appended"), ("flagged", "transactions at or above "
                         "the review threshold"), ("duplicates", "retried transactions answered from history"),
                         ("rejected", "transactions refused (4xx)")):
            c = CounterMetricFamily(f"fraudlens_serve_transactions_{key}", doc)
            c.add_metric([], counts[key])
            yield c
        w = self.service.worker
        if w is not None:
            for key, doc in (("cases_written", "case upserts by the background worker"),
                             ("explained", "flagged transactions explained in the background"),
                             ("errors", "background worker errors")):
                c = CounterMetricFamily(f"fraudlens_serve_worker_{key}", doc)
                c.add_metric([], getattr(w, key))
                yield c
            g = GaugeMetricFamily("fraudlens_serve_worker_backlog", "flagged transactions not yet explained "
                                  "(at the worker's last step)")
            g.add_metric([], w.backlog)
            yield g


def _error(status: int, detail: list[dict[str, Any]]) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


def create_app(service: ScoringService, token: str | None = None) -> FastAPI:
    """The FastAPI app of ``service`` (routes in the module docstring); ``token`` None = no token."""
    spec = service.spec
    Txn = transaction_model(spec)

    registry = CollectorRegistry()
    requests = Counter("fraudlens_serve_requests", "HTTP requests", ["route", "status"], registry=registry)
    latency = Histogram("fraudlens_serve_latency_seconds", "server-side request latency (seconds)", ["route"],
                        buckets=LATENCY_BUCKETS, registry=registry)
    registry.register(_CacheCollector(service))

    app = FastAPI(title="fraudlens scoring service", version="1",
                  description=f"Scores transactions of spec {spec.name!r} with model {service.bundle.short_sha} "
                              "(incremental, per-entity state).")
    app.state.service = service

    def done(request: Request, route: str, status: int) -> float:
        dt = time.perf_counter() - request.scope["state"]["t0"]
        requests.labels(route, str(status)).inc()
        latency.labels(route).observe(dt)
        return dt * 1000.0

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        route = request.url.path
        done(request, route, 422)
        service.counts["rejected"] += 1
        detail = [{"loc": list(e.get("loc", [])), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()]
        return _error(422, detail)

    txn_schema = Txn.model_json_schema(by_alias=True)
    batch_schema = {"type": "object", "required": ["transactions"], "additionalProperties": False,
                    "properties": {"transactions": {"type": "array", "items": txn_schema, "maxItems": MAX_BATCH}}}
    # sync "normal": a commit costs ~0.1 ms, so a request runs to completion in the event loop (no
    # thread hop: measured half the server CPU per request); sync "full": in the thread pool, so
    # requests arriving during an fsync are scored meanwhile and share the next commit
    inline = service.sync == "normal"

    async def call(fn, arg):
        return fn(arg) if inline else await run_in_threadpool(fn, arg)

    async def body_json(request: Request, route: str):
        try:
            return json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as e:
            raise ServiceError(422, [{"loc": ["body"], "msg": f"not valid JSON ({e})", "type": "json_invalid"}]) from None

    @app.post("/v1/score", summary="score one transaction",
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": txn_schema}}}})
    async def score(request: Request) -> Response:
        try:
            rec = await body_json(request, "/v1/score")
            if not isinstance(rec, dict):
                raise ServiceError(422, [{"loc": ["body"], "msg": "expected a JSON object (one transaction)",
                                          "type": "model_type"}])
            out = await call(service.score_one, rec)
        except ServiceError as e:
            done(request, "/v1/score", e.status)
            return _error(e.status, e.detail)
        out.body["latency_ms"] = done(request, "/v1/score", 200)
        return Response(json.dumps(out.body), media_type="application/json")

    @app.post("/v1/score/batch", summary="score transactions in order (one durable commit)",
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": batch_schema}}}})
    async def score_batch(request: Request) -> Response:
        try:
            body = await body_json(request, "/v1/score/batch")
            items = body.get("transactions") if isinstance(body, dict) else None
            if not isinstance(items, list):
                raise ServiceError(422, [{"loc": ["body", "transactions"], "msg": "expected {\"transactions\": [...]}",
                                          "type": "model_type"}])
            if len(items) > MAX_BATCH:
                raise ServiceError(413, [{"loc": ["body", "transactions"], "msg": f"{len(items):,} transactions; at "
                                          f"most {MAX_BATCH:,} per batch", "type": "too_many"}])
            recs = [(i, x) for i, x in enumerate(items) if isinstance(x, dict)]
            pre = [{"index": i, "loc": ["body", "transactions", i], "msg": "expected a JSON object (one transaction)",
                    "type": "model_type", "input": None} for i, x in enumerate(items) if not isinstance(x, dict)]
            out = await call(service.score_batch, [r for _, r in recs])
        except ServiceError as e:
            done(request, "/v1/score/batch", e.status)
            return _error(e.status, e.detail)
        index = [i for i, _ in recs]
        for r in out["results"] + out["rejected"]:
            r["index"] = index[r["index"]]
        service.counts["rejected"] += len(pre)
        out["rejected"] = sorted(out["rejected"] + pre, key=lambda r: r["index"])
        out["rejected_count"] = len(out["rejected"])
        out["latency_ms"] = done(request, "/v1/score/batch", 200)
        return Response(json.dumps(out), media_type="application/json")

    @app.get("/v1/explanations/{transaction_id}", summary="background explanation of a flagged transaction")
    def explanation(request: Request, transaction_id: str) -> JSONResponse:
        e = service.explanation(transaction_id)
        if e is None:
            done(request, "/v1/explanations", 404)
            return _error(404, [{"loc": ["path", "transaction_id"], "msg": "no explanation stored for this "
                                 "transaction (not flagged, shadow mode, or not yet computed)", "type": "not_found"}])
        done(request, "/v1/explanations", 200)
        return JSONResponse(e)

    @app.get("/healthz", summary="liveness and state")
    def healthz() -> dict:
        return service.health()

    @app.get("/metrics", summary="Prometheus metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(_Auth, token=token)
    return app
