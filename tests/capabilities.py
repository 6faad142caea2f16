"""What each backend can do, with reasons: used as marks, never as ``if dialect`` in tests.

    @needs("row_lock_waits_observable")
    def test_...(app): ...

A capability names the backends that have it and why the others do not; a test
that needs one is skipped on the others with that reason.
"""

from __future__ import annotations

import pytest

CAPABILITIES: dict[str, tuple[tuple[str, ...], str]] = {
    "row_lock_waits_observable": (
        ("postgresql", "mysql"),
        "SQLite has no row locks: its claimers queue for the database write lock, which no view shows",
    ),
    "interleaved_writers": (
        ("postgresql", "mysql"),
        "SQLite serialises writers at BEGIN IMMEDIATE: no sweep can delete a key's row between an "
        "enqueue's read of it and its commit",
    ),
    "key_lock_after_begin": (
        ("postgresql", "mysql"),
        "SQLite takes its write lock at BEGIN, before any statement, so a claim has no moment "
        "between starting and locking its key",
    ),
    "planner_without_statistics": (
        ("sqlite",),
        "PostgreSQL and MySQL plan with the table statistics they keep; SQLite has none until "
        "ANALYZE, so only its planner needs steering away from a low-selectivity index",
    ),
    "notify_channel": (
        ("postgresql",),
        "MySQL and SQLite have no notification channel: other processes find work at their next poll",
    ),
    "snapshot_older_than_a_commit": (
        ("postgresql", "mysql"),
        "SQLite serialises writers at BEGIN IMMEDIATE: a transaction that writes never reads from a "
        "snapshot older than another writer's commit, so it cannot miss a committed trigger key",
    ),
    "lock_refused_at_once": (
        ("postgresql", "mysql"),
        "SQLite has no NOWAIT: a second writer waits busy_timeout for the database lock before "
        "'database is locked', which the SQLite contention of every concurrent test meets",
    ),
    "locking_reads_past_the_snapshot": (
        ("mysql",),
        "PostgreSQL's REPEATABLE READ refuses to update a row changed after its snapshot (a "
        "serialization failure, retried by the caller); SQLite serialises writers at BEGIN IMMEDIATE",
    ),
    "server_side_routines": (
        ("postgresql", "mysql"),
        "SQLite is in-process: a statement is a call, not a round trip, so the lane routine "
        "runs its steps in Python (ductwork.limits.claims._in_python), each a statement",
    ),
    "python_lane_routine": (
        ("sqlite",),
        "PostgreSQL and MySQL run the lane routine on the server, one round trip: its "
        "statements are the routine's (tests/properties/test_refinement.py checks them)",
    ),
    "server_side_connections": (
        ("postgresql", "mysql"),
        "SQLite is embedded: there is no server to terminate connections from",
    ),
}


def needs(capability: str) -> pytest.MarkDecorator:
    """Mark a test that only runs where ``capability`` holds (see ``backend_filter`` in conftest)."""
    if capability not in CAPABILITIES:
        raise KeyError(f"unknown capability {capability!r}; known: {sorted(CAPABILITIES)}")
    return pytest.mark.needs(capability)
