"""The lane routine refines its specification on each database: exhaustively over a bounded
domain, then over generated states beyond it.

``ductwork.limits.claims.release_and_claim`` computes in SQL on PostgreSQL and MySQL-family
(one round trip) what the pure ``ductwork.limits.plan.plan`` decides (``buckets.decide`` and
the poll order, composed), and in Python on SQLite. ``tests/refinement.py`` writes a state
of the rows, calls the routine, and compares what it returned and every row it left with
what the specification says, through the one abstraction from rows to state
(``ductwork_proof/conformance/abstraction.py``). A difference names the case and the first row or value that
differs. Every broken variant of the routines' SQL is killed by the exhaustive part, or
argued equivalent (``python -m tests.sql_mutation``; docs/verification.md, "The lane routine
and its refinement test").

Checks: INV-LIM-1, INV-LIM-2, INV-LIM-3, INV-LIM-4, INV-LIM-5, INV-LIM-6, INV-LIM-8,
INV-EXE-2, INV-CLK-1.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from ductwork.db import engines
from tests.refinement import Case, World, cases, exhaustive

#: generated states per database, by HYPOTHESIS_PROFILE
GENERATED = {"dev": 50, "ci": 300, "deep": 3000}


@pytest.fixture
def world(db_url):
    engine = engines.create_engine(db_url)
    try:
        yield World.make(db_url, engine)
    finally:
        engine.dispose()


def test_the_routine_does_what_the_plan_says_on_every_state_of_the_bounded_domain(world, record_property):
    checked = 0
    for case in exhaustive():
        difference = world.check(case)
        assert difference is None, f"{case}: {difference}"
        checked += 1
    record_property("states", checked)
    assert checked >= 1400, checked  # the domain is what the module docstring says


def test_the_routine_does_what_the_plan_says_on_generated_states(world):
    examples = GENERATED.get(os.environ.get("HYPOTHESIS_PROFILE", "dev"), GENERATED["dev"])

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(cases())
    def routine_refines_plan(case: Case) -> None:
        difference = world.check(case)
        assert difference is None, difference

    routine_refines_plan()


def test_a_difference_is_reported(world, monkeypatch):
    """The check can fail: with a specification that claims one execution fewer than the
    routine, the first keyed case with a batch differs, and the report names the claims."""
    from ductwork.limits import plan as plan_module
    from tests import refinement

    real = plan_module.plan

    def stingy(state, request):  # type: ignore[no-untyped-def]
        decided = real(state, request)
        return plan_module.Plan(**{**decided.__dict__, "claims": decided.claims[:-1]}) if decided.claims else decided

    monkeypatch.setattr(refinement, "plan", stingy)
    first = next((d for case in exhaustive() if (d := world.check(case)) is not None), None)
    assert first is not None, "no case differed from a wrong specification"
    assert first.startswith("claimed ["), first
