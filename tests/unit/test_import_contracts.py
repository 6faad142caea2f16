"""The layers hold: ``lint-imports`` keeps every contract of pyproject.toml.

Checks: the ``[tool.importlinter]`` contracts (CONTRIBUTING.md, "Layout"): ductwork's
layers (cli, public face, fleet, pipelines, limits, db, base) import only downwards,
lazy and type-only imports included; no two sibling modules or packages import each
other, at any depth; the model and ductwork never import each other. And that the
check can fail: the same contracts run on a copy of the packages with one upward
import added (the db layer importing the public face) must report a broken contract.
Skipped, saying why, only when import-linter is not installed (the ``test`` extra
installs it). About 2 s.
"""

from __future__ import annotations

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
    for package in ("ductwork", "model"):
        shutil.copytree(REPO / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    ids = tmp_path / "ductwork" / "db" / "ids.py"
    ids.write_text(ids.read_text() + "\n\ndef _upward() -> None:\n    from ductwork.app import App  # noqa: F401\n")

    result = _lint_imports(tmp_path)

    assert result.returncode != 0, result.stdout
    assert "ductwork.db is not allowed to import ductwork.app" in result.stdout, result.stdout
    assert "ductwork.db.ids -> ductwork.app" in result.stdout, result.stdout
