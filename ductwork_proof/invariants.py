"""The invariants' IDs and statements, as INVARIANTS.md states them (its ``### INV-…``
headings), shipped so that a report names what it checked without the repository.

``tests/unit/test_proof_results.py`` holds this table equal to INVARIANTS.md's headings, but
for the IDs the page marks model only (specified and modelled, the engine pending; none
now), which no report names until the engine enforces them.
"""

from __future__ import annotations

STATEMENTS: dict[str, str] = {
    "INV-LIM-1": "In-flight executions of a key never exceed its concurrency",
    "INV-LIM-2": "Claims of a key fit every rate entry",
    "INV-LIM-3": "Slots never leak",
    "INV-LIM-4": "Bucket levels stay in range and survive restarts",
    "INV-LIM-5": "A rate-blocked key is stamped with the exact time of its next token",
    "INV-LIM-6": "FIFO across lanes",
    "INV-LIM-7": "Configuration is validated at boot; dominated entries change nothing",
    "INV-LIM-8": "In-flight executions of a key family never exceed its ceiling",
    "INV-LIM-9": "Forgetting an idle partition removes its rows and adds no token",
    "INV-ADV-1": "Successors are created exactly once",
    "INV-ADV-2": "A stale claim token commits nothing",
    "INV-ADV-3": "Fan-in fires exactly once, after every sibling, with all their outputs",
    "INV-ADV-4": "A batched expand yields exactly N children",
    "INV-EXE-1": "No lost work",
    "INV-EXE-2": "An outcome is recorded at most once",
    "INV-EXE-3": "Idempotency keys",
    "INV-EXE-4": "Retry and crash budgets",
    "INV-EXE-5": "A timed-out step's code is stopped before its slot is freed",
    "INV-RUN-1": "Runs settle, and terminal states are final",
    "INV-CTX-1": "A context key is set once per run",
    "INV-HLT-1": "A halted run's on_halt outcome is recorded exactly once",
    "INV-HLT-2": "Every halted run with a handler gets its hook delivered",
    "INV-REV-1": "One new run per revive",
    "INV-REV-2": "A revive re-executes and re-advances no succeeded step",
    "INV-REV-3": "A revived branch resumes where it stopped",
    "INV-TRG-1": "One run per pipeline and trigger key",
    "INV-TRG-2": "A trigger in the caller's transaction commits or rolls back with it",
    "INV-CLK-1": "One clock",
    "INV-PRN-1": "A prune never touches a live run",
    "INV-PRN-2": "A pruned run leaves no row behind, and a prune deletes whole runs",
}
