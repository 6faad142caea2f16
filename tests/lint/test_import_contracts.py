"""The layers hold: ``lint-imports`` keeps every contract of pyproject.toml.

Checks: the ``[tool.importlinter]`` contracts (CONTRIBUTING.md, "Layout"): ductwork's
layers (cli, public face, fleet, pipelines, limits, db, base) import only downwards,
lazy and type-only imports included; no two sibling modules or packages import each
other, at any depth; the model and ductwork never import each other. And that the
check can fail: the same contracts run on a copy of the packages with one upward
import added (the db layer importing the public face) must report a broken contract.
And that the pure modules (the rules the SQL code calls with values read under its
locks, which the generated mutants of ``tests/mutation.py`` rewrite) import neither
SQLAlchemy nor a module of ``ductwork.db``, ``.limits``, ``.pipelines`` or ``.fleet``
that is not pure itself (read from their import statements). The import-linter checks:
skipped, saying why, only when import-linter is not installed (the ``test`` extra
installs it). In the lint tier (``pytest tests/lint``) with the other static checks.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """Run ``lint-imports`` with ``root``'s pyproject.toml on the packages under ``root``."""
    pytest.importorskip("importlinter", reason="import-linter is not installed (pip install -e '.[test]')")
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                               "sys.exit(lint_imports_command())",
         "--no-cache", "--no-logo", str(root / "pyproject.toml")],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_every_import_contract_is_kept():
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout
    assert "BROKEN" not in result.stdout, result.stdout


def test_an_upward_import_breaks_the_layers(tmp_path: Path):
    for package in ("ductwork", "model", "ductwork_proof"):
        shutil.copytree(REPO / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # the contracts' root packages include tests/ (the proof may not import it): an empty one
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    ids = tmp_path / "ductwork" / "db" / "ids.py"
    ids.write_text(ids.read_text() + "\n\ndef _upward() -> None:\n    from ductwork.app import App  # noqa: F401\n")

    result = _lint_imports(tmp_path)

    assert result.returncode != 0, result.stdout
    assert "ductwork.db is not allowed to import ductwork.app" in result.stdout, result.stdout
    assert "ductwork.db.ids -> ductwork.app" in result.stdout, result.stdout


#: the pure modules: decisions on values, no SQL, no clock, no I/O
PURE = ("ductwork/durations.py", "ductwork/limit_entries.py", "ductwork/limits/buckets.py",
        "ductwork/limits/outcomes.py", "ductwork/pipelines/definition.py", "ductwork/pipelines/registry.py",
        "ductwork/pipelines/snapshot.py", "ductwork/pipelines/rules.py")
#: what a pure module may import from ductwork's packages besides the pure modules (the base
#: modules are free): the Step class a definition's nodes refer to (no SQL either)
PURE_PACKAGES_ALLOWED = {"ductwork.pipelines.step"}


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", PURE)
def test_the_pure_modules_import_no_sql(module: str):
    imported = _imported(REPO / module)
    assert not {name for name in imported if name.split(".")[0] == "sqlalchemy"}, imported
    packaged = {name for name in imported
                if name.split(".")[:2] in (["ductwork", "db"], ["ductwork", "limits"], ["ductwork", "pipelines"],
                                           ["ductwork", "fleet"])}
    assert packaged <= PURE_PACKAGES_ALLOWED | {m.removesuffix(".py").replace("/", ".") for m in PURE}, packaged
