"""The engine keeps its budgets (issue 31), as ``tests/engine_size.py`` counts them.

Checks: no function of ``ductwork/`` (methods and nested functions included, migrations
excluded) above cyclomatic complexity 15 (radon's count); no module of ``ductwork/`` above
600 lines; no ``Database as App``; no ``Any`` in the signature or fields of a name defined
below the top and imported into another layer; the engine core's code lines (db, limits,
pipelines, fleet; not blank, comments or docstrings; migrations excluded) at most
``CODE_LINES_BUDGET``, a ratchet lowered by the commit that removes code, and its code
tokens at most ``CODE_TOKENS_BUDGET``, the same ratchet counted in tokens. And that each
check can fail: run on a copy of ``ductwork/`` with one budget broken (a function of
complexity 16, a module of 601 lines, a ``Database as App``, one ``Any`` put back at a
boundary, one code line too many, a token too many on a line already there), it reports
exactly that. ``python -m tests.engine_size``
prints the same figures. In the lint tier (``pytest tests/lint``); no database.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import engine_size
from tests.engine_size import (
    CODE_LINES_BUDGET,
    CODE_TOKENS_BUDGET,
    MAX_COMPLEXITY,
    MAX_MODULE_LINES,
    boundary_anys,
    code_lines,
    code_tokens,
    complexities,
    core_code_lines,
    core_code_tokens,
    database_as_app,
    long_modules,
)

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "ductwork"
PYPROJECT = REPO / "pyproject.toml"

pytest.importorskip("radon", reason="radon is not installed (pip install -e '.[test]')")


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of ``ductwork/`` (and pyproject.toml beside it) to break one budget in."""
    shutil.copytree(PACKAGE, tmp_path / "ductwork", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    return tmp_path / "ductwork"


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {path}: update this test's snippet"
    path.write_text(text.replace(old, new))


# --------------------------------------------------------------------------- complexity


def test_no_function_is_above_the_complexity_budget():
    too_complex = [str(f) for f in complexities(PACKAGE) if f.complexity > MAX_COMPLEXITY]
    assert not too_complex, f"above complexity {MAX_COMPLEXITY}: {too_complex}"


#: 1 + 15 branches: one past the budget
_SIXTEEN = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(15)) + "\n    return -1\n"


@pytest.mark.parametrize(("added", "name"), [
    (f"def _too_complex(x):\n{_SIXTEEN}", "_too_complex"),
    ("class _Holder:\n" + textwrap.indent(f"def method(self, x):\n{_SIXTEEN}", "    "), "_Holder.method"),
    ("def _outer():\n" + textwrap.indent(f"def inner(x):\n{_SIXTEEN}", "    ") + "    return inner\n",
     "_outer.<locals>.inner"),
], ids=["function", "method", "nested"])
def test_a_function_of_complexity_16_breaks_the_budget(copy: Path, added: str, name: str):
    buckets = copy / "limits" / "buckets.py"
    buckets.write_text(buckets.read_text() + "\n\n" + added)

    found = [f for f in complexities(copy) if f.complexity > MAX_COMPLEXITY]

    assert [(f.path, f.name, f.complexity) for f in found] == [("ductwork/limits/buckets.py", name, 16)]


# --------------------------------------------------------------------------- module length


def test_no_module_is_above_the_line_budget():
    assert long_modules(PACKAGE) == []


def test_a_module_of_601_lines_breaks_the_budget(copy: Path):
    (copy / "db" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))

    assert long_modules(copy) == [f"ductwork/db/long.py ({MAX_MODULE_LINES + 1})"]


# --------------------------------------------------------------------------- typed seams


def test_no_module_imports_database_as_app():
    assert database_as_app(PACKAGE) == []


def test_database_as_app_is_reported(copy: Path):
    _edit(copy / "fleet" / "reaper.py", "    from ductwork.db.database import Database, Tx\n",
          "    from ductwork.db.database import Database, Tx\n    from ductwork.db.database import Database as App\n")

    [found] = database_as_app(copy)
    assert found.startswith("ductwork/fleet/reaper.py:"), found
    assert found.endswith(" Database as App"), found


def test_no_name_says_any_at_a_package_boundary():
    assert boundary_anys(PACKAGE, PYPROJECT) == []


@pytest.mark.parametrize(("module", "old", "new", "reported"), [
    # a method of a class another layer imports (pipelines, limits and fleet call tx.execute)
    ("db/database.py", "def execute(self, stmt: sa.Executable,", "def execute(self, stmt: Any,",
     "ductwork.db.database.Tx.execute(stmt): Any"),
    # an attribute its __init__ annotates
    ("db/database.py", "self.held_keys: dict[str, object] = {}", "self.held_keys: dict[str, Any] = {}",
     "ductwork.db.database.Tx.held_keys: dict[str, Any]"),
    # a function of a module imported whole (from ductwork.db import dialects; dialects.for_update)
    ("db/dialects.py", "def for_update(stmt: sa.Select[Any], bind: Bind,",
     "def for_update(stmt: sa.Select[Any], bind: Any,", "ductwork.db.dialects.for_update(bind): Any"),
    # a base module's function (durations is imported by pipelines)
    ("durations.py", "def parse_interval_us(value: object)", "def parse_interval_us(value: Any)",
     "ductwork.durations.parse_interval_us(value): Any"),
    # a dataclass field
    ("pipelines/hooks.py", "    halt: dict[str, Json]\n", "    halt: dict[str, Any]\n",
     "ductwork.pipelines.hooks.ClaimedHook.halt: dict[str, Any]"),
], ids=["method", "attribute", "module", "base", "field"])
def test_an_any_at_a_boundary_is_reported(copy: Path, module: str, old: str, new: str, reported: str):
    _edit(copy / module, old, new)

    assert boundary_anys(copy, copy.parent / "pyproject.toml") == [reported]


