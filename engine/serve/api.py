"""The scoring service's HTTP API (FastAPI): :func:`create_app`.

Routes:

* ``POST /v1/score`` - one transaction, a JSON object with the spec's raw column names
  (the request model is built from the spec, see :func:`transaction_model`); returns
  ``transaction_id``, ``entity_id``, ``probability`` (fraud probability in [0, 1]), ``logit``,
  ``decision`` (``below_review`` / ``review`` / ``decline``), ``reasons`` (``[{code, text}]``,
  facts of the entity's recent history), ``model_sha256``, ``latency_ms`` (server time from the
  request's arrival to the response, milliseconds), ``duplicate``, ``shadow``, ``calibrated``
  (a duplicate is answered from the stored row, its reasons not recomputed: ``[]``).
  Errors: 422 (malformed: ``detail[0].loc = ["body", column]``, ``msg`` = the reason, the file
  reader's wording; ``json_invalid`` for a body that does not parse; ``timestamp_ahead`` for a
  timestamp more than ``--max-ahead-minutes`` after the server's clock), 409 (out of order, or a
  transaction id reused with other content), 401 (token), 413 (body over the cap), 415 (not
  ``application/json``), 421 (Host not loopback on a loopback service), 500 (non-finite score,
  or an unexpected error, as JSON), 503 (history store unavailable).
* ``POST /v1/score/batch`` - ``{"transactions": [...]}`` (at most 1,000), scored in order, one
  durable commit; every item is in ``results`` or ``rejected`` (index, column, reason).
* ``GET /v1/explanations/{transaction_id}`` - the background explanation of a flagged transaction
  (the id may contain ``/``, sent as is or as ``%2F``); non-finite numbers are ``null``.
* ``GET /healthz`` (no token needed: then only ``{"status": "ok"}``), ``GET /metrics`` (Prometheus
  text), ``GET /openapi.json``, ``/docs``.

Every request first passes :class:`engine.serve.guard.Guard` (Host check on loopback, token,
``Content-Type: application/json`` for POSTs, body caps before parsing, metrics of every
status). Bodies are decoded as UTF-8 only; ``NaN`` / ``Infinity`` literals, and JSON nested too
deeply to parse, are ``422 json_invalid``.
"""

# no "from __future__ import annotations": FastAPI resolves the local request models from the annotations

import json
import os
import time
from typing import Any, Optional, Union

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field, create_model

from engine.data.spec import DatasetSpec
from engine.serve.guard import Guard
from engine.serve.record import RecordError, aggregate_columns, canonical_row, json_finite, required_keys
from engine.serve.service import MAX_BATCH, ScoringService, ServiceError

Cell = Optional[Union[str, int, float, bool]]
#: latency histogram buckets, seconds
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
#: bodies larger than this are parsed in the thread pool, not in the event loop (bytes)
PARSE_INLINE_BYTES = 64 * 2**10


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


class _CacheCollector:
    """Prometheus collector of the service's cache and worker state (read at scrape time)."""

    def __init__(self, service: ScoringService):
        self.service = service
        self.state: dict[str, Any] | None = None  # set by the route just before each scrape (a remote service's)

    def collect(self):
        st = self.state if self.state is not None else self.service.metrics_state()
        s = st["cache"]
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
        counts = st["counts"]
        for key, doc in (("scored", "transactions scored and appended"), ("flagged", "transactions at or above "
                         "the review threshold"), ("duplicates", "retried transactions answered from history"),
                         ("rejected", "transactions refused (4xx)")):
            c = CounterMetricFamily(f"fraudlens_serve_transactions_{key}", doc)
            c.add_metric([], counts[key])
            yield c
        w = st["worker"]
        if w is not None:
            for key, doc in (("cases_written", "case upserts by the background worker"),
                             ("explained", "flagged transactions explained in the background"),
                             ("errors", "background worker errors")):
                c = CounterMetricFamily(f"fraudlens_serve_worker_{key}", doc)
                c.add_metric([], w[key])
                yield c
            g = GaugeMetricFamily("fraudlens_serve_worker_backlog", "flagged transactions not yet explained "
                                  "(at the worker's last step)")
            g.add_metric([], w["backlog"])
            yield g
        if getattr(self.service, "remote", False):
            svc = self.service
            c = CounterMetricFamily("fraudlens_serve_dynamic_batches", "batches of rows sent to the scoring process")
            c.add_metric([], svc.batches)
            yield c
            c = CounterMetricFamily("fraudlens_serve_dynamic_batch_rows", "rows in those batches (rows / batches = "
                                    "mean dynamic batch size)")
            c.add_metric([], svc.batched_rows)
            yield c


