"""The judges of ``ductwork verify``'s environment checks (``ductwork_proof/environment.py``)
on the values a failing environment would give: each fails naming the value read, and
passes on the values this project's databases give (the probes that read them run in
``tests/integration/test_verify_environment.py``). No database.

Checks: none of INVARIANTS.md's (the environment the engine relies on).
"""

from __future__ import annotations

from datetime import datetime

import pytest

from ductwork.pipelines.payloads import STATEMENT_BYTES_NEEDED
from ductwork_proof.environment import (
    CHECKS,
    MAX_CLOCK_OFFSET_S,
    STATEMENTS,
    LockOutcome,
    judge_blocks,
    judge_clock,
    judge_isolation,
    judge_journal_mode,
    judge_microseconds,
    judge_packet,
    judge_skip_locked,
    judge_version,
)


@pytest.mark.parametrize(("flavour", "version"), [
    ("postgresql", (13, 0)), ("postgresql", (15, 20)), ("mysql", (8, 0, 11)), ("mariadb", (10, 6, 0)),
    ("mariadb", (10, 11, 19)), ("sqlite", (3, 35, 0)), ("sqlite", (3, 40, 1))])
def test_a_supported_release_passes(flavour: str, version: tuple[int, ...]):
    passed, detail = judge_version(flavour, version)
    assert passed is True, detail


@pytest.mark.parametrize(("flavour", "version", "named"), [
    ("postgresql", (12, 19), "PostgreSQL 12.19 is older than 13"),
    ("mysql", (5, 7, 44), "MySQL 5.7.44 is older than 8.0"),
    ("mariadb", (10, 5, 9), "MariaDB 10.5.9 is older than 10.6"),
    ("sqlite", (3, 34, 1), "SQLite 3.34.1 is older than 3.35")])
def test_an_older_release_fails_naming_it_and_the_minimum(flavour: str, version: tuple[int, ...], named: str):
    assert judge_version(flavour, version) == (False, f"{named}, the oldest release verify accepts")


@pytest.mark.parametrize("got", ["read committed", "READ-COMMITTED", "READ COMMITTED"])
def test_read_committed_as_each_server_spells_it_passes(got: str):
    assert judge_isolation("READ COMMITTED", got)[0] is True


@pytest.mark.parametrize("got", ["REPEATABLE-READ", "repeatable read", "serializable", "READ-UNCOMMITTED"])
def test_another_isolation_than_the_engine_asks_for_fails_naming_it(got: str):
    passed, detail = judge_isolation("READ COMMITTED", got)
    assert passed is False
    assert detail.startswith(f"connections get {got}, not the READ COMMITTED the engine asks for")


def test_sqlite_passes_in_wal_and_fails_in_another_journal_mode():
    assert judge_journal_mode("wal")[0] is True
    assert judge_journal_mode("delete") == (
        False, "journal_mode delete, not the wal the engine sets: this file system or build does not take it")


def test_skip_locked_passes_only_when_it_returns_the_unlocked_row_alone():
    assert judge_skip_locked(LockOutcome((2,)))[0] is True


def test_a_locking_read_that_waits_until_the_lock_timeout_passes():
    passed, detail = judge_blocks(LockOutcome(None, timed_out=True, error="Lock wait timeout exceeded"))
    assert passed is True
    assert "Lock wait timeout exceeded" in detail


@pytest.mark.parametrize(("judge", "outcome", "says"), [
    # SKIP LOCKED that waits, returns the locked row, or returns none
    (judge_skip_locked, LockOutcome(None, timed_out=True, error="canceling statement due to lock timeout"),
     "waited for the locked row until the lock timeout: SKIP LOCKED did not skip"),
    (judge_skip_locked, LockOutcome((1, 2)),
     "returned rows [1, 2] while row 1 was locked: the lock was not respected"),
    (judge_skip_locked, LockOutcome((1,)), "returned rows [1] while row 1 was locked"),
    (judge_skip_locked, LockOutcome(()), "returned rows [], not [2]: the unlocked row was not returned"),
    (judge_skip_locked, LockOutcome(None, error="syntax error at or near \"SKIP\""),
     "refused: syntax error at or near \"SKIP\""),
    # a locking read that does not wait for the lock
    (judge_blocks, LockOutcome((1,)), "went through while another transaction held the lock (returned rows [1])"),
    (judge_blocks, LockOutcome(None, error="could not obtain lock on row"),
     "refused without waiting for the lock: could not"),
])
def test_a_lock_outcome_the_engine_cannot_rely_on_fails_naming_what_happened(judge, outcome: LockOutcome, says: str):
    passed, detail = judge(outcome)
    assert passed is False
    assert says in detail


def test_timestamps_read_back_exactly_pass_and_truncated_ones_fail_naming_both():
    written = datetime(2026, 1, 2, 3, 4, 5, 123456)
    assert judge_microseconds([(written, written)])[0] is True
    assert judge_microseconds([(written, written.replace(microsecond=0))]) == (
        False, "2026-01-02T03:04:05.123456 read back as 2026-01-02T03:04:05")
    assert judge_microseconds([(written, written.replace(microsecond=123000))])[0] is False


@pytest.mark.parametrize(("offset", "uncertainty"), [(0.0, 0.001), (-4.9, 0.0), (4.9, 0.0), (6.0, 1.5)])
def test_a_clock_offset_within_the_bound_or_not_surely_beyond_it_passes(offset: float, uncertainty: float):
    passed, detail = judge_clock(offset, uncertainty)
    assert passed is True, detail


@pytest.mark.parametrize("offset", [5.5, -5.5, 3600.0])
def test_a_clock_offset_surely_beyond_the_bound_fails_naming_it(offset: float):
    passed, detail = judge_clock(offset, 0.2)
    assert passed is False
    assert detail.startswith(f"database clock {offset:+.4f} s from this host's (± 0.2000 s): more than "
                             f"{MAX_CLOCK_OFFSET_S:g} s")


def test_max_allowed_packet_below_what_a_maximum_payload_needs_fails_naming_both():
    assert judge_packet(STATEMENT_BYTES_NEEDED)[0] is True
    assert judge_packet(64 * 1024 * 1024)[0] is True
    passed, detail = judge_packet(4 * 1024 * 1024)
    assert passed is False
    assert detail.startswith(f"max_allowed_packet 4,194,304 bytes, less than the {STATEMENT_BYTES_NEEDED:,}")
    assert f"SET GLOBAL max_allowed_packet = {STATEMENT_BYTES_NEEDED}" in detail


def test_every_check_has_a_one_line_statement():
    assert list(STATEMENTS) == list(CHECKS)
    assert all(len(text) <= 120 and "\n" not in text for text in STATEMENTS.values())
