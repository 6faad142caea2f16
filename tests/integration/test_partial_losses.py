"""Partial losses inside a batch: exactly one of several held executions or branches is
taken between the claim and the commit, on every batch path.

Each batch path holds several executions (or branch claims) and commits them in one
transaction: the worker's group commit of unkeyed successes, the keyed group commit (a
worker's keyed batch, released under one hold of the key's lock), an advancer's batch
(``Advancer.advance_batch``) and the async batch (async steps awaited together, then
group-committed). Here one of three is lost while the batch runs (its execution crashed
as the reaper crashes it, or its branch claim released as the reaper releases it, and
re-claimed by another advancer), and every row the commit could touch for the lost one
(its execution and its re-run, its job's output, its expand items, its step, its branch,
its advancements, its run, its halt hook, its context; for a keyed group, the key's
header and bucket too) is compared with what it was right after the loss: the commit
writes nothing for it, while the other two commit. A guard that
notices only "nothing ended" instead of "fewer ended than I hold" writes the lost one's
output, step and successor beside its pending re-run; the engine mutants
``group_guard_counts_none``, ``keyed_group_guard_counts_none`` and
``batch_fence_counts_none`` (tests/mutants.py) are that bug on each path.

Checks: INV-EXE-2 (a group commit ends only executions still open and its owner's; the
lost one's re-run is the live execution), INV-ADV-1 and INV-ADV-2 (a batch's stale
branch claim commits nothing for its branch), INV-LIM-1 and INV-CLK-1 (a keyed group
that lost one releases each of the others with its own seq after the reaper's release),
INV-LIM-8 (the same in a partition of a key family at its ceiling: a release takes only
its partition's lock and writes nothing of the family's row).
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from ductwork import Pipeline, Step
from ductwork.db import schema
from ductwork.db.clock import to_us
from ductwork.fleet.processes import register
from ductwork.fleet.worker import Worker
from ductwork.pipelines.advance import Advancer
from ductwork.pipelines.branches import candidates, claim_branch, claim_branches, release_advancement
from ductwork.pipelines.outcomes import record_crash
from tests.factories import run_rows
from tests.workloads import Echo

#: what a losing step does while it runs: (the input that loses, the callback given its run id)
LOSE: dict = {}


def _maybe_lose(n, run_id) -> None:
    if LOSE and LOSE["n"] == n:
        LOSE["then"](run_id)


class Loser(Step):
    """Returns its argument; the one whose argument is ``LOSE["n"]`` is lost while it runs."""

    def __init__(self, n):
        self.n = n

    def execute(self):
        _maybe_lose(self.n, self._ductwork_run_id)
        return self.n


class SpreadLoser(Loser):
    """As :class:`Loser`, but returns a list (an expand's items)."""

    def execute(self):
        _maybe_lose(self.n, self._ductwork_run_id)
        return [self.n, self.n]


class AsyncLoser(Loser):
    async def execute(self):
        _maybe_lose(self.n, self._ductwork_run_id)
        return self.n


class LoserChain(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Loser).chain(to=Echo)


class LoserExpand(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(SpreadLoser).expand(to=Echo).collapse(into=Echo)


class KeyedLoserChain(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Loser, limit_by="three").chain(to=Echo)


class PartitionLoser(Loser):
    """As :class:`Loser`, in its account's partition of the key family ``tenant``."""

    def __init__(self, account, n):
        super().__init__(n)
        self.account = account


class PartitionLoserChain(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(PartitionLoser, limit_by=("tenant", "account")).chain(to=Echo)


class AsyncLoserChain(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(AsyncLoser).chain(to=Echo)


@pytest.fixture(autouse=True)
def _no_loss_left():
    yield
    LOSE.clear()


@pytest.fixture
def keyed_app(db_url):
    from tests.conftest import installed, make_app

    yield from installed(make_app(db_url, job_worker={"limits": {
        "three": {"concurrency": 3, "rate": {"limit": 1000, "per": 1}}}}))  # (a rate: the key has a bucket)


@pytest.fixture
def family_app(db_url):
    """A key family whose ceiling one partition's ``concurrency`` fills."""
    from tests.conftest import installed, make_app

    yield from installed(make_app(db_url, job_worker={"limits": {
        "tenant": {"per_partition": {"concurrency": 3}, "concurrency": 3}}}))


@pytest.fixture
def advancer_app(db_url):
    """Every edge through an advancer: the workers leave their steps ``advancing``."""
    from tests.conftest import installed, make_app

    yield from installed(make_app(db_url, pipeline_advancer={"inline_linear": False}))


def crash_its_execution(app, process_id, frozen: dict, then=None):
    """A loss: the run's in-flight execution crashed as the reaper crashes it; its rows
    right after are kept in ``frozen``, and ``then()`` is called."""
    e, s = schema.executions, schema.steps

    def lose(run_id):
        with app.begin() as tx:
            (execution_id,) = tx.execute(
                sa.select(e.c.id).join(s, s.c.id == e.c.step_id)
                .where(s.c.run_id == run_id, e.c.completed_at.is_(None), e.c.claimed_at.is_not(None))).scalars()
        assert record_crash(app, execution_id, process_id, "ductwork.ProcessCrash", "reaped under its batch")
        frozen.update(run_rows(app, run_id))
        if then is not None:
            then()
    return lose


def key_rows(app, key: str) -> tuple[dict, list[tuple]]:
    """The key's header row (by column) and its buckets."""
    k, b = schema.limit_keys, schema.limit_buckets
    with app.begin() as tx:
        return (tx.execute(sa.select(k).where(k.c.key == key)).one()._asdict(),
                [tuple(row) for row in tx.execute(sa.select(b).where(b.c.key == key).order_by(b.c.period_s))])


def _steps(app, run_id) -> list[tuple[str, str]]:
    s = schema.steps
    with app.begin() as tx:
        return sorted(tuple(row) for row in tx.execute(sa.select(s.c.node, s.c.status).where(s.c.run_id == run_id)))


def _lost_batch(app, pipeline, then=None, account=None, also=None):
    """Three runs of ``pipeline`` (of ``account``'s, when given, before each one's number),
    then ``also()``, run by one batching worker whose batch loses the second run's execution
    while it runs (then calls ``then()``); returns (runs, the lost run's rows after the loss)."""
    pid = register(app, role="test", label="batcher")
    runs = [pipeline.trigger(*(() if account is None else (account,)), n) for n in range(3)]
    if also is not None:
        also()
    frozen: dict = {}
    LOSE.update(n=1, then=crash_its_execution(app, pid, frozen, then))
    worker = Worker(app, process_id=pid, batch_size=3, batch_window=60)
    worker.batch = 3  # paced as fast steps are (a new worker starts at 1)
    assert worker.run_once() is not None
    assert worker.held() == set()
    e = schema.executions
    with app.begin() as tx:
        claimed_at = tx.execute(sa.select(e.c.claimed_at).where(e.c.retry_count == 0, e.c.crash_count == 0,
                                                                 e.c.claimed_at.is_not(None))).scalars().all()
    assert len(claimed_at) == 3
    assert len(set(claimed_at)) == 1  # one batch claimed all three
    assert frozen, "the batch lost nothing"
    return runs, frozen


def _assert_lost_untouched(app, runs, frozen):
    lost = run_rows(app, runs[1].id)
    assert lost == frozen  # [INV-EXE-2] nothing of the commit for the lost one
    e = schema.executions
    assert [row for row in lost["executions"] if row[list(e.c.keys()).index("completed_at")] is None], \
        "the lost one's re-run is pending"


def test_a_group_commit_that_lost_one_writes_nothing_for_it(app):
    """Unkeyed chain runs (each success advanced inline by the group commit): the lost
    one's job keeps no output, its step stays ``in_progress`` with no successor, its
    branch and run are untouched, its re-run pending; the other two are advanced."""
    runs, frozen = _lost_batch(app, LoserChain)
    _assert_lost_untouched(app, runs, frozen)
    for run in (runs[0], runs[2]):
        assert _steps(app, run.id) == [("Echo#1", "in_progress"), ("Loser#0", "completed")]
    assert _steps(app, runs[1].id) == [("Loser#0", "in_progress")]


def test_a_group_commit_that_lost_one_writes_no_expand_items_for_it(app):
    """Expand runs (the group commit writes each job's items and leaves its step
    ``advancing``): the lost one's job has no items and its step stays ``in_progress``."""
    runs, frozen = _lost_batch(app, LoserExpand)
    _assert_lost_untouched(app, runs, frozen)
    assert frozen["expand_items"] == []
    for run in (runs[0], runs[2]):
        assert _steps(app, run.id) == [("SpreadLoser#0", "advancing")]
        assert len(run_rows(app, run.id)["expand_items"]) == 2


def test_a_keyed_group_commit_that_lost_one_writes_nothing_for_it(keyed_app):
    """A worker's keyed batch of three on a ``concurrency: 3`` key, one crashed (and
    released by the crash) while the batch runs: the keyed group commit writes nothing
    for it, and releases the other two each with its own seq after the crash's, the
    key's seq at the last of them, and its header and bucket otherwise as the loss left
    them (a release spends no token) [INV-LIM-1, INV-CLK-1]."""
    app = keyed_app
    k, b = schema.limit_keys, schema.limit_buckets
    with app.begin() as tx:  # ten tokens in the key's bucket (a new one starts empty)
        tx.execute(k.insert().values(key="three", seq=0, created_at=tx.now, updated_at=tx.now))
        tx.execute(b.insert().values(key="three", period_s=1, level_units=10 * 1_000_000, refilled_at_us=to_us(tx.now),
                                     updated_at=tx.now))
    after_loss: list = []
    runs, frozen = _lost_batch(app, KeyedLoserChain, then=lambda: after_loss.extend(key_rows(app, "three")))
    _assert_lost_untouched(app, runs, frozen)
    e = schema.executions
    with app.begin() as tx:
        releases = tx.execute(sa.select(e.c.release_seq).where(e.c.release_seq.is_not(None))
                              .order_by(e.c.release_seq)).scalars().all()
        claims = tx.execute(sa.select(e.c.claim_seq).where(e.c.claim_seq.is_not(None))).scalars().all()
    # the crash's and the two successes', each its own seq after the claims
    assert releases == [max(claims) + 1, max(claims) + 2, max(claims) + 3]
    (header, buckets), (header_then, buckets_then) = key_rows(app, "three"), after_loss
    assert header["seq"] == header_then["seq"] + 2 == releases[-1]
    assert {**header, "seq": None, "updated_at": None} == {**header_then, "seq": None, "updated_at": None}
    assert buckets_then
    assert buckets == buckets_then  # a release spends (or gives back) no token
    for run in (runs[0], runs[2]):
        assert ("Loser#0", "in_progress") not in _steps(app, run.id)
    assert _steps(app, runs[1].id) == [("Loser#0", "in_progress")]


def test_a_keyed_group_commit_in_a_partition_that_lost_one_writes_nothing_for_it(family_app):
    """The keyed group commit in a partition of a key family whose ceiling (3) the batch
    fills, one of its three crashed while it runs: nothing for the lost one; the other two
    released in the partition, each with its own seq after the crash's; the family's row
    as the loss left it (a release takes only its partition's lock, and ending an
    execution only lowers the family's count); another partition's execution, refused
    while the family was full, is claimed once the family has room [INV-LIM-8, INV-EXE-2]."""
    app = family_app
    waiting: list = []  # another partition's run, after the three: the family's ceiling keeps it
    after_loss: list = []
    runs, frozen = _lost_batch(app, PartitionLoserChain, account="a",
                               then=lambda: after_loss.extend(key_rows(app, "tenant")),
                               also=lambda: waiting.append(PartitionLoserChain.trigger("b", 7)))
    _assert_lost_untouched(app, runs, frozen)
    e, s = schema.executions, schema.steps
    partition = 'tenant["a"]'
    with app.begin() as tx:
        releases = tx.execute(sa.select(e.c.release_seq).where(e.c.limit_key == partition,
                                                                e.c.release_seq.is_not(None))
                              .order_by(e.c.release_seq)).scalars().all()
        claims = tx.execute(sa.select(e.c.claim_seq).where(e.c.limit_key == partition,
                                                            e.c.claim_seq.is_not(None))).scalars().all()
        other = tx.execute(sa.select(e.c.claimed_at).join(s, s.c.id == e.c.step_id)
                           .where(s.c.run_id == waiting[0].id)).scalars().all()
    assert releases == [max(claims) + 1, max(claims) + 2, max(claims) + 3]  # the crash's, then the group's
    assert key_rows(app, "tenant") == tuple(after_loss)  # [INV-LIM-8] the family's row: no release wrote it
    assert other == [None]  # refused while the batch filled the family
    for run in (runs[0], runs[2]):
        assert ("PartitionLoser#0", "in_progress") not in _steps(app, run.id)
    assert Worker(app, process_id=register(app, role="test", label="next")).run_once() is not None
    with app.begin() as tx:
        assert tx.execute(sa.select(e.c.claimed_at.is_not(None)).join(s, s.c.id == e.c.step_id)
                          .where(s.c.run_id == waiting[0].id, s.c.node == "PartitionLoser#0")).scalar_one()


def test_an_async_batch_that_lost_one_writes_nothing_for_it(app):
    """Async steps awaited together, then group-committed: one lost while awaited is
    left to its re-run, the other two are advanced."""
    runs, frozen = _lost_batch(app, AsyncLoserChain)
    _assert_lost_untouched(app, runs, frozen)
    for run in (runs[0], runs[2]):
        assert _steps(app, run.id) == [("AsyncLoser#0", "completed"), ("Echo#1", "in_progress")]


@pytest.mark.parametrize("then", ["released", "re-claimed"])
def test_an_advancers_batch_that_lost_one_branch_writes_nothing_for_it(advancer_app, then):
    """An advancer holds three branches' claims; one is released under it (as the reaper
    releases a dead process's), and maybe re-claimed by another advancer: its batch
    advances the other two and writes nothing for the lost branch (its step stays
    ``advancing``, no successor, the branch and its advancements as the loss left them);
    the new holder then advances it once [INV-ADV-1, INV-ADV-2]."""
    app = advancer_app
    pa, pb = (register(app, role="test", label=label) for label in ("a", "b"))
    runs = [LoserChain.trigger(n) for n in range(3)]
    worker = Worker(app)
    for _ in runs:
        assert worker.run_once().outcome == "success"
    with app.begin() as tx:
        branch_ids = candidates(tx, 10)
    claims = claim_branches(app, branch_ids, pa)
    assert len(claims) == 3
    claims.sort(key=lambda c: [r.id for r in runs].index(c.run_id))
    lost = claims[1]
    with app.begin() as tx:
        release_advancement(tx, lost.advancement_id, lost.branch_id, lost.token, "released under its batch")
    fresh = claim_branch(app, lost.branch_id, pb) if then == "re-claimed" else None
    frozen = run_rows(app, runs[1].id)
    results = Advancer(app, process_id=pa).advance_batch(claims)
    assert results == ["advanced", "stale", "advanced"]
    assert run_rows(app, runs[1].id) == frozen  # [INV-ADV-2] nothing for the stale claim
    for run in (runs[0], runs[2]):
        assert _steps(app, run.id) == [("Echo#1", "in_progress"), ("Loser#0", "completed")]
    assert _steps(app, runs[1].id) == [("Loser#0", "advancing")]
    if fresh is not None:
        assert Advancer(app, process_id=pb).advance(fresh) == "advanced"
        assert _steps(app, runs[1].id) == [("Echo#1", "in_progress"), ("Loser#0", "completed")]  # [INV-ADV-1]
