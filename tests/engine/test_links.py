"""Links between cases (engine/cases/links.py) on small constructed frames with a known answer."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import poisson

from engine.cases.link_figures import link_network_figure, network_positions
from engine.cases.links import (
    case_links,
    case_states,
    confirmed_from_store,
    fraud_onsets,
    link_graph,
    point_field,
    rank_points,
)
from engine.data.spec import DatasetSpec

DAY0 = pd.Timestamp("2024-03-01")


def spec(link_points=("terminal",)) -> DatasetSpec:
    return DatasetSpec.model_validate({
        "name": "links-tiny", "entity": {"columns": ["card"]}, "timestamp": {"column": "ts"},
        "amount": {"column": "amt"}, "label": {"column": "y"}, "link_points": list(link_points),
        "fields": [{"name": "terminal", "column": "t", "kind": "categorical", "model_input": False},
                   {"name": "mcc", "column": "m", "kind": "categorical"},
                   {"name": "risk", "column": "r", "kind": "numeric"}],
    })


def canonical(rows: list[tuple[str, float, str, int]]) -> pd.DataFrame:
    """(entity, day offset, terminal, label) rows -> canonical frame."""
    f = pd.DataFrame(rows, columns=["entity_id", "day", "terminal", "label"])
    f["timestamp"] = DAY0 + pd.to_timedelta(f["day"], unit="D")
    f["amount"] = 10.0
    f["mcc"] = "5411"
    f["risk"] = 0.0
    f["label"] = f["label"].astype("Int8")
    f.insert(0, "row_number", np.arange(1, len(f) + 1))
    f.insert(1, "transaction_id", [f"t{i}" for i in range(len(f))])
    f = f.drop(columns="day")
    return f.sort_values(["entity_id", "timestamp", "row_number"]).reset_index(drop=True)


def compromise_frame() -> pd.DataFrame:
    """Four fraud entities F0..F3 each visit terminal X two days before their first fraud (at
    another terminal); six clean entities C0..C5 and the fraud entities use the common terminals
    A and B every day; nobody clean visits X. The answer: X ranks first."""
    rows = []
    for i in range(4):
        onset = 20 + 5 * i
        for d in range(0, onset):
            rows.append((f"F{i}", d + 0.3, "A" if d % 2 else "B", 0))
        rows.append((f"F{i}", onset - 2 + 0.5, "X", 0))
        rows.append((f"F{i}", onset + 0.6, f"Z{i}", 1))  # the first fraud, elsewhere
    for j in range(6):
        for d in range(0, 45):
            rows.append((f"C{j}", d + 0.4, "A" if (d + j) % 2 else "B", 0))
    return canonical(rows)


def test_compromised_point_ranks_first_with_the_expected_statistic():
    f = compromise_frame()
    r = rank_points(f, spec(), window_days=7)
    assert r.point_field == "terminal" and r.n_fraud_entities == 4 and r.n_other_entities == 6
    top = r.table.iloc[0]
    assert top["point"] == "X" and top["fraud_entities"] == 4 and top["fraud_visit_days"] == 4
    # nobody clean visits X: nothing is expected there, the lift is (4 + 1) / (0 + 1)
    assert top["expected_visit_days"] == 0 and top["lift"] == pytest.approx(5.0)
    assert top["p_value"] == pytest.approx(poisson.sf(3, 0.0)) and top["p_value"] == 0.0
    # the terminals every entity uses are what fraud entities used as often as others: lift near 1
    common = r.table.set_index("point").loc[["A", "B"]]
    assert (common["lift"] < 1.6).all() and (common["lift"] > 0.5).all()
    # A's expectation by hand: every clean visit-day at A weighs (fraud windows covering its day) / (clean entities that day)
    fv = f.assign(day=(f["timestamp"] - DAY0).dt.days)
    on = fv[fv["label"] == 1].groupby("entity_id")["day"].min()
    exp = 0.0
    for _, row in fv[fv["terminal"] == "A"].drop_duplicates(["entity_id", "day"]).iterrows():
        o = on.get(row["entity_id"])
        if o is not None and row["day"] >= o - 7:
            continue  # in its own window, or after its onset: not clean
        cover = sum(1 for x in on if x - 7 <= row["day"] <= x)
        n_clean = 6 + sum(1 for x in on if x > row["day"] + 7)
        exp += cover / n_clean
    assert common.loc["A", "expected_visit_days"] == pytest.approx(exp)
    p = common.loc["A"]
    assert p["p_value"] == pytest.approx(poisson.sf(p["fraud_visit_days"] - 1, p["expected_visit_days"]))
    # the first-fraud terminals Z0..Z3 are each one entity's: never ranked
    assert not r.table["point"].str.startswith("Z").any()


def test_no_shared_point_ranks_nothing():
    """Must fail to find a link: each fraud entity's window holds only its own terminals."""
    rows = []
    for i in range(4):
        for d in range(10):
            rows.append((f"F{i}", d + 0.5, f"own{i}-{d % 3}", int(d == 9)))
    for j in range(3):
        rows += [(f"C{j}", d + 0.5, "shared", 0) for d in range(10)]
    r = rank_points(canonical(rows), spec(), window_days=7)
    assert r.n_fraud_entities == 4 and len(r.table) == 0 and r.top(5) == []
    # ... and the same frame with one terminal two fraud entities share does rank it
    rows += [("F0", 7.2, "skimmer", 0), ("F1", 8.1, "skimmer", 0)]
    r2 = rank_points(canonical(rows), spec(), window_days=7)
    assert r2.top(1) == ["skimmer"]


