"""Key families on each database: a family's ceiling over all its partitions, in the lane routine.

A partition key is ``family[<canonical JSON>]``; a family declared with ``per_partition``
limits and a ``concurrency`` of its own admits a claim of any of its partitions only while
the family's in-flight count, over all its partitions, is below that ceiling
(docs/semantics.md §5.1 "Partitioned keys"). These call the lane routine
(``ductwork.limits.claims.release_and_claim``: SQL on PostgreSQL and MySQL-family, Python on
SQLite) directly on rows the factories put in place, for a family ``f`` of ceiling 2 whose
partitions ``f["a"]``, ``f["b"]`` each have a concurrency of 2: a partition alone would admit
what the family refuses.

Checks: INV-LIM-8 (a poll at the family's ceiling refused ``family_concurrency``, writing
nothing; a batch ending where the family reaches it; a hand-off keeping the family at it;
the bound skipping a family at its ceiling), INV-LIM-6 (the bound).
"""

from __future__ import annotations

from datetime import datetime

import pytest
import sqlalchemy as sa

from ductwork.db import schema
from ductwork.fleet.processes import register
from ductwork.limits import claims
from ductwork.limits.executions import Ending, ensure_keys
from tests.conftest import installed, make_app
from tests.factories import make_executions, make_run

FAMILY = "f"
A, B = 'f["a"]', 'f["b"]'
LIMITS = {FAMILY: {"per_partition": {"concurrency": 2}, "concurrency": 2}}


@pytest.fixture
def family_app(db_url):
    yield from installed(make_app(db_url, job_worker={"limits": LIMITS}))


def _at(day: int) -> datetime:
    return datetime(2000, 1, day)


def _call(app, key, owner, endings=(), take=1, *, poll=True) -> claims.Taken:
    with app.begin() as tx:
        return claims.release_and_claim(app, tx, key, owner, [Ending(i) for i in endings], take, poll=poll)


def _ids(taken: claims.Taken) -> list[str]:
    return [c.execution_id for c in taken.claimed]


def _in_flight(app) -> int:
    """The family's in-flight count, over all its partitions."""
    e = schema.executions
    with app.begin(readonly=True) as tx:
        return tx.execute(sa.select(sa.func.count()).select_from(e)
                          .where(e.c.claimed_at.is_not(None), e.c.completed_at.is_(None),
                                 e.c.limit_key.in_([A, B]))).scalar_one()


def _rows(app) -> dict[str, list[tuple]]:
    """Every row the routine could write: the keys' headers, their buckets, the executions."""
    k, b, e = schema.limit_keys, schema.limit_buckets, schema.executions
    with app.begin(readonly=True) as tx:
        return {"keys": [tuple(r) for r in tx.execute(sa.select(k).order_by(k.c.key))],
                "buckets": [tuple(r) for r in tx.execute(sa.select(b).order_by(b.c.key, b.c.period_s))],
                "executions": [tuple(r) for r in tx.execute(sa.select(e).order_by(e.c.id))]}


def _setup(app, a: int, b: int, unkeyed: tuple[int, ...] = ()) -> tuple[str, list[str], list[str], list[str]]:
    """A process, ``a`` pending executions of ``f["a"]`` (eligible on day 1), ``b`` of
    ``f["b"]`` (day 2) and unkeyed ones on the given days; the family's row with its
    partitions'."""
    run_id, branch_id = make_run(app)
    owner = register(app, role="test", label="w")
    in_a = make_executions(app, run_id, branch_id, A, _at(1), a)
    in_b = make_executions(app, run_id, branch_id, B, _at(2), b)
    free = [make_executions(app, run_id, branch_id, None, _at(day))[0] for day in unkeyed]
    with app.begin() as tx:
        ensure_keys(tx, {FAMILY})  # written with its partitions' rows at enqueue (a no-op then)
    return owner, in_a, in_b, free


def test_a_familys_ceiling_bounds_polls_batches_and_hand_offs_over_all_its_partitions(family_app):
    app = family_app
    owner, in_a, in_b, _ = _setup(app, 3, 3)
    # a batch of f["a"] under the ceiling: two, the family's ceiling (the partition's is 2 too)
    assert _ids(_call(app, A, owner, take=3)) == in_a[:2]
    assert _in_flight(app) == 2
    # f["b"] has no execution in flight and a concurrency of 2, but the family is at its ceiling:
    # a poll is refused for the family, and writes nothing (not even the re-base of f["b"]'s row,
    # which holds no stored values yet)
    before = _rows(app)
    taken = _call(app, B, owner, take=1)
    assert (taken.ended, _ids(taken), taken.refused) == (True, [], "family_concurrency")
    assert _rows(app) == before
    # a hand-off ending one of f["a"] claims its next: the family stays at its ceiling
    taken = _call(app, A, owner, endings=[in_a[0]], take=1, poll=False)
    assert (taken.ended, _ids(taken)) == (True, [in_a[2]])
    assert _in_flight(app) == 2
    # one ended without a hand-off: one in flight; a poll of f["b"] taking 3 (its own concurrency
    # would admit 2) claims exactly 1, where the family reaches its ceiling
    assert _call(app, A, owner, endings=[in_a[1]], take=0, poll=False).ended
    assert _in_flight(app) == 1
    taken = _call(app, B, owner, take=3)
    assert (_ids(taken), taken.refused) == ([in_b[0]], None)
    assert _in_flight(app) == 2
    # at the ceiling again: refused, whichever partition
    assert _call(app, B, owner, take=1).refused == "family_concurrency"


