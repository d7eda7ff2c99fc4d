"""Identity, roles and the local credentials file (no Streamlit here).

* **Roles** (:data:`ROLES`) and what each may do (:data:`PERMISSIONS`): ``analyst`` works cases
  (assign, disposition, notes); ``supervisor`` can do everything an analyst can, plus approve a
  four-eyes disposition and change thresholds; ``auditor`` reads cases and the audit screen,
  never writes; ``admin`` manages users. :func:`require` raises :class:`AccessDenied` before an
  action; pages call it before every write, not only to hide a button.
* **User names** (:func:`validate_username`): lower-case ASCII letters, digits and ``. _ - @ +``
  (an e-mail address for sign-in through an identity provider), nothing else: a zero-width
  space, a Cyrillic "а" or an upper-case lookalike is refused, never normalised onto another
  user; ``system`` and ``demo`` are reserved.
* **Credentials file** (``$FRAUDLENS_USERS``, TOML, mode 0600): one table per user with its
  ``role`` and, for password sign-in, an argon2id ``password_hash`` (argon2-cffi). Users who sign
  in through the identity provider (Streamlit's ``st.login``) are listed by e-mail with a role
  and no hash. Written only by :func:`add_user` (``fraudlens users add``).
* **Bind rule** (:func:`check_bind`): the dashboard listens on 127.0.0.1 unless the operator asks
  for another address, and another address is refused unless sign-in is configured; demo mode
  (a demo user signed in automatically) only on a loopback address.
"""

from __future__ import annotations

import ipaddress
import os
import re
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ENV_USERS = "FRAUDLENS_USERS"
ENV_DEMO = "FRAUDLENS_DEMO"

ROLES = ("analyst", "supervisor", "auditor", "admin")
VIEW_CASES, CHOOSE_DATA, ASSIGN, DISPOSITION, NOTE = "view_cases", "choose_data", "assign", "disposition", "note"
APPROVE, SET_THRESHOLDS, VIEW_AUDIT, MANAGE_USERS = "approve", "set_thresholds", "view_audit", "manage_users"
_WORK = {VIEW_CASES, CHOOSE_DATA, ASSIGN, DISPOSITION, NOTE}
#: role -> the actions it may take
PERMISSIONS: dict[str, frozenset[str]] = {
    "analyst": frozenset(_WORK),
    "supervisor": frozenset(_WORK | {APPROVE, SET_THRESHOLDS, VIEW_AUDIT}),
    "auditor": frozenset({VIEW_CASES, CHOOSE_DATA, VIEW_AUDIT}),
    "admin": frozenset({MANAGE_USERS}),  # no case data: the audit log holds entities, notes, amounts
}
#: what each action is called in a refusal
ACTION_LABELS = {VIEW_CASES: "view cases", CHOOSE_DATA: "choose data", ASSIGN: "assign cases",
                 DISPOSITION: "record a disposition", NOTE: "add a note", APPROVE: "approve a four-eyes disposition",
                 SET_THRESHOLDS: "change thresholds", VIEW_AUDIT: "view the audit log", MANAGE_USERS: "manage users"}
RESERVED_NAMES = frozenset({"system", "demo"})
DEMO_USER = "demo"
DEMO_ROLE = "supervisor"
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._@+-]{0,127}")
_LOOPBACK_NAMES = {"localhost"}
#: sign-in throttle: at most this many wrong passwords per user name and client within the window (s)
MAX_FAILURES, FAILURE_WINDOW_S = 5, 900.0
#: ... and this many failed sign-ins per client address over names that are not users; counters kept at most
MAX_CLIENT_FAILURES, MAX_THROTTLE_KEYS = 20, 10_000


class AccessError(Exception):
    """Base class of the errors of this module."""


class AccessDenied(AccessError, PermissionError):
    """The signed-in user's role does not allow the action (or nobody is signed in)."""


class SignInError(AccessError, PermissionError):
    """Unknown user, wrong password, a user without a password hash, or too many failures."""


class UsersFileError(AccessError, ValueError):
    """The credentials file is missing, unreadable, not TOML, or holds an invalid entry."""


class BindError(AccessError, ValueError):
    """The dashboard was asked to listen beyond this machine without sign-in configured."""


@dataclass(frozen=True)
class Identity:
    """A signed-in user: ``name`` (validated), ``role`` (one of :data:`ROLES`) and ``method``
    (``password``, ``oidc`` or ``demo``). Only this module and the sign-in page make one."""

    name: str
    role: str
    method: str

    def can(self, action: str) -> bool:
        """True if this user's role allows ``action`` (one of the action constants)."""
        return action in PERMISSIONS.get(self.role, frozenset())


