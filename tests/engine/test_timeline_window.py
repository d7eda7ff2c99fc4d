"""The Case page's timeline window (engine.cases.timeline_table.timeline_window): which rows the chart draws
for a long history, and what it says it left out."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from engine.cases import timeline_table as tt


def _timeline(n: int) -> pd.DataFrame:
    flagged = np.zeros(n, bool)
    flagged[[3, n // 2, n - 2]] = True
    label = np.zeros(n)
    label[[5, n - 1]] = 1
    return pd.DataFrame({"transaction_id": [f"t{i}" for i in range(n)],
                         "timestamp": pd.date_range("2024-01-01", periods=n, freq="h"),
                         "flagged": flagged, "label": label})


def test_short_history_is_drawn_whole():
    tl = _timeline(40)
    w = tt.timeline_window(tl, "t10", max_points=40)
    assert (w.start, w.stop, w.total, w.complete) == (0, 40, 40, True)
    assert (w.hidden_flagged, w.hidden_frauds) == (0, 0)


def test_window_around_the_query_with_three_quarters_before():
    tl = _timeline(1000)
    w = tt.timeline_window(tl, "t500", max_points=101)
    assert (w.start, w.stop) == (425, 526)  # 75 before, the query, 25 after
    assert w.rows["transaction_id"].iloc[75] == "t500"
    assert list(w.rows["transaction_id"]) == [f"t{i}" for i in range(425, 526)]
    assert not w.complete
    # flagged at 3 and 998 are outside (500 inside); frauds at 5 and 999 outside
    assert (w.hidden_flagged, w.hidden_frauds) == (2, 2)


def test_window_shifts_inside_the_timeline_at_both_ends():
    tl = _timeline(1000)
    early = tt.timeline_window(tl, "t2", max_points=100)
    assert (early.start, early.stop) == (0, 100)
    late = tt.timeline_window(tl, "t999", max_points=100)
    assert (late.start, late.stop) == (900, 1000)
    assert late.hidden_frauds == 1 and late.hidden_flagged == 2  # fraud 5; flagged 3 and 500
    missing = tt.timeline_window(tl, "not-there", max_points=100)
    assert (missing.start, missing.stop) == (900, 1000)  # the latest rows


def test_counts_without_label_or_flag_columns_and_bad_arguments():
    tl = _timeline(300).drop(columns=["label", "flagged"])
    w = tt.timeline_window(tl, "t0", max_points=50)
    assert (w.hidden_flagged, w.hidden_frauds) == (0, 0)
    with pytest.raises(ValueError, match="max_points"):
        tt.timeline_window(tl, "t0", max_points=0)
    with pytest.raises(ValueError, match="before_share"):
        tt.timeline_window(tl, "t0", before_share=1.5)
