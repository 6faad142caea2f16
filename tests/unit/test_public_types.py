"""The public API is typed, ships its py.typed marker, and a type checker agrees.

Checks: none (tooling). ``python -m mypy`` with the ``[tool.mypy]`` configuration of
pyproject.toml checks the modules behind ``ductwork/__init__.py``'s exports, the test
helpers and the pytest plugin (untyped definitions disallowed), and
``tests/typing/user_pipeline.py``: a typed user's pipeline, trigger, drain, wait and
``Run.steps()`` access whose ``assert_type`` lines fail if, for example, ``trigger()``
returns ``Any``. About 8 s: a cold cache in a temporary directory, shared by the two runs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import ductwork

REPO = Path(__file__).resolve().parents[2]


def _mypy(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache), "--no-error-summary",
                           "--hide-error-context", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for this module's runs: the second run reuses the first's analysis."""
    return tmp_path_factory.mktemp("mypy_cache")


def test_the_package_ships_py_typed():
    assert (REPO / "ductwork" / "py.typed").is_file()
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["ductwork"]


def test_public_names_are_exported():
    assert sorted(ductwork.__all__) == sorted(name for name in vars(ductwork) if name in ductwork.__all__)
    for name in ("Run", "StepInfo", "StepError", "PipelineBuilder", "connect", "Pipeline", "Step", "Context"):
        assert name in ductwork.__all__, name


def test_mypy_passes_on_the_public_api_and_a_typed_user(cache):
    done = _mypy(cache)
    assert done.returncode == 0, done.stdout + done.stderr
    checked = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert "tests/typing" in checked
    assert "ductwork" in checked  # the whole package, the public API's modules among it


def test_mypy_fails_when_a_public_type_is_wrong(tmp_path, cache):
    """The check is not vacuous: a wrong expectation about trigger() is reported."""
    wrong = tmp_path / "wrong.py"
    wrong.write_text(textwrap.dedent("""
        from typing import Any, assert_type
        from tests.typing.user_pipeline import Sync

        assert_type(Sync.trigger("2026-01-01"), Any)
    """))
    done = _mypy(cache, "tests/typing/user_pipeline.py", str(wrong))
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'wrong.py:5: error: Expression is of type "Run", not "Any"' in done.stdout, done.stdout


def test_a_run_handle_made_from_an_id_alone_says_the_app_comes_first():
    """``ductwork.Run("…")`` reads as "the run with this id": the error names ``app.run``
    rather than Python's "missing 'run_id'" (a new user's trial hit the latter)."""
    with pytest.raises(TypeError, match=r"takes the App first; for a handle on run 'r1' use app.run\('r1'\)"):
        ductwork.Run("r1")  # type: ignore[arg-type]
