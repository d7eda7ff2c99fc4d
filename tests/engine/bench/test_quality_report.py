"""The quality benchmark's table: targets judged on the fold means, both transformer rows, the
information ceiling and the model choice are printed (the benchmark itself takes ~40 min)."""

import pandas as pd

from engine.bench.quality import BENCH_CONFIG, _report


def _per_fold(ap, auc, cp, silent=0.2):
    return pd.DataFrame({"fold": [f"test-{i}" for i in range(4)], "AUC ROC": auc, "Average precision": ap,
                         "Card Precision@100": cp, "Recall@100 scenario 1": 1.0, "Recall@100 scenario 2": 0.6,
                         "Recall@100 scenario 3": 0.9, "Silent fraud share": silent})


def test_report_judges_targets_on_fold_means(tmp_path):
    ens = _per_fold([0.73, 0.71, 0.74, 0.72], [0.89, 0.90, 0.88, 0.89], [0.33, 0.31, 0.32, 0.32])
    one = _per_fold([0.70, 0.69, 0.71, 0.70], [0.88] * 4, [0.31] * 4)
    gbt = _per_fold([0.68] * 4, [0.87] * 4, [0.30] * 4)
    out = tmp_path / "q.md"
    text = _report({"ensemble": ens, "single": one}, gbt, 4, [0.6, 0.65, 0.66, 0.67, 0.66], BENCH_CONFIG, (0, 1, 2),
                   60.0, "data.parquet", out, log=lambda *a: None, oracle=_per_fold([0.78] * 4, [0.9] * 4, [0.31] * 4))
    assert out.read_text() == text
    assert "| fraudlens transformer (mean probability of 3 seeds) | 0.890 ± 0.007 | 0.725 ± 0.011 | 0.320 ± 0.007 | this run |" in text
    assert "| average precision >= 0.72 | 0.725 yes | 0.700 **no** | 0.780 |" in text
    assert "| AUC ROC >= 0.89 | 0.890 yes | 0.880 **no** | 0.900 |" in text
    assert "| Card Precision@100 >= 0.32 | 0.320 yes | 0.310 **no** | 0.310: target above it |" in text
    assert "| average precision above the GBT of this run (0.680) | 0.725 yes | 0.700 yes | 0.780 |" in text
    assert "Gap of the transformer (3 seeds) to the ceiling: AUC ROC -0.010, Average precision -0.055, Card Precision@100 +0.010." in text
    assert "| LightGBM on the Handbook features | 0.870 ± 0.000 | 0.680 ± 0.000 | 0.300 ± 0.000 | this run |" in text
    assert "Silent frauds: on the test folds 20.0% (min 20.0%, max 20.0%) of the frauds are scenario-2 frauds" in text
    assert "It is not a strict bound" in text
    assert ("| information ceiling: every fraud but the silent scenario-2 ones ranked first (below) | "
            "0.900 ± 0.000 | 0.780 ± 0.000 | 0.310 ± 0.000 | `fraudlens bench ceiling` |") in text
    assert f"-> the snapshot after 4 of {BENCH_CONFIG.epochs} epochs" in text


def test_report_prints_the_ceiling_spread_over_tie_breaks(tmp_path):
    ens = _per_fold([0.72] * 4, [0.88] * 4, [0.30] * 4)
    oracle = _per_fold([0.78] * 4, [0.891] * 4, [0.316] * 4)
    oracle.attrs["draws"] = pd.DataFrame({"fold": [f"test-{i}" for i in range(4)] * 2, "draw": [0] * 4 + [1] * 4,
                                          "AUC ROC": [0.889] * 4 + [0.893] * 4, "Average precision": [0.78] * 8,
                                          "Card Precision@100": [0.315] * 4 + [0.317] * 4})
    text = _report({"ensemble": ens, "single": ens}, None, 4, [0.6] * 6, BENCH_CONFIG, (0,), 60.0, "d.parquet",
                   tmp_path / "q.md", log=lambda *a: None, oracle=oracle)
    assert ("Ceiling (mean of the 4 test folds) over its random tie-breaks: AUC ROC 0.889..0.893, "
            "Average precision 0.780..0.780, Card Precision@100 0.315..0.317.") in text
    assert "| Card Precision@100 >= 0.32 | 0.300 **no** | 0.300 **no** | 0.316: target above it |" in text
    assert "| AUC ROC >= 0.89 | 0.880 **no** | 0.880 **no** | 0.891 |" in text
