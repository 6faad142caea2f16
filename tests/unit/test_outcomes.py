"""What follows an execution's outcome (``ductwork/limits/outcomes.py``), no database.

Checks: the retry and crash budgets of a step reached exactly (the execution that
reaches them is the step's last), the retry delay, the crash back-off's immediate third
and its delays (n × back-off for the n-th re-run) [INV-EXE-4], and which keyed successes
are recorded as a release first. The transactions that call them (``record_failure``,
``crash_in``, ``record_successes``) are tested on every database in
``tests/integration/test_pipelines.py`` and ``test_batches.py``, and against the model in
``tests/properties/test_conformance_limits.py``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from ductwork.limits.outcomes import rerun_at, retry_at

NOW = datetime(2026, 3, 1, 12, 0, 0)


@pytest.mark.parametrize(("retry_count", "max_retry", "at"), [
    (0, 3, NOW + timedelta(seconds=10)),
    (2, 3, NOW + timedelta(seconds=10)),  # the 3rd failure: the last retry
    (3, 3, None),  # the budget reached exactly: the step fails
    (4, 3, None),
    (0, 0, None),  # no retries
    (0, 1, NOW + timedelta(seconds=10)),
])
def test_a_failure_is_retried_after_the_delay_within_its_budget(retry_count, max_retry, at):
    assert retry_at(retry_count, max_retry, 10.0, NOW) == at


def test_the_retry_delay_is_in_seconds_and_may_be_a_fraction():
    assert retry_at(0, 1, 0.25, NOW) == NOW + timedelta(milliseconds=250)
    assert retry_at(0, 1, 0.0, NOW) == NOW


@pytest.mark.parametrize(("crash_count", "max_crash", "at"), [
    (0, 10, NOW),
    (2, 10, NOW),  # the 3rd re-run of 10: still at once
    (3, 10, NOW + timedelta(seconds=40)),  # the 4th: 4 × 10 s
    (9, 10, NOW + timedelta(seconds=100)),  # the last one
    (10, 10, None),  # the budget reached exactly: the step fails
    (11, 10, None),
    (0, 0, None),
    (0, 2, NOW + timedelta(seconds=10)),  # 2 // 3 = 0: no re-run at once
    (0, 5, NOW), (1, 5, NOW + timedelta(seconds=20)),  # 5 // 3 = 1
    (2, 9, NOW), (3, 9, NOW + timedelta(seconds=40)),  # 9 // 3 = 3
])
def test_a_crash_is_re_run_at_once_then_backing_off_within_its_budget(crash_count, max_crash, at):
    assert rerun_at(crash_count, max_crash, 10.0, NOW) == at


def test_the_crash_back_off_is_in_seconds_and_may_be_a_fraction():
    assert rerun_at(3, 10, 0.5, NOW) == NOW + timedelta(seconds=2)
