"""``ductwork.status``: the snapshot behind ``ductwork status``, the dashboard and its
``/metrics``, on SQLite, PostgreSQL and MySQL.

Its statements do not grow with the number of keys (the dashboard reads it with 10⁴
keys); a key's ``claims`` is every claim the key admitted, retries and crashes
included, read from the key's sequence; :func:`execution_outcomes` counts every
execution by how it ended. Read-only: no statement writes or locks.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from ductwork import Pipeline
from ductwork.db import schema
from ductwork.fleet.processes import register
from ductwork.limits.claims import claim
from ductwork.status import execution_outcomes, key_statuses, snapshot
from ductwork.testing import drain
from tests.conftest import installed_on_manual_clock
from tests.workloads import FailsOnce

#: k00 of concurrency 1; k01..k29 also rated (a bucket starts empty [INV-LIM-2]: no claim here)
LIMITS = {"pair": {"concurrency": 2}, "k00": {"concurrency": 1},
          **{f"k{i:02}": {"concurrency": 1, "rate": [{"limit": 5, "per": "1s"}]} for i in range(1, 30)}}


class Paired(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(FailsOnce, limit_by="pair")


class OnKey(Pipeline):
    """A step on key k00 (concurrency 1)."""

    @classmethod
    def define(cls, p):
        p.start(FailsOnce, limit_by="k00")


@pytest.fixture
def keyed(db_url):
    yield from installed_on_manual_clock(db_url, job_worker={"limits": LIMITS})


def _statements(app) -> list[str]:
    seen: list[str] = []

    def record(_conn, _cursor, statement, *_args):
        seen.append(statement)

    sa.event.listen(app.engine, "before_cursor_execute", record)
    try:
        snapshot(app)
    finally:
        sa.event.remove(app.engine, "before_cursor_execute", record)
    return seen


def _add_keys(app, names) -> None:
    with app.begin() as tx:
        for name in names:
            tx.execute(schema.limit_keys.insert().values(key=name, seq=0, created_at=tx.now, updated_at=tx.now))


def test_the_snapshot_reads_ten_keys_or_thirty_with_the_same_statements(keyed):
    """It was three statements a key (30,000 for the dashboard's 10⁴ keys); now each
    statement reads every key, and none writes or locks."""
    _add_keys(keyed, [f"k{i:02}" for i in range(10)])
    few = _statements(keyed)
    _add_keys(keyed, [f"k{i:02}" for i in range(10, 30)])
    many = _statements(keyed)
    assert len(many) == len(few)
    assert len(snapshot(keyed).keys) == 30
    writes = [s for s in many if s.lstrip().split()[0].upper() in ("INSERT", "UPDATE", "DELETE")
              or "FOR UPDATE" in s.upper() or "FOR SHARE" in s.upper()]
    assert writes == []


def test_claims_count_every_claim_retries_included_and_one_in_flight(keyed):
    runs = [Paired.trigger(i) for i in range(3)]
    drain(keyed, skip_delays=True)
    assert {run.refresh().status for run in runs} == {"completed"}
    held = OnKey.trigger(9)  # claimed below and left in flight
    holder = register(keyed, role="test", label="holder")
    assert claim(keyed, holder) is not None
    waiting = OnKey.trigger(10)  # pending behind it (concurrency 1)
    e = schema.executions
    with keyed.begin(readonly=True) as tx:
        claimed = dict(tx.execute(sa.select(e.c.limit_key, sa.func.count()).where(e.c.claimed_at.is_not(None))
                                  .group_by(e.c.limit_key)).all())
    assert claimed == {"pair": 6, "k00": 1}  # each run: a failure, then its retry
    keys = {key.key: key for key in snapshot(keyed).keys}
    assert (keys["pair"].claims, keys["pair"].in_flight, keys["pair"].pending) == (6, 0, 0)
    assert (keys["k00"].claims, keys["k00"].in_flight, keys["k00"].pending) == (1, 1, 1)
    assert keys["k00"].buckets == []
    _add_keys(keyed, ["k01"])
    assert next(key for key in snapshot(keyed).keys if key.key == "k01").buckets == [(1, 0, 5)]
    assert (held.refresh().status, waiting.refresh().status) == ("in_progress", "in_progress")


def test_execution_outcomes_count_every_execution_by_how_it_ended(keyed):
    Paired.trigger(1)
    drain(keyed, skip_delays=True)
    OnKey.trigger(2)
    assert claim(keyed, register(keyed, role="test", label="holder")) is not None
    OnKey.trigger(3)
    assert execution_outcomes(keyed) == {"failure": 1, "success": 1, "running": 1, "pending": 1}


def test_a_snapshot_of_some_keys_or_of_the_busy_ones(keyed):
    OnKey.trigger(1)
    assert claim(keyed, register(keyed, role="test", label="holder")) is not None  # k00: one in flight
    Paired.trigger(2)  # pair: one pending
    _add_keys(keyed, ["k05", "k06"])
    with keyed.begin() as tx:  # k06 rate-blocked for an hour
        tx.execute(schema.limit_keys.update().where(schema.limit_keys.c.key == "k06")
                   .values(blocked_until=tx.now + timedelta(hours=1)))
    assert [k.key for k in snapshot(keyed).keys] == ["k00", "k05", "k06", "pair"]
    assert [k.key for k in snapshot(keyed, busy_only=True).keys] == ["k00", "k06", "pair"]
    (k05,) = snapshot(keyed, keys=["k05"]).keys
    assert (k05.key, k05.in_flight, k05.pending, k05.buckets) == ("k05", 0, 0, [(1, 0, 5)])
    (k00,) = snapshot(keyed, keys=["k00", "nope"]).keys
    assert (k00.in_flight, k00.claims) == (1, 1)
    assert snapshot(keyed, keys=[]).keys == []


def test_key_statuses_builds_only_the_window_it_returns(keyed):
    _add_keys(keyed, [f"k{i:02}" for i in range(30)] + ["pair"])
    now, matched, window = key_statuses(keyed, contains="k1", offset=3, limit=4)
    assert (matched, [k.key for k in window]) == (10, ["k13", "k14", "k15", "k16"])
    assert now <= snapshot(keyed).now  # database time, read once
    assert [k.key for k in key_statuses(keyed, offset=29)[2]] == ["k29", "pair"]
    assert key_statuses(keyed, busy_only=True)[1:] == (0, [])
