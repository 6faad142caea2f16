"""Fan-in arrivals interleaved with an expand parked between its batches.

An expand of ``WIDTH`` items creates its children ``expand_batch`` (here 2) at a time,
and its advancer keeps the claim between batches [INV-ADV-4]. Children of the first
batches can run, succeed and arrive at the collapse barrier while later batches do not
exist yet. Each test drives one schedule deterministically in this thread: the
expand's advancer (``run_once``) is held at the ``between_expand_batches`` checkpoint,
where the schedule runs the created children's jobs and makes chosen children arrive
(each claimed and advanced as ``run_once`` would), in a chosen order; after every
batch and every arrival it checks that:

- the children are exactly the indices ``0..cursor-1``, once each [INV-ADV-4];
- the barrier counted each arrival once: ``fanin_arrivals`` is the number of children
  that arrived [INV-ADV-3];
- no merge step exists before the last arrival, and exactly one after it, whatever
  batch the last arrival came from [INV-ADV-3];

and at the end that the merge's input holds all ``WIDTH`` outputs in index order.

The fault variants stop the expand's advancer in a gap: ``reap`` force-reaps its
process there (what a supervisor does to a killed one), so its next batch's fence
finds the claim gone and commits nothing; ``raise`` arms the checkpoint's ``raise``
action (a routing error: recorded, the branch released). Arrivals continue while the
branch is released, then a fresh advancer claims it and resumes at the cursor.

Checks: INV-ADV-3, INV-ADV-4, INV-ADV-2 (the reaped advancer commits nothing more).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import sqlalchemy as sa

from ductwork import faults
from ductwork.db import schema
from ductwork.fleet.processes import register
from ductwork.fleet.reaper import reap
from ductwork.fleet.worker import Worker
from ductwork.pipelines.advance import Advancer
from ductwork.pipelines.branches import claim_branch
from tests.conftest import installed, make_app
from tests.workloads import Fan

WIDTH = 5
BATCH = 2  # batches [0, 1], [2, 3], [4]: two gaps, then the end


@dataclass(frozen=True)
class Schedule:
    """Which children arrive in each gap (after batch 1, after batch 2) and after the
    last batch, in that order; ``fault``: (``reap`` | ``raise``, gap) stops the expand's
    advancer at the end of that gap, and ``released`` arrive before it is resumed."""

    gaps: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    fault: tuple[str, int] | None = None
    released: tuple[int, ...] = ()


SCHEDULES = {
    # the first batch's children all arrive while the expand is parked; the last batch is
    # committed after every earlier child arrived, and its only child arrives last
    "each_batch_arrives_at_once": Schedule(((0, 1), (2, 3), (4,))),
    # the last arrival is the first child of the first batch
    "last_arrival_from_the_first_batch": Schedule(((1,), (3, 2), (4, 0))),
    "first_batch_arrives_last": Schedule(((), (2, 3), (4, 1, 0))),
    "interleaved": Schedule(((1,), (0, 3), (4, 2))),
    "all_after_the_last_batch_reversed": Schedule(((), (), (4, 3, 2, 1, 0))),
    # the expand's advancer is reaped in a gap; children arrive while the branch is free
    "reaped_after_the_first_batch": Schedule(((0,), (2,), (4, 3)), ("reap", 1), (1,)),
    "reaped_after_every_earlier_child_arrived": Schedule(((0, 1), (2, 3), (4,)), ("reap", 2)),
    "reaped_then_first_batch_arrives_last": Schedule(((), (3,), (4, 2, 0)), ("reap", 1), (1,)),
    # the checkpoint raises (a routing error, recorded): the branch is released and resumed
    "raised_after_the_first_batch": Schedule(((1,), (2, 3), (4,)), ("raise", 1), (0,)),
    "raised_after_the_second_batch": Schedule(((), (0, 2), (1, 4)), ("raise", 2), (3,)),
}


@pytest.fixture
def fan_app(db_url):
    yield from installed(make_app(db_url, pipeline_advancer={"expand_batch": BATCH}))
    faults.disarm()


class Driver:
    """The schedule's state and its checks."""

    def __init__(self, app, run_id: str):
        self.app = app
        self.run_id = run_id
        self.worker = Worker(app)
        self.arriver = Advancer(app)
        self.arrived: list[int] = []

    def barrier(self) -> str:
        b = schema.branches
        with self.app.begin(readonly=True) as tx:
            return tx.execute(sa.select(b.c.parent_id).where(
                b.c.run_id == self.run_id, b.c.parent_id.is_not(None)).limit(1)).scalar_one()

    def children(self) -> dict[int, str]:
        b, barrier = schema.branches, self.barrier()
        with self.app.begin(readonly=True) as tx:
            rows = tx.execute(sa.select(b.c.barrier_index, b.c.id).where(b.c.parent_id == barrier)).all()
        indices = [row.barrier_index for row in rows]
        assert sorted(indices) == list(range(len(indices))), indices  # [INV-ADV-4] each index once
        return {row.barrier_index: row.id for row in rows}

    def run_jobs(self) -> None:
        """Every created child's job, run to success (left ``advancing``: a collapse is
        never advanced inline)."""
        for _ in range(100):
            if self.worker.run_once() is None:
                return
        raise AssertionError("the children's jobs did not settle")

    def arrive(self, index: int) -> None:
        """Child ``index`` arrives at the barrier: claimed and advanced as ``run_once`` does."""
        self.run_jobs()
        claim = claim_branch(self.app, self.children()[index], self.arriver.process_id)
        assert claim is not None, f"child {index} is not claimable"
        assert self.arriver.advance_batch([claim]) == ["advanced"]
        self.arrived.append(index)
        self.check()

    def check(self) -> None:
        b, s = schema.branches, schema.steps
        barrier = self.barrier()
        children = self.children()
        with self.app.begin(readonly=True) as tx:
            row = tx.execute(sa.select(b.c.fanin_arrivals, b.c.fanout_cursor, b.c.fanout_width)
                             .where(b.c.id == barrier)).one()
            came = tx.execute(sa.select(b.c.barrier_index).where(
                b.c.parent_id == barrier, b.c.fanin_arrived_at.is_not(None))).scalars().all()
            merges = tx.execute(sa.select(s.c.id).join(b, b.c.id == s.c.branch_id).where(
                b.c.merged_barrier_id == barrier)).scalars().all()
        assert row.fanout_cursor == len(children)  # [INV-ADV-4] the cursor commits with its batch
        assert row.fanout_width == WIDTH
        assert sorted(came) == sorted(self.arrived)
        assert row.fanin_arrivals == len(self.arrived)  # [INV-ADV-3] each arrival counted once
        assert len(merges) == (1 if len(self.arrived) == WIDTH else 0), (  # [INV-ADV-3] once, at the last
            f"{len(merges)} merge steps after arrivals {self.arrived} with {len(children)} children created")


