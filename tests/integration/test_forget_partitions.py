"""Forgetting idle partitions (docs/semantics.md §5.1, "Forgetting idle partitions"), on
SQLite, PostgreSQL and MySQL.

Checks: INV-LIM-9 (a partition's rows are removed only while it is idle, re-checked under
its lock; a bucket created again starts empty, so no token is added; a static key and a
family's own row are never forgotten), INV-CLK-1 (a partition's row created again numbers
its claims and releases above every sequence number its forgotten rows used), and the race
with an enqueue: a sweep that deletes the row between an enqueue's read of it and its commit
leaves a pending execution whose key has no row, and the claim creates the row and claims it.
The sweep reads at most its batch of header rows per call and goes on from where it stopped.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime

import pytest
import sqlalchemy as sa

from ductwork.db import schema
from ductwork.db.clock import ManualClock
from ductwork.fleet.processes import register
from ductwork.limits import claims, executions
from ductwork.limits.claims import Refusal, claim, claim_keyed
from ductwork.limits.executions import Ending, forget_idle_partitions, forget_partition
from ductwork_proof.conformance.factories import make_executions, make_run
from tests.capabilities import needs
from tests.conftest import installed, make_app

T0 = datetime(2026, 1, 1, 12, 0, 0)
KEY = 'fam["acct-1"]'
LIMITS = {"fam": {"per_partition": {"concurrency": 1, "rate": {"limit": 1, "per": 1}}}, "static[1]": {"concurrency": 1}}


@pytest.fixture
def fam_app(db_url, request):
    """An app on a ManualClock whose family ``fam`` admits one claim per second per partition
    (its supervisor section overridden by an indirect parameter, when given)."""
    supervisor = getattr(request, "param", {})
    yield from installed(make_app(db_url, clock=ManualClock(T0), job_worker={"limits": LIMITS},
                                  supervisor=supervisor))


def rows(app) -> dict[str, list[tuple]]:
    """Every row of the limits tables, as tuples, sorted."""
    with app.begin(readonly=True) as tx:
        return {t.name: sorted(tuple(r) for r in tx.execute(sa.select(t)))
                for t in (schema.limit_keys, schema.limit_buckets)}


def seqs(app, key: str) -> list[int]:
    """Every claim and release sequence number the key's executions hold."""
    e = schema.executions
    with app.begin(readonly=True) as tx:
        got = tx.execute(sa.select(e.c.claim_seq, e.c.release_seq).where(e.c.limit_key == key)).all()
    return sorted(s for row in got for s in row if s is not None)


def claim_and_complete(app, process: str, key: str) -> None:
    """Claim one execution of ``key`` and release it: its first decision creates its bucket
    empty (refused), one second on a token is there."""
    got = claim_keyed(app, key, process)
    if isinstance(got, Refusal):
        assert got.reason == "rate", got
        app.clock.advance(seconds=1)
        got = claim_keyed(app, key, process)
    (claimed,) = got
    with app.begin() as tx:
        assert claims.release_and_claim(app, tx, key, process, [Ending(claimed.execution_id)]).ended


@pytest.fixture
def history(fam_app):
    """Partition KEY with two executions claimed and completed: it is idle, its bucket and
    its header row (seq 4) left, a minute later (its bucket full again)."""
    run_id, branch_id = make_run(fam_app)
    process = register(fam_app, role="test", label="w")
    make_executions(fam_app, run_id, branch_id, KEY, T0, 2)
    claim_and_complete(fam_app, process, KEY)
    claim_and_complete(fam_app, process, KEY)
    fam_app.clock.advance(seconds=60)
    assert seqs(fam_app, KEY) == [1, 2, 3, 4]
    return run_id, branch_id, process