@dataclass(frozen=True)
class UserRecord:
    """One entry of the credentials file: role and argon2 hash (``None``: identity-provider user)."""

    name: str
    role: str
    password_hash: str | None


def can(identity: Identity | None, action: str) -> bool:
    """True if ``identity`` is signed in and its role allows ``action``."""
    return identity is not None and identity.can(action)


def require(identity: Identity | None, action: str) -> Identity:
    """Return ``identity`` if its role allows ``action``; else raise :class:`AccessDenied`
    (a one-line message naming the role and the action)."""
    if identity is None:
        raise AccessDenied(f"sign in to {ACTION_LABELS.get(action, action)}")
    if not identity.can(action):
        raise AccessDenied(f"your role ({identity.role}) may not {ACTION_LABELS.get(action, action)}")
    return identity


def validate_username(name: object) -> str:
    """``name`` if it is a valid user name, else raise :class:`UsersFileError`.

    Valid: 1-128 characters of lower-case ASCII letters, digits and ``. _ - @ +``, starting with
    a letter or digit, not one of :data:`RESERVED_NAMES`. Nothing is normalised: a lookalike (a
    zero-width space, a Cyrillic letter, upper case, surrounding spaces) is an error, so it can
    never become another user's name.
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        shown = ascii(name)[:60]
        raise UsersFileError(f"invalid user name {shown}: use 1-128 lower-case ASCII letters, digits and . _ - @ +")
    if name in RESERVED_NAMES:
        raise UsersFileError(f"user name {name!r} is reserved")
    return name


def validate_role(role: object) -> str:
    """``role`` if it is one of :data:`ROLES`, else raise :class:`UsersFileError`."""
    if role not in ROLES:
        raise UsersFileError(f"unknown role {ascii(role)[:40]}: one of {', '.join(ROLES)}")
    return role  # type: ignore[return-value]


# ---------------------------------------------------------------------------- credentials file
def users_path(env: dict[str, str] | None = None) -> Path | None:
    """The credentials file named by ``$FRAUDLENS_USERS`` (``None`` when unset or empty)."""
    v = (os.environ if env is None else env).get(ENV_USERS, "").strip()
    return Path(v).expanduser() if v else None


#: the last parsed credentials file per path: (its bytes, users). A page run asks for the signed-in
#: user's role several times; the file is read every time (a few hundred bytes) and parsed again
#: only when its bytes differ. Keyed by content, not by modification time: an edit within the
#: file system's timestamp granularity (or an inode reused by the next rename) is never missed.
_USERS_CACHE: dict[str, tuple[bytes, dict[str, UserRecord]]] = {}
_USERS_CACHE_LOCK = threading.Lock()


def load_users(path: str | Path) -> dict[str, UserRecord]:
    """Read the credentials file: user name -> :class:`UserRecord` (a new dict on every call).

    The file is read on every call; its parse is reused while its bytes are unchanged.

    Raises :class:`UsersFileError` (naming the file and the user) if the file cannot be read, is
    not TOML, or an entry has an invalid name, role or hash.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise UsersFileError(f"{p}: no such credentials file (create it with `fraudlens users add`)") from None
    except OSError as e:
        raise UsersFileError(f"{p}: cannot read ({type(e).__name__})") from None
    with _USERS_CACHE_LOCK:
        hit = _USERS_CACHE.get(str(p))
    if hit is not None and hit[0] == raw:
        return dict(hit[1])
    out = _parse_users(p, raw)
    with _USERS_CACHE_LOCK:
        _USERS_CACHE[str(p)] = (raw, out)
    return dict(out)


def _parse_users(p: Path, raw: bytes) -> dict[str, UserRecord]:
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UsersFileError(f"{p}: cannot read ({type(e).__name__})") from None
    except tomllib.TOMLDecodeError as e:
        raise UsersFileError(f"{p}: not valid TOML ({e})") from None
    users = doc.get("users", {})
    if not isinstance(users, dict):
        raise UsersFileError(f"{p}: [users] must be a table")
    out = {}
    for name, entry in users.items():
        try:
            validate_username(name)
            if not isinstance(entry, dict):
                raise UsersFileError("entry must be a table")
            role = validate_role(entry.get("role"))
            h = entry.get("password_hash")
            if h is not None and (not isinstance(h, str) or not h.startswith("$argon2")):
                raise UsersFileError("password_hash must be an argon2 hash")
        except UsersFileError as e:
            raise UsersFileError(f"{p}: user {ascii(name)[:60]}: {e}") from None
        out[name] = UserRecord(name=name, role=role, password_hash=h)
    return out


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_users(path: str | Path, users: dict[str, UserRecord]) -> Path:
    """Write ``users`` to ``path`` atomically (a temp file in the same folder, mode 0600, then
    renamed over the old one); the folder is created 0700 if missing. Returns the path."""
    p = Path(path)
    p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lines = ["# fraudlens users: written by `fraudlens users add`; passwords are argon2id hashes", ""]
    for u in sorted(users.values(), key=lambda u: u.name):
        lines += [f"[users.{_toml_str(u.name)}]", f"role = {_toml_str(u.role)}"]
        if u.password_hash:
            lines.append(f"password_hash = {_toml_str(u.password_hash)}")
        lines.append("")
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
        os.chmod(tmp, 0o600)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p


