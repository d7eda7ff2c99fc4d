"""The HTTP guard of the scoring service: one pure ASGI middleware (:class:`Guard`) in front of
every route of :func:`engine.serve.api.create_app`, in this order:

1. **Host** (DNS rebinding, https://en.wikipedia.org/wiki/DNS_rebinding): when the service is
   bound to a loopback address, the ``Host`` header must name a loopback host
   (``localhost``, ``127.x.x.x``, ``[::1]``) with the service's port; otherwise ``421``. A page
   of ``http://evil.example`` whose name is re-pointed to 127.0.0.1 sends ``Host: evil.example``
   and is refused before any route runs.
2. **Token**: with a token, every route but ``/healthz`` needs ``Authorization: Bearer <token>``
   (:func:`hmac.compare_digest`); otherwise ``401``. ``/healthz`` answers without it, but only
   ``{"status": "ok"}``; its details (model, thresholds, counts, worker errors) need the token.
3. **Content type** of a ``POST``: ``application/json``, with no ``charset`` or
   ``charset=utf-8``; anything else ``415``. A browser page can send a cross-origin ``POST``
   without asking only as ``text/plain``, form or multipart data (a "simple request",
   https://fetch.spec.whatwg.org/#cors-safelisted-request-header); ``application/json`` needs a
   CORS preflight, which this service never approves (it sends no CORS headers).
4. **Body size** of a ``POST``, before any parsing: a ``Content-Length`` above the route's cap
   (:data:`MAX_BODY_BYTES`) is refused at once, and a chunked body is read up to the cap and
   refused as soon as it passes it; ``413`` naming the cap. The body is then handed to the route
   from memory.
5. **Metrics**: every response's real status and latency per route
   (``fraudlens_serve_requests_total{route, status}``, ``fraudlens_serve_latency_seconds``),
   including the refusals above and ``500`` from an unexpected exception (answered as JSON, the
   traceback in the service log).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import time
from typing import Any

log = logging.getLogger("fraudlens.serve")

#: body cap per POST route, bytes (``POST`` to any other path: :data:`DEFAULT_MAX_BODY_BYTES`)
MAX_BODY_BYTES = {"/v1/score": 1 * 2**20, "/v1/score/batch": 16 * 2**20}
DEFAULT_MAX_BODY_BYTES = 1 * 2**20
#: route labels of the metrics (anything else is counted as ``other``)
ROUTES = ("/v1/score", "/v1/score/batch", "/healthz", "/metrics", "/openapi.json", "/docs")
EXPLANATIONS = "/v1/explanations"


def route_label(path: str) -> str:
    """The metrics label of a request path (bounded: the routes, else ``"other"``)."""
    if path in ROUTES:
        return path
    if path.startswith(EXPLANATIONS + "/"):
        return EXPLANATIONS
    return "other"


def error_body(status: int, loc: list, msg: str, kind: str) -> tuple[int, bytes]:
    """A FastAPI-style error response body ``{"detail": [{"loc", "msg", "type"}]}`` as bytes
    (ASCII JSON: any text is escaped, so it always encodes)."""
    return status, json.dumps({"detail": [{"loc": loc, "msg": msg, "type": kind}]}).encode()


def _loopback_name(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_ok(value: str, port: int | None) -> bool:
    """True if the ``Host`` header ``value`` names a loopback host and ``port`` (an absent port
    is 80). ``"localhost:8000"``, ``"127.0.0.1:8000"``, ``"[::1]:8000"`` pass for port 8000."""
    v = value.strip().lower()
    if v.startswith("["):
        name, closed, rest = v[1:].partition("]")
        got = rest[1:] if rest.startswith(":") else ("" if rest == "" else None)
        if not closed:  # "[::1" is not a Host
            return False
    else:
        name, sep, got = v.rpartition(":") if ":" in v else (v, "", "")
        if ":" in name:  # an unbracketed IPv6 literal is not a valid Host
            return False
    if got is None or not _loopback_name(name) or not (got == "" or (got.isascii() and got.isdigit())):
        return False  # "localhost:8501@evil.example" has no port: not a Host
    if port is None:
        return True
    try:
        return int(got or 80) == port
    except ValueError:
        return False


def content_type_ok(value: str) -> bool:
    """True for ``application/json`` with no ``charset`` or ``charset=utf-8`` (any case, quoted or not)."""
    media, *params = value.split(";")
    if media.strip().lower() != "application/json":
        return False
    for p in params:
        k, _, v = p.partition("=")
        if k.strip().lower() == "charset" and v.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return False
    return True


class Guard:
    """Pure ASGI middleware: host, token, content type, body cap, metrics (module docstring).

    Args:
        app: the ASGI app.
        token: the bearer token, or None (no token).
        loopback_port: when not None, the service is bound to loopback and the ``Host`` header
            must name a loopback host with this port (``0`` = any port); None = no Host check.
        requests, latency: the prometheus ``Counter(route, status)`` and ``Histogram(route)``.
        direct: ``{path: async handler(body bytes, scope state) -> (status, JSON bytes)}``: a
            ``POST`` to such a path that passed every check is answered by its handler, not by
            the inner app (the hot path of the service, ``/v1/score``: no router, request
            object or exception middleware per request). An exception in the handler is a JSON
            500, as anywhere else.
    """

    def __init__(self, app, token: str | None, loopback_port: int | None, requests, latency, direct=None):
        self.app, self.token = app, (token or "").encode()
        self.direct = dict(direct or {})
        self.port = loopback_port
        self.requests, self.latency = requests, latency

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        if not self.token:
            return True
        scheme, _, cred = headers.get(b"authorization", b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(cred.strip(), self.token)

    async def _refuse(self, send, status: int, loc: list, msg: str, kind: str, headers=()) -> None:
        _, body = error_body(status, loc, msg, kind)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                *headers]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        state = scope.setdefault("state", {})
        state["t0"] = t0
        route = route_label(scope["path"])
        status: list[int] = [500]
        started = [False]

        async def send_status(msg):
            if msg["type"] == "http.response.start":
                status[0], started[0] = int(msg["status"]), True
            await send(msg)

        try:
            await self._handle(scope, receive, send_status, state)
        except Exception as e:  # noqa: BLE001 - logged with its traceback, answered as JSON 500
            log.exception("unexpected error in %s %s", scope.get("method"), scope["path"])
            if not started[0]:
                await self._refuse(send_status, 500, [], f"internal error ({type(e).__name__}); see the service "
                                   "log", "internal_error")
        finally:
            if not started[0] and state.get("disconnected"):
                status[0] = 499
            self.requests.labels(route, str(status[0])).inc()
            self.latency.labels(route).observe(time.perf_counter() - t0)

    async def _handle(self, scope, receive, send, state: dict[str, Any]) -> None:
        headers: dict[bytes, bytes] = {}
        for k, v in scope["headers"]:
            headers.setdefault(k, v)
        if self.port is not None:
            host = headers.get(b"host", b"").decode("latin-1")
            if not host_ok(host, self.port or None):
                await self._refuse(send, 421, ["header", "Host"], f"Host {host[:100]!r} is not this service: it "
                                   "listens on loopback only and answers requests for localhost / 127.0.0.1 / "
                                   "[::1] with its port (protection against DNS rebinding)", "misdirected")
                return
        state["authorized"] = self._authorized(headers)
        if not state["authorized"] and scope["path"] != "/healthz":
            await self._refuse(send, 401, ["header", "Authorization"], "a valid bearer token is required",
                               "unauthorized", headers=[(b"www-authenticate", b"Bearer")])
            return
        if scope["method"] == "POST":
            ctype = headers.get(b"content-type", b"").decode("latin-1")
            if not content_type_ok(ctype):
                await self._refuse(send, 415, ["header", "Content-Type"], f"Content-Type {ctype[:100]!r}: expected "
                                   "'application/json' (UTF-8; no other charset)", "unsupported_media_type")
                return
            cap = MAX_BODY_BYTES.get(scope["path"], DEFAULT_MAX_BODY_BYTES)
            too_big = (413, ["body"], f"request body larger than {cap:,} bytes, the limit of {scope['path']} "
                       "(engine/serve/guard.py MAX_BODY_BYTES)", "body_too_large")
            length = headers.get(b"content-length")
            if length is not None:
                try:
                    n = int(length)
                except ValueError:
                    await self._refuse(send, 400, ["header", "Content-Length"], "Content-Length is not a number",
                                       "bad_request")
                    return
                if n > cap:
                    await self._refuse(send, *too_big)
                    return
            chunks, size = [], 0
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":  # counted as 499 (client closed the request)
                    state["disconnected"] = True
                    return
                chunk = msg.get("body", b"")
                size += len(chunk)
                if size > cap:
                    await self._refuse(send, *too_big)
                    return
                chunks.append(chunk)
                if not msg.get("more_body", False):
                    break
            body = b"".join(chunks)
            handler = self.direct.get(scope["path"])
            if handler is not None:
                code, out = await handler(body, state)
                await send({"type": "http.response.start", "status": code,
                            "headers": [(b"content-length", str(len(out)).encode()),
                                        (b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": out})
                return
            replayed = [False]

            async def replay():
                if not replayed[0]:
                    replayed[0] = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)
