"""Batches: several unkeyed claims in one transaction, several successes in one commit.

Checks: INV-LIM-6 (a batch takes exactly what polls in a row would, and never an
execution past an older keyed lane), INV-EXE-2 (a group commit ends only executions
still open and held by its owner; one reaped under it is left to the reaper and the
rest are recorded alone), INV-EXE-1 (a worker that dies mid-batch leaves nothing
claimed: what it ran but did not record, and what it had not started, is crashed
and re-runs), and that concurrent batches claim each execution once.
"""

from __future__ import annotations

import threading
from datetime import datetime

import pytest
import sqlalchemy as sa

from ductwork.db import schema
from ductwork.fleet import execute
from ductwork.fleet.processes import register
from ductwork.fleet.worker import Worker
from ductwork.limits import claims
from ductwork.limits.claims import claim, claim_batch, claim_keyed
from ductwork.pipelines import outcomes
from ductwork.pipelines.outcomes import HandOff, Success, record_crash, record_successes
from ductwork.pipelines.payloads import Output
from ductwork.pipelines.runs import cached_definition
from tests.capabilities import needs
from tests.factories import make_executions, make_run, of_another_process
from tests.workloads import Unkeyed

AT = datetime(2000, 1, 1)


def _rows(app, ids):
    e = schema.executions
    with app.begin() as tx:
        rows = tx.execute(sa.select(e.c.id, e.c.claimed_at, e.c.completed_at, e.c.outcome, e.c.process_id)
                          .where(e.c.id.in_(ids))).all()
    return {row.id: row for row in rows}


def test_a_batch_claims_the_oldest_unkeyed_executions_in_poll_order(app):
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    ids = make_executions(app, run_id, branch_id, None, AT, 5)
    claimed = claim_batch(app, process, 3)
    assert [c.execution_id for c in claimed] == ids[:3]
    rows = _rows(app, ids)
    assert {rows[i].claimed_at for i in ids[:3]} == {claimed[0].claimed_at}  # one transaction
    assert all(rows[i].process_id == process for i in ids[:3])
    assert all(rows[i].claimed_at is None for i in ids[3:])
    assert [c.execution_id for c in claim_batch(app, process, 10)] == ids[3:]
    assert claim_batch(app, process, 10) == []


def test_a_batch_stops_before_an_older_keyed_lane(app):
    """Unkeyed u1, u2, then keyed k, then unkeyed u3, all eligible at once: a batch of
    five takes u1 and u2 only; the next poll takes k, as polls one by one would [INV-LIM-6]."""
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    u1, u2 = make_executions(app, run_id, branch_id, None, AT, 2)
    k, = make_executions(app, run_id, branch_id, "shared", AT)
    u3, = make_executions(app, run_id, branch_id, None, AT)
    assert [c.execution_id for c in claim_batch(app, process, 5)] == [u1, u2]
    assert claim(app, process).execution_id == k
    assert [c.execution_id for c in claim_batch(app, process, 5)] == [u3]


