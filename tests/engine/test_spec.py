"""engine.data.spec: built-in specs, validation, TOML round trip."""

from __future__ import annotations

import tomllib

import pytest

from engine.data.spec import (
    ColumnRole,
    DatasetSpec,
    FieldKind,
    builtin_specs,
    load_spec,
    spec_from_dict,
)


def minimal(**over) -> dict:
    d = {
        "name": "m",
        "entity": {"columns": ["card"]},
        "timestamp": {"column": "when"},
        "amount": {"column": "amt"},
    }
    d.update(over)
    return d


def test_builtin_specs_load():
    assert {"tabformer", "handbook", "banksim", "demo"} <= set(builtin_specs())
    for name in builtin_specs():
        spec = load_spec(name)
        assert isinstance(spec, DatasetSpec) and spec.name == name


def test_tabformer_spec_roles():
    s = load_spec("tabformer")
    assert s.entity.columns == ["User", "Card"] and s.entity.separator == ":"
    assert s.timestamp.parts == {"year": "Year", "month": "Month", "day": "Day", "time": "Time"}
    assert s.amount.column == "Amount"
    assert (s.label.column, s.label.positive, s.label.negative) == ("Is Fraud?", ["Yes"], ["No"])
    by = {f.name: f for f in s.fields}
    assert list(by) == ["merchant", "merchant_city", "merchant_state", "zip", "mcc", "use_chip", "errors"]
    assert (by["merchant"].column, by["merchant"].hashed_buckets) == ("Merchant Name", 4096)
    assert by["merchant_city"].hashed_buckets == 1024 and by["zip"].hashed_buckets == 1024
    assert by["zip"].normalize == "zip5"
    assert by["mcc"].kind is FieldKind.CATEGORICAL and by["mcc"].hashed_buckets is None
    assert by["errors"].kind is FieldKind.MULTI_VALUED and by["errors"].separator == ","
    assert s.passthrough == [] and "Fraud Episode" not in s.required_columns()
    assert s.roles()["Errors?"] is ColumnRole.MULTI_VALUED


def test_demo_is_tabformer_plus_passthrough():
    t, d = load_spec("tabformer"), load_spec("demo")
    assert d.passthrough == ["Fraud Episode", "Fraud Kind", "Fraud Cause"]
    strip = {"name", "description", "passthrough"}
    assert t.model_dump(exclude=strip) == d.model_dump(exclude=strip)
    assert set(d.required_columns()) == set(t.required_columns()) | {"Fraud Episode", "Fraud Kind", "Fraud Cause"}


def test_handbook_and_banksim_specs():
    h = load_spec("handbook")
    assert h.id == "TRANSACTION_ID" and h.entity.columns == ["CUSTOMER_ID"]
    assert h.timestamp.column == "TX_DATETIME" and h.amount.column == "TX_AMOUNT"
    assert [(f.name, f.column, f.hashed_buckets) for f in h.fields] == [("terminal", "TERMINAL_ID", 16384)]
    assert (h.label.column, h.label.positive, h.label.negative) == ("TX_FRAUD", ["1"], ["0"])
    assert h.passthrough == ["TX_FRAUD_SCENARIO"]
    assert h.ignored == ["TX_TIME_SECONDS", "TX_TIME_DAYS"]
    assert "TX_TIME_DAYS" not in h.required_columns()
    b = load_spec("banksim")
    assert (b.timestamp.column, b.timestamp.unit, b.timestamp.origin) == ("step", "D", "2014-01-01")
    assert "arbitrary" in b.description
    assert {f.name: f.kind.value for f in b.fields} == {
        "merchant": "categorical", "category": "categorical", "age": "categorical", "gender": "categorical"
    }
    assert b.fields[0].hashed_buckets == 1024


@pytest.mark.parametrize("name", ["tabformer", "handbook", "banksim", "demo"])
def test_toml_round_trip(name):
    s = load_spec(name)
    again = spec_from_dict(tomllib.loads(s.to_toml()))
    assert again == s


def test_toml_escapes_awkward_text(tmp_path):
    s = spec_from_dict(minimal(description='line 1\nline "2"\t\\ end', passthrough=["a b?", "ü"]))
    p = tmp_path / "s.toml"
    p.write_text(s.to_toml())
    assert load_spec(p) == s


