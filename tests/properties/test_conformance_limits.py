"""The engine's claim path against the model, step by step, on each database.

Runs ``LimitsAgainstModel`` (``ductwork_proof/conformance/limits.py``, the machine
``ductwork verify`` runs against an adopter's database) on each of the suite's databases,
with the hypothesis profile's budget: the engine (a real database, a ManualClock) and the
model's ``LimitsModel`` side by side: enqueue keyed, unkeyed and delayed jobs,
move the clock (by zero, one µs, sub-millisecond and larger steps), claim by
one of several workers, claim a batch, complete (also with a hand-off of the key's next
job, and several at once in a group commit), fail (retries), crash and reap a worker,
restart with changed limits, a step on a rated key that fails with its retry
claimed once eligible (``fail_and_claim_the_retry``), and forget a partition
(``forget_partition``: idle or busy, or the static key or the family, which change
nothing). After every rule the engine and the model agree on each key's in-flight count,
bucket levels and ``blocked_until`` stamp, every claim chose the same job, and no key used
a sequence number twice.

Checks: INV-LIM-1, INV-LIM-2, INV-LIM-3, INV-LIM-4, INV-LIM-5, INV-LIM-6, INV-LIM-7,
INV-LIM-8 (a key family beside the keys), INV-LIM-9 (forgetting idle partitions), INV-CLK-1
(every decision uses the injected database time; a key's numbers across a forget),
INV-EXE-2, INV-EXE-4.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from ductwork_proof.conformance.limits import LimitsAgainstModel

CONFORMANCE = {"dev": (10, 40), "ci": (40, 50), "deep": (400, 100)}


def conformance_settings(**overrides) -> settings:
    """Examples and steps per HYPOTHESIS_PROFILE (each example resets the database)."""
    import os

    examples, steps = CONFORMANCE.get(os.environ.get("HYPOTHESIS_PROFILE", "dev"), CONFORMANCE["dev"])
    chosen = {"max_examples": examples, "stateful_step_count": steps, "deadline": None, **overrides}
    if os.environ.get("DUCTWORK_NO_SHRINK") == "1":  # mutant hunts: the first counterexample is enough;
        from hypothesis import Phase  # the budget stays the profile's, so a kill under ci is CI's own

        chosen.setdefault("phases", [Phase.explicit, Phase.reuse, Phase.generate])
    return settings(settings(), **chosen)


def test_limits_engine_agrees_with_model(db_url):
    from ductwork.db import engines

    engine = engines.create_engine(db_url)
    try:
        run_state_machine_as_test(lambda: LimitsAgainstModel(db_url, engine), settings=conformance_settings())
    finally:
        engine.dispose()
