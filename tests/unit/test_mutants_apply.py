"""Every engine mutant still applies to the current source.

A mutant (``tests/mutants.py``) is a list of source edits; a refactor that changes or
duplicates one of its snippets would make it fail to apply, or apply somewhere else.
This is the fast guard for that: each snippet occurs exactly once in the package, the
patched files compile and differ from the originals, and a copy made by
``tests.mutants.apply`` runs its own patched code (a fresh interpreter started with
its environment imports ``ductwork`` from the copy). The slow tier
(``tests/properties/test_mutants.py``) checks that each one is killed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import mutants
from tests.mutants import MUTANTS, PACKAGE, MutantError


@pytest.mark.parametrize("name", list(MUTANTS))
def test_the_mutant_applies_once_and_changes_the_package(name):
    changed = mutants.patched(name)
    assert changed, f"mutant {name} changes nothing"
    for path, text in changed.items():
        assert text != (PACKAGE / path).read_text()
        if path.suffix == ".py":  # (the routine's SQL is checked by its server when installed)
            compile(text, str(path), "exec")


@pytest.mark.parametrize("name", list(MUTANTS))
def test_the_mutant_names_the_invariants_it_breaks(name):
    assert "[INV-" in MUTANTS[name].description
    assert "[INV-" in MUTANTS[name].guard


def test_a_snippet_missing_or_repeated_is_an_error_naming_the_mutant(tmp_path, monkeypatch):
    (tmp_path / "a.py").write_text("x = 1\ny = 1\n")
    monkeypatch.setitem(MUTANTS, "demo", mutants.Mutant("demo [INV-LIM-1]", "demo [INV-LIM-1]", (("= 1", "= 2"),)))
    with pytest.raises(MutantError, match=r"mutant demo: snippet '= 1' occurs 2 times .*a\.py"):
        mutants.patched("demo", tmp_path)
    monkeypatch.setitem(MUTANTS, "demo", mutants.Mutant("demo", "demo", (("z = 1", "z = 2"),)))
    with pytest.raises(MutantError, match="mutant demo: snippet 'z = 1' occurs 0 times in the package"):
        mutants.patched("demo", tmp_path)
    monkeypatch.setitem(MUTANTS, "demo", mutants.Mutant("demo", "demo", (("y = 1", "y = 2\nz = 3"),)))
    assert mutants.patched("demo", tmp_path) == {Path("a.py"): "x = 1\ny = 2\nz = 3\n"}


def test_a_process_run_with_the_copy_imports_the_patched_package(tmp_path):
    scratch = mutants.apply("batch_past_lane", tmp_path / "scratch")
    code = "import ductwork, ductwork.limits.claims; print(ductwork.__file__)"
    done = subprocess.run([sys.executable, "-c", code], env=mutants.environ(scratch), cwd=mutants.REPO,
                          capture_output=True, text=True, check=True, timeout=60)
    assert Path(done.stdout.strip()).resolve() == (scratch / "ductwork" / "__init__.py").resolve()
    mutants.check_ran_patched("batch_past_lane", scratch)
    changed = (scratch / "ductwork").resolve()
    assert sum("# mutant: a batch ignores" in path.read_text() for path in changed.rglob("*.py")) == 1


def test_a_mutant_of_the_routines_sql_counts_as_run_once_the_copys_package_is_loaded(tmp_path):
    """The routine's SQL is read from the package's files (installed by migrating, or read as
    text): a process that loaded the copy's ``ductwork.db.migrate`` ran the mutant."""
    scratch = mutants.apply("no_key_lock", tmp_path / "scratch")
    sql = scratch / "ductwork" / "limits" / "sql" / "release_and_claim_3.postgresql.sql"
    assert "-- mutant: no lock" in sql.read_text()
    code = "import ductwork.db.migrate"
    subprocess.run([sys.executable, "-c", code], env=mutants.environ(scratch), cwd=mutants.REPO, check=True, timeout=60)
    mutants.check_ran_patched("no_key_lock", scratch)
