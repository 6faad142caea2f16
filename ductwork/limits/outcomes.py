"""What follows an execution's outcome: pure functions of the counters read with it.

    >>> from datetime import datetime
    >>> now = datetime(2026, 1, 1)
    >>> retry_at(2, 3, 10.0, now), retry_at(3, 3, 10.0, now)
    (datetime.datetime(2026, 1, 1, 0, 0, 10), None)

No SQL, no clock, no configuration: ``pipelines.outcomes.record_failure`` and
``pipelines.outcomes.crash_in`` read the execution's counters and the database time in the
transaction that ends it, look the budgets up for the step's pipeline and class, call a
rule, and enqueue the next execution it returns (or fail the step) in that transaction
[INV-EXE-4]. The model does the same in ``PipelinesModel.run_execution`` (and
``_may_retry``); ``tests/unit/test_outcomes.py`` pins every branch and boundary, and the
rules are mutated (``python -m tests.mutation ductwork.limits.outcomes``).

Not here: an ``invalid`` execution, which fails its step whatever budget is left (it
cannot succeed: ``pipelines.outcomes.record_invalid``), and the on_halt hook's budgets, the same
numbers decided apart (``pipelines.rules.decide_hook``).
"""

from __future__ import annotations

from datetime import datetime, timedelta


def retry_at(retry_count: int, max_retry: int, retry_delay: float, now: datetime) -> datetime | None:
    """When the retry of an execution that failed or timed out becomes eligible:
    ``retry_delay`` seconds after ``now`` while ``retry_count < max_retry`` (the retry then
    has ``retry_count + 1``); None when the budget is spent and the step fails. ``max_retry
    = 3``: at most 4 executions of a step end in failure or timeout."""
    if retry_count < max_retry:  # [INV-EXE-4] the retry budget
        return now + timedelta(seconds=retry_delay)
    return None


def rerun_at(crash_count: int, max_crash: int, crash_backoff: float, now: datetime) -> datetime | None:
    """When the re-run of a crashed execution becomes eligible, while ``crash_count <
    max_crash`` (the re-run then has ``crash_count + 1`` = n): at ``now`` while n ≤
    ``max_crash // 3``, else n × ``crash_backoff`` seconds later. None when the budget is
    spent and the step fails. ``max_crash = 10``, back-off 10 s: crashes 1 to 3 re-run at
    once, the 4th 40 s later, the 10th 100 s later, the 11th fails the step."""
    if crash_count < max_crash:  # [INV-EXE-4] the crash budget
        count = crash_count + 1
        return now if count <= max_crash // 3 else now + timedelta(seconds=crash_backoff) * count
    return None