def _hasher():
    from argon2 import PasswordHasher

    return PasswordHasher()  # argon2id, the library's current recommended parameters


def add_user(path: str | Path, name: str, role: str, password: str | None) -> UserRecord:
    """Add or replace user ``name`` with ``role`` in the credentials file at ``path``.

    ``password`` is hashed with argon2id (only the hash is written); ``None`` adds a user who
    signs in through the identity provider (``name`` is then their e-mail address). Passwords
    shorter than 12 characters are refused. Raises :class:`UsersFileError`.
    """
    validate_username(name)
    validate_role(role)
    if password is not None and len(password) < 12:
        raise UsersFileError("password too short: at least 12 characters")
    p = Path(path)
    users = load_users(p) if p.exists() else {}
    rec = UserRecord(name=name, role=role, password_hash=_hasher().hash(password) if password is not None else None)
    users[name] = rec
    write_users(p, users)
    return rec


class _Throttle:
    """Wrong-password counters of this process. Keyed by (client address, user name):
    :data:`MAX_FAILURES` within :data:`FAILURE_WINDOW_S` seconds lock that name *for that client*
    until the window has passed, so nobody can lock another person out from their own address;
    and per client over the names that are *not* users: :data:`MAX_CLIENT_FAILURES` lock the
    client's guesses of unknown names (spraying names, each a costly argon2 check), never a real
    user's sign-in (behind a reverse proxy every browser has the proxy's address: a per-address
    lock over all names would lock every user out). Without a client address (``None``) the name
    alone is the key. At most :data:`MAX_THROTTLE_KEYS` counters are kept (expired ones dropped
    first, then the least recently failed), so unknown names cannot grow it without bound."""

    def __init__(self) -> None:
        self._fails: dict[tuple, list[float]] = {}
        self._lock = threading.Lock()

    def check(self, name: str, client: str | None = None, known: bool = True) -> None:
        """Reserve one attempt for ``name`` from ``client`` (counted as a failure until
        :meth:`clear`), or raise :class:`SignInError` when the name (for this client) or, for a
        name that is not a user (``known`` False), the client is over its count within the window.
        Reserving before the hash is checked bounds attempts made in parallel too (40 at once: 5
        checked)."""
        now = time.monotonic()
        keys = {("name", client, name): (MAX_FAILURES, "too many wrong passwords for this user: try again in "
                                                       f"{FAILURE_WINDOW_S / 60:.0f} minutes")}
        if client is not None and not known:
            keys[("client", client)] = (MAX_CLIENT_FAILURES, "too many failed sign-ins from this address: try "
                                                             f"again in {FAILURE_WINDOW_S / 60:.0f} minutes")
        with self._lock:
            for key, (limit, why) in keys.items():
                recent = [t for t in self._fails.get(key, []) if now - t < FAILURE_WINDOW_S]
                if recent:
                    self._fails[key] = recent
                else:  # a refused attempt never adds a counter
                    self._fails.pop(key, None)
                if len(recent) >= limit:
                    raise SignInError(why)
            for key in keys:
                self._fails.setdefault(key, []).append(now)
            if len(self._fails) > MAX_THROTTLE_KEYS:
                self._shrink(now)

    def _shrink(self, now: float) -> None:
        for key in [k for k, ts in self._fails.items() if not ts or now - ts[-1] >= FAILURE_WINDOW_S]:
            del self._fails[key]
        for key in sorted(self._fails, key=lambda k: self._fails[k][-1])[:max(0, len(self._fails) - MAX_THROTTLE_KEYS)]:
            del self._fails[key]

    def clear(self, name: str, client: str | None = None) -> None:
        """Forget the failures of ``name`` from ``client`` only (a successful sign-in there: one
        from localhost never unlocks a remote address)."""
        with self._lock:
            self._fails.pop(("name", client, name), None)

    def reset(self, name: str) -> None:
        """Forget the failures of ``name`` from every client (an administrator's unlock)."""
        with self._lock:
            for key in [k for k in self._fails if k[0] == "name" and k[2] == name]:
                del self._fails[key]

    def __len__(self) -> int:
        return len(self._fails)


THROTTLE = _Throttle()
_DUMMY_HASH: list[str] = []


