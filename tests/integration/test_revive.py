"""Reviving a halted run (``Run.revive``, ``ductwork revive``) on every database.

INV-REV-1 (one new run per halted run, concurrent revivers included), INV-REV-2 (no
succeeded step runs or advances again), INV-REV-3 (each halted branch resumes where it
stopped: a failed step re-run with its input, a fresh budget and its idempotency key; an
advancement halt advanced again), the errors for a run that is not halted, and the
context copied only when asked.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
import sqlalchemy as sa

from ductwork import Pipeline, ReviveError, Step
from ductwork.db import schema
from ductwork.testing import drain
from tests.conftest import installed, make_app, race, race_processes, reset_tables
from tests.workloads import Echo, Takes

#: what the broken steps do; a test "deploys a fix" by flipping these
BROKEN = {"fail": True, "crash": True}
RAN: Counter[str] = Counter()  # executions per (node, input), to see nothing ran twice
KEYS: dict[str, list[str]] = {}  # idempotency keys seen per node


class Count(Takes):
    def execute(self):
        RAN[f"Count {self.value}"] += 1
        return list(range(self.value))


class Double(Takes):
    def execute(self):
        RAN[f"Double {self.value}"] += 1
        return self.value * 2


class Fragile(Takes):
    """Fails while BROKEN["fail"], for odd inputs only."""

    def execute(self):
        RAN[f"Fragile {self.value}"] += 1
        KEYS.setdefault(f"Fragile {self.value}", []).append(self.idempotency_key)
        if BROKEN["fail"] and self.value % 2:
            raise ValueError(f"fragile {self.value}")
        return self.value + 100


class Flaky(Takes):
    """Fails its first attempt at 0 (then ends after its siblings), and 3 while BROKEN["fail"]."""

    def execute(self):
        RAN[f"Flaky {self.value}"] += 1
        if (self.value == 0 and RAN["Flaky 0"] == 1) or (BROKEN["fail"] and self.value == 3):
            raise ValueError(f"flaky {self.value}")
        return self.value + 100


class Spread(Takes):
    def execute(self):
        return [self.value * 10 + 1, self.value * 10 + 2]


class Leaf(Takes):
    """Fails at 111 while BROKEN["fail"]."""

    def execute(self):
        if BROKEN["fail"] and self.value == 111:
            raise ValueError("leaf 111")
        return self.value


class Crashy(Step):
    """Its constructor raises while BROKEN["crash"]: every execution counts as a crash."""

    def __init__(self, n):
        if BROKEN["crash"]:
            raise KeyError("constructor fails")
        self.n = n

    def execute(self):
        RAN[f"Crashy {self.n}"] += 1
        KEYS.setdefault("Crashy", []).append(self.idempotency_key)
        return self.n


class Total(Takes):
    def execute(self):
        RAN["Total"] += 1
        return sum(self.value)


class SetsContext(Takes):
    def execute(self):
        self.context.set("seen", self.value)
        return self.value


class ReadsContext(Takes):
    def execute(self):
        if BROKEN["fail"]:
            raise ValueError("not yet")
        return self.context.get("seen")


class FanP(Pipeline):
    """expand into four children, the odd ones fail while broken, collapse into a total."""

    @classmethod
    def define(cls, p):
        p.start(Count).expand(to=Fragile).collapse(into=Total)


class FlakyFanP(Pipeline):
    """expand into four children: 0 succeeds on its retry, 3 fails while broken."""

    @classmethod
    def define(cls, p):
        p.start(Count).expand(to=Flaky).collapse(into=Total)


class NestedP(Pipeline):
    """three expands deep: 0 -> 1, 2 -> 11, 12, 21, 22 -> eight leaves; leaf 111 fails while broken."""

    @classmethod
    def define(cls, p):
        (p.start(Spread).expand(to=Spread).expand(to=Spread).expand(to=Leaf)
         .collapse(into=Total).collapse(into=Total).collapse(into=Total))


class ChainCrashP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Double).chain(to=Crashy).chain(to=Double)


class DivideP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Double).divide(to=[Double, Double]).combine(into=Total)


class KeyedP(Pipeline):
    """Its failing step is keyed: a revive re-enqueues it on its key."""

    @classmethod
    def define(cls, p):
        p.start(Echo).chain(to=Fragile, limit_by="vendor")


class ContextP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(SetsContext).chain(to=ReadsContext)


@pytest.fixture(autouse=True)
def _broken():
    BROKEN.update(fail=True, crash=True)
    RAN.clear()
    KEYS.clear()
    yield
    BROKEN.update(fail=True, crash=True)


def _rows(app, table, **where):
    with app.begin(readonly=True) as tx:
        return tx.execute(sa.select(table).where(*[table.c[k] == v for k, v in where.items()])).all()


def _halted(app, pipeline, *args):
    run = pipeline.trigger(*args)
    drain(app, timeout=60, skip_delays=True)
    assert run.refresh().status == "halted"
    return run


@pytest.fixture
def offset_app(db_url):
    """The ``app`` fixture with a clock that ``drain(skip_delays=True)`` may move."""
    from ductwork.db.clock import OffsetClock

    yield from installed(make_app(db_url, clock=OffsetClock()))


# --------------------------------------------------------------------------- resumption


def test_a_revived_fan_out_reruns_only_the_failed_children_and_then_merges(offset_app):
    app = offset_app
    run = _halted(app, FanP, 4)
    assert run.halt_reasons == ["job_retries_exhausted"] * 2
    before = dict(RAN)
    failed = {s.input[0]: s for s in run.steps() if s.status == "failed"}
    BROKEN["fail"] = False  # the fix is deployed
    new = run.revive()
    assert new.id != run.id
    assert new.status == "in_progress"
    assert run.refresh().status == "halted"  # the halted run stays as it was
    drain(app, timeout=60, skip_delays=True)
    assert new.refresh().status == "completed"
    # [INV-REV-2] Count and the even children ran once, before the halt; the odd ones again
    assert RAN - Counter(before) == Counter({"Fragile 1": 1, "Fragile 3": 1, "Total": 1})
    steps = new.steps()
    (total,) = [s for s in steps if s.node.startswith("Total")]
    assert total.input == [[100, 101, 102, 103]]  # every child's output, in fan-out order
    carried = [s for s in steps if s.node.startswith(("Count", "Fragile")) and s.attempts == 0]
    assert sorted(s.input[0] for s in carried if s.node.startswith("Fragile")) == [0, 2]
    # [INV-REV-3] a re-run step has the failed step's input and idempotency key
    for n in (1, 3):
        (again,) = [s for s in steps if s.node.startswith("Fragile") and s.input == [n]]
        assert again.id != failed[n].id
        assert again.attempts == 1
        assert set(KEYS[f"Fragile {n}"]) == {failed[n].id} == {again.idempotency_key}
    # Run.history() (`ductwork show --json`) names the same key for every step
    assert {r.id: r.idempotency_key for r in new.history().steps} == {s.id: s.idempotency_key for s in steps}
    new_run = _rows(app, schema.runs, id=new.id)[0]
    assert (new_run.revived_from, new_run.halted_at) == (run.id, None)
    assert new_run.definition_sha1 == _rows(app, schema.runs, id=run.id)[0].definition_sha1


def test_a_crashes_exhausted_halt_reruns_the_step_with_its_original_input(manual_app):
    app = manual_app
    run = _halted(app, ChainCrashP, 5)
    assert run.halt_reasons == ["job_crashes_exhausted"]
    (failed,) = [s for s in run.steps() if s.status == "failed"]
    assert failed.input == [10]
    BROKEN["crash"] = False
    new = run.revive()
    drain(app, timeout=60, skip_delays=True)
    assert new.refresh().status == "completed"
    steps = new.steps()
    assert [(s.node, s.input, s.output) for s in steps] == [
        ("Double#0", [5], 10), ("Crashy#1", [10], 10), ("Double#2", [10], 20)]
    assert KEYS["Crashy"] == [failed.id]  # the same key as the executions that crashed
    assert RAN["Double 5"] == 1  # carried over, not run again


def test_an_advancement_halt_is_advanced_again(db_url, monkeypatch):
    from ductwork.app import set_default_app
    from ductwork.pipelines.advance import Advancer

    app = make_app(db_url)
    reset_tables(app.engine)
    set_default_app(app)
    try:
        real = Advancer._divide

        def broken(self, c, definition, nodes):  # noqa: ARG001 - stands in for the method
            raise RuntimeError("routing broke")

        monkeypatch.setattr(Advancer, "_divide", broken)
        run = DivideP.trigger(1)
        drain(app, timeout=30)
        assert run.refresh().halt_reasons == ["advancer_retries_exhausted"]
        monkeypatch.setattr(Advancer, "_divide", real)
        new = run.revive()
        (resumed,) = new.steps()
        assert (resumed.status, resumed.output, resumed.attempts) == ("advancing", 2, 0)
        drain(app, timeout=30)
        assert new.refresh().status == "completed"
        assert RAN["Double 1"] == 1  # its output was carried over; only the transition ran again
        (total,) = [s for s in new.steps() if s.node.startswith("Total")]
        assert total.output == 8
    finally:
        set_default_app(None)
        app.dispose()


def test_the_context_is_copied_only_when_asked(offset_app):
    app = offset_app
    plain, copied = _halted(app, ContextP, 7), _halted(app, ContextP, 8)
    BROKEN["fail"] = False
    plain_new, copied_new = plain.revive(), copied.revive(duplicate_context=True)
    drain(app, timeout=60, skip_delays=True)
    assert {s.node: s.output for s in plain_new.refresh().steps()}["ReadsContext#1"] is None
    assert {s.node: s.output for s in copied_new.refresh().steps()}["ReadsContext#1"] == 8
    assert len(_rows(app, schema.context, run_id=copied.id)) == 1  # the halted run keeps its own


def test_a_revive_copies_only_its_run_in_order_and_leaves_another_halted_run_as_it_was(offset_app):
    """Two halted fan-outs side by side, each with context rows whose first and last set
    times are days apart. Reviving one with its context copies its own expand items and
    context rows (times included) and nothing of the other's; its branches and history
    steps keep their start order (new ids in the old order: the fan-out's children, started
    together, end in another order: 0 on its retry); every row of both halted runs stays as
    it was."""
    import json
    from datetime import timedelta

    from ductwork.db.ids import new_id
    from tests.factories import run_rows

    app = offset_app
    run, other = _halted(app, FlakyFanP, 4), _halted(app, FanP, 6)
    c, b = schema.context, schema.branches
    with app.begin() as tx:
        for rid, keys in ((run.id, ["a", "b"]), (other.id, ["c"])):
            tx.execute(c.insert(), [{"id": new_id(), "run_id": rid, "key": k, "value": json.dumps({"raw_value": k}),
                                     "first_set_at": tx.now - timedelta(days=3 + i), "last_set_at": tx.now}
                                    for i, k in enumerate(keys)])
    before = {r.id: run_rows(app, r.id) for r in (run, other)}
    new = run.revive(duplicate_context=True)
    assert {r.id: run_rows(app, r.id) for r in (run, other)} == before

    def context(run_id):
        return [row[2:] for row in run_rows(app, run_id)["context"]]  # key, value, first and last set

    def branches(run_id):
        with app.begin(readonly=True) as tx:
            return [tuple(row) for row in tx.execute(
                sa.select(b.c.started_at, b.c.barrier_index, b.c.fanout_width, b.c.fanin_arrivals)
                .where(b.c.run_id == run_id).order_by(b.c.started_at, b.c.id))]

    assert context(new.id) == context(run.id)
    assert context(new.id) != context(other.id)
    assert branches(new.id) == branches(run.id)
    old = [(s.node, s.input, s.output, s.status) for s in run.steps()]
    # history in its start order, then the re-enqueued failed steps (started now), in theirs
    expected = [s for s in old if s[3] != "failed"] + [(*s[:3], "in_progress") for s in old if s[3] == "failed"]
    assert [(s.node, s.input, s.output, s.status) for s in new.steps()] == expected
    assert ("Count#0", [4], [0, 1, 2, 3], "completed") in expected


def test_a_revive_of_nested_fan_outs_inserts_each_branch_after_its_barrier(offset_app):
    """Three expands deep, halted at one leaf after the other innermost groups merged: a
    merged branch has no parent but its barrier is a child branch (one level up), which the
    revive must insert before it (foreign key). The revived run completes with every leaf."""
    app = offset_app
    run = _halted(app, NestedP, 0)
    b = schema.branches
    with app.begin(readonly=True) as tx:
        merged = tx.execute(sa.select(b.c.barrier_id).where(
            b.c.run_id == run.id, b.c.parent_id.is_(None), b.c.barrier_id.is_not(None))).scalars().all()
        parents = dict(tx.execute(sa.select(b.c.id, b.c.parent_id).where(b.c.run_id == run.id)).all())
    # the merges of groups 12, 21 and 22 (their barriers: the branches of 1 and 2), and of 2
    assert sorted(parents[barrier] is not None for barrier in merged) == [False, True, True, True]
    BROKEN["fail"] = False
    new = run.revive()
    drain(app, timeout=60, skip_delays=True)
    assert new.refresh().status == "completed"
    assert len(_rows(app, schema.branches, run_id=new.id)) > len(_rows(app, schema.branches, run_id=run.id))
    assert [s.output for s in new.steps()][-1] == 111 + 112 + 121 + 122 + 211 + 212 + 221 + 222


def test_the_revived_branches_ids_rise_in_the_halted_runs_start_order(offset_app):
    """Ids rise in creation order only within a process: a branch started by another
    process may have started later than a branch with a greater id. Here the first child's
    start is moved an hour on, after its siblings' (whose ids are greater). The
    revive creates the copies in start order, so in the revived run id order is start
    order again (the order a halt hook lists halted branches in)."""
    from datetime import timedelta

    app = offset_app
    run = _halted(app, FanP, 4)
    b, s = schema.branches, schema.steps
    with app.begin() as tx:
        first = tx.execute(sa.select(s.c.branch_id).where(s.c.run_id == run.id, s.c.node == "Fragile#1")
                           .order_by(s.c.branch_id).limit(1)).scalar_one()
        started = tx.execute(sa.select(b.c.started_at).where(b.c.id == first)).scalar_one()
        tx.execute(b.update().where(b.c.id == first).values(started_at=started + timedelta(hours=1)))
    new = run.revive()
    with app.begin(readonly=True) as tx:
        by_id = tx.execute(sa.select(b.c.started_at).where(b.c.run_id == new.id).order_by(b.c.id)).scalars().all()
    assert by_id == sorted(by_id)
    assert by_id[-1] == started + timedelta(hours=1)  # the moved child is the last copy: it started last


def test_a_keyed_failed_step_is_re_enqueued_on_its_key_and_no_context_is_copied_as_none(offset_app):
    app = offset_app
    run = _halted(app, KeyedP, 3)
    BROKEN["fail"] = False
    new = run.revive(duplicate_context=True)  # the halted run has no context: nothing to copy
    e, st = schema.executions, schema.steps
    with app.begin(readonly=True) as tx:
        queued = tx.execute(sa.select(st.c.node, e.c.limit_key).join(st, st.c.id == e.c.step_id)
                            .where(st.c.run_id == new.id, e.c.completed_at.is_(None))).all()
    assert [tuple(row) for row in queued] == [("Fragile#1", "vendor")]
    assert _rows(app, schema.limit_keys, key="vendor")
    assert _rows(app, schema.context, run_id=new.id) == []
    drain(app, timeout=60, skip_delays=True)
    assert new.refresh().status == "completed"
    assert {s.node: s.output for s in new.steps()}["Fragile#1"] == 103


def test_a_revived_run_that_halts_again_can_be_revived_and_keeps_the_first_key(offset_app):
    app = offset_app
    run = _halted(app, FanP, 2)
    (failed,) = [s for s in run.steps() if s.status == "failed"]
    again = run.revive()
    drain(app, timeout=60, skip_delays=True)
    assert again.refresh().status == "halted"
    BROKEN["fail"] = False
    third = again.revive()
    drain(app, timeout=60, skip_delays=True)
    assert third.refresh().status == "completed"
    assert set(KEYS["Fragile 1"]) == {failed.id}  # one key across the three runs' executions
    assert RAN["Count 2"] == 1
    assert RAN["Fragile 0"] == 1


def test_history_and_show_say_which_steps_were_carried_over_and_from_which_run(offset_app, db_url, capsys):
    """A revived run's steps without executions were carried over from the halted run
    (``StepRecord.carried_from``, ``carried_from`` in ``show --json``, a line in ``show``);
    a run revived from a revived run names its own source, not the first one."""
    import json

    from ductwork.cli import main

    app = offset_app
    first = _halted(app, FanP, 2)  # Count, Fragile 0, Fragile 1 (failed)
    (failed,) = [s for s in first.steps() if s.status == "failed"]
    second = first.revive()
    drain(app, timeout=60, skip_delays=True)
    assert second.refresh().status == "halted"  # still broken
    BROKEN["fail"] = False
    third = second.revive()
    drain(app, timeout=60, skip_delays=True)
    assert third.refresh().status == "completed"
    for run, source in ((second, first), (third, second)):
        steps = run.history().steps
        carried = {s.id for s in steps if s.carried_from == source.id}
        assert carried == {s.id for s in steps if not s.executions}
        assert [(s.node, s.idempotency_key == failed.id) for s in steps if s.id in carried] == [
            ("Count#0", False), ("Fragile#1", False)]  # Count and Fragile 0; Fragile 1 re-runs
        assert all(s.carried_from is None for s in first.history().steps)
        assert main(["show", run.id, "--json", "--database-url", db_url, "-c", "/dev/null"]) == 0
        shown = json.loads(capsys.readouterr().out)["steps"]
        assert {s["id"]: s["carried_from"] for s in shown} == {s.id: s.carried_from for s in steps}
        assert main(["show", run.id, "--database-url", db_url, "-c", "/dev/null"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert f"  carried over  2 of {len(steps)} steps from {source.id}, as history (their executions stay " \
               "with that run)" in lines
        assert lines.count(f"    carried over from run {source.id} by its revive: no executions here (they stay "
                           "with that run)") == 2
        assert lines.count(f"    re-runs the step that failed in run {source.id}, with its idempotency key "
                           f"{failed.id}") == 1


# --------------------------------------------------------------------------- refusals


def test_only_a_halted_run_is_revived(offset_app):
    app = offset_app
    running = FanP.trigger(2)
    with pytest.raises(ReviveError, match=f"cannot revive run {running.id}: it is in_progress"):
        running.revive()
    drain(app, timeout=60, skip_delays=True)
    BROKEN["fail"] = False
    done = FanP.trigger(2)
    drain(app, timeout=60, skip_delays=True)
    assert done.refresh().status == "completed"
    with pytest.raises(ReviveError, match=f"cannot revive run {done.id}: it is completed; only a halted run"):
        done.revive()
    runs = len(_rows(app, schema.runs))
    from ductwork.pipelines.revive import revive_run

    with pytest.raises(ReviveError, match="cannot revive run no-such-run: it does not exist"):
        revive_run(app, "no-such-run")
    assert len(_rows(app, schema.runs)) == runs  # nothing written


# --------------------------------------------------------------------------- exactly once


def test_reviving_twice_returns_the_same_run(offset_app):
    app = offset_app
    run = _halted(app, FanP, 2)
    first = run.revive()
    assert run.revive().id == first.id
    assert [r.id for r in _rows(app, schema.runs, revived_from=run.id)] == [first.id]


def test_concurrent_revives_from_threads_create_one_run(offset_app):
    app = offset_app
    run = _halted(app, FanP, 4)
    got = [new.id for new in race([run.revive] * 4)]
    assert len(set(got)) == 1  # [INV-REV-1]
    assert [r.id for r in _rows(app, schema.runs, revived_from=run.id)] == got[:1]
    assert len(_rows(app, schema.steps, run_id=got[0])) == len(_rows(app, schema.steps, run_id=run.id))


def _revive_in_process(url, run_id, start, out):
    from ductwork.app import App
    from ductwork.config import Config
    from ductwork.pipelines.revive import revive_run

    app = App(url, Config.from_section({}, source="<revive>"))
    start.wait(60)
    out.put(revive_run(app, run_id))
    app.dispose()


def test_concurrent_revives_from_processes_create_one_run(offset_app, db_url):
    app = offset_app
    run = _halted(app, FanP, 4)
    got = race_processes(_revive_in_process, db_url, run.id)
    assert len(set(got)) == 1  # [INV-REV-1]
    assert [r.id for r in _rows(app, schema.runs, revived_from=run.id)] == got[:1]


def test_the_unique_index_refuses_a_second_revived_run(offset_app):
    """The guarantee behind the lock: a second row naming the same halted run is refused,
    and the error boundary names it."""
    from ductwork.db import dialects
    from ductwork.db.ids import new_id
    from ductwork.errors import RevivedConcurrently

    app = offset_app
    run = _halted(app, FanP, 2)
    new = run.revive()
    source = _rows(app, schema.runs, id=new.id)[0]._asdict()
    with pytest.raises(RevivedConcurrently), dialects.translate_db_errors(
            {"uq_run_revived_from": lambda _: RevivedConcurrently(run.id)}), app.begin() as tx:
        tx.execute(schema.runs.insert().values(**{**source, "id": new_id()}))


def test_a_reviver_that_missed_the_winners_row_gets_the_winners_run_from_the_unique_index(offset_app, monkeypatch):
    """The error boundary behind the lock: a reviver whose check found no revival (as one
    that read before the winner committed would; here the check answers None once) has
    its run refused by the unique index, and ``revive_run`` answers with the winner's run,
    read after the refusal; nothing of the refused revive is written."""
    from ductwork.pipelines import revive

    app = offset_app
    run = _halted(app, FanP, 2)
    first = revive.revive_run(app, run.id)
    real, calls = revive.existing_revival, []

    def missed_once(tx, run_id):
        calls.append(run_id)
        return None if len(calls) == 1 else real(tx, run_id)

    monkeypatch.setattr(revive, "existing_revival", missed_once)
    counts = {t.name: len(_rows(app, t)) for t in (schema.runs, schema.branches, schema.steps, schema.executions)}
    assert revive.revive_run(app, run.id) == first
    assert calls == [run.id, run.id]  # the check in the transaction, then the one after the refusal
    assert {t.name: len(_rows(app, t)) for t in (schema.runs, schema.branches, schema.steps,
                                                  schema.executions)} == counts


def test_a_revive_is_logged_once_after_its_commit(offset_app, caplog):
    """A revive that writes its run logs it once, with both run ids, the halted branches
    it resumed and whether the context was copied; a second revive of the same run (it
    returns the first's run, writing nothing) logs nothing."""
    import logging

    app = offset_app
    run = _halted(app, FanP, 4)
    caplog.set_level(logging.INFO, logger="ductwork.revive")
    new = run.revive()
    assert run.revive().id == new.id
    records = [r for r in caplog.records if r.name == "ductwork.revive"]
    assert [r.getMessage() for r in records] == [
        f"run {run.id} revived as run {new.id}: 2 halted branch(es) resumed, context not copied"]
    assert (records[0].run_id, records[0].revived_from) == (new.id, run.id)


# --------------------------------------------------------------------------- command line


def test_the_revive_command_prints_the_new_run_and_refuses_other_states(offset_app, db_url):
    app = offset_app
    run = _halted(app, FanP, 2)
    cmd = [sys.executable, "-m", "ductwork.cli", "revive", "--database-url", db_url]
    first = subprocess.run([*cmd, run.id], capture_output=True, text=True, timeout=120, check=False)
    assert first.returncode == 0, first.stderr
    (revived,) = _rows(app, schema.runs, revived_from=run.id)
    assert first.stdout.strip() == revived.id
    again = subprocess.run([*cmd, run.id], capture_output=True, text=True, timeout=120, check=False)
    assert (again.returncode, again.stdout.strip()) == (0, revived.id)
    refused = subprocess.run([*cmd, revived.id], capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (f"ductwork revive: ReviveError: cannot revive run {revived.id}: "
                                      "it is in_progress; only a halted run can be revived")


def test_a_revived_run_that_halts_again_owes_its_own_on_halt_hook(offset_app):
    """A revive makes a new run: if it halts too, it owes its own hook (one per halted
    run, INV-HLT-1), under its own idempotency key; the first run's hook is untouched."""
    from tests.workloads.hooks import HaltingPipeline

    first = HaltingPipeline.trigger(1)
    drain(offset_app, skip_delays=True)
    before = first.history().hook
    assert before is not None
    assert before.status == "succeeded"
    revived = first.revive()
    drain(offset_app, skip_delays=True)
    assert revived.refresh().status == "halted"
    again = revived.history().hook
    assert again is not None
    assert again.status == "succeeded"
    assert again.id != before.id
    assert first.history().hook == before
    with offset_app.begin(readonly=True) as tx:
        h = schema.halt_hooks
        rows = tx.execute(sa.select(h.c.run_id).where(h.c.run_id.in_([first.id, revived.id]))).scalars().all()
    assert sorted(rows) == sorted([first.id, revived.id])
