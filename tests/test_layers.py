"""The engine's layers import one way down, and no room grows past its size budget.

Layers, lowest first: ``engine.data`` < ``engine.model`` < ``engine.explain`` < ``engine.trust`` <
``engine.cases`` < ``engine.bench`` / ``engine.serve`` / ``engine.distributed`` < ``engine.cli`` (with
``engine.cli_common``, its helpers, and ``engine.cli_report``).
A module may import its own layer and any layer below it, never one above. Imports are read from
the source with :mod:`ast` (including imports inside functions and ``TYPE_CHECKING`` blocks), so a
lazy upward import is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: top-level subpackage (or module) of ``engine`` -> layer rank
LAYERS = {
    "data": 0,
    "model": 1,
    "explain": 2,
    "trust": 3,
    "cases": 4,
    "bench": 5,
    "serve": 5,
    "distributed": 5,
    "cli": 6,
    "cli_common": 6,
    "cli_report": 6,
    "cli_audit": 6,
}
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300


def _layer_of_module(dotted: str) -> str | None:
    """``engine.model.scoring`` -> ``model``; ``engine`` itself -> None."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "engine" else None


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imported_modules(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """Every ``engine.*`` module named by an import in ``tree`` as (line, dotted name)."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node.lineno, target))
            # ``from engine import cases`` names a subpackage through the alias
            if target == "engine":
                out += [(node.lineno, f"engine.{a.name}") for a in node.names
                        if not a.name.startswith("__")]  # engine.__version__ is the root's
    return [(line, t) for line, t in out if t == "engine" or t.startswith("engine.")]


def upward_imports(root: Path) -> list[str]:
    """Every import in ``root/engine`` that goes to a higher layer, as readable lines.

    ``root`` is a repository root holding an ``engine`` package. A module of a layer not in
    :data:`LAYERS` is reported too, so a new package must be placed in the order explicitly.
    """
    problems = []
    for path in sorted((root / "engine").rglob("*.py")):
        module = _module_name(path, root)
        own = _layer_of_module(module)
        if own is None:  # engine/__init__.py: the root imports no subpackage
            own_rank = -1
        elif own not in LAYERS:
            problems.append(f"{path.relative_to(root)}: package engine.{own} has no layer in LAYERS")
            continue
        else:
            own_rank = LAYERS[own]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, target in _imported_modules(tree, module, path.name == "__init__.py"):
            layer = _layer_of_module(target)
            if layer is None:
                continue
            rank = LAYERS.get(layer)
            if rank is None:
                problems.append(f"{path.relative_to(root)}:{line} imports {target} (no layer)")
            elif rank > own_rank:
                problems.append(
                    f"{path.relative_to(root)}:{line} imports {target}: layer {layer!r} is above "
                    f"{own or 'engine'!r}"
                )
    return problems


def oversized(root: Path) -> list[str]:
    """Modules over :data:`MAX_MODULE_LINES` lines and classes over :data:`MAX_CLASS_LINES`."""
    out = []
    for path in sorted((root / "engine").rglob("*.py")) + sorted((root / "dashboard").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        n = text.count("\n") + (not text.endswith("\n"))
        if n > MAX_MODULE_LINES:
            out.append(f"{path.relative_to(root)}: {n} lines > {MAX_MODULE_LINES}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                out.append(f"{path.relative_to(root)}: class {node.name} "
                           f"{node.end_lineno - node.lineno + 1} lines > {MAX_CLASS_LINES}")
    return out


def test_engine_imports_only_downwards():
    assert upward_imports(ROOT) == []


def test_no_module_or_class_over_budget():
    assert oversized(ROOT) == []


def _fake_engine(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / "engine" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for d in [p for p in (tmp_path / "engine").rglob("*") if p.is_dir()] + [tmp_path / "engine"]:
        (d / "__init__.py").touch()
    return tmp_path


@pytest.mark.parametrize(
    "rel, source, expected",
    [
        ("data/io.py", "from engine.model.scoring import score_frame\n", "layer 'model' is above 'data'"),
        ("model/scoring.py", "def f():\n    from engine.explain import explain_all\n", "above 'model'"),
        ("explain/shap_values.py", "from ..cases import store\n", "layer 'cases' is above 'explain'"),
        ("model/train.py", "from engine import trust\n", "layer 'trust' is above 'model'"),
        ("trust/reasons.py", "import engine.cases.report\n", "above 'trust'"),
        ("data/spec.py", "from . import features\nfrom ..bench import quality\n", "above 'data'"),
        ("newthing/x.py", "x = 1\n", "has no layer"),
    ],
)
def test_the_layer_check_fails_on_an_upward_import(tmp_path, rel, source, expected):
    root = _fake_engine(tmp_path, {rel: source})
    problems = upward_imports(root)
    assert problems and all(expected in p for p in problems), problems


def test_the_layer_check_accepts_downward_and_sibling_imports(tmp_path):
    root = _fake_engine(tmp_path, {
        "cases/view.py": "from engine.model.scoring import score_frame\nfrom . import figures\n",
        "cases/figures.py": "from engine.explain.base import Explanation\n",
        "model/scoring.py": "from ..data.io import read_transactions\nfrom .sequences import make_batch\n",
        "cli.py": "from engine.bench import quality\nfrom engine.cases import view\n",
    })
    assert upward_imports(root) == []


def test_the_size_check_fails_on_a_long_module_and_a_long_class(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES + 1))
    root = _fake_engine(tmp_path, {
        "data/long.py": "x = 1\n" * (MAX_MODULE_LINES + 1),
        "model/big.py": f"class Big:\n{body}\n",
    })
    (root / "dashboard").mkdir()
    problems = oversized(root)
    assert len(problems) == 2, problems
    assert "long.py: 601 lines" in problems[0] and "class Big" in problems[1]
