"""The one CSV writer writes a path atomically, mode 0600, never through a link
(:func:`engine.data.csv_writer.write_private_bytes`): score, explain and rejected-row files hold card
numbers and personal data, and a symlink planted at an output path must not redirect the write."""

from __future__ import annotations

import os
import stat

import pandas as pd
import pytest

from engine.data import csv_writer
from engine.data.csv_writer import csv_bytes, write_csv, write_private_text

FRAME = pd.DataFrame({"card": ["4111111111111111", "=HYPERLINK(1)"], "amount": [12.5, -3.0]})


@pytest.fixture(autouse=True)
def _usual_umask():
    old = os.umask(0o022)  # the usual umask: a plain write would give 0644
    yield
    os.umask(old)


def _mode(p) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_a_new_csv_is_0600_and_holds_the_neutralised_bytes(tmp_path):
    p = tmp_path / "sub" / "scores.csv"
    assert write_csv(FRAME, p) == p
    assert _mode(p) == 0o600
    assert p.read_bytes() == csv_bytes(FRAME)
    assert p.read_text().splitlines() == ["card,amount", "4111111111111111,12.5", "'=HYPERLINK(1),-3.0"]
    assert sorted(x.name for x in p.parent.iterdir()) == ["scores.csv"]  # no temporary file left


def test_a_symlink_at_the_path_is_replaced_never_written_through(tmp_path):
    target = tmp_path / "victim.txt"
    target.write_text("keep me")
    os.chmod(target, 0o644)
    link = tmp_path / "scores.csv"
    link.symlink_to(target)
    write_csv(FRAME, link)
    assert target.read_text() == "keep me" and _mode(target) == 0o644  # the link's target untouched
    assert not link.is_symlink() and link.is_file() and _mode(link) == 0o600
    assert link.read_bytes() == csv_bytes(FRAME)
    dangling = tmp_path / "rejected.csv"
    dangling.symlink_to(tmp_path / "nowhere" / "new.csv")
    write_csv(FRAME, dangling)
    assert not (tmp_path / "nowhere").exists() and not dangling.is_symlink() and _mode(dangling) == 0o600


def test_an_existing_file_is_replaced_with_mode_0600(tmp_path):
    p = tmp_path / "scores.csv"
    p.write_text("old,rows\n1,2\n")
    os.chmod(p, 0o644)
    write_csv(FRAME.head(1), p)
    assert p.read_text() == "card,amount\n4111111111111111,12.5\n" and _mode(p) == 0o600
    hard = tmp_path / "other-name.csv"  # a hard link to the old file keeps the old bytes
    os.link(p, hard)
    write_csv(FRAME, p)
    assert hard.read_text() == "card,amount\n4111111111111111,12.5\n"
    assert p.read_bytes() == csv_bytes(FRAME)


def test_a_directory_is_refused_and_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    with pytest.raises(IsADirectoryError, match="is a directory"):
        write_csv(FRAME, tmp_path)
    p = tmp_path / "scores.csv"
    p.write_text("old\n")

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(csv_writer.os, "replace", refuse)
    with pytest.raises(PermissionError):
        write_csv(FRAME, p)
    assert p.read_text() == "old\n" and sorted(x.name for x in tmp_path.iterdir()) == ["scores.csv"]


def test_write_private_text_is_utf8_0600_and_replaces_a_link(tmp_path):
    target = tmp_path / "victim.json"
    target.write_text("{}")
    out = tmp_path / "explanation.json"
    out.symlink_to(target)
    assert write_private_text(out, '{"merchant": "Café"}\n') == out
    assert target.read_text() == "{}"
    assert out.read_bytes() == '{"merchant": "Café"}\n'.encode("utf-8") and _mode(out) == 0o600


def test_buffers_are_still_written_as_before():
    import io

    b, t = io.BytesIO(), io.StringIO()
    assert write_csv(FRAME, b) is b and write_csv(FRAME, t) is t
    assert b.getvalue() == csv_bytes(FRAME) and t.getvalue() == csv_bytes(FRAME).decode("utf-8")


def test_a_stream_at_the_path_is_written_to_not_replaced(tmp_path):
    """Review: --out /dev/stdout or a shell's >(...) pipe failed (a temporary file under /dev/fd) or,
    as root, replaced the /dev/stdout link with a file."""
    import os
    import threading

    from engine.data.csv_writer import write_private_text

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    t = threading.Thread(target=lambda: got.append(open(fifo, encoding="utf-8").read()))
    t.start()
    write_private_text(fifo, "hello")
    t.join(10)
    assert got == ["hello"] and fifo.is_fifo()
