"""The guard modules' mutant generator (``tests/guard_mutation.py``) writes what it says.

Every guard module yields mutants, each a one-change variant that compiles and differs
from the module; the four operators are there, including the classes issue 37 found by
hand (a sweep measuring a claim from its creation time, a where clause dropped); and a
mutant changes exactly the node it names. The nightly run itself is not run here.
"""

from __future__ import annotations

import ast
import difflib

import pytest

from tests import guard_mutation
from tests.guard_mutation import ARGUED, GUARD_TESTS, OPERATORS, PACKAGE, generate, mutated_source


@pytest.mark.parametrize("module", list(GUARD_TESTS))
def test_each_guard_module_has_mutants_and_tests_that_exist(module):
    generated = generate(module)
    assert generated, module
    assert {g.operator for g in generated} <= set(OPERATORS)
    assert [g.number for g in generated] == list(range(1, len(generated) + 1))
    for path in GUARD_TESTS[module]:
        assert (guard_mutation.ROOT / path).exists(), path


def _diff(module: str, number: int) -> list[str]:
    original = ast.unparse(ast.parse((PACKAGE / module).read_text())).splitlines()
    mutated = mutated_source(module, number).splitlines()
    compile("\n".join(mutated), module, "exec")
    return [line for line in difflib.unified_diff(original, mutated, lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_the_reapers_mutants_cover_every_operator_and_each_changes_one_line():
    generated = generate("fleet/reaper.py")
    assert {g.operator for g in generated} == set(OPERATORS)
    for g in generated:
        changed = _diff("fleet/reaper.py", g.number)
        assert len(changed) == 2, (g, changed)  # one line out, one line in


def test_the_sweeps_claim_time_read_as_its_creation_time_is_generated():
    swaps = [g for g in generate("fleet/reaper.py") if g.what == "`_e.c.claimed_at` read as `created_at`"]
    added = [_diff("fleet/reaper.py", g.number)[1] for g in swaps]
    assert sum("old(_e.c.created_at)" in line for line in added) == 1
    assert sum("_e.c.created_at.is_not(None)" in line for line in added) == 1


def test_a_where_of_one_argument_is_dropped_whole():
    (dropped,) = [g for g in generate("fleet/reaper.py") if g.what == "`.where(_p.c.id != own_process_id)` dropped"]
    removed, added = _diff("fleet/reaper.py", dropped.number)
    assert ".where(_p.c.id != own_process_id)" in removed
    assert ".where(" not in added


@pytest.mark.parametrize("name", sorted(ARGUED))
def test_each_argued_equivalent_names_a_mutant_of_the_current_source(name):
    """An argument holds for the numbering it was made on: a change to the module renumbers
    its mutants, and the argument must be made again (here it fails first)."""
    module, number = name.split("#")
    what, argument = ARGUED[name]
    assert generate(module)[int(number) - 1].what == what, f"{name}: renumbered, argue again"
    assert argument