def test_racing_batches_claim_each_execution_once(app):
    """Four threads, each of its own process (``of_another_process``), claim batches until
    nothing is left: every execution is claimed by exactly one of them."""
    run_id, branch_id = make_run(app)
    ids = make_executions(app, run_id, branch_id, None, AT, 40)
    pids = [register(app, role="test", label=f"w{i}") for i in range(4)]
    got: dict[str, list[str]] = {p: [] for p in pids}
    barrier = threading.Barrier(len(pids))
    failures = []

    def claimer(pid):
        own = of_another_process(app)
        try:
            barrier.wait(timeout=30)
            while batch := claim_batch(own, pid, 3):
                got[pid].extend(c.execution_id for c in batch)
        except Exception as error:  # noqa: BLE001 - reported below, on the test's thread
            failures.append(error)
        finally:
            own.dispose()

    threads = [threading.Thread(target=claimer, args=(p,)) for p in pids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures
    claimed = [i for batch in got.values() for i in batch]
    assert sorted(claimed) == sorted(ids)  # each once: no duplicate, none missed
    rows = _rows(app, ids)
    assert all(rows[i].process_id == p for p, batch in got.items() for i in batch)


def test_a_group_commit_records_every_success_in_one_transaction(app):
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    ids = make_executions(app, run_id, branch_id, None, AT, 3)
    claimed = claim_batch(app, process, 3)
    assert record_successes(app, [Success(c, Output(str(n))) for n, c in enumerate(claimed)]) == []
    rows = _rows(app, ids)
    assert {rows[i].outcome for i in ids} == {"success"}
    assert len({rows[i].completed_at for i in ids}) == 1
    s = schema.steps
    with app.begin() as tx:
        outputs = dict(tx.execute(sa.select(s.c.id, s.c.output_payload)
                                  .where(s.c.id.in_([c.step_id for c in claimed]))).all())
        statuses = set(tx.execute(sa.select(s.c.status).where(s.c.id.in_([c.step_id for c in claimed]))).scalars())
    assert [outputs[c.step_id] for c in claimed] == ['{"payload": 0}', '{"payload": 1}', '{"payload": 2}']
    assert statuses == {"advancing"}


def test_a_group_commit_leaves_a_reaped_execution_to_the_reaper(app):
    """One execution of the batch is crashed under it (as a reaper would): the group's
    guard ends fewer rows than it holds, so nothing of the group is written, and each of
    the others is then recorded alone; the crashed one keeps its outcome and its re-run
    [INV-EXE-2]."""
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    ids = make_executions(app, run_id, branch_id, None, AT, 3)
    claimed = claim_batch(app, process, 3)
    assert record_crash(app, ids[1], process, "ductwork.ProcessCrash", "reaped")
    record_successes(app, [Success(c, Output("null")) for c in claimed])
    rows = _rows(app, ids)
    assert [rows[i].outcome for i in ids] == ["success", "process_crashed", "success"]
    e = schema.executions
    with app.begin() as tx:
        reruns = tx.execute(sa.select(sa.func.count()).where(
            e.c.step_id == claimed[1].step_id, e.c.completed_at.is_(None))).scalar_one()
    assert reruns == 1


def test_a_release_of_several_takes_one_outcome_and_no_error(app):
    """The lane routine ends several executions at once only as a group commit does: with
    one outcome and no error (an error is one execution's). Asked to end two held
    executions with different outcomes, or with one outcome and an error each, it refuses
    (its assertion) before any statement, and both stay held, their rows as they were
    [INV-EXE-2]."""
    from ductwork.limits.claims import release_and_claim
    from ductwork.limits.executions import Ending, ErrorInfo

    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    ids = make_executions(app, run_id, branch_id, None, AT, 2)
    assert [c.execution_id for c in claim_batch(app, process, 2)] == ids
    before = _rows(app, ids)
    error = ErrorInfo("ValueError", "bad input", None)
    for endings in ([Ending(ids[0], "success"), Ending(ids[1], "failure")],
                    [Ending(ids[0], "failure", error), Ending(ids[1], "failure", error)]):
        with pytest.raises(AssertionError), app.begin() as tx:
            release_and_claim(app, tx, None, process, endings)
        assert _rows(app, ids) == before, endings


@needs("planner_without_statistics")
def test_a_group_commit_reads_its_rows_by_primary_key(app):
    """Every UPDATE of a batch finds its rows through the primary key, not through the
    index of a guard column (``process_id``, ``status``) that would make it read every
    execution the process ever ran, or every step of that status."""
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    make_executions(app, run_id, branch_id, None, AT, 3)
    claimed = claim_batch(app, process, 3)
    sent = []

    def capture(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001 - SQLAlchemy's hook
        if statement.lstrip().upper().startswith("UPDATE") and not executemany:
            sent.append((statement, parameters))

    sa.event.listen(app.engine, "before_cursor_execute", capture)
    try:
        record_successes(app, [Success(c, Output("null")) for c in claimed])
    finally:
        sa.event.remove(app.engine, "before_cursor_execute", capture)
    assert len(sent) == 2  # the executions' guard; the steps' status with their output (one UPDATE: one output)
    with app.engine.connect() as conn:
        for statement, parameters in sent:
            plan = " ".join(row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters))
            assert "ix_execution_process" not in plan, (statement, plan)
            assert "ix_step_status" not in plan, (statement, plan)
            assert "(id=?)" in plan, (statement, plan)


@pytest.mark.parametrize("routine", [
    pytest.param("python", marks=needs("python_lane_routine")),
    pytest.param("server", marks=needs("server_side_routines"))])
def test_a_batch_plans_for_the_ids_it_carries(app, routine):
    """The claim, the load and the group commit write their batch's ids into the statement
    text, so the database plans each for those ids: a prepared statement's generic plan,
    chosen while the queue tables were small, would otherwise be kept as they grow
    (ductwork.db.dialects.inline_ids). On a server the claim, the load and the guard are
    the lane routine's, one call whose ids travel as one array: the group commit's
    statement (the steps' status and outputs) still carries theirs in its text."""
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    ids = make_executions(app, run_id, branch_id, None, AT, 3)
    sent = []

    def capture(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001 - SQLAlchemy's hook
        if " IN " in statement.upper() and " NOT IN " not in statement.upper():  # (not the lane scan's lanes met)
            sent.append((statement, parameters))

    sa.event.listen(app.engine, "before_cursor_execute", capture)
    try:
        claimed = claim_batch(app, process, 3)
        record_successes(app, [Success(c, Output("null")) for c in claimed])
    finally:
        sa.event.remove(app.engine, "before_cursor_execute", capture)
    # claim, load and the executions' guard (in Python), the steps' status with their output
    assert len(sent) == {"python": 4, "server": 1}[routine]
    step_ids = [c.step_id for c in claimed]
    for statement, parameters in sent:
        expected = step_ids if "ductwork_steps SET" in statement else ids
        assert all(f"'{i}'" in statement for i in expected), statement
        values = parameters.values() if isinstance(parameters, dict) else parameters
        assert not set(expected) & set(values), (statement, parameters)


def _executions_of(app, runs):
    """Every execution of these runs' steps."""
    e, s = schema.executions, schema.steps
    with app.begin() as tx:
        return tx.execute(sa.select(e.c.step_id, e.c.outcome, e.c.crash_count, e.c.claimed_at, e.c.completed_at)
                          .join(s, s.c.id == e.c.step_id)
                          .where(s.c.run_id.in_([r.id for r in runs]))).all()


def _open_claims(app, process):
    e = schema.executions
    with app.begin() as tx:
        return tx.execute(sa.select(sa.func.count()).where(
            e.c.process_id == process, e.c.completed_at.is_(None))).scalar_one()


def test_a_worker_runs_fast_steps_in_batches_and_group_commits_them(app):
    runs = [Unkeyed.trigger(i) for i in range(20)]
    process = register(app, role="test", label="w")
    worker = Worker(app, process_id=process, hand_off=lambda: True, batch_size=8)
    while worker.run_once() is not None:
        pass
    rows = _executions_of(app, runs)
    assert len(rows) == 20
    assert {r.outcome for r in rows} == {"success"}
    commits = {r.completed_at for r in rows}
    assert len(commits) < 20, "fast steps were group-committed"
    assert max(sum(1 for r in rows if r.completed_at == at) for at in commits) <= 8
    assert worker.held() == set()
    assert _open_claims(app, process) == 0


def test_a_worker_without_batches_takes_one_execution_per_claim(app):
    runs = [Unkeyed.trigger(i) for i in range(3)]
    worker = Worker(app, hand_off=lambda: False, batch_size=1)
    for _ in runs:
        assert worker.run_once().outcome == "success"
    assert worker.run_once() is None


def test_a_worker_dying_mid_batch_leaves_nothing_claimed(app, monkeypatch):
    """The third step of a batch raises what no step failure covers (the thread is
    leaving): the two run but not yet recorded, the third, and the two not started are
    all crashed and re-run; while it ran, the worker held all five [INV-EXE-1]."""
    for i in range(5):
        Unkeyed.trigger(i)
    process = register(app, role="test", label="w")
    worker = Worker(app, process_id=process, hand_off=lambda: True, batch_size=5)
    worker.batch = 5  # as after fast steps
    calls, seen = [], []
    original = execute.run_body

    def run_body(app, claimed, definition):
        calls.append(claimed.execution_id)
        seen.append(worker.held())
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(app, claimed, definition)

    monkeypatch.setattr(execute, "run_body", run_body)
    with pytest.raises(KeyboardInterrupt):
        worker.run_once()
    assert len(calls) == 3
    assert seen[0] == seen[2]
    assert len(seen[0]) == 5
    assert worker.held() == set()
    assert _open_claims(app, process) == 0
    e = schema.executions
    with app.begin() as tx:
        outcomes = tx.execute(sa.select(e.c.outcome, e.c.crash_count).where(e.c.process_id == process)).all()
        pending = tx.execute(sa.select(sa.func.count()).where(e.c.claimed_at.is_(None), e.c.crash_count == 1)
                             ).scalar_one()
    assert sorted(outcomes) == [("process_crashed", 0)] * 5
    assert pending == 5


def test_one_failing_success_does_not_sink_its_batch(app, monkeypatch):
    """The second success's advancement raises: the batch's transaction rolls back, the
    first and third are recorded alone, and the error is raised for the second, which
    stays claimed for its worker to crash; its siblings' crash budgets are untouched."""
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    ids = make_executions(app, run_id, branch_id, None, AT, 3)
    claimed = claim_batch(app, process, 3)
    real = outcomes.advance_on_successes

    def broken(tx, inline):  # the routing of the second success fails, in any transaction holding it
        if any(i.claimed.execution_id == ids[1] for i in inline):
            raise RuntimeError("routing failed")
        return real(tx, inline)

    monkeypatch.setattr(outcomes, "advance_on_successes", broken)
    successes = [Success(c, Output("null")) for c in claimed]
    with pytest.raises(RuntimeError, match="routing failed"):
        record_successes(app, successes)
    rows = _rows(app, ids)
    assert [rows[i].outcome for i in ids] == ["success", None, "success"]
    assert rows[ids[1]].claimed_at is not None
    assert rows[ids[1]].completed_at is None


def test_a_failed_group_commit_crashes_only_its_group(app, monkeypatch):
    """The first group commit fails with an engine error: the one success in it is
    crashed (it re-runs), the two executions still queued stay held and run at the next
    run_once, and every job ends with exactly one success."""
    import ductwork.fleet.worker as worker_module

    runs = [Unkeyed.trigger(i) for i in range(3)]
    process = register(app, role="test", label="w")
    worker = Worker(app, process_id=process, hand_off=lambda: True, batch_size=3, batch_window=0.0)
    worker.batch = 3  # as after fast steps; a zero window flushes after every success
    calls = []
    original = worker_module.record_successes

    def failing_once(*args, **kwargs):
        calls.append(args[1][0].claimed.execution_id)
        if len(calls) == 1:
            raise RuntimeError("engine error")
        return original(*args, **kwargs)

    monkeypatch.setattr(worker_module, "record_successes", failing_once)
    with pytest.raises(RuntimeError, match="engine error"):
        worker.run_once()
    assert len(worker.held()) == 2  # the two not yet run, still claimed by this worker
    while worker.run_once() is not None:
        pass
    by_step: dict = {}
    for row in _executions_of(app, runs):
        by_step.setdefault(row.step_id, []).append((row.outcome, row.crash_count))
    assert sorted(sorted(v) for v in by_step.values()) == [
        [("process_crashed", 0), ("success", 1)], [("success", 0)], [("success", 0)]]
    assert worker.held() == set()
    assert _open_claims(app, process) == 0


@pytest.fixture
def keyed_app(db_url):
    from tests.conftest import make_app, reset_tables

    app = make_app(db_url, job_worker={"limits": {"three": {"concurrency": 3}}})
    reset_tables(app.engine)
    yield app
    app.dispose()


def test_a_keyed_batch_claims_what_polls_in_a_row_would(keyed_app):
    """Keyed k1..k5 of a ``concurrency: 3`` key: a keyed batch of up to five takes
    k1, k2, k3 under one lock hold (the next poll would find the key saturated), each
    with its own claim sequence number, as three polls would [INV-LIM-1, INV-LIM-6]."""
    app = keyed_app
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    ks = make_executions(app, run_id, branch_id, "three", AT, 5)
    got = claim_batch(app, process, 1, keyed_limit=5)
    assert [c.execution_id for c in got] == ks[:3]
    with app.begin() as tx:
        seqs = [tx.execute(sa.select(schema.executions.c.claim_seq).where(schema.executions.c.id == k))
                .scalar_one() for k in ks[:3]]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == 3
    assert claim_batch(app, process, 1, keyed_limit=5) == []  # saturated


def test_a_keyed_batch_stops_before_an_older_lane(keyed_app):
    """Keyed k1, k2, then unkeyed u, then keyed k3: a keyed batch of up to three takes
    k1 and k2 only; the next poll takes u, as polls one by one would [INV-LIM-6]."""
    app = keyed_app
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    k1, k2 = make_executions(app, run_id, branch_id, "three", AT, 2)
    u, = make_executions(app, run_id, branch_id, None, AT)
    k3, = make_executions(app, run_id, branch_id, "three", AT)
    assert [c.execution_id for c in claim_batch(app, process, 1, keyed_limit=3)] == [k1, k2]
    assert claim(app, process).execution_id == u
    assert [c.execution_id for c in claim_batch(app, process, 1, keyed_limit=3)] == [k3]


def _seqs(app, ids, column):
    e = schema.executions
    with app.begin() as tx:
        return [tx.execute(sa.select(getattr(e.c, column)).where(e.c.id == i)).scalar_one() for i in ids]


def test_a_keyed_group_commit_releases_each_with_its_own_seq_and_hands_on_the_next(keyed_app):
    """Keyed k1..k5 of a ``concurrency: 3`` key, k1..k3 claimed: their successes recorded
    in one keyed group commit release k1, k2, k3 with seq+1, +2, +3 in that order, under
    one lock hold after the claims [INV-LIM-1, INV-CLK-1], and the hand-off of up to three
    takes k4 and k5, with the next sequence numbers, as two polls in a row would."""
    app = keyed_app
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    ks = make_executions(app, run_id, branch_id, "three", AT, 5)
    got = claim_batch(app, process, 1, keyed_limit=3)
    handed = record_successes(app, [Success(c, Output("null")) for c in got], HandOff(keyed_limit=3))
    assert [c.execution_id for c in handed] == ks[3:]
    claims_, releases = _seqs(app, ks, "claim_seq"), _seqs(app, ks[:3], "release_seq")
    assert releases == [claims_[2] + 1, claims_[2] + 2, claims_[2] + 3]  # one per success, in order
    assert claims_[3:] == [releases[-1] + 1, releases[-1] + 2]
    rows = _rows(app, ks)
    assert {rows[k].completed_at for k in ks[:3]} == {rows[ks[3]].claimed_at}  # one transaction
    with app.begin() as tx:
        seq = tx.execute(sa.select(schema.limit_keys.c.seq).where(schema.limit_keys.c.key == "three")).scalar_one()
    assert seq == claims_[4]


def test_a_keyed_group_commit_with_nothing_to_hand_on_moves_the_keys_seq_past_its_releases(keyed_app):
    """Keyed k1, k2 claimed, nothing else pending: their keyed group commit hands nothing
    on, and the key's seq is its last release's, so the next claim (k3, created after)
    takes the number after it [INV-LIM-1, INV-CLK-1]."""
    app = keyed_app
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    ks = make_executions(app, run_id, branch_id, "three", AT, 2)
    got = claim_batch(app, process, 1, keyed_limit=2)
    assert record_successes(app, [Success(c, Output("null")) for c in got], HandOff(keyed_limit=2)) == []
    releases = _seqs(app, ks, "release_seq")
    assert releases == [max(_seqs(app, ks, "claim_seq")) + 1, max(_seqs(app, ks, "claim_seq")) + 2]
    with app.begin() as tx:
        seq = tx.execute(sa.select(schema.limit_keys.c.seq).where(schema.limit_keys.c.key == "three")).scalar_one()
    assert seq == releases[-1]
    k3, = make_executions(app, run_id, branch_id, "three", AT)
    assert [c.execution_id for c in claim_batch(app, process, 1, keyed_limit=1)] == [k3]
    assert _seqs(app, [k3], "claim_seq") == [releases[-1] + 1]


def test_a_keyed_group_commit_leaves_a_reaped_execution_to_the_reaper(keyed_app):
    """A keyed group commit whose guard misses one execution (the reaper crashed it) is
    recorded one by one: the others succeed, the reaped one keeps its crash [INV-EXE-2];
    only the last transaction hands on (the crash's re-run), so what the process holds is
    what the caller is given."""
    app = keyed_app
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    ks = make_executions(app, run_id, branch_id, "three", AT, 3)
    got = claim_batch(app, process, 1, keyed_limit=3)
    record_crash(app, ks[1], process, "Reaped", "reaped")
    handed = record_successes(app, [Success(c, Output("null")) for c in got], HandOff(keyed_limit=3))
    rows = _rows(app, ks)
    assert [rows[k].outcome for k in ks] == ["success", "process_crashed", "success"]
    releases = _seqs(app, ks, "release_seq")
    assert len(set(releases)) == 3
    e = schema.executions
    with app.begin() as tx:
        held = tx.execute(sa.select(e.c.id).where(e.c.process_id == process, e.c.completed_at.is_(None))).scalars()
        assert [c.execution_id for c in handed] == list(held) != []


@pytest.mark.parametrize("outputs", [["1", "1", "2", "1", "null", "2"], [str(i) for i in range(7)]],
                         ids=["few distinct outputs", "each its own"])
def test_a_group_commit_stores_each_steps_own_output(app, outputs):
    """A group commit writes one UPDATE per distinct output while there are few of them
    (``branches.DISTINCT_OUTPUTS``), else one per step: either way each step keeps the
    output its own execution returned, and only the group's steps are written."""
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    make_executions(app, run_id, branch_id, None, AT, len(outputs) + 1)
    claimed = claim_batch(app, process, len(outputs))
    record_successes(app, [Success(c, Output(v)) for c, v in zip(claimed, outputs, strict=True)])
    s = schema.steps
    with app.begin() as tx:
        stored = dict(tx.execute(sa.select(s.c.id, s.c.output_payload).where(s.c.run_id == run_id)).all())
    assert {c.step_id: stored[c.step_id] for c in claimed} == {
        c.step_id: '{"payload": ' + v + "}" for c, v in zip(claimed, outputs, strict=True)}
    assert [v for k, v in stored.items() if k not in {c.step_id for c in claimed}] == [None]


def test_a_group_of_distinct_outputs_writes_each_by_its_own_id_and_stamps_no_completion(app):
    """One output more than ``branches.DISTINCT_OUTPUTS``, each distinct, and no other step
    in progress: the steps' status write is one UPDATE per step (an ``executemany``), each
    by its own id, so each step keeps its own output; and a step left ``advancing`` has no
    ``completed_at`` (only a completion stamps one)."""
    from ductwork.pipelines.branches import DISTINCT_OUTPUTS

    outputs = [str(i) for i in range(DISTINCT_OUTPUTS + 1)]
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    make_executions(app, run_id, branch_id, None, AT, len(outputs))
    claimed = claim_batch(app, process, len(outputs))
    record_successes(app, [Success(c, Output(v)) for c, v in zip(claimed, outputs, strict=True)])
    s = schema.steps
    with app.begin() as tx:
        stored = {row.id: row for row in tx.execute(
            sa.select(s.c.id, s.c.status, s.c.output_payload, s.c.completed_at).where(s.c.run_id == run_id))}
    assert {c.step_id: stored[c.step_id].output_payload for c in claimed} == {
        c.step_id: '{"payload": ' + v + "}" for c, v in zip(claimed, outputs, strict=True)}
    assert {(row.status, row.completed_at) for row in stored.values()} == {("advancing", None)}


def test_inline_ids_quotes_any_text_exactly(app):
    """Plain ids are quoted by ductwork in one string, any other text by SQLAlchemy
    (``dialects.inline_ids``): a quote, a backslash or a ``%`` finds its own row and no other."""
    from ductwork.db import dialects

    k = schema.limit_keys
    keys = ["plain-1", "plain_2.x:y", "o'brien", "back\\slash", "50%", "a', 'plain-1"]
    with app.begin() as tx:
        tx.execute(k.insert(), [{"key": key, "seq": 0, "created_at": AT, "updated_at": AT} for key in keys])
    for wanted in (keys[:2], keys[2:3], keys[3:4], keys[4:5], keys[5:], ["absent"], keys):
        with app.begin() as tx:
            found = set(tx.execute(sa.select(k.c.key).where(k.c.key.in_(dialects.inline_ids(wanted)))).scalars())
        assert found == set(wanted) - {"absent"}, wanted


def test_a_group_of_several_lanes_is_one_transaction_that_hands_nothing_on(keyed_app):
    """Successes of two lanes (keyed k1 of ``three``, then unkeyed u1) in one call, with a
    hand-off of one of either: one transaction records both (one commit), k1 released with
    its key's next seq, and nothing is handed on though a poll would claim in either lane
    (u2 and k2 stay pending)."""
    app = keyed_app
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    k1, = make_executions(app, run_id, branch_id, "three", AT)
    u1, u2 = make_executions(app, run_id, branch_id, None, AT, 2)
    k2, = make_executions(app, run_id, branch_id, "three", AT)
    first, second = claim(app, process), claim(app, process)
    assert [first.execution_id, second.execution_id] == [k1, u1]
    cached_definition(app, first.definition_sha1)  # (read once, in a transaction of its own)
    commits = []

    def committed(conn):
        commits.append(conn)

    sa.event.listen(app.engine, "commit", committed)
    try:
        handed = record_successes(app, [Success(first, Output("1")), Success(second, Output("2"))],
                                  HandOff(limit=1, keyed_limit=1))
    finally:
        sa.event.remove(app.engine, "commit", committed)
    assert handed == []
    assert len(commits) == 1
    rows = _rows(app, [k1, u1, u2, k2])
    assert [rows[i].outcome for i in (k1, u1)] == ["success", "success"]
    assert (rows[u2].claimed_at, rows[k2].claimed_at) == (None, None)
    assert _seqs(app, [k1], "release_seq") == [_seqs(app, [k1], "claim_seq")[0] + 1]
    assert _seqs(app, [u1], "release_seq") == [None]  # the unkeyed lane has no sequence


@pytest.fixture
def partitioned_app(db_url):
    """Keys ``one_a`` and ``one_b`` (``concurrency: 1``) and ``three`` (3)."""
    from tests.conftest import installed, make_app

    limits = {"one_a": {"concurrency": 1}, "one_b": {"concurrency": 1}, "three": {"concurrency": 3}}
    yield from installed(make_app(db_url, job_worker={"limits": limits}))


def _a1_b1(app):
    """A run, a process, and one pending execution of ``one_a``, then one of ``one_b``."""
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    a1, = make_executions(app, run_id, branch_id, "one_a", AT)
    b1, = make_executions(app, run_id, branch_id, "one_b", AT)
    return run_id, branch_id, process, a1, b1


def test_a_batch_goes_on_past_the_keys_its_runs_fill(partitioned_app, monkeypatch):
    """Pending a1, b1, a2 (``concurrency: 1`` keys), t1..t4 (``three``), then u1: a batch
    takes a run of one lane at a time and goes on only after a run that filled its key's
    concurrency, as polls one after another would [INV-LIM-6]: a1, b1, where a batch of two
    ends, trying no lane more; then t1, where a share of ``three`` below its concurrency
    ends it; then t2, t3, where ``three`` is full but its run of two did not fill it alone,
    so the batch ends there too; then u1, an unkeyed run."""
    app = partitioned_app
    run_id, branch_id, process, a1, b1 = _a1_b1(app)
    a2, = make_executions(app, run_id, branch_id, "one_a", AT)
    ts = make_executions(app, run_id, branch_id, "three", AT, 4)
    u1, = make_executions(app, run_id, branch_id, None, AT)
    keyed = []

    def counted(app, key, *args):
        keyed.append(key)
        return claim_keyed(app, key, *args)

    monkeypatch.setattr(claims, "claim_keyed", counted)
    assert [c.execution_id for c in claim_batch(app, process, 2, 2)] == [a1, b1]
    assert keyed == ["one_a", "one_b"]  # the batch has its two: no lane more is tried
    assert [c.execution_id for c in claim_batch(app, process, 9, 9, per_key={"three": 1})] == [ts[0]]
    claimed = claim_batch(app, process, 9, 9)
    assert [c.execution_id for c in claimed] == [ts[1], ts[2]]
    claimed += claim_batch(app, process, 9, 9)
    assert [c.execution_id for c in claimed] == [ts[1], ts[2], u1]
    assert record_successes(app, [Success(c, Output("null")) for c in claimed], HandOff(9, 9)) == []
    assert [c.execution_id for c in claim_batch(app, process, 2, 2)] == [ts[3]]  # a2: one_a is still held
    assert _rows(app, [a2])[a2].claimed_at is None


def test_a_batch_scans_as_many_lanes_as_it_may_claim(db_url, monkeypatch):
    """Twenty ``concurrency: 1`` keys with one pending execution each, the oldest first: a
    batch of twenty takes one of each, in poll order, from one scan of twenty lanes, not
    eight at a time (threads of one process walking the same eight lanes passed the seven
    their siblings were filling and scanned again: a scan a claim) [INV-LIM-6]; a batch
    of three scans eight, a poll's least, and stops at its three."""
    from tests.conftest import installed, make_app

    keys = [f"k{i:02}" for i in range(20)]
    for app in installed(make_app(db_url, job_worker={"limits": {key: {"concurrency": 1} for key in keys}})):
        run_id, branch_id = make_run(app)
        process = register(app, role="test", label="w")
        ids = [make_executions(app, run_id, branch_id, key, AT)[0] for key in keys]
        scans, scan = [], claims.scan_lanes

        def counted(*args, scan=scan, scans=scans, **kwargs):
            lanes = scan(*args, **kwargs)
            if "passed" in kwargs:  # a batch's scan (not the bound of a run of several, on SQLite)
                scans.append(len(lanes))
            return lanes

        monkeypatch.setattr(claims, "scan_lanes", counted)
        assert [c.execution_id for c in claim_batch(app, process, 3, 3)] == ids[:3]
        assert scans == [8]
        assert [c.execution_id for c in claim_batch(app, process, 17, 17)] == ids[3:]
        assert scans == [8, 17]


@pytest.mark.parametrize("lane", [None, "three"], ids=["unkeyed", "keyed"])
def test_a_claim_the_database_rolls_back_for_contention_is_made_again(partitioned_app, monkeypatch, lane):
    """A poll's claim in a lane whose transaction the database rolls back for contention
    (MariaDB chose it as a deadlock's victim while inserts of other transactions held its
    index range) is made again and claims, rather than ending the worker's ``run_once``
    with the error: it wrote nothing."""
    app = partitioned_app
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    execution, = make_executions(app, run_id, branch_id, lane, AT)
    routine, calls = claims.release_and_claim, []

    def deadlocked_once(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == 1:
            raise sa.exc.OperationalError("CALL ductwork_release_and_claim_3", {}, Exception(1213, "Deadlock found"))
        return routine(*args, **kwargs)

    monkeypatch.setattr(claims, "release_and_claim", deadlocked_once)
    assert [c.execution_id for c in claim_batch(app, process, 1)] == [execution]
    assert calls == [lane, lane]


def test_a_group_of_several_keys_releases_them_in_key_order(partitioned_app, monkeypatch):
    """Successes given as b1 (``one_b``), t1 (``three``), a1 (``one_a``): the group takes
    each key's lock by its routine in key order, one_a, one_b, three, whatever the order of
    the successes, so two groups of the same keys never wait on each other in a cycle
    (docs/semantics.md §9)."""
    app = partitioned_app
    run_id, branch_id, process, a1, b1 = _a1_b1(app)
    t1, = make_executions(app, run_id, branch_id, "three", AT)
    held = {c.execution_id: c for c in claim_batch(app, process, 9, 9)}
    assert set(held) == {a1, b1, t1}
    routine, order = outcomes.release_and_claim, []

    def spy(app, tx, key, *args, **kwargs):
        order.append(key)
        return routine(app, tx, key, *args, **kwargs)

    monkeypatch.setattr(outcomes, "release_and_claim", spy)
    record_successes(app, [Success(held[i], Output("null")) for i in (b1, t1, a1)])
    assert order == ["one_a", "one_b", "three"]
    assert {r.outcome for r in _rows(app, [a1, b1, t1]).values()} == {"success"}


def test_a_lone_success_that_lost_its_execution_is_refused_without_a_batch_warning(app, caplog):
    """A single success whose execution the reaper crashed: CommitFailed, nothing written,
    and no WARNING of this module (it is no batch, and an outcome that was not recorded is
    not logged)."""
    import logging

    from ductwork.errors import CommitFailed

    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    execution, = make_executions(app, run_id, branch_id, None, AT)
    claimed = claim(app, process)
    assert record_crash(app, execution, process, "ductwork.ProcessCrash", "reaped")
    caplog.set_level(logging.WARNING, logger="ductwork.executions")
    caplog.clear()
    with pytest.raises(CommitFailed):
        record_successes(app, [Success(claimed, Output("1"))])
    assert [r.getMessage() for r in caplog.records if r.name == "ductwork.executions"] == []
    assert _rows(app, [execution])[execution].outcome == "process_crashed"


@pytest.mark.parametrize("connection_invalidated", [False, True], ids=["contention", "disconnect"])
def test_a_group_commit_the_database_would_repeat_is_raised_whole(app, monkeypatch, connection_invalidated):
    """The group's transaction fails with an error the database would retry (rolled back
    for contention, or the connection lost): it is raised for the whole batch, nothing
    recorded (``retry_transient`` repeats the batch), not recorded one by one; repeated,
    the batch commits in one transaction."""
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    ids = make_executions(app, run_id, branch_id, None, AT, 3)
    claimed = claim_batch(app, process, 3)
    real = outcomes.advance_on_successes
    error = sa.exc.OperationalError("UPDATE ...", {}, Exception("database is locked"),
                                    connection_invalidated=connection_invalidated)
    if connection_invalidated:
        error.orig = Exception("server closed the connection")

    def rolled_back(tx, inline):  # a transaction of the whole batch is rolled back; one alone would pass
        if len(inline) > 1:
            raise error
        return real(tx, inline)

    monkeypatch.setattr(outcomes, "advance_on_successes", rolled_back)
    successes = [Success(c, Output("null")) for c in claimed]
    with pytest.raises(sa.exc.OperationalError):
        record_successes(app, successes)
    rows = _rows(app, ids)
    assert [(rows[i].outcome, rows[i].completed_at, rows[i].process_id) for i in ids] == [(None, None, process)] * 3
    monkeypatch.undo()
    record_successes(app, successes)
    rows = _rows(app, ids)
    assert [rows[i].outcome for i in ids] == ["success"] * 3
    assert len({rows[i].completed_at for i in ids}) == 1


def _generations(app):
    return app.wakeup.generation, app.advancer_wakeup.generation


def test_a_group_commit_wakes_a_worker_only_for_a_slot_nobody_took_over(keyed_app):
    """What a group commit wakes (``Tx.wake``): an unkeyed group freed no slot a worker
    could wait for (advancers only: its steps are left ``advancing``); a keyed group that
    hands nothing on freed its key's slots (one worker too); a keyed group whose hand-off
    took as many as it released freed none for anyone else (advancers only)."""
    app = keyed_app
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    make_executions(app, run_id, branch_id, None, AT, 2)
    unkeyed = claim_batch(app, process, 2)
    before = _generations(app)
    assert record_successes(app, [Success(c, Output("null")) for c in unkeyed]) == []
    assert _generations(app) == (before[0], before[1] + 1)

    make_executions(app, run_id, branch_id, "three", AT, 4)
    keyed = claim_batch(app, process, 1, keyed_limit=2)
    before = _generations(app)
    handed = record_successes(app, [Success(c, Output("null")) for c in keyed], HandOff(keyed_limit=2))
    assert len(handed) == 2
    assert _generations(app) == (before[0], before[1] + 1)

    before = _generations(app)
    assert record_successes(app, [Success(c, Output("null")) for c in handed], HandOff(keyed_limit=2)) == []
    assert _generations(app) == (before[0] + 1, before[1] + 1)


def test_the_keyed_commit_checkpoints_are_passed_by_keyed_commits_only(keyed_app, monkeypatch):
    """``before_release_key_lock`` and ``in_keyed_group_commit`` (``ductwork.faults``) are
    the crash windows of a keyed commit: armed, an unkeyed success passes neither, a keyed
    one passes each once."""
    from ductwork import faults

    app = keyed_app
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    make_executions(app, run_id, branch_id, None, AT)
    make_executions(app, run_id, branch_id, "three", AT)
    unkeyed, keyed = claim(app, process), claim(app, process)
    assert (unkeyed.limit_key, keyed.limit_key) == (None, "three")
    monkeypatch.setenv("DUCTWORK_FAULT_SLEEP", "0")
    checkpoints = (faults.BEFORE_RELEASE_KEY_LOCK, faults.IN_KEYED_GROUP_COMMIT)
    for name in checkpoints:
        faults.arm(name, "sleep")
    try:
        record_successes(app, [Success(unkeyed, Output("null"))])
        assert [faults.fired(name) for name in checkpoints] == [0, 0]
        record_successes(app, [Success(keyed, Output("null"))])
        assert [faults.fired(name) for name in checkpoints] == [1, 1]
    finally:
        faults.disarm()


def _header(app, key):
    k = schema.limit_keys
    with app.begin() as tx:
        return tuple(tx.execute(sa.select(k).where(k.c.key == key)).one())


def test_a_keys_lock_and_header_write_read_and_write_its_own_row_only(db_url):
    """Two keys of ``concurrency: 2``: ``a_busy`` (created first, first by name) whose seq
    is far along and whose slots are all taken, and ``b_idle`` (seq 0). A poll of
    ``a_busy`` is refused and writes nothing, not even its header's ``updated_at``;
    ``b_idle``'s claim and release number from its own header (seq 1, then 2) and write
    only its own: ``a_busy``'s header row stays exactly as it was, every column
    [INV-LIM-1, INV-LIM-3]."""
    from ductwork.db.clock import ManualClock
    from ductwork.limits.claims import Refusal, claim_keyed
    from tests.conftest import installed, make_app

    clock = ManualClock(datetime(2026, 1, 1))
    limits = {"a_busy": {"concurrency": 2}, "b_idle": {"concurrency": 2}}
    for app in installed(make_app(db_url, clock=clock, job_worker={"limits": limits})):
        run_id, branch_id = make_run(app)
        process = register(app, role="test", label="w")
        make_executions(app, run_id, branch_id, "a_busy", AT, 5)
        first = claim_batch(app, process, 1, keyed_limit=2)
        record_successes(app, [Success(c, Output("null")) for c in first])
        assert len(claim_batch(app, process, 1, keyed_limit=2)) == 2  # a_busy's seq: 6, its slots taken
        (idle,) = make_executions(app, run_id, branch_id, "b_idle", AT)
        busy = _header(app, "a_busy")
        clock.advance(seconds=1)
        assert claim_keyed(app, "a_busy", process) == Refusal("a_busy", "concurrency")
        assert _header(app, "a_busy") == busy
        clock.advance(seconds=1)
        (claimed,) = claim_keyed(app, "b_idle", process)
        assert claimed.execution_id == idle
        record_successes(app, [Success(claimed, Output("null"))])
        assert (_seqs(app, [idle], "claim_seq"), _seqs(app, [idle], "release_seq")) == ([1], [2])
        assert _header(app, "b_idle")[list(schema.limit_keys.c.keys()).index("seq")] == 2
        assert _header(app, "a_busy") == busy


def test_a_batch_is_not_held_back_by_a_key_that_may_not_admit(db_url):
    """The oldest pending executions are a rate-blocked key's (its bucket starts empty:
    the first poll stamps it for an hour) and a saturated key's (``concurrency: 1``, its
    slot held by the first poll's claim, the only execution in flight), then three
    unkeyed: the lane scan skips both keys, so a batch of three takes the three unkeyed
    executions and no keyed claim is tried and refused [INV-LIM-5, INV-LIM-6]."""
    from tests.conftest import installed, make_app

    for app in installed(make_app(db_url, job_worker={"limits": {
            "hourly": {"rate": {"limit": 1, "per": "1h"}}, "one": {"concurrency": 1}}})):
        run_id, branch_id = make_run(app)
        process = register(app, role="test", label="w")
        make_executions(app, run_id, branch_id, "hourly", AT)
        o1, _o2 = make_executions(app, run_id, branch_id, "one", AT, 2)
        us = make_executions(app, run_id, branch_id, None, AT, 3)
        told = []
        assert [c.execution_id for c in claim_batch(app, process, 1, refused=told.append)] == [o1]
        assert [r.key for r in told] == ["hourly"]  # refused, and stamped until its token
        told.clear()
        assert [c.execution_id for c in claim_batch(app, process, 3, refused=told.append)] == us
        assert told == []


@pytest.fixture
def siblings_app(db_url):
    """Keys ``one_a`` and ``one_b`` (``concurrency: 1``) and ``three`` (3)."""
    from tests.conftest import installed, make_app

    limits = {"one_a": {"concurrency": 1}, "one_b": {"concurrency": 1}, "three": {"concurrency": 3}}
    yield from installed(make_app(db_url, job_worker={"limits": limits}))


@pytest.mark.parametrize("share", [1, 3], ids=["fills", "leaves-room"])
def test_a_thread_passes_a_lane_a_sibling_is_trying_to_fill(siblings_app, monkeypatch, share):
    """Two threads of one process (one App, as a fleet process's threads share it): the
    first is inside its try of a lane, parked before the database; the second polls. A try
    that may take the key's whole concurrency (``one_a``, 1) is passed by the sibling, as
    refused, without a round trip: it claims ``one_b``'s b1 and never tries ``one_a``; on
    SQLite, where a try is a call in the process and not a round trip, it tries ``one_a``
    and claims a1 itself (the first, refused there, goes on to b1). A try with a share
    below the concurrency (``three``, 3, share 1) may leave room: the sibling tries the
    lane too, and each claims one of its executions."""
    app = siblings_app
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    key = "one_a" if share == 1 else "three"
    first_lane = make_executions(app, run_id, branch_id, key, AT, 2)
    b1, = make_executions(app, run_id, branch_id, "one_b", AT)
    inside, go, tried, got = threading.Event(), threading.Event(), [], {}

    def parked(app, key, *args):
        tried.append((threading.current_thread().name, key))
        if threading.current_thread().name == "first":
            inside.set()
            assert go.wait(30)
        return claim_keyed(app, key, *args)

    monkeypatch.setattr(claims, "claim_keyed", parked)
    first = threading.Thread(target=lambda: got.setdefault("first", claim_batch(app, process, 1)), name="first")
    first.start()
    try:
        assert inside.wait(30)
        second = [c.execution_id for c in claim_batch(app, process, 1, 1, per_key={"three": 1})]
    finally:
        go.set()
        first.join(30)
    passes = share == 1 and app.backend != "sqlite"
    if passes:
        assert (second, tried) == ([b1], [("first", "one_a"), ("MainThread", "one_b")])
        assert [c.execution_id for c in got["first"]] == first_lane[:1]
    else:
        assert (tried[:2], second) == ([("first", key), ("MainThread", key)], first_lane[:1])
        assert [c.execution_id for c in got["first"]] == ([b1] if share == 1 else first_lane[1:])


@needs("server_side_routines")
def test_a_thread_passes_a_lane_its_process_holds_full_until_a_release(siblings_app, monkeypatch):
    """A poll whose try took a ``concurrency: 1`` key's slot leaves the key marked as held
    full by its process: a sibling's poll from a scan made before that claim passes the lane
    without trying it. The release of that execution (before it commits) removes the mark,
    a success's as a failure's: a poll from the same stale scan tries the lane again, and
    claims its next execution."""
    from ductwork.pipelines.outcomes import record_failure

    app = siblings_app
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    a1, a2, a3 = make_executions(app, run_id, branch_id, "one_a", AT, 3)
    b1, _ = make_executions(app, run_id, branch_id, "one_b", AT, 2)
    with app.begin(readonly=True) as tx:
        stale = claims.scan_lanes(app, tx)  # one_a, then one_b: both may admit
    held, = claim_batch(app, process, 1)
    assert held.execution_id == a1
    tried = []

    def counted(app, key, *args):
        tried.append(key)
        return claim_keyed(app, key, *args)

    monkeypatch.setattr(claims, "scan_lanes", lambda *_, **__: stale)
    monkeypatch.setattr(claims, "claim_keyed", counted)
    assert [c.execution_id for c in claim_batch(app, process, 1)] == [b1]
    assert tried == ["one_b"]
    assert record_successes(app, [Success(held, Output("null"))], HandOff(0, 0)) == []
    failing, = claim_batch(app, process, 1)
    assert (failing.execution_id, tried) == (a2, ["one_b", "one_a"])
    assert claim_batch(app, process, 1) == []  # one_a passed again, one_b held (b1)
    record_failure(app, failing, RuntimeError("down"))
    assert [c.execution_id for c in claim_batch(app, process, 1)] == [a3]


@needs("server_side_routines")
def test_a_success_lost_to_the_reaper_leaves_no_lane_held_full(siblings_app, monkeypatch):
    """The reaper of another process crashed a1 (``one_a``, ``concurrency: 1``) and a1's
    re-run succeeded there: this process's record of a1's success is refused before any
    release (its step moved on), and still the key is no longer held full by this process:
    a poll from a scan made while a1 was held tries ``one_a`` and claims a2."""
    from ductwork.errors import CommitFailed

    app = siblings_app
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    a1, = make_executions(app, run_id, branch_id, "one_a", AT)
    with app.begin(readonly=True) as tx:
        stale = claims.scan_lanes(app, tx)
    held, = claim_batch(app, process, 1)
    other = of_another_process(app)
    try:
        assert record_crash(other, a1, process, "ductwork.ProcessCrash", "reaped")
        rerun, = claim_batch(other, register(other, role="test", label="other"), 1)
        assert record_successes(other, [Success(rerun, Output("null"))]) == []
    finally:
        other.dispose()
    with pytest.raises(CommitFailed):
        record_successes(app, [Success(held, Output("null"))])
    a2, = make_executions(app, run_id, branch_id, "one_a", AT)
    monkeypatch.setattr(claims, "scan_lanes", lambda *_, **__: stale)
    assert [c.execution_id for c in claim_batch(app, process, 1)] == [a2]
