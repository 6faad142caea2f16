"""Random pipelines and step outcomes: the engine ends every run exactly where the model does.

Runs each pipeline conformance hunt (``ductwork_proof/conformance/pipelines.py``, the
hunts ``ductwork verify`` runs against an adopter's database) on each of the suite's
databases, with the hypothesis profile's budget (15, 40 and 400 examples under ``dev``,
``ci`` and ``deep``):

Hypothesis generates a definition (every transition kind, nested; some fan-ins
deliberately invalid), trigger arguments, budgets and an oracle that decides each
execution's outcome (a value, a failure, a timeout, a crash; sometimes a return
value the step may not return). The model's ``run_to_quiescence`` and the engine
(a real database, a ManualClock, a worker and an advancer driven to quiescence,
resuming a dampened run once) must agree on the run's final state: its status,
the multiset of (node, status) of its steps, each branch's final node, status and
halt reason, and every fan-in's inputs.

A second hunt drives both sides with the batched operations (group commits that
advance inline, advancer batches) and compares them the same way.

A third gives every definition an ``on_halt`` handler and draws how each of the hook's
attempts ends (success, failure, crash): a halted run owes one hook on both sides, and
it ends with the same status, counters and last outcome (``claim_hook``, ``run_hook``,
``reap_hook`` against the worker's hook runner).

A fourth (``test_engine_prunes_what_the_model_prunes``) triggers a generated pipeline
several times an hour apart (the last run left in progress; some runs dampen), then
prunes in batches at a generated cutoff on both sides: the same runs go, a pruned run
leaves no row in any run table, and every kept run is as it was.

A fifth revives: each halted run is revived (``revive``, with or without its context,
twice over to check the second returns the same run), sometimes with a "fix deployed"
(every step succeeds from then on), and the revived run driven to rest; the engine and
the model must agree on every run of the chain, and the model's invariants hold.

A seventh (``test_engine_agrees_when_children_arrive_while_their_expand_is_parked``) holds
every expand's advancer between its batches while a second worker and advancer do a drawn
amount of work, so children of the first batches run and arrive at their fan-in before the
later batches exist (``drive`` alone never does: an advancer commits all of an expand's
batches in one ``run_once``); the runs still end where the model's do.

A sixth (``test_engine_triggers_end_where_the_model_triggers_end``) triggers with drawn keys
(or none), in ductwork's own transaction or in a caller's that commits or rolls back, with
prunes in between that free keys: call by call both sides return the same run or none, and
the same runs exist at the end with the same keys.

Checks: INV-ADV-1, INV-ADV-2, INV-ADV-3, INV-ADV-4, INV-EXE-1, INV-EXE-4, INV-RUN-1,
INV-HLT-1, INV-HLT-2, INV-PRN-1, INV-PRN-2, INV-REV-1, INV-REV-2, INV-REV-3, INV-TRG-1,
INV-TRG-2.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from ductwork_proof.conformance.pipelines import (
    HUNTS,
    PARKED_COVERAGE,
    PRUNE_COVERAGE,
    REVIVE_FIGURES,
    TRIGGER_FIGURES,
    hunt,
)

EXAMPLES = {"dev": 15, "ci": 40, "deep": 400}


def examples() -> int:
    """The hypothesis profile's example budget of a hunt (each example resets the database)."""
    return EXAMPLES.get(os.environ.get("HYPOTHESIS_PROFILE", "dev"), EXAMPLES["dev"])


@contextmanager
def printed(db_url: str, name: str, figures: Counter, what: str) -> Iterator[None]:
    """Around the hunt ``name``: ``figures`` emptied before it, and what it counted in them
    printed after it (``-s``), the hunt passed or not: ``<name> conformance [<database>]: <what>: {…}``."""
    figures.clear()
    try:
        yield
    finally:
        print(f"{name} conformance [{db_url.split(':')[0]}]: {what}: {dict(sorted(figures.items()))}")


def test_engine_runs_end_where_the_model_ends(db_url):
    hunt(db_url, HUNTS["runs"], examples=examples())


def test_engine_prunes_what_the_model_prunes(db_url):
    with printed(db_url, "prune", PRUNE_COVERAGE, "examples by (pruned, live kept)"):
        hunt(db_url, HUNTS["prune"], examples=examples())


def test_engine_batches_end_where_the_model_batches_end(db_url):
    """The batched operations against the engine: the model drives with
    ``advance_on_successes``, ``claim_branches`` and ``advance_batch`` (batches of the
    drawn size), the engine with group commits that advance inline (``advance_on_successes``)
    and an advancer that claims and advances in batches (``claim_branches``,
    ``Advancer.advance_batch``) of that size; every run ends in the same state."""
    hunt(db_url, HUNTS["batches"], examples=examples())


def test_engine_keyed_runs_end_where_the_model_ends(db_url):
    """Keyed steps (every node ``limit_by`` a key of concurrency 1): the engine's worker
    records each keyed success in the transaction that advances it inline, then the lane
    routine releases its slot and hands the key's next execution on, alone or in a group
    commit of the drawn size; the model drives with its batched operations; every run ends
    in the same state [INV-ADV-1, INV-RUN-1, INV-LIM-1]."""
    hunt(db_url, HUNTS["keyed"], examples=examples())


def test_engine_agrees_when_children_arrive_while_their_expand_is_parked(db_url):
    """Work done inside every expand's gaps between batches (``parked_gaps``, the
    number of units per gap drawn): children of the first batches run and arrive at
    their fan-in while the expand holds its claim, and every run still ends where the
    model's does [INV-ADV-3, INV-ADV-4]. The gaps reached and the arrivals made in them
    are printed (``-s``)."""
    with printed(db_url, "parked", PARKED_COVERAGE, "expands' gaps and arrivals in them"):
        hunt(db_url, HUNTS["parked"], examples=examples())


def test_engine_hooks_end_where_the_model_hooks_end(db_url):
    """Every generated definition names an on_halt handler: a run that halts owes exactly
    one hook on both sides [INV-HLT-1], delivered within the same budgets to the same
    status, counters and last outcome [INV-HLT-2]; a run that does not halt owes none."""
    hunt(db_url, HUNTS["hooks"], examples=examples())


def test_engine_revives_end_where_the_model_ends(db_url):
    """Revives against the engine: every run of a revive chain ends where the model's does."""
    with printed(db_url, "revives", REVIVE_FIGURES, "revive chains"):
        hunt(db_url, HUNTS["revives"], examples=examples())


def test_engine_triggers_end_where_the_model_triggers_end(db_url):
    """Keyed and transactional triggers against the engine, with and without a key window,
    time passing between them (``age``) or finished runs pruned [INV-TRG-1, INV-TRG-2]."""
    with printed(db_url, "triggers", TRIGGER_FIGURES, "triggers"):
        hunt(db_url, HUNTS["triggers"], examples=examples())