def _error_bytes(detail: list[dict[str, Any]]) -> bytes:
    # ASCII JSON (json.dumps escapes any text, lone surrogates included), so it always encodes
    return json.dumps({"detail": detail}).encode()


def _error(status: int, detail: list[dict[str, Any]]) -> Response:
    return Response(_error_bytes(detail), status_code=status, media_type="application/json")


class _NonFiniteLiteral(ValueError):
    pass


def _reject_constant(name: str):
    raise _NonFiniteLiteral(f"{name} is not a JSON number; numbers must be finite")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object hook that refuses a repeated key (RFC 8259 section 4: names SHOULD be unique;
    parsers disagree on which value wins, so a proxy and this service could read two different
    transactions from one body)."""
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _NonFiniteLiteral(f"the key {dup!r} appears more than once in one object")
    return d


def parse_body(raw: bytes) -> Any:
    """The JSON value of a request body: UTF-8 only, no ``NaN`` / ``Infinity`` / ``-Infinity``,
    no key repeated within one object.

    Raises:
        ServiceError: 422 ``json_invalid`` (not UTF-8, not JSON, a non-finite literal, a repeated
            key, or nested too deeply for the parser).
    """
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as e:
        msg = f"the body is not UTF-8 text ({e})"
    except RecursionError:
        msg = "the body is nested too deeply to parse"
    except _NonFiniteLiteral as e:
        msg = f"not valid JSON: {e}"
    except ValueError as e:
        msg = f"not valid JSON ({e})"
    raise ServiceError(422, [{"loc": ["body"], "msg": msg, "type": "json_invalid"}])


def create_app(service: ScoringService, token: str | None = None, loopback_port: int | None = None) -> FastAPI:
    """The FastAPI app of ``service`` (routes in the module docstring).

    Args:
        service: the scoring service.
        token: the bearer token; None = no token.
        loopback_port: the port of a service bound to a loopback address: then the ``Host``
            header must name a loopback host with this port (:class:`engine.serve.guard.Guard`);
            None = no Host check (a service bound to another interface, or in-process use).
    """
    spec = service.spec
    Txn = transaction_model(spec)

    registry = CollectorRegistry()
    requests = Counter("fraudlens_serve_requests", "HTTP requests by route and response status", ["route", "status"],
                       registry=registry)
    latency = Histogram("fraudlens_serve_latency_seconds", "server-side request latency (seconds)", ["route"],
                        buckets=LATENCY_BUCKETS, registry=registry)
    collector = _CacheCollector(service)
    registry.register(collector)

    app = FastAPI(title="fraudlens scoring service", version="1",
                  description=f"Scores transactions of spec {spec.name!r} with model {service.bundle.short_sha} "
                              "(incremental, per-entity state).")
    app.state.service = service
    remote = bool(getattr(service, "remote", False))  # engine.serve.scorer.RemoteService: the scorer is a child process

    def elapsed_ms(state: dict[str, Any]) -> float:  # since the Guard saw the request
        return (time.perf_counter() - state["t0"]) * 1000.0

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        service.count_rejected(1)
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

    async def parse(raw: bytes):  # the body, already read and size-capped by the Guard
        return parse_body(raw) if len(raw) <= PARSE_INLINE_BYTES else await run_in_threadpool(parse_body, raw)

    async def score_body(raw: bytes, state: dict[str, Any]) -> tuple[int, bytes]:
        """``POST /v1/score`` on the body's bytes: (HTTP status, JSON response bytes). The Guard
        calls it directly once it has read the body (:class:`engine.serve.guard.Guard` ``direct``):
        the router, request object and exception middlewares of a FastAPI route cost about as
        much CPU as scoring on this path. The route below is the same function (OpenAPI, and any
        use of the app without the Guard)."""
        try:
            rec = await parse(raw)
            if not isinstance(rec, dict):
                raise ServiceError(422, [{"loc": ["body"], "msg": "expected a JSON object (one transaction)",
                                          "type": "model_type"}])
            if remote:
                try:
                    row = canonical_row(rec, spec)
                except RecordError as err:  # malformed: answered here, never sent to the scorer
                    service.count_rejected(1)
                    raise ServiceError(422, [err.detail()]) from None
                res = await service.score_row(row)
                if res[0] == "err":
                    raise ServiceError(res[1], res[2])
                body = res[1]
            else:
                body = (await call(service.score_one, rec)).body
        except ServiceError as e:
            return e.status, _error_bytes(e.detail)
        body["latency_ms"] = elapsed_ms(state)
        return 200, json.dumps(body).encode()

    @app.post("/v1/score", summary="score one transaction",
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": txn_schema}}}})
    async def score(request: Request) -> Response:
        status, body = await score_body(await request.body(), request.scope["state"])
        return Response(body, status_code=status, media_type="application/json")

    @app.post("/v1/score/batch", summary="score transactions in order (one durable commit)",
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": batch_schema}}}})
    async def score_batch(request: Request) -> Response:
        try:
            body = await parse(await request.body())
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
            # always in the thread pool: a batch of 1,000 takes ~1 s, which would block the event loop
            if remote:
                out = await service.call("batch", [r for _, r in recs])
            else:
                out = await run_in_threadpool(service.score_batch, [r for _, r in recs])
        except ServiceError as e:
            return _error(e.status, e.detail)
        index = [i for i, _ in recs]
        for r in out["results"] + out["rejected"]:
            r["index"] = index[r["index"]]
        service.count_rejected(len(pre))
        out["rejected"] = sorted(out["rejected"] + pre, key=lambda r: r["index"])
        out["rejected_count"] = len(out["rejected"])
        out["latency_ms"] = elapsed_ms(request.scope["state"])
        return Response(json.dumps(out), media_type="application/json")

    @app.get("/v1/explanations/{transaction_id:path}", summary="background explanation of a flagged transaction")
    async def explanation(request: Request, transaction_id: str) -> Response:
        try:
            e = await (service.call("explanation", transaction_id) if remote
                       else run_in_threadpool(service.explanation, transaction_id))
        except ServiceError as err:
            return _error(err.status, err.detail)
        if e is None:
            return _error(404, [{"loc": ["path", "transaction_id"], "msg": "no explanation stored for this "
                                 "transaction (not flagged, shadow mode, or not yet computed)", "type": "not_found"}])
        # stored before the NaN-safe storage (a NaN weight): null, so the answer is JSON
        return Response(json.dumps(json_finite(e), allow_nan=False), media_type="application/json")

    @app.get("/healthz", summary="liveness; with the token (when one is set) also the state")
    async def healthz(request: Request):
        if token and not request.scope["state"].get("authorized"):
            return {"status": "ok"}
        if not remote:
            return await run_in_threadpool(service.health)
        try:
            h = await service.call("health")
        except ServiceError as err:
            return _error(err.status, err.detail)
        h["processes"] = {"front": os.getpid(), "scorer": service.info["pid"],
                          "dynamic_batches": service.batches, "dynamic_batch_rows": service.batched_rows}
        return h

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        if remote:
            try:
                st = await service.call("metrics")
            except ServiceError as err:
                return _error(err.status, err.detail)
            st["counts"]["rejected"] += service.rejected_here
            collector.state = st
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
        return await run_in_threadpool(lambda: Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST))

    app.add_middleware(Guard, token=token, loopback_port=loopback_port, requests=requests, latency=latency,
                       direct={"/v1/score": score_body})
    return app
