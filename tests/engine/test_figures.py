"""Pure Plotly figures: every figure's data equals its inputs (no hidden rescaling)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from engine.cases import figures as F
from engine.explain.base import Explanation

T, L, H, FIELDS = 5, 2, 3, ["amount", "mcc", "merchant"]
IDS = [f"t{i}" for i in range(T)]


def _expl(method="integrated_gradients", values=None, **kw) -> Explanation:
    rng = np.random.default_rng(0)
    base = dict(
        method=method, entity_id="e1", transaction_ids=IDS, query_transaction_id=IDS[-1],
        values=rng.normal(size=T) if values is None else values,
        units="logit", signed=True, baseline="zeros", params={"n_steps": 8}, score_logit=0.7,
    )
    base.update(kw)
    return Explanation(**base)


def _attention() -> Explanation:
    rng = np.random.default_rng(1)
    m = rng.random((L, H, T, T)) * np.tril(np.ones((T, T)))
    m /= m.sum(-1, keepdims=True)
    return _expl("attention", values=m[-1].mean(0)[-1], units="attention weight", signed=False,
                 extras={"per_layer_head": m[:, :, -1, :], "matrices": m})


def _labels():
    ts = pd.date_range("2024-01-01", periods=T, freq="3h")
    return F.transaction_labels(ts, [10.0, 20.5, 20.5, 3.0, 99.99], "USD", query_last=True)


# ---------------------------------------------------------------------------------- labels
def test_transaction_labels_are_time_and_amount_unique_and_mark_the_query():
    ts = pd.to_datetime(["2024-01-01 10:00", "2024-01-01 10:00", "2024-01-02 08:30"])
    labs = F.transaction_labels(ts, [5.0, 5.0, -25.0], "USD", query_last=True)
    assert labs[0] == "2024-01-01 10:00 UTC · 5.00 USD"  # the one time and amount format (engine.cases.fmt)
    assert labs[1] == "2024-01-01 10:00 UTC · 5.00 USD (2)"  # Plotly would merge equal categories
    assert labs[2] == "▶ query · 2024-01-02 08:30 UTC · -25.00 USD"
    assert F.format_amount(1234.5, "XYZ") == "1,234.50 XYZ"
    assert F.format_amount(2.1, "USD") == "2.10 USD" and F.format_amount(float("nan"), "USD") == "?"


# ------------------------------------------------------------------------------------- bars
def test_attribution_bars_heights_are_the_values_signed_colours_query_outlined():
    e = _expl(values=np.array([0.5, -0.25, 0.0, 1.0, -2.0]))
    fig = F.attribution_bars(e, labels=_labels())
    bar = fig.data[0]
    assert isinstance(bar, go.Bar)
    np.testing.assert_array_equal(bar.y, e.values)
    assert list(bar.x) == _labels()
    assert list(bar.marker.color) == [F.FRAUD_COLOR, F.LEGIT_COLOR, F.FRAUD_COLOR, F.FRAUD_COLOR, F.LEGIT_COLOR]
    assert bar.marker.line.color[-1] == F.QUERY_COLOR and bar.marker.line.width[-1] > 0
    assert all(w == 0 for w in bar.marker.line.width[:-1])
    assert "logit" in fig.layout.yaxis.title.text
    assert list(bar.customdata) == IDS


def test_attribution_bars_without_the_query_names_its_value_in_the_title():
    e = _expl(values=np.array([0.5, -0.25, 0.0, 1.0, -2.0]))
    fig = F.attribution_bars(e, include_query=False)
    np.testing.assert_array_equal(fig.data[0].y, e.values[:-1])
    assert len(fig.data[0].x) == T - 1
    assert "-2.000 logit" in fig.layout.title.text


def test_attribution_bars_unsigned_attention_is_neutral_and_default_labels_are_ids():
    e = _attention()
    fig = F.attribution_bars(e)
    assert set(fig.data[0].marker.color) == {F.NEUTRAL_COLOR}
    assert fig.data[0].x[0] == "t0" and "query" in fig.data[0].x[-1]
    assert fig.layout.yaxis.title.text == "attention weight"


def test_labels_of_the_wrong_length_are_refused():
    with pytest.raises(ValueError, match="labels"):
        F.attribution_bars(_expl(), labels=["a", "b"])


# -------------------------------------------------------------------------------- attention
@pytest.mark.parametrize("layer,head", [(0, 0), (1, 2), (0, None), (None, None)])
def test_attention_heatmap_z_is_the_selected_matrix(layer, head):
    e = _attention()
    m = e.extras["matrices"]
    li = L - 1 if layer is None else layer
    want = m[li].mean(0) if head is None else m[li, head]
    fig = F.attention_heatmap(e, layer, head, labels=_labels())
    hm = fig.data[0]
    assert isinstance(hm, go.Heatmap)
    np.testing.assert_allclose(np.asarray(hm.z, dtype=float), want)
    assert list(hm.x) == _labels() and list(hm.y) == _labels()
    assert f"layer {li + 1}" in fig.layout.title.text
    assert ("mean over heads" in fig.layout.title.text) == (head is None)
    # the query row is boxed
    (box,) = [s for s in fig.layout.shapes if s.type == "rect"]
    assert box.y0 == T - 1 - 0.5 and box.y1 == T - 1 + 0.5 and box.line.color == F.QUERY_COLOR


def test_attention_heatmap_rejects_a_layer_or_head_out_of_range():
    with pytest.raises(ValueError, match="layer"):
        F.attention_heatmap(_attention(), L, None)
    with pytest.raises(ValueError, match="head"):
        F.attention_heatmap(_attention(), 0, H)


def test_attention_without_matrices_uses_the_query_rows():
    e = _attention()
    e.extras.pop("matrices")
    z = F.attention_matrix(e, 1, 1)
    np.testing.assert_allclose(z, e.extras["per_layer_head"][1, 1][None, :])
    fig = F.attention_heatmap(e, 1, 1)
    assert len(fig.data[0].y) == 1


def test_rollout_heatmap_uses_the_rollout_matrix_or_the_values():
    r = np.tril(np.ones((T, T)))
    r /= r.sum(-1, keepdims=True)
    e = _expl("attention_rollout", values=r[-1], units="attention weight", signed=False, extras={"rollout": r})
    np.testing.assert_allclose(np.asarray(F.attention_heatmap(e).data[0].z, dtype=float), r)
    e2 = _expl("attention_rollout", values=r[-1], units="attention weight", signed=False)
    np.testing.assert_allclose(np.asarray(F.attention_heatmap(e2).data[0].z, dtype=float), r[-1][None, :])
    assert F.attention_shape(e2) == (1, 1) and F.attention_shape(_attention()) == (L, H)


# ----------------------------------------------------------------------------------- fields
def test_field_heatmap_z_is_field_values_centred_on_zero():
    fv = np.arange(T * 3, dtype=float).reshape(T, 3) - 4.0
    e = _expl(field_values=fv, field_names=FIELDS)
    fig = F.field_heatmap(e, labels=_labels())
    hm = fig.data[0]
    np.testing.assert_array_equal(np.asarray(hm.z, dtype=float), fv)
    assert list(hm.x) == FIELDS and list(hm.y) == _labels()
    assert hm.zmid == 0 and hm.zmax == -hm.zmin == np.abs(fv).max()
    # colour range from earlier transactions only; z unchanged
    fig2 = F.field_heatmap(e, scale="history")
    assert fig2.data[0].zmax == np.abs(fv[:-1]).max()
    np.testing.assert_array_equal(np.asarray(fig2.data[0].z, dtype=float), fv)


def test_field_figures_need_field_values():
    with pytest.raises(ValueError, match="per-field"):
        F.field_heatmap(_expl())
    with pytest.raises(ValueError, match="per-field"):
        F.field_bars(_expl())
    with pytest.raises(ValueError, match="scale"):
        F.field_heatmap(_expl(field_values=np.zeros((T, 3)), field_names=FIELDS), scale="bad")


def test_field_bars_are_the_query_row():
    fv = np.random.default_rng(2).normal(size=(T, 3))
    e = _expl(field_values=fv, field_names=FIELDS)
    fig = F.field_bars(e, values=["$1.00", "5411", "m1"])
    np.testing.assert_array_equal(fig.data[0].x, fv[-1])
    assert list(fig.data[0].y) == ["amount = $1.00", "mcc = 5411", "merchant = m1"]
    np.testing.assert_array_equal(F.field_bars(e, position=1).data[0].x, fv[1])


# --------------------------------------------------------------------------------- timeline
def _timeline():
    return pd.DataFrame(
        {
            "transaction_id": ["a", "b", "c", "d"],
            "timestamp": pd.date_range("2024-03-01", periods=4, freq="D"),
            "amount": [10.0, 250.0, 12.5, 3.0],
            "probability": [0.1, 0.95, 0.4, 0.7],
            "label": pd.array([0, 1, pd.NA, 0], dtype="Int8"),
            "mcc": ["5411", "5999", "5411", "5812"],
        }
    )


def test_timeline_markers_follow_the_scores_with_the_threshold_line():
    tl = _timeline()
    fig = F.timeline_figure(tl, 0.62, query_id="c", currency="USD", hover_columns=["mcc"])
    main = fig.data[0]
    np.testing.assert_array_equal(main.y, tl["probability"])
    np.testing.assert_array_equal(main.marker.color, tl["probability"])
    assert list(main.customdata[:, 0].astype(float).astype(int)) == [0, 1, 2, 3]  # positions, not ids
    assert main.marker.size[1] > main.marker.size[0]  # bigger = more likely fraud
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert len(lines) == 1 and lines[0].y0 == lines[0].y1 == 0.62
    names = [t.name for t in fig.data]
    assert names == ["transactions", "known fraud", "query"]
    fraud = fig.data[1]
    assert list(fraud.y) == [0.95]
    assert list(fig.data[2].y) == [0.4] and fig.data[2].marker.color == F.QUERY_COLOR
    assert fig.layout.yaxis.title.text == "fraud probability"
    # the line's label reads as the metrics do (format_threshold: 0.014, never 0.01)
    assert [a.text for a in F.timeline_figure(tl, 0.014).layout.annotations] == ["review threshold 0.014"]
    assert [a.text for a in F.score_distribution(tl["probability"], 0.014).layout.annotations] == [
        "review threshold 0.014"]


def test_timeline_by_amount_has_no_threshold_line():
    tl = _timeline().drop(columns="label")
    fig = F.timeline_figure(tl, 0.5, y="amount", currency="USD")
    np.testing.assert_array_equal(fig.data[0].y, tl["amount"])
    assert not [s for s in fig.layout.shapes if s.type == "line"]
    assert [t.name for t in fig.data] == ["transactions"]
    assert "USD" in fig.layout.yaxis.title.text
    with pytest.raises(ValueError):
        F.timeline_figure(tl, 0.5, y="logit")


def test_timeline_of_no_transactions_is_an_empty_figure():
    fig = F.timeline_figure(_timeline().iloc[:0], 0.5)
    assert len(fig.data[0].x) == 0


# ----------------------------------------------------------------------------- distribution
def test_score_distribution_has_every_score_and_the_threshold():
    p = np.linspace(0, 1, 101)
    fig = F.score_distribution(pd.Series(p), 0.3, highlight=[0.2, 0.9])
    np.testing.assert_array_equal(fig.data[0].x, p)
    np.testing.assert_array_equal(fig.data[1].x, [0.2, 0.9])
    (line,) = [s for s in fig.layout.shapes if s.type == "line"]
    assert line.x0 == line.x1 == 0.3


def test_training_history_figure():
    h = [{"epoch": 1, "loss": 0.9, "val_average_precision": 0.2, "val_auc_roc": 0.7},
         {"epoch": 2, "loss": 0.5, "val_average_precision": 0.4, "val_auc_roc": 0.8}]
    fig = F.training_history_figure(h)
    assert [t.name for t in fig.data] == ["training loss", "validation AP", "validation AUC ROC"]
    assert list(fig.data[0].y) == [0.9, 0.5]


def test_training_history_figure_of_a_seed_ensemble_has_lines_per_member():
    h = [{"epoch": e, "loss": 1.0 / e, "val_average_precision": 0.1 * e + m, "member": m}
         for m in (0, 1) for e in (1, 2, 3)]
    fig = F.training_history_figure(h)
    assert [t.name for t in fig.data] == ["training loss (member 1)", "validation AP (member 1)",
                                          "training loss (member 2)", "validation AP (member 2)"]
    assert list(fig.data[3].y) == pytest.approx([1.1, 1.2, 1.3]) and list(fig.data[3].x) == [1, 2, 3]


def test_figures_use_no_external_assets():
    figs = [F.attribution_bars(_expl()), F.attention_heatmap(_attention()), F.timeline_figure(_timeline(), 0.5)]
    for f in figs:
        js = f.to_json()
        assert "http://" not in js and "https://" not in js


def test_long_contexts_label_a_subset_of_ticks_but_keep_every_bar():
    n = 100
    e = Explanation(method="shap", entity_id="e", transaction_ids=[f"t{i}" for i in range(n)],
                    query_transaction_id=f"t{n - 1}", values=np.linspace(-1, 1, n), units="logit", signed=True,
                    baseline="", params={}, score_logit=0.0)
    fig = F.attribution_bars(e)
    assert len(fig.data[0].y) == n
    ticks = list(fig.layout.xaxis.tickvals)
    assert len(ticks) <= 32 and ticks[-1] == fig.data[0].x[-1]


def test_training_history_axes_are_labelled_separately():
    fig = F.training_history_figure([{"epoch": 1, "loss": 0.9, "val_average_precision": 0.2}])
    assert fig.layout.yaxis.title.text == "training loss"
    assert fig.layout.yaxis2.title.text == "validation metric" and tuple(fig.layout.yaxis2.range) == (0, 1)


def test_timeline_leaves_click_and_drag_modes_to_streamlit():
    # setting dragmode / clickmode here stopped point clicks from reaching st.plotly_chart(on_select)
    fig = F.timeline_figure(_timeline(), 0.5)
    assert fig.layout.dragmode is None and fig.layout.clickmode is None


def test_attribution_bars_draw_two_standard_error_bars_when_the_method_has_them():
    se = np.array([0.05, 0.1, 0.0, 0.2, 0.0])
    e = _expl("shap", values=np.array([0.5, -0.25, 0.01, 1.0, 0.0]), standard_errors=se)
    fig = F.attribution_bars(e, include_query=False)
    bar = fig.data[0]
    np.testing.assert_array_equal(bar.y, e.values[:-1])
    np.testing.assert_allclose(bar.error_y.array, 2 * se[:-1]) and bar.error_y.visible
    assert list(bar.customdata[:, 0]) == IDS[:-1] and list(bar.customdata[:, 1].astype(float)) == list(se[:-1])
    assert "±2 standard errors" in fig.layout.title.text and "standard error" in bar.hovertemplate
    # no standard errors (IG) or all zero (exact SHAP): no error bars
    for ex in (_expl(), _expl("shap", standard_errors=np.zeros(T))):
        f = F.attribution_bars(ex)
        assert f.data[0].error_y.array is None and "standard error" not in (f.layout.title.text or "")


def test_titled_figures_keep_the_title_above_the_legend_band():
    """Title in the top band of the figure (container coordinates), the horizontal legend just
    above the plot, and a top margin that holds both (a chart title overlapped its legend)."""
    from engine.cases import model_figures as MF
    from engine.trust import figures as TF

    for layout_fn in (F._layout, TF._layout):
        fig = go.Figure(data=[go.Scatter(x=[0, 1], y=[0, 1], name="a"), go.Scatter(x=[0, 1], y=[1, 0], name="b")])
        fig = layout_fn(fig, "A long chart title that used to run into the legend", 300)
        lay = fig.layout
        assert lay.title.yref == "container" and lay.title.yanchor == "top" and lay.title.y >= 0.95
        assert lay.legend.orientation == "h" and lay.legend.yanchor == "bottom" and lay.legend.y == 1.0
        # title text (~20 px at 14 px font) + legend row (~24 px) fit in the margin
        assert lay.margin.t >= 28 + 24 + 12
        untitled = layout_fn(go.Figure(), None, 300)
        assert untitled.layout.title.text is None and untitled.layout.margin.t < lay.margin.t
    assert MF._layout is F._layout  # the Model page's charts use the same layout


def test_a_long_timeline_is_drawn_with_webgl_markers_and_the_same_positions():
    n = F.WEBGL_MIN_POINTS + 1
    tl = pd.DataFrame({"transaction_id": [f"t{i}" for i in range(n)],
                       "timestamp": pd.date_range("2024-01-01", periods=n, freq="h"),
                       "amount": np.linspace(1, 100, n), "probability": np.linspace(0, 1, n)})
    fig = F.timeline_figure(tl, 0.5, query_id="t7")
    assert fig.data[0].type == "scattergl" and fig.data[0].name == "transactions"
    assert list(fig.data[0].customdata[:3, 0].astype(float).astype(int)) == [0, 1, 2]
    assert [t.name for t in fig.data] == ["transactions", "query"]
    assert F.timeline_figure(tl.iloc[: F.WEBGL_MIN_POINTS], 0.5).data[0].type == "scatter"