def test_an_idle_partition_is_forgotten_and_comes_back_empty_numbering_on(fam_app, history):
    run_id, branch_id, process = history
    assert forget_partition(fam_app, KEY)
    left = rows(fam_app)
    assert [r for r in left["ductwork_limit_keys"] if r[0] == KEY] == []
    assert left["ductwork_limit_buckets"] == []
    assert [r[0] for r in left["ductwork_limit_keys"]] == ["fam"]  # the family's row stays
    (later,) = make_executions(fam_app, run_id, branch_id, KEY, fam_app.clock.now(), 1)
    # [INV-LIM-9] the bucket starts empty: a kept one was full and would admit now
    refused = claim_keyed(fam_app, KEY, process)
    assert refused == Refusal(KEY, "rate")
    fam_app.clock.advance(seconds=1)
    (claimed,) = claim_keyed(fam_app, KEY, process)
    assert claimed.execution_id == later
    assert seqs(fam_app, KEY) == [1, 2, 3, 4, 5]  # [INV-CLK-1] on from 4, not from 0


@pytest.mark.parametrize("busy", ["pending", "in_flight"])
def test_a_busy_partition_static_key_or_family_row_is_never_forgotten(fam_app, history, busy):
    run_id, branch_id, process = history
    make_executions(fam_app, run_id, branch_id, KEY, fam_app.clock.now(), 1)
    make_executions(fam_app, run_id, branch_id, "static[1]", fam_app.clock.now(), 1)
    if busy == "in_flight":
        assert isinstance(claim_keyed(fam_app, KEY, process), list)
        assert isinstance(claim_keyed(fam_app, "static[1]", process), list)
    before = rows(fam_app)
    assert not forget_partition(fam_app, KEY)  # [INV-LIM-9] busy
    assert not forget_partition(fam_app, "static[1]")  # a static key, even idle or named like a partition
    assert not forget_partition(fam_app, "fam")  # the family's own row: every partition's claim locks it
    assert rows(fam_app) == before


def test_a_pending_execution_whose_row_was_forgotten_is_claimed(fam_app, history, monkeypatch):
    """The state the race leaves (any backend): the sweep forgot the partition after an
    enqueue read its row and before the enqueue committed, so the execution is pending in a
    lane whose key has no row. A poll's lane walk finds the lane (from the executions, the
    key's row outer-joined) and its claim creates the row, locked, and claims it; its bucket
    starts empty and its sequence goes on."""
    run_id, branch_id, process = history
    assert forget_partition(fam_app, KEY)
    with monkeypatch.context() as patched:  # the enqueue found the row (read before the sweep deleted it)
        patched.setattr(executions, "ensure_keys", lambda *_: None)
        (pending,) = make_executions(fam_app, run_id, branch_id, KEY, fam_app.clock.now(), 1)
    assert [r for r in rows(fam_app)["ductwork_limit_keys"] if r[0] == KEY] == []
    assert claim(fam_app, process) is None  # a poll's walk found the lane: its row created, its bucket empty
    assert [r[0] for r in rows(fam_app)["ductwork_limit_keys"]] == ["fam", KEY]
    fam_app.clock.advance(seconds=1)
    claimed = claim(fam_app, process)
    assert claimed is not None
    assert claimed.execution_id == pending
    assert seqs(fam_app, KEY) == [1, 2, 3, 4, 5]


class ForgetBeforeCommit:
    """An app whose transactions, once their body ran, let a sweep forget ``key`` from
    another connection before they commit (what ``make_executions`` enqueues then commits
    after the sweep)."""

    def __init__(self, app, key: str):
        self.app, self.key, self.forgot = app, key, None

    @contextlib.contextmanager
    def begin(self):
        with self.app.begin() as tx:
            yield tx
            self.forgot = forget_partition(self.app, self.key)


@needs("interleaved_writers")
def test_a_sweep_between_an_enqueues_read_and_its_commit(fam_app, history):
    """The race itself, on a server: the enqueue read the partition's row (it exists) and
    inserted its execution; before it commits, the sweep locks the row, finds no execution
    it can see and deletes the row; the enqueue commits. The claim creates the row again,
    starts its bucket empty, numbers on above the forgotten sequence, and claims it."""
    run_id, branch_id, process = history
    racing = ForgetBeforeCommit(fam_app, KEY)
    (pending,) = make_executions(racing, run_id, branch_id, KEY, fam_app.clock.now(), 1)
    assert racing.forgot is True, "the sweep did not see the uncommitted enqueue: it forgot the row"
    assert [r for r in rows(fam_app)["ductwork_limit_keys"] if r[0] == KEY] == []
    refused = claim_keyed(fam_app, KEY, process)
    assert refused == Refusal(KEY, "rate")  # [INV-LIM-9] the bucket starts empty
    fam_app.clock.advance(seconds=1)
    (claimed,) = claim_keyed(fam_app, KEY, process)
    assert claimed.execution_id == pending
    assert seqs(fam_app, KEY) == [1, 2, 3, 4, 5]  # [INV-CLK-1]


