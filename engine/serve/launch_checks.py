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
