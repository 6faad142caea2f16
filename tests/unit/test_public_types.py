"""The public API is typed, ships its py.typed marker, and mypy is pointed at it.

Checks: none (tooling). The package ships ``py.typed``; ``__all__`` names what
``ductwork/__init__.py`` exports; ``[tool.mypy]`` checks the whole package (the modules
behind the exports, the test helpers and the pytest plugin) and ``tests/typing/``, a typed
user's code whose ``assert_type`` lines fail if, for example, ``trigger()`` returns ``Any``.
mypy itself runs in the lint tier: ``tests/lint/test_static_checks.py`` runs it over that
configuration, and on a wrong expectation about ``trigger()``, which it must report.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import ductwork

REPO = Path(__file__).resolve().parents[2]


def test_the_package_ships_py_typed():
    assert (REPO / "ductwork" / "py.typed").is_file()
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["ductwork"]


def test_public_names_are_exported():
    assert sorted(ductwork.__all__) == sorted(name for name in vars(ductwork) if name in ductwork.__all__)
    for name in ("Run", "StepInfo", "StepError", "PipelineBuilder", "connect", "Pipeline", "Step", "Context"):
        assert name in ductwork.__all__, name


def test_mypy_checks_the_public_api_and_a_typed_user():
    checked = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert "tests/typing" in checked
    assert "ductwork" in checked  # the whole package, the public API's modules among it


def test_a_run_handle_made_from_an_id_alone_says_the_app_comes_first():
    """``ductwork.Run("…")`` reads as "the run with this id": the error names ``app.run``
    rather than Python's "missing 'run_id'" (a new user's trial hit the latter)."""
    with pytest.raises(TypeError, match=r"takes the App first; for a handle on run 'r1' use app.run\('r1'\)"):
        ductwork.Run("r1")  # type: ignore[arg-type]
