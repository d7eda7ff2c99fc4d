"""Generated access attacks (issue 12, items 1-2): server paths outside the data roots, lookalike
user names at sign-in, and listening beyond this machine without sign-in. One parametrised case
per attack class; every case is built by code here (no copied files)."""

from __future__ import annotations

import re

import os
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from engine.serve import access as ac
from engine.serve import paths as sp

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "dashboard" / "app.py")
PW = "correct horse battery staple"
SECRET = "FRAUDLENS-HOSTILE-SECRET-7f3a"

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A data root with one CSV, a secret file outside it, the secret in this process's
    environment (so /proc/self/environ holds it), a credentials file and a temp case store."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "ok.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    secret = tmp_path / "outside" / "pseudonym.key"
    secret.parent.mkdir()
    secret.write_text(f"{SECRET}\n", encoding="utf-8")
    users = tmp_path / "users.toml"
    ac.add_user(users, "alice", "analyst", PW)
    ac.THROTTLE.reset("alice")
    monkeypatch.setenv("FRAUDLENS_TEST_SECRET", SECRET)
    monkeypatch.setenv(sp.ENV_DATA_ROOTS, str(root))
    monkeypatch.setenv("FRAUDLENS_USERS", str(users))
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "store"))
    for v in ("FRAUDLENS_DEMO", "FRAUDLENS_DATA", "FRAUDLENS_SPEC", "FRAUDLENS_MODEL", "FRAUDLENS_ANALYST"):
        monkeypatch.delenv(v, raising=False)
    return {"root": root, "secret": secret, "users": users, "tmp": tmp_path}


def _attack_path(kind: str, w: dict) -> str:
    if kind == "etc_passwd":
        return "/etc/passwd"
    if kind == "traversal":  # starts inside the root, climbs out
        return str(w["root"]) + "/../outside/pseudonym.key"
    if kind == "deep_traversal":
        return str(w["root"]) + "/" + "../" * 12 + "etc/passwd"
    if kind == "symlink_out":
        link = w["root"] / "innocent.csv"
        link.symlink_to(w["secret"])
        return str(link)
    if kind == "symlinked_dir_out":
        d = w["root"] / "more"
        d.symlink_to(w["secret"].parent, target_is_directory=True)
        return str(d / "pseudonym.key")
    if kind == "proc_environ":
        return "/proc/self/environ"
    raise AssertionError(kind)


PATH_ATTACKS = ["etc_passwd", "traversal", "deep_traversal", "symlink_out", "symlinked_dir_out", "proc_environ"]


@pytest.mark.parametrize("kind", PATH_ATTACKS)
def test_paths_outside_the_roots_are_refused(world, kind):
    path = _attack_path(kind, world)
    with pytest.raises(sp.PathNotAllowed, match="not inside a data root"):
        sp.check_path(path)
    assert all(SECRET not in str(p) for p in sp.list_files())  # and never offered in the page's list
    assert (world["root"] / "ok.csv").resolve() in sp.list_files()


@pytest.mark.parametrize("kind", PATH_ATTACKS)
def test_the_page_never_reads_or_echoes_a_path_outside_the_roots(world, kind):
    """The Cases page has no free-text path box; a session source outside the roots (as a
    tampered session would hold) is refused before it is opened, and no file text is shown."""
    from dashboard.components.access import SESSION_KEY

    path = _attack_path(kind, world)
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state[SESSION_KEY] = ac.Identity("alice", "analyst", "password")
    at.session_state["source"] = {"kind": "path", "path": path, "spec": "demo", "label": "x", "max_rows": None}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not [t for t in at.text_input if t.key in ("src_path", "model_dir")]
    plain = [re.sub(r"\\(.)", r"\1", e.value) for e in at.error]  # shown markdown-escaped: as text
    assert plain and plain[0].startswith("Not allowed:"), plain
    shown = " ".join(str(getattr(el, "value", "")) for el in at.main.children.values())
    shown += " ".join(plain)
    assert SECRET not in shown and "root:x:0:0" not in shown


LOOKALIKES = {
    "cyrillic_a": "\u0430lice",  # Cyrillic а
    "zero_width_space": "alice\u200b",
    "zero_width_joiner": "al\u200dice",
    "fullwidth": "\uff41lice",
    "upper_case": "Alice",
    "surrounding_space": " alice ",
    "nul": "alice\x00",
    "reserved_system": "system",
    "reserved_demo": "demo",
}


@pytest.mark.parametrize("kind", list(LOOKALIKES))
def test_lookalike_names_neither_sign_in_nor_get_created(world, kind):
    name = LOOKALIKES[kind]
    with pytest.raises(ac.SignInError, match="unknown user or wrong password"):
        ac.authenticate(world["users"], name, PW)  # alice's password, under a lookalike of her name
    with pytest.raises(ac.UsersFileError):
        ac.add_user(world["users"], name, "supervisor", PW)
    assert set(ac.load_users(world["users"])) == {"alice"}


@pytest.mark.parametrize("kind", ["cyrillic_a", "zero_width_space", "reserved_system"])
def test_lookalike_names_are_refused_by_the_sign_in_form(world, kind):
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert at.title[0].value == "Sign in to fraudlens" and not at.dataframe
    at.text_input(key="signin_name").input(LOOKALIKES[kind])
    at.text_input(key="signin_password").input(PW)
    at.button(key="FormSubmitter:signin_form-Sign in").click().run()
    assert any("unknown user or wrong password" in e.value for e in at.error)
    assert at.title[0].value == "Sign in to fraudlens" and not at.dataframe and not at.metric


BIND_ATTACKS = {"all_ipv4": ["--address", "0.0.0.0"], "all_ipv6": ["--address", "::"],
                "lan_ip": ["--address", "10.0.0.7"], "empty": ["--address", ""],
                "demo_on_all": ["--address", "0.0.0.0", "--demo"]}


@pytest.mark.parametrize("kind", list(BIND_ATTACKS))
def test_listening_beyond_this_machine_without_sign_in_is_refused(world, kind, monkeypatch):
    from engine.cli import app

    if kind != "demo_on_all":
        monkeypatch.delenv("FRAUDLENS_USERS")  # no sign-in configured
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("the server was started"))
    monkeypatch.setattr(Path, "home", lambda: world["tmp"])  # no ~/.streamlit/secrets.toml
    res = CliRunner().invoke(app, ["dashboard", "--port", "1", *BIND_ATTACKS[kind]])
    assert res.exit_code == 2, res.output
    assert ("demo mode" if kind == "demo_on_all" else "without sign-in") in " ".join(res.output.split())
