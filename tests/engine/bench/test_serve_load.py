"""The serve load test's verdict and its client: a run that misses the rate, has an error or a
p99 above 5 ms must not count as meeting the target; the client parses Content-Length responses
and refuses chunked ones."""

from __future__ import annotations

import asyncio

import pytest

from engine.bench.serve_client import _read_response
from engine.bench.serve_load import RunResult, target_rows


def _run(rate: float, n: int, wall: float, p99_ms: float, errors: int = 0, clients: int = 8) -> RunResult:
    ms = [1.0] * (n - n // 50) + [p99_ms] * (n // 50)  # 2 % of requests at p99_ms: the p99 is p99_ms
    return RunResult("d", clients, f"paced {rate:,.0f}/s", "normal", client_ms=ms, server_ms=ms, errors=errors,
                     wall_s=wall, rate=rate)


def test_meets_needs_the_rate_no_errors_and_p99():
    assert _run(1000, 5000, 5.0, 4.0).meets(5.0)
    assert not _run(1000, 5000, 5.0, 6.0).meets(5.0)  # p99 above 5 ms
    assert not _run(1000, 3000, 5.0, 1.0).meets(5.0)  # 600 tx/s achieved of 1,000
    assert not _run(1000, 5000, 5.0, 1.0, errors=1).meets(5.0)
    unpaced = RunResult("d", 8, "unpaced", "normal", client_ms=[1.0] * 10, wall_s=1.0)
    assert not unpaced.meets(5.0)


def test_target_rows_report_the_highest_rate_met():
    runs = [_run(250, 1250, 5.0, 2.0), _run(500, 2500, 5.0, 3.0), _run(1000, 5000, 5.0, 9.0)]
    (row,) = target_rows(runs)
    assert row == "| d | normal | one | 8 | 500 tx/s | no |"
    (row,) = target_rows([_run(250, 1250, 5.0, 7.0)])
    assert row.endswith("| none | no |")
    (row,) = target_rows([_run(1000, 5000, 5.0, 4.9)])
    assert row.endswith("| 1,000 tx/s | yes |")


def _parse(raw: bytes):
    async def go():
        r = asyncio.StreamReader()
        r.feed_data(raw)
        r.feed_eof()
        return await _read_response(r)

    return asyncio.run(go())


def test_client_reads_content_length_and_refuses_chunked():
    body = b'{"transaction_id": "1", "latency_ms": 0.5}'
    assert _parse(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\ncontent-type: application/json\r\n\r\n" % len(body)
                  + body) == (200, body)
    assert _parse(b"HTTP/1.1 409 Conflict\r\nContent-Length: 2\r\n\r\n{}")[0] == 409
    with pytest.raises(ValueError, match="Content-Length"):
        _parse(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
    with pytest.raises(asyncio.IncompleteReadError):
        _parse(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}")