class Gaps:
    """Runs ``gaps[k]`` when an expand's advancer reaches its (k+1)-th gap between batches,
    then passes the checkpoint as armed. A check failing in a gap is kept in ``failed``
    (the advancer would record it as a routing error) and raised by :meth:`raise_failed`."""

    def __init__(self, monkeypatch, gaps: list[Callable[[], None]]):
        self.gaps, self.reached, self.failed = gaps, [], []
        self.real = faults.hit
        monkeypatch.setattr(faults, "hit", self.hit)

    def hit(self, name: str) -> None:
        if name == faults.BETWEEN_EXPAND_BATCHES:
            self.reached.append(len(self.reached) + 1)
            try:
                self.gaps[len(self.reached) - 1]()
            except AssertionError as failed:
                self.failed.append(failed)
                raise
        self.real(name)

    def raise_failed(self) -> None:
        if self.failed:
            raise self.failed[0]


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_children_arriving_while_their_expand_is_parked_fire_the_merge_once(fan_app, monkeypatch, name):
    schedule = SCHEDULES[name]
    app = fan_app
    run = Fan.trigger(WIDTH)
    driver = Driver(app, run.id)
    parked = Advancer(app, process_id=register(app, role="advancer", label="parked"))
    action, faulted = schedule.fault or (None, 0)

    def gap(k: int) -> Callable[[], None]:
        def events() -> None:
            driver.check()
            assert len(driver.children()) == BATCH * k  # parked after batch k, the claim held
            for index in schedule.gaps[k - 1]:
                driver.arrive(index)
            if k == faulted and action == "reap":
                assert reap(app, parked.process_id, force=True)  # its claim released, crash counted
            if k == faulted and action == "raise":
                faults.arm(faults.BETWEEN_EXPAND_BATCHES, "raise")
        return events

    hook = Gaps(monkeypatch, [gap(1), gap(2)])
    reached = hook.reached
    assert driver.worker.run_once() is not None  # Items: the expand's step succeeds
    done = parked.run_once()  # the expand, batch by batch
    hook.raise_failed()
    assert done == ("advanced" if action is None else "stale" if action == "reap" else "error")
    if action is not None:
        assert reached == list(range(1, faulted + 1))
        driver.check()  # nothing more was committed by the stopped advancer [INV-ADV-2]
        assert len(driver.children()) == BATCH * faulted
        faults.disarm()
        for index in schedule.released:
            driver.arrive(index)
        resumer = Advancer(app)
        expand = driver.barrier()
        claim = claim_branch(app, expand, resumer.process_id)
        assert claim is not None
        done = resumer.advance_batch([claim])
        hook.raise_failed()
        assert done == ["advanced"], done  # resumes at the cursor [INV-ADV-4]
    assert reached == [1, 2]
    driver.check()
    assert len(driver.children()) == WIDTH
    for index in schedule.gaps[2]:
        driver.arrive(index)
    assert sorted(driver.arrived) == list(range(WIDTH))

    for _ in range(50):  # the merge's own step, with run_once loops only
        if driver.arriver.run_once() == "idle" and driver.worker.run_once() is None:
            break
    assert run.refresh().status == "completed"
    (merge,) = [s for s in run.steps() if s.node.startswith("Gather")]
    assert merge.input == [[i * 10 for i in range(WIDTH)]]  # [INV-ADV-3] every output, in index order
    assert merge.output == [i * 10 for i in range(WIDTH)]
    driver.check()
