"""The repository is ruff clean and mypy clean, as configured in pyproject.toml.

Checks: none (tooling). ``ruff check .`` with ``[tool.ruff]`` (the whole repository) and
``mypy`` with ``[tool.mypy]`` (ductwork/ and model/ strict, tests/typing/ and examples/) run as
subprocesses; a finding fails the test with their output. Two more tests show that each
check can fail: a file with a violation, checked with the same configuration, is reported;
and one that the public types are checked: a file expecting ``trigger()`` of
``tests/typing/user_pipeline.py`` (a typed user's code with ``assert_type`` lines) to
return ``Any`` fails with mypy's message naming the real type.
The lint tier (``pytest tests/lint``), out of the unit tier because mypy on a cold cache in a
temporary directory takes most of its time.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "pyproject.toml"


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for this module's runs."""
    return tmp_path_factory.mktemp("mypy_cache")


def test_ruff_reports_nothing():
    done = _run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_reports_nothing(cache):
    done = _run("mypy", "--cache-dir", str(cache))
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_reports_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f(items=[]):\n    return items\n")
    done = _run("ruff", "check", "--no-cache", "--config", str(CONFIG), str(bad), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "F401" in done.stdout, done.stdout  # unused import
    assert "B006" in done.stdout, done.stdout  # mutable default


@pytest.mark.parametrize("package", ["model", "ductwork"])
def test_mypy_is_strict_on_the_model_and_the_engine(tmp_path, cache, package):
    """A module of the ``model`` or ``ductwork`` package with an unannotated function is reported."""
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "bad.py").write_text(textwrap.dedent("""
        def half(x):
            return x / 2
    """))
    done = _run("mypy", "--cache-dir", str(cache), "--config-file", str(CONFIG), f"{package}/bad.py", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "[no-untyped-def]" in done.stdout, done.stdout


def test_mypy_fails_when_a_public_type_is_wrong(tmp_path, cache):
    """The typed user's check is not vacuous: a wrong expectation about trigger() is reported."""
    wrong = tmp_path / "wrong.py"
    wrong.write_text(textwrap.dedent("""
        from typing import Any, assert_type
        from tests.typing.user_pipeline import Sync

        assert_type(Sync.trigger("2026-01-01"), Any)
    """))
    done = _run("mypy", "--cache-dir", str(cache), "--no-error-summary", "--hide-error-context",
                "tests/typing/user_pipeline.py", str(wrong))
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'wrong.py:5: error: Expression is of type "Run", not "Any"' in done.stdout, done.stdout