def test_the_sweep_reads_a_bounded_batch_and_goes_on_where_it_stopped(fam_app, caplog):
    run_id, branch_id = make_run(fam_app)
    process = register(fam_app, role="test", label="w")
    idle = [f"fam[{i}]" for i in range(5)]
    for key in idle:
        make_executions(fam_app, run_id, branch_id, key, T0, 1)
        claim_and_complete(fam_app, process, key)
    make_executions(fam_app, run_id, branch_id, "fam[9]", T0, 1)  # pending: never forgotten
    assert forget_idle_partitions(fam_app, limit=10) == ([], "")  # nothing idle for an hour yet
    fam_app.clock.advance(seconds=3600)
    with caplog.at_level(logging.INFO, logger="ductwork.limits"):
        first = forget_idle_partitions(fam_app, limit=3)  # the rows fam, fam[0], fam[1]
        second = forget_idle_partitions(fam_app, after=first[1], limit=3)  # fam[2], fam[3], fam[4]
        third = forget_idle_partitions(fam_app, after=second[1], limit=3)  # fam[9], then the end
    assert first == (["fam[0]", "fam[1]"], "fam[1]")
    assert second == (["fam[2]", "fam[3]", "fam[4]"], "fam[4]")
    assert third == ([], "")
    assert [r[0] for r in rows(fam_app)["ductwork_limit_keys"]] == ["fam", "fam[9]"]
    assert "forgot 3 idle partitions: fam[2], fam[3], fam[4]" in caplog.text


def test_a_sweep_of_one_row_a_batch_goes_on_past_a_row_it_does_not_forget(fam_app):
    """The next batch starts after the last row read, not at it: with a batch of one row
    (``supervisor.forget_batch: 1``) and the family's own row first, a sweep that started
    at that row again would read it for ever and forget nothing."""
    run_id, branch_id = make_run(fam_app)
    process = register(fam_app, role="test", label="w")
    make_executions(fam_app, run_id, branch_id, "fam[0]", T0, 1)
    claim_and_complete(fam_app, process, "fam[0]")
    fam_app.clock.advance(seconds=3600)
    first = forget_idle_partitions(fam_app, limit=1)  # the family's row: never forgotten
    second = forget_idle_partitions(fam_app, after=first[1], limit=1)
    assert (first, second) == (([], "fam"), (["fam[0]"], "fam[0]"))


def test_a_new_partition_numbers_on_from_its_familys_seq(fam_app, history):
    """The family's row keeps the highest seq any forgotten partition used: a partition
    never seen before starts above it too (any start above its own past is sound)."""
    run_id, branch_id, process = history
    assert forget_partition(fam_app, KEY)
    make_executions(fam_app, run_id, branch_id, "fam[7]", fam_app.clock.now(), 1)
    fam_app.clock.advance(seconds=1)
    claim_keyed(fam_app, "fam[7]", process)  # refused: its bucket starts empty
    fam_app.clock.advance(seconds=1)
    assert len(claim_keyed(fam_app, "fam[7]", process)) == 1
    assert seqs(fam_app, "fam[7]") == [5]