def test_one_role_per_column():
    with pytest.raises(ValueError, match="'fraud' is both label and field"):
        spec_from_dict(minimal(label={"column": "fraud"},
                               fields=[{"name": "f", "column": "fraud", "kind": "categorical"}]))
    with pytest.raises(ValueError, match="'card' is both entity and passthrough"):
        spec_from_dict(minimal(passthrough=["card"]))
    # two fields may read the same column
    s = spec_from_dict(minimal(fields=[{"name": "m1", "column": "m", "kind": "categorical"},
                                       {"name": "m2", "column": "m", "kind": "categorical", "hashed_buckets": 64}]))
    assert s.required_columns() == ["card", "when", "amt", "m"]


def test_validation_errors():
    with pytest.raises(ValueError, match="both positive and negative"):
        spec_from_dict(minimal(label={"column": "y", "positive": ["1"], "negative": ["1", "0"]}))
    with pytest.raises(ValueError, match="reserved"):
        spec_from_dict(minimal(fields=[{"name": "amount", "column": "x", "kind": "numeric"}]))
    with pytest.raises(ValueError, match="would clash"):
        spec_from_dict(minimal(passthrough=["label"]))
    with pytest.raises(ValueError, match="exactly one of 'column' or 'parts'"):
        spec_from_dict(minimal(timestamp={}))
    with pytest.raises(ValueError, match="'unit' needs an 'origin'"):
        spec_from_dict(minimal(timestamp={"column": "step", "unit": "D"}))
    with pytest.raises(ValueError, match="<dict>: invalid dataset spec"):
        spec_from_dict(minimal(colour="red"))


def test_load_spec_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a built-in spec"):
        load_spec("no_such_spec")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(ValueError, match=f"{bad}: invalid TOML"):
        load_spec(bad)
    inv = tmp_path / "inv.toml"
    inv.write_text('name = "x"\n')
    with pytest.raises(ValueError, match=f"{inv}: invalid dataset spec"):
        load_spec(inv)


def test_spec_key_is_the_name_for_a_builtin_and_the_content_for_any_other(tmp_path):
    """Case and explanation-cache keys use spec_key: a spec that shares a built-in's name but reads
    the file differently (cards instead of users as entities) must get another key."""
    from engine.data.spec import SPEC_DIR, load_spec, spec_key

    text = (SPEC_DIR / "demo.toml").read_text()
    assert spec_key(load_spec("demo")) == "demo"
    copy = tmp_path / "copy.toml"
    copy.write_text(text)
    assert spec_key(load_spec(copy)) == "demo"  # same content, same source
    users = tmp_path / "users.toml"
    users.write_text(text.replace('columns = ["User", "Card"]', 'columns = ["User"]', 1))
    other = tmp_path / "other.toml"
    other.write_text(text.replace('hashed_buckets = 4096', 'hashed_buckets = 2048', 1))
    k_users, k_other = spec_key(load_spec(users)), spec_key(load_spec(other))
    assert load_spec(users).name == "demo" and k_users.startswith("demo@") and len(k_users) == len("demo@") + 12
    assert k_other.startswith("demo@") and k_other != k_users
    assert spec_key(load_spec(users)) == k_users  # stable


def test_a_same_named_spec_is_another_case_source(tmp_path):
    from types import SimpleNamespace

    from dashboard.components import data_source_id
    from engine.cases import view as cv
    from engine.data.spec import SPEC_DIR
    from tiny_models import demo_slice

    data = demo_slice(tmp_path / "tx.csv", 200)
    users = tmp_path / "users.toml"
    users.write_text((SPEC_DIR / "demo.toml").read_text().replace('columns = ["User", "Card"]', 'columns = ["User"]', 1))
    a = SimpleNamespace(source=cv.load_source(data, "demo"), src={"spec": "demo"})
    b = SimpleNamespace(source=cv.load_source(data, users), src={"spec": str(users)})
    assert a.source.spec.name == b.source.spec.name == "demo"
    assert data_source_id(a).endswith("/demo")
    assert data_source_id(b) != data_source_id(a) and data_source_id(b).startswith(data_source_id(a) + "@")
