"""``model/`` is an independent specification: no file in it may import ``ductwork``.

Checks: the independence the engine-vs-model tests rely on (docs/verification.md, "Layers of evidence").
"""

from __future__ import annotations

import ast
from pathlib import Path

MODEL = Path(__file__).resolve().parents[2] / "model"


def _imports(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                "__import__", "import_module"):
            names += [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
    return names


def test_model_never_imports_ductwork():
    files = sorted(MODEL.rglob("*.py"))
    assert files, "model/ holds no Python files"
    offenders = {
        str(path.relative_to(MODEL.parent)): name
        for path in files
        for name in _imports(ast.parse(path.read_text(), str(path)))
        if name == "ductwork" or name.startswith("ductwork.")
    }
    assert offenders == {}


def test_checker_sees_imports():
    """The checker itself finds every import form (so it cannot pass vacuously)."""
    source = "import ductwork\nfrom ductwork.x import y\nimportlib.import_module('ductwork')\n"
    assert _imports(ast.parse(source)) == ["ductwork", "ductwork.x", "ductwork"]
