"""Trust figures plot the result arrays unchanged."""

import subprocess
import sys

import numpy as np
from trust_helpers import context, one_torch_thread, positive_queries  # noqa: F401

from engine.explain import explain_all
from engine.trust.agreement import method_agreement
from engine.trust.faithfulness import evaluate_faithfulness
from engine.trust.figures import agreement_heatmap, deletion_curve_figure, insertion_curve_figure, randomisation_figure
from engine.trust.sanity import randomisation_check


def test_curves_heatmap_and_randomisation_figures():
    ctx = context(positive_queries(15)[3])
    ex = explain_all(ctx, ["attention", "occlusion"])
    res = evaluate_faithfulness(ctx, ex, k_max=3, n_random=2)
    r = res["occlusion"]
    fig = deletion_curve_figure(r, title="t")
    own = fig.data[-1]
    np.testing.assert_array_equal(own.x, r.deletion["k"])
    np.testing.assert_array_equal(own.y, r.deletion["logit"])
    np.testing.assert_array_equal(fig.data[1].y, r.random_deletion["logit"])
    np.testing.assert_array_equal(fig.data[2].y, r.attention_deletion["logit"])
    assert "Occlusion" in own.name and f"{r.aopc:.2f}" in own.name and fig.layout.yaxis.title.text.endswith("(logit)")
    assert len(deletion_curve_figure(res["attention"]).data) == 3  # no separate attention-order trace
    ins = insertion_curve_figure(r)
    np.testing.assert_array_equal(ins.data[-1].y, r.insertion["logit"])
    ag = method_agreement(ex)
    hm = agreement_heatmap(ag.spearman, bound=ag.bound)
    np.testing.assert_array_equal(hm.data[0].z, ag.spearman.to_numpy())
    assert list(hm.data[0].x) == ["Attention", "Occlusion"]
    rc = randomisation_check(ctx, {"const": lambda c: np.arange(c.T, dtype=float)})
    rf = randomisation_figure(rc.steps_table, bound=rc.bound)
    np.testing.assert_allclose(rf.data[0].y, 1.0)  # what the verdict reads: |rho| per step
    np.testing.assert_allclose(rf.data[0].y, rc.steps_table["mean_rho"])
    assert list(rf.data[0].x) == rc.steps[1:]
    assert rf.layout.shapes[0].y0 == rc.bound  # the bound line


def test_figures_module_does_not_import_torch():
    code = "import sys, engine.trust.figures, engine.trust.agreement; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
