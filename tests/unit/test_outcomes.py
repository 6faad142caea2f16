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

from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest

from ductwork.limits.outcomes import releases_first, rerun_at, retry_at

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


@dataclass(frozen=True)
class _Claim:
    limit_key: str | None
    fills_key: bool


@dataclass(frozen=True)
class _Success:
    claimed: _Claim
    ran_s: float | None = None


@pytest.mark.parametrize(("claims", "first"), [
    ([], False),
    ([_Claim(None, False)], False),
    ([_Claim(None, True)], False),  # an unkeyed claim holds no slot
    ([_Claim("api", False)], False),  # a key with room: what follows is written inline
    ([_Claim("api", True)], True),
    ([_Claim("api", False), _Claim("api", True)], True),  # one claim that filled the key is enough
    ([_Claim("api", True), _Claim("api", False)], True),
])
def test_a_success_releases_first_when_its_claim_filled_its_key(claims, first):
    successes = [_Success(c) for c in claims]  # untimed bodies count as slow
    assert releases_first(successes, 0.005) is first
    assert releases_first(iter(successes), 0.005) is first


@pytest.mark.parametrize(("ran_s", "first"), [
    (0.005, True),  # a body of exactly release_first_after: released first
    (0.0049, False),  # just faster: what follows is written inline
    (None, True),  # untimed
    (1.0, True),
])
def test_a_full_key_success_releases_first_only_after_a_body_that_slow(ran_s, first):
    assert releases_first([_Success(_Claim("api", True), ran_s)], 0.005) is first
    assert releases_first([_Success(_Claim("api", False), 1.0), _Success(_Claim("api", True), ran_s)],
                          0.005) is first
    assert releases_first([_Success(_Claim("api", True), 0.0)], 0.0) is True  # 0: every full-key success
