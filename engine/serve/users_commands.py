"""``fraudlens users add / list``: the local sign-in credentials file (argon2 hashes only)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from engine.data.csv_writer import show_controls

console = Console(width=None if sys.stdout.isatty() else 150)


def _fail(msg: str) -> None:
    """One error line (the message may quote file text: never rich markup), exit 2."""
    text = show_controls(" ".join(str(msg).split()))
    console.print(f"[red]error:[/red] {escape(text)}", soft_wrap=True)
    raise typer.Exit(2)


users_app = typer.Typer(no_args_is_help=True, help="local sign-in: the credentials file ($FRAUDLENS_USERS)")


def _users_file(path: Optional[Path]) -> Path:
    from engine.serve import access as ac

    p = path or ac.users_path()
    if p is None:
        _fail(f"no credentials file: pass --file or set ${ac.ENV_USERS}")
    return p


@users_app.command("add")
def users_add(
    name: str = typer.Argument(..., help="user name: lower-case ASCII letters, digits, . _ - @ + (an e-mail for --oidc)"),
    role: str = typer.Option(..., help="analyst, supervisor, auditor or admin"),
    file: Optional[Path] = typer.Option(None, "--file", help="credentials file (default: $FRAUDLENS_USERS)"),
    oidc: bool = typer.Option(False, "--oidc", help="signs in through the identity provider: no password"),
):
    """Add (or replace) a user; prompts twice for the password and writes only its argon2 hash (file mode 0600)."""
    from engine.serve import access as ac

    path = _users_file(file)
    try:
        ac.validate_username(name)
        ac.validate_role(role)
    except ac.UsersFileError as e:
        _fail(str(e))
    password = None if oidc else typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    try:
        rec = ac.add_user(path, name, role, password)
    except ac.UsersFileError as e:
        _fail(str(e))
    console.print(f"{rec.name}: {rec.role}, {'identity provider' if oidc else 'password (argon2id hash)'} in {path}",
                  markup=False)


@users_app.command("list")
def users_list(file: Optional[Path] = typer.Option(None, "--file", help="credentials file (default: $FRAUDLENS_USERS)")):
    """The users of the credentials file, with their role and sign-in method (never a hash)."""
    from engine.serve import access as ac

    try:
        users = ac.load_users(_users_file(file))
    except ac.UsersFileError as e:
        _fail(str(e))
    for u in sorted(users.values(), key=lambda u: u.name):
        console.print(f"{u.name}\t{u.role}\t{'password' if u.password_hash else 'identity provider'}", markup=False)
