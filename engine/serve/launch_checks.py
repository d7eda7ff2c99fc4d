"""Checks before the dashboard starts: a sign-in configured in Streamlit secrets, a free port."""

from __future__ import annotations

from pathlib import Path


def secrets_have_auth(root: Path) -> bool:
    """True if a Streamlit secrets file the dashboard will read (the repository's
    ``root/.streamlit/secrets.toml`` or ``~/.streamlit/secrets.toml``) has an ``[auth]`` table."""
    import tomllib

    for p in (root / ".streamlit" / "secrets.toml", Path.home() / ".streamlit" / "secrets.toml"):
        try:
            if "auth" in tomllib.loads(p.read_text(encoding="utf-8")):
                return True
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
    return False


def port_free(address: str, port: int) -> bool:
    """True if nothing listens on ``address``:``port`` (a bind test, SO_REUSEADDR as the server)."""
    import socket

    try:
        infos = socket.getaddrinfo(address or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False
    for fam, typ, proto, _, addr in infos:
        with socket.socket(fam, typ, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(addr)
            except OSError:
                return False
    return True


def model_spec_file(bundle) -> Path:
    """The spec a checkpoint was trained with, as the dashboard's ``--spec``: a built-in spec's name
    when the checkpoint's spec is that built-in spec unchanged, else a TOML file written once to
    ``$FRAUDLENS_DATA_DIR/specs/model-<sha12>.toml`` (folder 0700, file 0600, replaced atomically),
    so ``fraudlens dashboard --data F --model M`` reads ``F`` as ``score`` and ``explain`` do (it
    used the demo spec, and the page failed with "columns required by spec 'demo' not found").

    Raises:
        OSError: the data folder cannot be written.
    """
    from engine.cases.store.common import default_db_path
    from engine.data.spec import builtin_specs, load_spec
    from engine.serve.history import private_dirs

    spec = bundle.spec
    if spec.name in builtin_specs() and load_spec(spec.name) == spec:
        return Path(spec.name)
    folder = private_dirs(default_db_path().parent / "specs")
    out = folder / f"model-{bundle.short_sha}.toml"
    text = spec.to_toml()
    if out.is_file() and not out.is_symlink() and out.read_text(encoding="utf-8") == text:
        return out
    from engine.data.csv_writer import write_private_text

    return write_private_text(out, text)  # random temporary name, removed on failure
