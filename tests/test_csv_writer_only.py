"""Every CSV the project writes goes through the one neutralising writer
(:mod:`engine.data.csv_writer`): no ``.to_csv(`` call and no ``csv.writer`` / ``csv.DictWriter``
anywhere else in ``engine/``, ``dashboard/`` or ``bench/`` (read with :mod:`ast`, so comments and
strings do not count). ``report.to_csv`` (the report's CSV writer, a module function that itself
calls the writer) is told apart from ``DataFrame.to_csv`` by resolving the receiver to a module."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WRITER = ROOT / "engine" / "data" / "csv_writer.py"
SCANNED = ("engine", "dashboard", "bench")


def _module_aliases(tree: ast.AST) -> set[str]:
    """Names bound to *modules* by the file's imports (``import x as y``, ``from a import b`` when
    ``a.b`` is a module)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                try:
                    if importlib.util.find_spec(f"{node.module}.{a.name}") is not None:
                        out.add(a.asname or a.name)
                except (ImportError, ValueError):
                    pass
    return out


def csv_writes_outside_the_writer(root: Path) -> list[str]:
    """``path:line`` of every direct CSV write under ``root``'s scanned folders but the writer."""
    problems = []
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*.py")):
            if path.resolve() == (root / "engine" / "data" / "csv_writer.py").resolve():
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            modules = _module_aliases(tree)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                f = node.func
                recv = f.value.id if isinstance(f.value, ast.Name) else None
                if f.attr == "to_csv" and recv not in modules:
                    problems.append(f"{path.relative_to(root)}:{node.lineno}: .to_csv(")
                elif f.attr in ("writer", "DictWriter") and recv == "csv":
                    problems.append(f"{path.relative_to(root)}:{node.lineno}: csv.{f.attr}(")
    return problems


def test_no_csv_is_written_outside_the_one_writer():
    assert WRITER.is_file()
    assert csv_writes_outside_the_writer(ROOT) == []


def test_the_check_finds_a_direct_write(tmp_path):
    (tmp_path / "engine" / "data").mkdir(parents=True)
    (tmp_path / "engine" / "data" / "csv_writer.py").write_text("df.to_csv('x')\n")  # the writer may
    (tmp_path / "dashboard").mkdir()
    (tmp_path / "dashboard" / "p.py").write_text(
        "import csv\nimport pandas as pd\n\ndef f(df, fh):\n    df.to_csv(fh)\n    csv.writer(fh)\n"
        "    pd.DataFrame.to_csv(df, fh)\n")
    assert csv_writes_outside_the_writer(tmp_path) == [
        "dashboard/p.py:5: .to_csv(", "dashboard/p.py:6: csv.writer(", "dashboard/p.py:7: .to_csv("]