def test_sqlalchemys_own_any_and_a_private_helper_are_not_reported(copy: Path):
    """``Row[Any]`` is SQLAlchemy's row type, and a name no other layer imports is no seam."""
    _edit(copy / "db" / "database.py", "def execute(self, stmt: sa.Executable,",
          "def execute(self, stmt: sa.Select[Any],")
    buckets = copy / "limits" / "buckets.py"
    buckets.write_text(buckets.read_text() + "\n\ndef _private(value: Any) -> Any:\n    return value\n")

    assert boundary_anys(copy, copy.parent / "pyproject.toml") == []


# --------------------------------------------------------------------------- code lines


def test_code_lines_count_code_only():
    source = textwrap.dedent('''\
        """A module docstring,
        on two lines."""

        # a comment
        import os  # a comment after code

        SQL = """
        SELECT 1
        """


        def f(x):
            """A docstring."""
            #: a field comment
            return (x
                    + 1)
    ''')
    # import os; SQL = (3 lines); def f; return (2 lines)
    assert code_lines(source) == 1 + 3 + 1 + 2


def test_code_tokens_count_code_only_and_a_joined_line_is_no_token_fewer():
    source = textwrap.dedent('''\
        """A docstring."""
        # a comment
        x = (1 +
             2)  # a comment after code
        SQL = """
        SELECT 1
        """
    ''')
    joined = source.replace("(1 +\n     2)", "(1 + 2)")

    # x = ( 1 + 2 ); SQL = <string>
    assert len(code_tokens(source)) == len(code_tokens(joined)) == 7 + 3
    assert code_lines(joined) == code_lines(source) - 1


def test_the_engine_core_is_within_its_code_lines_budget():
    counted = core_code_lines(PACKAGE)
    assert sum(counted.values()) <= CODE_LINES_BUDGET, (
        f"the engine core has {sum(counted.values()):,} code lines ({counted}), more than the budget of "
        f"{CODE_LINES_BUDGET:,} (tests/engine_size.py): the engine may not grow")


def test_a_code_line_too_many_breaks_the_budget(copy: Path):
    over = CODE_LINES_BUDGET - sum(core_code_lines(PACKAGE).values()) + 1
    claims = copy / "limits" / "claims.py"
    text = claims.read_text()
    tokens = ["log", "=", "logging", ".", "getLogger", "(", '"ductwork.claims"', ")"]
    assert "".join(tokens[2:]) in text
    assert over < len(tokens)
    # the same tokens, split onto `over` more lines by backslashes: lines more, no token more
    split = " \\\n".join(tokens[:over + 1]) + " " + "".join(tokens[over + 1:])
    claims.write_text(text.replace(f"log = {''.join(tokens[2:])}", split))

    broken = engine_size.budgets(copy, copy.parent / "pyproject.toml")

    assert broken[f"the engine core within {CODE_LINES_BUDGET:,} code lines"] == [f"{CODE_LINES_BUDGET + 1:,}"]
    assert [name for name, breaches in broken.items() if breaches] == [
        f"the engine core within {CODE_LINES_BUDGET:,} code lines"]


def test_the_engine_core_is_within_its_code_tokens_budget():
    tokens = core_code_tokens(PACKAGE)
    assert tokens <= CODE_TOKENS_BUDGET, (
        f"the engine core has {tokens:,} code tokens, more than the budget of {CODE_TOKENS_BUDGET:,} "
        f"(tests/engine_size.py): the engine may not grow")


def test_a_code_token_too_many_on_a_line_already_there_breaks_the_tokens_budget(copy: Path):
    over = CODE_TOKENS_BUDGET - core_code_tokens(PACKAGE) + 1
    pairs = (over + 1) // 2  # a pair of parentheses is two tokens, on the same line
    claims = copy / "limits" / "claims.py"
    text = claims.read_text()
    line = 'log = logging.getLogger("ductwork.claims")'
    assert line in text
    claims.write_text(text.replace(line, f'log = logging.getLogger({"(" * pairs}"ductwork.claims"{")" * pairs})'))

    broken = engine_size.budgets(copy, copy.parent / "pyproject.toml")

    name = f"the engine core within {CODE_TOKENS_BUDGET:,} code tokens"
    assert broken[name] == [f"{core_code_tokens(PACKAGE) + 2 * pairs:,}"]
    assert [n for n, breaches in broken.items() if breaches] == [name]


def test_the_report_runs_and_says_every_budget_is_kept():
    done = subprocess.run([sys.executable, "-m", "tests.engine_size"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"at the start of issue 31 (6bcd6ac): {engine_size.CODE_LINES_AT_ISSUE_31:,}" in done.stdout
    assert "BROKEN" not in done.stdout, done.stdout
    assert done.stdout.count("  ok: ") == 6, done.stdout
