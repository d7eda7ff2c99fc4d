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


def test_report_judges_the_default_recipe_against_the_equally_informed_gbt(tmp_path):
    from engine.bench.quality import default_recipe_config

    cfg = default_recipe_config(3)
    assert (cfg.members, cfg.ema_epochs, cfg.row_ff, cfg.epochs, cfg.context_length) == (3, 1.0, 128, 6, 64)
    ens = _per_fold([0.73, 0.71, 0.74, 0.72], [0.89, 0.90, 0.88, 0.89], [0.33, 0.31, 0.32, 0.32])
    one = _per_fold([0.70, 0.69, 0.71, 0.70], [0.88] * 4, [0.31] * 4)
    same = _per_fold([0.717] * 4, [0.874] * 4, [0.315] * 4)
    same.attrs["run"] = "Run 2026-12-01T12:47:10+00:00 on x"
    per_seed = {"AUC ROC": [0.88, 0.89], "Average precision": [0.70, 0.75], "Card Precision@100": [0.31, 0.31]}
    text = _report({"ensemble": ens, "single": one, "per_seed": per_seed}, None, 5, [0.6] * 6, cfg, (0, 1), 60.0,
                   "d.parquet", tmp_path / "q.md", log=lambda *a: None, same=same)
    assert "| fraudlens transformer (mean probability of 2 training run (3-member ensemble)s) |" in text
    assert "| average precision above the equally informed GBT (0.717) | 0.725 yes | 0.700 **no** |" in text
    assert "| AUC ROC above the equally informed GBT (0.874) | 0.890 yes | 0.880 yes |" in text
    assert "| average precision >= 0.74 (issue 14) | 0.725 **no** | 0.700 **no** |" in text
    assert "| Card Precision@100 >= 0.315 (issue 14) | 0.320 yes | 0.310 **no** |" in text
    assert "AUC ROC >= 0.89 (issue 14)" not in text  # the same target as the older one: one row
    # equal is not above: the check fails at 0.315 vs 0.315 for the single run (0.310) and passes for 0.320
    assert "| Card Precision@100 above the equally informed GBT (0.315) | 0.320 yes | 0.310 **no** |" in text
    assert ("AUC ROC 0.0050, Average precision 0.0250, Card Precision@100 0.0000 (target for average precision: <= 0.02). "
            "Per seed AP: 0.700, 0.750.") in text
    assert "recorded: `bench/results/quality_same_inputs.md` (Run 2026-12-01T12:47:10+00:00 on x...)" in text
    assert "members 3, next-transaction pretraining 0 min per fold (0 = none)." in text and "(each member's curve counted once: 2 x 3 curves per fold)" in text


def test_member_histories_split_an_ensemble_fit_per_member():
    from engine.bench.quality import member_histories

    h = [{"epoch": e, "member": k, "val_average_precision": 0.1 * e + k} for k in range(2) for e in (1, 2, 3)]
    h = h[:-1]  # member 1 stopped by the time budget after 2 epochs
    assert member_histories(h) == [[0.1, 0.2], [1.1, 1.2]]
    assert member_histories([{"val_average_precision": 0.5}, {"val_average_precision": None}]) == [[0.5, 0.0]]


def test_recorded_same_inputs_reads_the_recorded_run_and_refuses_a_partial_table(tmp_path):
    from engine.bench.quality import ROOT, recorded_same_inputs

    rec = recorded_same_inputs(ROOT / "bench" / "results" / "quality_same_inputs.md")
    assert list(rec["fold"]) == ["test-0", "test-1", "test-2", "test-3"]
    assert 0.5 < rec["Average precision"].mean() < 0.9 and rec.attrs["run"].startswith("Run 2026-")
    bad = tmp_path / "s.md"
    bad.write_text("| test-0 (2018-08-15) | 0.865 | 0.716 | 0.317 |\n")
    import pytest

    with pytest.raises(ValueError, match="expected 4 test-fold rows, got 1"):
        recorded_same_inputs(bad)


def test_model_choice_is_read_from_an_earlier_run_and_a_bad_log_is_refused(tmp_path):
    import pytest

    from engine.bench.quality import ROOT, read_model_choice

    curve, best = read_model_choice(ROOT / "bench" / "results" / "quality_default_5seeds_validation.log")
    assert best == 6 and len(curve) == 6 and curve[0] == pytest.approx(0.49)
    log = tmp_path / "v.log"
    log.write_text("epoch 1: loss 0.1\n[transformer] validation AP by epoch [0.5, 0.7, 0.6] -> 3 epochs\n")
    with pytest.raises(ValueError, match="3 epochs is not the best epoch"):
        read_model_choice(log)
    log.write_text("[transformer] validation AP by epoch [0.5, 0.7, 0.6] -> 2 epochs\n" * 2)
    with pytest.raises(ValueError, match="got 2"):
        read_model_choice(log)
    log.write_text("nothing\n")
    with pytest.raises(ValueError, match="got 0"):
        read_model_choice(log)


def test_the_report_names_the_run_whose_model_choice_it_reused(tmp_path):
    ens = _per_fold([0.72] * 4, [0.88] * 4, [0.30] * 4)
    text = _report({"ensemble": ens, "single": ens}, None, 6, [0.6] * 6, BENCH_CONFIG, (0,), 60.0, "d.parquet",
                   tmp_path / "q.md", log=lambda *a: None, choice_from="bench/results/v.log")
    assert "read from `bench/results/v.log` (the validation folds were not trained again)" in text
    text = _report({"ensemble": ens, "single": ens}, None, 6, [0.6] * 6, BENCH_CONFIG, (0,), 60.0, "d.parquet",
                   tmp_path / "q.md", log=lambda *a: None)
    assert "not trained again" not in text
