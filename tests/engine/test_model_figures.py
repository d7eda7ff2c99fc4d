"""The Model page's figures (engine.cases.model_figures): the plotted arrays are the inputs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from engine.cases import model_figures as mf
from engine.cases.figures import FRAUD_COLOR, NEUTRAL_COLOR, QUERY_COLOR
from engine.model.calibration import reliability_table


def test_pr_curve_marks_the_lowest_plotted_threshold_at_or_above_the_slider():
    curve = pd.DataFrame({"threshold": [0.9, 0.6, 0.3], "precision": [1.0, 0.8, 0.5], "recall": [0.2, 0.6, 1.0],
                          "alerts": [1, 5, 10], "alerts_per_day": [0.5, 2.5, 5.0]})
    fig = mf.pr_curve_figure(curve, 0.5, word="score")
    line, mark = fig.data
    assert list(line.x) == [0.2, 0.6, 1.0] and list(line.y) == [1.0, 0.8, 0.5]
    assert (mark.x[0], mark.y[0]) == (0.6, 0.8)  # threshold 0.6 is the lowest >= 0.5
    assert "score ≥" in line.hovertemplate and "probability" not in line.hovertemplate
    assert len(mf.pr_curve_figure(curve, 0.95).data) == 1  # no plotted threshold at or above it


def test_reliability_figure_plots_the_non_empty_bins_with_the_ece_in_the_legend():
    y = np.array([0, 0, 1, 1])
    p = np.array([0.1, 0.2, 0.7, 0.9])
    fig = mf.reliability_figure({"test": reliability_table(y, p)}, ece={"test": 0.175})
    diag, s = fig.data
    assert list(diag.x) == [0, 1] and list(diag.y) == [0, 1]
    assert list(s.x) == pytest.approx([0.1, 0.2, 0.7, 0.9]) and list(s.y) == [0.0, 0.0, 1.0, 1.0]
    assert s.name == "test (ECE 0.1750)"


def test_importance_and_psi_figures():
    f = pd.DataFrame({"field": ["amount", "mcc"], "mean_abs_logit": [0.5, 1.5], "mean_logit": [0.4, -1.0],
                      "probability_reading": [0.05, -0.2]})
    bar = mf.importance_figure(f, word="score").data[0]
    assert list(bar.y) == ["amount", "mcc"] and list(bar.x) == [0.5, 1.5]  # largest last = on top
    assert bar.text[1] == "-1.00 logit ≈ -20.0 pts of score"
    t = pd.DataFrame({"field": ["a", "b", "c"], "psi": [0.3, 0.05, 0.12],
                      "reading": ["major shift", "stable", "moderate shift"]})
    fig = mf.psi_figure(t)
    bar = fig.data[0]
    assert list(bar.y) == ["b", "c", "a"] and list(bar.marker.color) == [NEUTRAL_COLOR, QUERY_COLOR, FRAUD_COLOR]
    assert sorted(s.x0 for s in fig.layout.shapes) == [0.1, 0.25]