def test_the_bound_skips_the_partitions_of_a_family_at_its_ceiling(family_app):
    """Another lane's batch and hand-off stop before an older execution of a partition that may
    admit [INV-LIM-6], not before one of a family at its ceiling, which a poll would not try,
    though the partition itself (one of 2 in flight) is not saturated."""
    app = family_app
    owner, in_a, in_b, free = _setup(app, 2, 2, unkeyed=(3, 4, 5, 6, 7))
    assert _ids(_call(app, A, owner, take=2)) == in_a  # the family at its ceiling; f["b"]'s pending are older
    # at its ceiling: a batch of the unkeyed lane passes f["b"]'s older pending, and a hand-off claims
    assert _ids(_call(app, None, owner, take=2)) == free[:2]
    assert _ids(_call(app, None, owner, endings=[free[0]], take=1, poll=False)) == [free[2]]
    # one of the family's ended: f["b"] may admit, and its oldest (day 2) bounds the unkeyed lane
    assert _call(app, A, owner, endings=[in_a[0]], take=0, poll=False).ended
    assert _ids(_call(app, None, owner, endings=[free[1]], take=1, poll=False)) == []
    assert _ids(_call(app, None, owner, take=2)) == [free[3]]
    assert _ids(_call(app, B, owner, take=2)) == [in_b[0]]  # the family's last slot


def test_a_polls_refusal_at_the_familys_ceiling_is_counted_at_the_workers_heartbeat(family_app, monkeypatch, caplog):
    """A worker counts a poll refused ``family_concurrency`` by key and reason, and its next
    heartbeat adds the count to ``ductwork_key_refusals`` on each database. The reason is
    18 characters: before revision 0015 widened the column from 16, the servers refused the
    upsert, and every heartbeat after it failed (the worker keeps its counts for the next)."""
    from ductwork.fleet import supervisor
    from ductwork.limits.lanes import scan_lanes

    app = family_app
    owner, _, _, _ = _setup(app, 2, 1)
    with app.begin(readonly=True) as tx:
        (lane_b,) = [lane for lane in scan_lanes(app, tx) if lane.key == B]  # before the family filled
    assert _ids(_call(app, A, owner, take=2)) != []  # another process fills the family's ceiling
    assert _in_flight(app) == 2
    runner = supervisor.Runner(app, "job_worker", 1, "counting")
    runner.process_id = register(app, role="job_worker", label="counting")
    runner._units()  # its worker, sharing the process's counts; no thread started
    (worker,) = runner.units
    monkeypatch.setattr(claims, "scan_lanes", lambda *_, **__: [lane_b])  # its scan raced the fill: room in f

    assert worker.run_once() is None  # refused under the family's lock
    assert runner.beat()

    assert "heartbeat failed" not in caplog.text
    k = schema.key_refusals
    with app.begin(readonly=True) as tx:
        assert tx.execute(sa.select(k.c.key, k.c.reason, k.c.refusals)).all() == [(B, "family_concurrency", 1)]


def test_a_heartbeat_whose_refusal_counts_are_refused_is_sent_without_them(family_app, monkeypatch, caplog):
    """An observability counter must not cost a worker its lease: when the heartbeat's
    transaction fails with the refusal counts in it (as every one did while a reason did not
    fit its column), the heartbeat is sent again without them, the failure is logged as an
    error naming the counts, and they are kept for the next heartbeat, which writes them."""
    from ductwork.fleet import supervisor
    from ductwork.limits.claims import Refusal

    app = family_app
    runner = supervisor.Runner(app, "job_worker", 1, "counting")
    runner.process_id = register(app, role="job_worker", label="counting")
    runner._units()  # its worker and the process's counts; no thread started
    real = supervisor.heartbeat

    def refusing_counts(app_, process_id, refusals=None):
        if refusals:
            raise sa.exc.DataError("INSERT INTO ductwork_key_refusals", {}, ValueError("value too long"))
        return real(app_, process_id, refusals)

    def stamped() -> datetime:
        p = schema.processes
        with app.begin(readonly=True) as tx:
            return tx.execute(sa.select(p.c.last_heartbeat_at).where(p.c.id == runner.process_id)).scalar_one()

    before = stamped()
    runner.refusals.count(Refusal(B, "family_concurrency"))
    with monkeypatch.context() as patched:
        patched.setattr(supervisor, "heartbeat", refusing_counts)
        assert runner.beat()
    assert stamped() > before  # the lease held
    assert "heartbeat sent without its refusal counts" in caplog.text
    assert "family_concurrency" in caplog.text
    assert runner.beat()  # the next one writes what was kept
    k = schema.key_refusals
    with app.begin(readonly=True) as tx:
        assert tx.execute(sa.select(k.c.key, k.c.reason, k.c.refusals)).all() == [(B, "family_concurrency", 1)]
