"""The lane routine decides a partition's claims with its family's ceiling (issue 34).

A partition ``f["a"]`` of family ``f`` (``per_partition: {concurrency: 2}``, ceiling 2) is
claimed only while the family's in-flight count over all its partitions is below 2: a poll
of another partition with the family at its ceiling is refused for ``family_concurrency``
and writes nothing, a batch stops at the ceiling, a hand-off keeps its worker's family
slot, and the lane scan the routine's bound restates skips a partition of a saturated
family. Called through ``claims.release_and_claim``; on PostgreSQL only until the
MySQL-family routine and the Python path (SQLite) decide families too.

Checks: INV-LIM-8, INV-LIM-6.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from ductwork.db import schema
from ductwork.db.clock import ManualClock
from ductwork.fleet.processes import register
from ductwork.limit_entries import entry_digest
from ductwork.limits import claims
from ductwork.limits.executions import Ending
from ductwork_proof.conformance import abstraction
from tests.conftest import installed, make_app
from tests.factories import make_executions, make_run

NOW = datetime(2026, 1, 1, 12, 0, 0)
A, B, STATIC = 'f["a"]', 'f["b"]', "s"


@pytest.fixture
def family_app(db_url):
    if not db_url.startswith("postgresql"):
        pytest.skip("the family ceiling is decided by the PostgreSQL routine so far")
    yield from installed(make_app(db_url, clock=ManualClock(NOW), job_worker={"limits": {
        "f": {"per_partition": {"concurrency": 2}, "concurrency": 2},
        STATIC: {"concurrency": 5},
    }}))


class World:
    def __init__(self, app):
        self.app = app
        self.run_id, self.branch_id = make_run(app)
        self.me = register(app, role="test", label="me")
        self.other = register(app, role="test", label="other")

    def pending(self, key, count=1, ago=10):
        """``count`` pending executions of ``key``, eligible ``ago`` seconds before now (each
        later one created after), their key rows following this config, the family's row
        written with its partitions'."""
        ids = make_executions(self.app, self.run_id, self.branch_id, key, NOW - timedelta(seconds=ago), count)
        k = schema.limit_keys
        with self.app.begin() as tx:
            tx.execute(k.update().where(k.c.key == key).values(config_digest=entry_digest(self.app.config.entry_for(key))))
            if "[" in key and tx.execute(sa.select(k.c.key).where(k.c.key == "f")).first() is None:
                tx.execute(k.insert().values(key="f", seq=0, config_digest=None, created_at=tx.now, updated_at=tx.now))
        return ids

    def hold(self, key, count, process=None, ago=20):
        """``count`` executions of ``key`` in flight, held by ``process`` (default: another)."""
        ids = self.pending(key, count, ago)
        e = schema.executions
        with self.app.begin() as tx:
            tx.execute(e.update().where(e.c.id.in_(ids)).values(claimed_at=tx.now,
                                                                process_id=process or self.other))
        return ids

    def call(self, key, take, *, poll, endings=()):
        with self.app.begin() as tx:
            return claims.release_and_claim(self.app, tx, key, self.me, [Ending(i, "success") for i in endings],
                                            take, poll=poll)

    def rows(self):
        with self.app.begin(readonly=True) as tx:
            return abstraction.snapshot(tx.conn)

    def family_in_flight(self):
        return abstraction.family_in_flight(self.rows(), "f")


def test_a_poll_of_a_partition_of_a_family_at_its_ceiling_is_refused_and_writes_nothing(family_app):
    world = World(family_app)
    world.hold(A, 2)
    world.pending(B, 2)
    before = world.rows()
    taken = world.call(B, 3, poll=True)
    assert (taken.ended, taken.claimed, taken.refused) == (True, [], "family_concurrency")
    assert world.rows() == before  # no re-base, bucket, stamp or sequence number


def test_a_batch_in_a_partition_stops_at_the_familys_ceiling(family_app):
    world = World(family_app)
    world.hold(A, 1)
    first, *_ = world.pending(B, 3)
    taken = world.call(B, 3, poll=True)
    assert [c.execution_id for c in taken.claimed] == [first]  # B admits two; the family only one
    assert taken.refused is None
    assert world.family_in_flight() == 2


def test_a_hand_off_keeps_its_workers_family_slot(family_app):
    world = World(family_app)
    mine = world.hold(A, 2, process=world.me)[0]
    following = world.pending(A, 1)[0]
    world.pending(B, 1, ago=5)  # waiting in the other partition, after A's next: the slot stays in A
    taken = world.call(A, 1, poll=False, endings=[mine])
    assert [c.execution_id for c in taken.claimed] == [following]
    assert world.family_in_flight() == 2


@pytest.mark.parametrize(("flying", "handed"), [(2, True), (1, False)])
def test_the_bound_skips_a_partition_of_a_saturated_family(family_app, flying, handed):
    """A hand-off on a static key yields to an older partition's lane only while that
    partition's family may admit it [INV-LIM-6, INV-LIM-8]."""
    world = World(family_app)
    world.hold(A, flying)
    mine = world.hold(STATIC, 1, process=world.me)[0]
    world.pending(B, 1, ago=30)  # older than the static key's next
    following = world.pending(STATIC, 1)[0]
    taken = world.call(STATIC, 1, poll=False, endings=[mine])
    assert [c.execution_id for c in taken.claimed] == ([following] if handed else [])