@pytest.mark.parametrize("fam_app", [{"forget_idle_after": "10m", "forget_batch": 3}], indirect=True)
def test_the_supervisors_tick_sweeps_a_configured_batch_after_the_configured_idle_age(fam_app):
    """Each supervisor tick runs one step of the sweep, of ``supervisor.forget_batch`` rows,
    the next tick the next step, and forgets a partition once no claim or release changed it
    for ``supervisor.forget_idle_after`` (ten minutes here; the defaults, an hour and 100 rows,
    would forget nothing at first, then all three at once)."""
    from ductwork.fleet.supervisor import Supervisor

    run_id, branch_id = make_run(fam_app)
    process = register(fam_app, role="test", label="w")
    partitions = ["fam[0]", "fam[1]", "fam[2]"]
    for key in partitions:
        make_executions(fam_app, run_id, branch_id, key, T0, 1)
        claim_and_complete(fam_app, process, key)  # each a second after the one before
    tick = Supervisor(fam_app, [], role="worker")
    tick.children.clear()  # the tick without child processes
    fam_app.clock.advance(seconds=540)  # the last release nine minutes ago, the first 9 min 2 s
    tick.run_once()  # the batch of three rows: fam, fam[0], fam[1]
    tick.run_once()  # the rest, fam[2]; the next tick starts again at the first key
    assert [r[0] for r in rows(fam_app)["ductwork_limit_keys"]] == ["fam", *partitions]
    fam_app.clock.advance(seconds=60)  # every partition idle for ten minutes at least
    tick.run_once()  # fam, fam[0], fam[1]: the batch of three, of which two partitions
    assert [r[0] for r in rows(fam_app)["ductwork_limit_keys"]] == ["fam", "fam[2]"]
    tick.run_once()  # fam[2]
    assert [r[0] for r in rows(fam_app)["ductwork_limit_keys"]] == ["fam"]


def test_a_forget_touches_no_other_partition_and_keeps_the_familys_highest_seq(fam_app, history):
    """A partition whose one execution is in flight, with nothing else in flight anywhere,
    is busy; once idle, forgetting it leaves another partition's bucket alone; forgetting
    that other one (which numbered less) does not lower the family's high-water mark, so the
    first partition, seen again, numbers on above its own past [INV-LIM-9, INV-CLK-1]."""
    run_id, branch_id, process = history
    other = 'fam["acct-2"]'
    make_executions(fam_app, run_id, branch_id, other, fam_app.clock.now(), 1)
    claim_and_complete(fam_app, process, other)  # its row numbered 1, 2; its bucket left
    make_executions(fam_app, run_id, branch_id, KEY, fam_app.clock.now(), 1)
    (claimed,) = claim_keyed(fam_app, KEY, process)  # the only execution in flight anywhere
    assert not forget_partition(fam_app, KEY)  # [INV-LIM-9] busy: its own execution is in flight
    with fam_app.begin() as tx:
        assert claims.release_and_claim(fam_app, tx, KEY, process, [Ending(claimed.execution_id)]).ended
    assert seqs(fam_app, KEY) == [1, 2, 3, 4, 5, 6]
    assert forget_partition(fam_app, KEY)
    assert {r[0] for r in rows(fam_app)["ductwork_limit_buckets"]} == {other}  # the other's bucket stays
    assert forget_partition(fam_app, other)  # it numbered up to 2: the family keeps 6
    make_executions(fam_app, run_id, branch_id, KEY, fam_app.clock.now(), 1)
    claim_and_complete(fam_app, process, KEY)
    assert seqs(fam_app, KEY) == [1, 2, 3, 4, 5, 6, 7, 8]  # [INV-CLK-1] on from 6


def test_a_new_partition_reads_its_own_familys_seq(fam_app):
    """A partition's first row numbers on from its own family's row, not from another key's
    row met first: a static key's row, written before the family's, has numbered 2 [INV-CLK-1].
    And a claim creates only a partition's missing row: a key never named gets none."""
    run_id, branch_id = make_run(fam_app)
    process = register(fam_app, role="test", label="w")
    make_executions(fam_app, run_id, branch_id, "plain", T0, 1)  # its row first, unconfigured
    (taken,) = claim_keyed(fam_app, "plain", process)
    with fam_app.begin() as tx:
        assert claims.release_and_claim(fam_app, tx, "plain", process, [Ending(taken.execution_id)]).ended
    assert seqs(fam_app, "plain") == [1, 2]
    make_executions(fam_app, run_id, branch_id, KEY, T0, 1)
    claim_and_complete(fam_app, process, KEY)
    assert seqs(fam_app, KEY) == [1, 2]  # from the family's 0, not from "plain"'s 2
    # only a partition's missing row is created by its claim: a key never named has none
    assert claim_keyed(fam_app, "never-named", process) == Refusal("never-named", "gone")
    assert "never-named" not in {r[0] for r in rows(fam_app)["ductwork_limit_keys"]}
