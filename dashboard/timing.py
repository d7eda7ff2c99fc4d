"""Page timing on the dashboard server: where a page run's time goes, and the Case page's pause
after the reasons box. No torch, no Streamlit calls."""

from __future__ import annotations

import logging
import os
import time

timing_log = logging.getLogger("fraudlens.dashboard.timing")


class SectionTimer:
    """Logs how long each section of one page-script run took, on the server
    (``fraudlens.dashboard.timing`` at INFO: ``"case: lead 12 ms"``; wall-clock milliseconds
    since the previous mark, and the run's total at :meth:`done`). Not the browser's drawing time.
    The browser bench (bench/browser_case_bench.py) prints these lines so a slow case open can
    be traced to a section. Costs a ``perf_counter`` call per mark when the level is above INFO.

    Usage: ``t = SectionTimer("case")``, then ``t.mark("lead")`` after each section."""

    def __init__(self, page: str):
        self.page = page
        self.t0 = self.last = time.perf_counter()
        self.on = timing_log.isEnabledFor(logging.INFO)

    def mark(self, section: str) -> None:
        """Log the time since the previous mark (or the start) under ``section``."""
        now = time.perf_counter()
        if self.on:
            timing_log.info("%s: %s %.0f ms", self.page, section, (now - self.last) * 1000.0)
        self.last = now

    def done(self) -> None:
        """Log the whole run's time since construction."""
        if self.on:
            timing_log.info("%s: total %.0f ms", self.page, (time.perf_counter() - self.t0) * 1000.0)


#: seconds the Case page script pauses right after drawing the reasons box (``$FRAUDLENS_LEAD_PAUSE_S``;
#: 0 = none; the test suite sets 0): a script that sends the whole case at once (everything stored) had
#: the browser draw every chart of the page before it painted the reasons; the pause lets the reasons
#: go out and be painted first (demo data, headless Chromium on 2 cores: case switch p50 ~0.86-0.98 s
#: without it, ~0.72 s with 0.15 s; bench/results/browser.md)
LEAD_PAUSE_S_DEFAULT = 0.1


def lead_pause_s() -> float:
    """``$FRAUDLENS_LEAD_PAUSE_S`` seconds (default :data:`LEAD_PAUSE_S_DEFAULT`), clipped to [0, 1];
    a value that is not a number gives the default."""
    try:
        v = float(os.environ.get("FRAUDLENS_LEAD_PAUSE_S", LEAD_PAUSE_S_DEFAULT))
    except ValueError:
        return LEAD_PAUSE_S_DEFAULT
    return min(max(v, 0.0), 1.0) if v == v else LEAD_PAUSE_S_DEFAULT
