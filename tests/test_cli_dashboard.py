"""``fraudlens dashboard`` and ``fraudlens users``: the credentials file the CLI writes, a taken port,
and (slow) a real server: 'ready' only when the first page can be served, listening on 127.0.0.1
only, and stopped with the PID the CLI was started under."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.cli import app
from engine.serve import access as ac

ROOT = Path(__file__).resolve().parents[1]
PW = "correct horse battery staple"


def test_users_add_prompts_and_writes_only_the_hash(tmp_path, monkeypatch):
    p = tmp_path / "users.toml"
    monkeypatch.setenv("FRAUDLENS_USERS", str(p))
    res = CliRunner().invoke(app, ["users", "add", "alice", "--role", "supervisor"], input=f"{PW}\n{PW}\n")
    assert res.exit_code == 0, res.output
    assert "alice: supervisor, password (argon2id hash)" in res.output
    text = p.read_text(encoding="utf-8")
    assert PW not in text and "$argon2id$" in text
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    assert ac.authenticate(p, "alice", PW) == ac.Identity("alice", "supervisor", "password")
    res = CliRunner().invoke(app, ["users", "add", "bob", "--role", "analyst"], input=f"{PW}\n{PW}x\n{PW}\n{PW}\n")
    assert res.exit_code == 0 and "do not match" in res.output  # typer's confirmation re-asks
    res = CliRunner().invoke(app, ["users", "add", "carol@bank.example", "--role", "auditor", "--oidc"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["users", "list"])
    assert res.output.split() == ["alice", "supervisor", "password", "bob", "analyst", "password",
                                  "carol@bank.example", "auditor", "identity", "provider"]
    assert "$argon2" not in res.output


@pytest.mark.parametrize("name,role,msg", [("\u0430lice", "analyst", "invalid user name"),
                                           ("system", "analyst", "reserved"), ("dave", "root", "unknown role")])
def test_users_add_refuses_bad_names_and_roles(tmp_path, name, role, msg):
    res = CliRunner().invoke(app, ["users", "add", name, "--role", role, "--file", str(tmp_path / "u.toml")],
                             input=f"{PW}\n{PW}\n")
    assert res.exit_code == 2 and msg in res.output
    assert not (tmp_path / "u.toml").exists()


def test_dashboard_refuses_a_taken_port(monkeypatch):
    monkeypatch.delenv("FRAUDLENS_USERS", raising=False)
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("the server was started"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = CliRunner().invoke(app, ["dashboard", "--port", str(port)])
    assert res.exit_code == 2
    assert f"port {port} on 127.0.0.1 is already in use" in res.output


@pytest.mark.parametrize("how", ["users_file", "oidc_secrets"])
def test_dashboard_listens_elsewhere_only_with_sign_in(tmp_path, monkeypatch, how):
    monkeypatch.delenv("FRAUDLENS_USERS", raising=False)
    monkeypatch.delenv("FRAUDLENS_DEMO", raising=False)
    monkeypatch.setattr(Path, "home", lambda: tmp_path)
    if how == "users_file":
        ac.add_user(tmp_path / "u.toml", "alice", "analyst", PW)
        monkeypatch.setenv("FRAUDLENS_USERS", str(tmp_path / "u.toml"))
    else:
        (tmp_path / ".streamlit").mkdir()
        (tmp_path / ".streamlit" / "secrets.toml").write_text(
            '[auth]\nredirect_uri = "http://x/oauth2callback"\ncookie_secret = "s"\n', encoding="utf-8")
    started = []

    def fake_exec(exe, argv, env):
        started.append((argv, env))
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", fake_exec)
    monkeypatch.chdir(tmp_path)
    port = _free_port()
    res = CliRunner().invoke(app, ["dashboard", "--address", "0.0.0.0", "--port", str(port)])
    assert res.exit_code == 0, res.output
    argv, env = started[0]
    assert argv[1:] == ["-m", "dashboard.launch", "--address", "0.0.0.0", "--port", str(port)]
    assert env["FRAUDLENS_DEMO"] == ""
    assert "sign-in required" in res.output


def test_dashboard_defaults_to_127_0_0_1(monkeypatch, tmp_path):
    monkeypatch.delenv("FRAUDLENS_USERS", raising=False)
    started = []
    monkeypatch.setattr(os, "execve", lambda exe, argv, env: started.append(argv) or (_ for _ in ()).throw(SystemExit(0)))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["dashboard", "--port", str(_free_port())])
    assert res.exit_code == 0, res.output
    assert started[0][started[0].index("--address") + 1] == "127.0.0.1"


def test_dashboard_reads_data_with_the_models_spec_when_no_spec_is_given(monkeypatch, tmp_path):
    """New-user trial: ``dashboard --data F --model M`` read ``F`` with the demo spec (the warm-up
    failed with "columns required by spec 'demo' not found" and the page with it), where score and
    explain use the model's spec."""
    from engine.data.spec import load_spec
    from engine.model.checkpoint import load_checkpoint
    from tiny_models import tiny_checkpoint, tiny_frame, tiny_spec

    monkeypatch.delenv("FRAUDLENS_USERS", raising=False)
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "store"))
    tiny_checkpoint(tiny_frame(), tiny_spec(), tmp_path / "m", {"thresholds": {"review": 0.5}})
    bundle = load_checkpoint(tmp_path / "m")
    (tmp_path / "f.csv").write_text("x\n", encoding="utf-8")
    started = []
    monkeypatch.setattr(os, "execve", lambda exe, argv, env: started.append(env) or (_ for _ in ()).throw(SystemExit(0)))
    for _ in range(2):  # the second run finds the file it wrote
        res = CliRunner().invoke(app, ["dashboard", "--port", str(_free_port()), "--data", str(tmp_path / "f.csv"),
                                       "--model", str(tmp_path / "m")])
        assert res.exit_code == 0, res.output
    spec_file = Path(started[-1]["FRAUDLENS_SPEC"])
    assert spec_file == (tmp_path / "store" / "specs" / f"model-{bundle.short_sha}.toml").resolve()
    assert load_spec(spec_file) == bundle.spec
    assert stat.S_IMODE(os.stat(spec_file).st_mode) == 0o600
    assert "with the model's spec" in res.output
    # an explicit --spec wins; without --model the demo spec stays the default (no file written)
    CliRunner().invoke(app, ["dashboard", "--port", str(_free_port()), "--data", str(tmp_path / "f.csv"),
                             "--model", str(tmp_path / "m"), "--spec", "handbook"])
    assert started[-1]["FRAUDLENS_SPEC"] == "handbook"
    CliRunner().invoke(app, ["dashboard", "--port", str(_free_port()), "--data", str(tmp_path / "f.csv")])
    assert "FRAUDLENS_SPEC" not in started[-1] or started[-1]["FRAUDLENS_SPEC"] == os.environ.get("FRAUDLENS_SPEC")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lan_ip() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: picks the outgoing interface
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def _serving(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.slow
def test_dashboard_ready_local_only_and_stopped_by_its_pid(tmp_path):
    port = _free_port()
    env = {**os.environ, "FRAUDLENS_DATA_DIR": str(tmp_path / "store"), "FRAUDLENS_DEMO": ""}
    env.pop("FRAUDLENS_USERS", None)
    log = tmp_path / "dash.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "dashboard", "--port", str(port), "--demo"],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 240
        healthy_before_warm = []
        while "dashboard ready" not in log.read_text(encoding="utf-8", errors="replace"):
            assert proc.poll() is None and time.time() < deadline, log.read_text(encoding="utf-8")[-3000:]
            before = log.read_text(encoding="utf-8", errors="replace")
            try:  # the server only answers once the model and data are loaded (the first page's work)
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1)
                healthy_before_warm.append("model and data loaded" not in before)
            except OSError:
                pass
            time.sleep(0.2)
        text = log.read_text(encoding="utf-8")
        assert text.index("model and data loaded") < text.index("dashboard ready")
        assert not any(healthy_before_warm)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=5) as r:
            assert r.read() == b"ok"
        lan = _lan_ip()
        if lan:
            assert not _serving(lan, port)  # 127.0.0.1 only
        os.kill(proc.pid, signal.SIGTERM)  # the PID the CLI was started under
        proc.wait(30)
        assert not _serving("127.0.0.1", port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_help_shows_literal_brackets_and_the_cli_has_a_version():
    from importlib.metadata import version

    from typer.testing import CliRunner

    from engine.cli import app

    r = CliRunner().invoke(app, ["dashboard", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "[auth] in .streamlit/secrets.toml" in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"fraudlens {version('fraudlens')}"
