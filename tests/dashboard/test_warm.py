"""The launch warm-up fills the caches the first page load reads (it used to fail on a missing
argument and only log it, so the first visitor paid for scoring)."""

from dashboard import state


def test_warm_fills_the_entries_load_all_reads(monkeypatch, tmp_path):
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "data"))
    settings = state.parse_settings(["--max-rows", "3000"])
    key = state.warm(settings)  # raises on any error: the launcher only logs them
    bundle = state.get_bundle(key[4])
    review = state.thresholds_now(bundle)["review"]
    ranking = state._ranking(*key, review)
    assert len(ranking) > 0 and state._ranking(*key, review) is ranking  # a cache hit: the same object
    assert state._flagged(*key, review) is state._flagged(*key, review)