def test_onset_day_is_counted_only_when_asked():
    rows = []
    for i in range(3):
        rows += [(f"F{i}", d + 0.2, "A", 0) for d in range(12)]
        rows.append((f"F{i}", 12.5, "X", 1))  # the fraud happens at X (a compromised terminal)
    rows += [(f"C{j}", d + 0.2, "A", 0) for j in range(4) for d in range(14)]
    f = canonical(rows)
    assert rank_points(f, spec(), window_days=3).top(1) == ["X"]
    without = rank_points(f, spec(), window_days=3, include_onset=False)
    assert "X" not in without.top(10)
    with pytest.raises(ValueError, match="window_days"):
        rank_points(f, spec(), window_days=0, include_onset=False)
    with pytest.raises(ValueError, match="window_days"):
        rank_points(f, spec(), window_days=2.5)


def test_point_field_comes_from_the_spec():
    assert point_field(spec()) == "terminal"
    assert point_field(spec(()), "mcc") == "mcc"
    with pytest.raises(ValueError, match="no link_points"):
        point_field(spec(()))
    with pytest.raises(ValueError, match="not a categorical field"):
        point_field(spec(), "risk")
    with pytest.raises(ValueError, match="link_points"):
        spec(("risk",))
    with pytest.raises(ValueError, match="link_points"):
        spec(("nope",))
    # another point field ranks its own values
    f = compromise_frame()
    r = rank_points(f, spec(), point="mcc", window_days=7)
    assert r.point_field == "mcc" and r.top(5) == ["5411"]  # the one MCC everybody uses: no excess
    assert 0.5 < r.table.iloc[0]["lift"] < 2


def test_confirmed_cases_count_as_fraud_entities(tmp_path):
    from engine.cases.store import CaseStore, source_id

    f = compromise_frame()
    f.loc[f["entity_id"] == "F3", "label"] = pd.array([0] * int((f["entity_id"] == "F3").sum()), dtype="Int8")
    assert fraud_onsets(f).index.tolist() == ["F0", "F1", "F2"]
    sha, src = "c" * 64, source_id("d" * 64, "links-tiny")
    f3 = f[f["entity_id"] == "F3"]
    top = f3.loc[f3["terminal"] == "Z3", "transaction_id"].iloc[0]
    summary = pd.DataFrame({"entity_id": ["F3", "C0"], "max_probability": [0.9, 0.8],
                            "max_transaction_id": [top, "t0"], "first_ts": [DAY0, DAY0], "last_ts": [DAY0, DAY0],
                            "max_amount": [10.0, 10.0], "n_transactions": [30, 45], "n_known_fraud": [0, 0]})
    with CaseStore(tmp_path / "cases.sqlite3", four_eyes=False) as store:
        store.upsert_cases(sha, summary, source_id=src)
        assert confirmed_from_store(store, sha, src) == {}
        cid = int(store.queue(sha, 0.0, source_id=src).set_index("entity_id").loc["F3", "case_id"])
        store.record_disposition(cid, "confirmed_fraud", "skimmed at X", analyst="alice")
        conf = confirmed_from_store(store, sha, src)
        states = case_states(store, sha, src)
    assert conf == {"F3": top}
    on = fraud_onsets(f, conf)
    assert on.index.tolist() == ["F0", "F1", "F2", "F3"]
    assert on["F3"] == f3.loc[f3["transaction_id"] == top, "timestamp"].iloc[0]
    assert rank_points(f, spec(), confirmed=conf, window_days=7).table.iloc[0]["fraud_entities"] == 4
    assert rank_points(f, spec(), window_days=7).table.set_index("point").loc["X", "fraud_entities"] == 3
    assert dict(zip(states["entity_id"], states["state"])) == {"F3": "confirmed_fraud", "C0": "open"}