def authenticate(path: str | Path, name: str, password: str, client: str | None = None) -> Identity:
    """Check ``name`` / ``password`` against the credentials file; the signed-in identity.

    The name must be exactly a listed user name (no normalisation: a lookalike is an unknown
    user). An unknown name is checked against a dummy hash so the answer takes as long as a
    wrong password. ``client``: the address the attempt comes from (the dashboard passes the
    browser's), which the wrong-password lock is kept per (see :class:`_Throttle`). Raises
    :class:`SignInError` ("unknown user or wrong password", or too many failures) and
    :class:`UsersFileError` for a bad file.
    """
    users = load_users(path)
    key = name if isinstance(name, str) else ""
    THROTTLE.check(key, client, known=key in users)
    from argon2.exceptions import InvalidHashError, VerificationError

    rec = users.get(key)
    ph = _hasher()
    if not _DUMMY_HASH:
        _DUMMY_HASH.append(ph.hash("fraudlens-dummy-password"))
    ok = False
    try:
        ok = ph.verify(rec.password_hash if rec and rec.password_hash else _DUMMY_HASH[0], password or "")
    except (VerificationError, InvalidHashError):
        ok = False
    if not ok or rec is None or rec.password_hash is None:
        # the attempt reserved by THROTTLE.check stays counted
        raise SignInError("unknown user or wrong password")
    THROTTLE.clear(key, client)
    return Identity(name=rec.name, role=rec.role, method="password")


def still_signed_in(path: str | Path | None, ident: Identity) -> Identity | None:
    """``ident`` as the credentials file says now (read on every call: a removed user or a
    changed role takes effect at the next page run or action, not at the next sign-in).

    Returns the identity with the file's current role, or ``None`` when the user is no longer
    listed, the file cannot be read (fail closed), or (password users) has no password any more.
    A demo identity, and any identity while no credentials file is configured (``path`` None: the
    server's environment, fixed for its life), is returned as it is.
    """
    if ident.method == "demo" or path is None:
        return ident
    try:
        rec = load_users(path).get(ident.name)
    except UsersFileError:
        return None
    if rec is None or (ident.method == "password" and rec.password_hash is None):
        return None
    return ident if rec.role == ident.role else Identity(name=ident.name, role=rec.role, method=ident.method)


def oidc_identity(path: str | Path | None, email: object) -> Identity:
    """The identity of a user signed in through the identity provider with ``email`` (ASCII is
    lower-cased): they must be listed in the credentials file (their role comes from there). Raises
    :class:`SignInError` if not listed or no file is configured."""
    if path is None:
        raise SignInError(f"no credentials file (${ENV_USERS}) lists the roles of identity-provider users")
    addr = email if isinstance(email, str) else ""
    addr = addr.lower() if addr.isascii() else addr  # e-mail case is not identity; a non-ASCII lookalike matches nobody
    rec = load_users(path).get(addr)
    if rec is None:
        raise SignInError(f"{ascii(addr)[:80]} has no role in this fraudlens: ask an admin to add it")
    return Identity(name=rec.name, role=rec.role, method="oidc")


def assignable_users(path: str | Path | None) -> list[str]:
    """Names of the users who may be assigned a case (analysts and supervisors), sorted."""
    if path is None or not Path(path).exists():
        return []
    return sorted(u.name for u in load_users(path).values() if ASSIGN in PERMISSIONS[u.role])


# ---------------------------------------------------------------------------------- bind rule
def is_loopback(address: str | None) -> bool:
    """True for ``localhost`` and loopback IPs (127.0.0.0/8, ::1); False for anything else,
    including an empty address (which Streamlit takes as every interface)."""
    if not address:
        return False
    if address.strip().lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def demo_enabled(env: dict[str, str] | None = None) -> bool:
    """True if ``$FRAUDLENS_DEMO`` is ``1``, ``true``, ``yes`` or ``on``."""
    return (os.environ if env is None else env).get(ENV_DEMO, "").strip().lower() in {"1", "true", "yes", "on"}


def check_bind(address: str, *, password_signin: bool, oidc_signin: bool, demo: bool) -> None:
    """Raise :class:`BindError` unless listening on ``address`` is allowed: a loopback address
    always; any other only with sign-in configured (a credentials file with at least one user,
    or ``[auth]`` in ``.streamlit/secrets.toml``) and never in demo mode."""
    if is_loopback(address):
        return
    if demo:
        raise BindError(f"demo mode signs in a demo user automatically: it listens only on 127.0.0.1, not {address}")
    if not (password_signin or oidc_signin):
        raise BindError(f"refusing to listen on {address} without sign-in: set ${ENV_USERS} to a credentials file "
                        "(`fraudlens users add NAME --role ROLE`) or configure [auth] in .streamlit/secrets.toml")