def test_case_links_lists_the_entities_at_the_same_points_in_the_window():
    rows = []
    # the case K and two others visit X in the same days; L visits X a month later (outside the window)
    rows += [("K", 10.5, "X", 0), ("K", 11.5, "Y", 0), ("K", 12.5, "Q", 1)]
    rows += [("M", 9.5, "X", 0), ("M", 11.7, "Y", 0), ("M", 12.8, "Q", 1)]
    rows += [("N", 8.5, "X", 0), ("N", 30.0, "A", 0)]
    rows += [("L", 45.0, "X", 0), ("L", 46.0, "A", 0)]
    f = canonical(rows)
    scores = pd.DataFrame({"entity_id": f["entity_id"], "probability": np.linspace(0.1, 0.9, len(f))})
    cases = pd.DataFrame({"entity_id": ["M", "N"], "case_id": [7, 8], "state": ["confirmed_fraud", "open"]})
    r = rank_points(f, spec(), window_days=7)
    cl = case_links(f, spec(), "K", window_days=7, ranking=r, scores=scores, cases=cases)
    assert cl.anchor == "first fraud" and cl.window_end - cl.window_start == pd.Timedelta(days=8)
    assert cl.window_start == DAY0 + pd.Timedelta(days=5)
    assert cl.linked["entity_id"].tolist() == ["M", "N"]  # L is outside the window
    m = cl.linked.iloc[0]
    assert m["shared_points"] == 3 and m["points"] == "Q, X, Y" and bool(m["fraud_entity"])
    assert m["case_state"] == "confirmed_fraud" and m["case_id"] == 7
    assert m["max_probability"] == pytest.approx(scores.loc[f["entity_id"] == "M", "probability"].max())
    n = cl.linked.iloc[1]
    assert n["shared_points"] == 1 and not n["fraud_entity"] and n["case_state"] == "open"
    pts = cl.points.set_index("point")
    assert pts.loc["X", "linked_entities"] == 2 and pts.loc["Y", "linked_entities"] == 1
    assert pts.loc["X", "rank"] == r.table.set_index("point").loc["X", "rank"]
    # an entity without fraud: the window ends at the query time given
    cl2 = case_links(f, spec(), "L", window_days=7, at=DAY0 + pd.Timedelta(days=46))
    assert cl2.anchor == "query" and cl2.linked.empty  # nobody else at X or A in those days
    with pytest.raises(KeyError):
        case_links(f, spec(), "nobody")
    # the network: K, M, N and the points X, Y, Q
    g = link_graph(cl)
    kinds = sorted(d["kind"] for _, d in g.nodes(data=True))
    assert kinds.count("entity") == 3 and kinds.count("point") == 3
    assert g.has_edge(("entity", "N"), ("point", "X")) and not g.has_edge(("entity", "N"), ("point", "Y"))
    _, pos = network_positions(cl)
    _, pos2 = network_positions(cl)
    assert pos == pos2  # seeded layout


def test_network_figure_shows_data_text_as_text():
    rows = [("K", 1.5, "<b>X</b>", 0), ("K", 2.5, "Y", 1), ("<img src=x>", 1.7, "<b>X</b>", 0),
            ("<img src=x>", 2.6, "Y", 1)]
    f = canonical(rows)
    cl = case_links(f, spec(), "K", window_days=3, cases=pd.DataFrame(
        {"entity_id": ["<img src=x>"], "case_id": [1], "state": ["<i>open</i>"]}))
    fig = link_network_figure(cl, point_label="terminal")
    texts = [t for tr in fig.data if tr.text is not None for t in tr.text]
    joined = " ".join(texts)
    assert "&lt;b&gt;X&lt;/b&gt;" in joined and "&lt;img src=x&gt;" in joined and "&lt;i&gt;open&lt;/i&gt;" in joined
    assert "<b>" not in joined and "<img" not in joined and "<i>" not in joined
    assert {tr.name for tr in fig.data if tr.name} == {"this case", "fraud entity", "terminal"}
