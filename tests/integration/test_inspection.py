"""Inspection without SQL and retention, on SQLite, PostgreSQL and MySQL.

``Run.history()``/``list_runs`` and the ``ductwork runs``/``show`` commands that
render them (one source of truth), their errors and read-only-ness; ``ductwork
prune``: what it deletes and what it never touches, batches, dry runs, and a
prune killed inside a batch.

Checks: INV-PRN-1 (never a live run, re-checked under the lock), INV-PRN-2
(a pruned run leaves no row; a killed batch leaves whole runs), INV-CLK-1 (the
cutoff is database time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

import ductwork
from ductwork import Pipeline, Step
from ductwork.cli import main
from ductwork.db import schema
from ductwork.errors import RunFilterError, UnknownRunError
from ductwork.fleet.processes import register
from ductwork.history_text import history_json, render_history
from ductwork.limits.claims import claim
from ductwork.pipelines import prune as pruning
from ductwork.pipelines.history import list_runs
from ductwork.testing import drain
from tests.conftest import installed_on_manual_clock
from tests.workloads import Boom, FailsOnce, Items, Square, Sum

AT = datetime(2000, 1, 1)

# --------------------------------------------------------------------------- pipelines


class Fans(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Items).expand(to=Square).collapse(into=Sum)


class Fails(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Square).chain(to=Boom)


class Later(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Square).chain(to=Square, delay="30d")


class Waits(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Square).dampen(before=Square)


class Keyed(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Square, limit_by="one_at_a_time")


class Staggered(Pipeline):
    """A divide whose first child fails once (FailsOnce: its retry a ``retry_delay`` later)
    and whose second succeeds at once, then a combine: each branch's and each step's
    other time columns (its last advance, its arrival, its finish, its last write)
    disagree with its start order."""

    @classmethod
    def define(cls, p):
        slow, fast = p.start(Square).divide(to=[FailsOnce, Square])
        slow.combine(fast, into=Sum)


class KeyedThenDelayed(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Square, limit_by="one_at_a_time").chain(to=Square, delay="1h")


class HaltsAndWaits(Pipeline):
    """Two branches: one halts (Boom), the other waits in a dampen: the run is dampened
    with a halted branch."""

    @classmethod
    def define(cls, p):
        _, waits = p.start(Square).divide(to=[Boom, Square])
        waits.dampen(before=Square)


@pytest.fixture
def clocked(db_url):
    """A ManualClock app (so a test can age its runs), tables empty, the default app."""
    yield from installed_on_manual_clock(db_url, job_worker={"limits": {"one_at_a_time": {"concurrency": 1}}})


def _work_now(app) -> None:
    """Everything runnable at the clock's now, without moving the clock (drain would)."""
    from ductwork.fleet.worker import Worker
    from ductwork.pipelines.advance import Advancer

    worker, advancer = Worker(app), Advancer(app)
    for _ in range(1000):
        if advancer.run_once() == "idle" and worker.run_once() is None:
            return
    raise AssertionError("work did not run out")


def _cli(capsys, db_url, *argv):
    code = main([*argv, "--database-url", db_url, "-c", "/dev/null"])
    out = capsys.readouterr()
    return code, out.out, out.err


# --------------------------------------------------------------------------- history


def test_history_of_a_completed_fan_out(clocked):
    run = Fans.trigger(3)
    drain(clocked, skip_delays=True)
    history = run.history()
    assert isinstance(history, ductwork.RunHistory)
    assert (history.run.status, history.run.pipeline, history.run.revived_from) == (
        "completed", "tests.integration.test_inspection:Fans", None)
    assert history.run.finished_at == history.run.completed_at is not None
    assert sorted(s.node for s in history.steps) == ["Items#0", "Square#1", "Square#1", "Square#1", "Sum#2"]
    assert len(history.branches) == 5  # start, three children, the fan-in target
    assert {b.status for b in history.branches} == {"completed"}
    children = [b for b in history.branches if b.parent_id is not None]
    assert sorted(b.barrier_index for b in children) == [0, 1, 2]
    for step in history.steps:
        assert step.wait is None
        assert step.status == "completed"
        assert [x.outcome for x in step.executions] == ["success"]
        assert step.executions[0].claimed_at is not None
        assert step.executions[0].error is None
    with pytest.raises(AttributeError):
        history.run.status = "halted"  # type: ignore[misc]  # frozen


def test_history_of_a_halted_run_names_the_error_and_the_backtrace_on_request(clocked, db_url, capsys):
    run = Fails.trigger(2)
    drain(clocked, skip_delays=True)
    history = run.history()
    assert (history.run.status, history.run.halt_reasons) == ("halted", ("job_retries_exhausted",))
    (failed,) = [s for s in history.steps if s.status == "failed"]
    assert failed.node == "Boom#1"
    assert len(failed.executions) == 3
    assert [x.outcome for x in failed.executions] == ["failure"] * 3
    assert {(x.error.klass, x.error.message, x.error.backtrace) for x in failed.executions if x.error} == {
        ("builtins.ValueError", "boom 4", None)}
    traced = run.history(backtraces=True)
    (failed,) = [s for s in traced.steps if s.status == "failed"]
    assert all("raise ValueError" in (x.error.backtrace or "") for x in failed.executions if x.error)

    code, out, err = _cli(capsys, db_url, "show", run.id)
    assert (code, err) == (0, "")
    assert f"run {run.id}  halted" in out
    assert "halt reasons  job_retries_exhausted" in out
    assert "builtins.ValueError: boom 4" in out
    assert "raise ValueError" not in out
    code, out, _ = _cli(capsys, db_url, "show", run.id, "--backtrace")
    assert code == 0
    assert "raise ValueError" in out
    code, out, _ = _cli(capsys, db_url, "show", run.id, "--json")
    document = json.loads(out)
    assert (code, document["format"], document["run"]["status"]) == (0, 1, "halted")
    assert set(document) == {"format", "now", "run", "branches", "steps", "context_keys", "hook"}
    expected = json.loads(json.dumps(history_json(run.history())))
    assert {**document, "now": None} == {**expected, "now": None}  # the CLI's clock is the database's


def test_a_revived_run_names_its_source_even_once_that_is_pruned(clocked, db_url, capsys):
    """``revived_from`` (migration 0003) is shown; the run it names may be gone (pruned)."""
    source, revived = Fails.trigger(1), Fans.trigger(1)
    drain(clocked, skip_delays=True)
    with clocked.begin() as tx:  # as a revive records it
        tx.execute(schema.runs.update().where(schema.runs.c.id == revived.id).values(revived_from=source.id))
    clocked.clock.advance(timedelta(days=1))
    assert pruning.prune(clocked, timedelta(hours=1), pipeline="Fails").runs == 1
    assert revived.history().run.revived_from == source.id
    code, out, _ = _cli(capsys, db_url, "show", revived.id)
    assert code == 0
    assert f"revived from  {source.id} (that run may have been pruned since)" in out
    code, out, _ = _cli(capsys, db_url, "runs", "--json")
    assert [(r["id"], r["revived_from"]) for r in json.loads(out)["runs"]] == [(revived.id, source.id)]
    code, out, _ = _cli(capsys, db_url, "runs")
    (line,) = [line for line in out.splitlines() if line.startswith(revived.id)]
    assert (code, line.split("  ")[-1]) == (0, f"revived from {source.id}")


def test_a_halted_run_names_the_run_revived_from_it(clocked, db_url, capsys):
    """Once revived, a halted run says so wherever it is listed, so an operator working
    through ``ductwork runs --status halted`` sees which are already taken care of."""
    halted, other = Fails.trigger(1), Fails.trigger(2)
    drain(clocked, skip_delays=True)
    assert [r.revived_as for r in list_runs(clocked, status="halted")] == [None, None]
    revived = halted.revive()
    assert revived.id != halted.id
    assert {r.id: r.revived_as for r in list_runs(clocked, status="halted")} == {halted.id: revived.id,
                                                                                other.id: None}
    assert (halted.history().run.revived_as, other.history().run.revived_as) == (revived.id, None)
    assert revived.history().run.revived_as is None  # in progress: only a halted run is revived
    code, out, _ = _cli(capsys, db_url, "runs", "--status", "halted")
    (line,) = [line for line in out.splitlines() if line.startswith(halted.id)]
    assert (code, line.split("  ")[-1]) == (0, f"job_retries_exhausted; revived as {revived.id}")
    (line,) = [line for line in out.splitlines() if line.startswith(other.id)]
    assert line.split("  ")[-1] == "job_retries_exhausted"
    code, out, _ = _cli(capsys, db_url, "show", halted.id)
    assert (code, f"  revived as    {revived.id}" in out.splitlines()) == (0, True)
    code, out, _ = _cli(capsys, db_url, "runs", "--json", "--status", "halted")
    assert {r["id"]: r["revived_as"] for r in json.loads(out)["runs"]} == {halted.id: revived.id, other.id: None}
    code, out, _ = _cli(capsys, db_url, "show", halted.id, "--json")
    assert json.loads(out)["run"]["revived_as"] == revived.id


def test_waits_delay_dampen_and_a_keys_concurrency(clocked):
    later = Later.trigger(1)
    waiting = Waits.trigger(1)
    _work_now(clocked)  # Later's delayed step stays pending
    (delayed,) = [s for s in later.history().steps if s.status == "in_progress"]
    assert delayed.wait is not None
    assert delayed.wait.kind == "delay"
    assert delayed.wait.until == clocked.now() + timedelta(days=30)
    (branch,) = waiting.history().branches
    assert (branch.status, branch.wait) == ("dampened", ductwork.Wait(kind="resume"))

    first, second = Keyed.trigger(1), Keyed.trigger(2)
    assert claim(clocked, register(clocked, role="test", label="holder")) is not None
    waits = {run.id: run.history().steps[0].wait for run in (first, second)}
    assert sorted(w.kind for w in waits.values() if w) == ["concurrency", "running"]
    (blocked,) = [w for w in waits.values() if w and w.kind == "concurrency"]
    assert (blocked.key, blocked.in_flight, blocked.concurrency) == ("one_at_a_time", 1, 1)


def test_list_runs_filters_and_the_runs_command(clocked, db_url, capsys):
    old = Fans.trigger(1)
    clocked.clock.advance(timedelta(hours=2))
    failed, waiting = Fails.trigger(1), Waits.trigger(1)
    drain(clocked, skip_delays=True)
    assert [r.id for r in list_runs(clocked)] == [waiting.id, failed.id, old.id]  # newest first
    assert [r.id for r in list_runs(clocked, status="halted")] == [failed.id]
    assert [r.id for r in list_runs(clocked, pipeline="Fans")] == [old.id]
    assert [r.id for r in list_runs(clocked, pipeline="tests.integration.test_inspection:Fails")] == [failed.id]
    assert {r.id for r in list_runs(clocked, since="1h")} == {failed.id, waiting.id}
    assert {r.id for r in list_runs(clocked, since="2026-01-01T13:00:00Z")} == {failed.id, waiting.id}
    assert len(list_runs(clocked, limit=1)) == 1
    code, out, err = _cli(capsys, db_url, "runs", "--status", "halted")
    assert (code, err) == (0, "")
    assert failed.id in out
    assert "job_retries_exhausted" in out
    assert old.id not in out
    code, out, _ = _cli(capsys, db_url, "runs", "--json", "--limit", "2")
    document = json.loads(out)
    assert [r["id"] for r in document["runs"]] == [waiting.id, failed.id]
    assert set(document["runs"][0]) == {"id", "pipeline", "status", "triggered_at", "completed_at", "halted_at",
                                        "revived_from", "halt_reasons", "revived_as", "finished_at"}


def test_a_run_not_halted_with_a_halted_branch_is_listed_with_its_halt_reason(clocked, db_url, capsys):
    """A run whose branch halted while another waits in a dampen is dampened, not halted:
    ``list_runs`` (and ``ductwork runs``) give its halt reason as ``run_history`` does,
    nothing hidden (RunRecord.halt_reasons: why each halted branch halted)."""
    run = HaltsAndWaits.trigger(3)
    drain(clocked, skip_delays=True)
    (listed,) = list_runs(clocked)
    assert (listed.status, listed.halt_reasons) == ("dampened", ("job_retries_exhausted",))
    assert listed.halt_reasons == run.history().run.halt_reasons == tuple(run.refresh().halt_reasons)
    code, out, _ = _cli(capsys, db_url, "runs")
    assert code == 0
    assert "job_retries_exhausted" in out


def test_a_runs_definition_is_its_snapshot_and_a_revived_run_shares_it(clocked):
    failed = Fails.trigger(1)
    drain(clocked, skip_delays=True)
    assert failed.definition() == Fails.definition
    assert failed.revive().definition() == Fails.definition
    assert Waits.trigger(1).definition().edges["Square#0"].type == "dampen"
    clocked.clock.advance(timedelta(days=1))
    assert pruning.prune(clocked, timedelta(hours=1), pipeline="Fails").runs == 1  # the halted one
    with pytest.raises(UnknownRunError, match=failed.id):
        failed.definition()


def test_list_runs_pages_by_keyset_through_runs_triggered_at_one_moment(clocked):
    """``before``: the (triggered_at, id) of the previous page's last run. Seven runs at
    one moment (the clock does not move) and three an hour later: pages of three list
    every run once, newest first, ties by id; a filter holds on every page."""
    early = [Waits.trigger(i) for i in range(7)]
    clocked.clock.advance(timedelta(hours=1))
    late = [Waits.trigger(i) for i in range(3)]
    expected = [r.id for r in sorted(late, key=lambda r: r.id, reverse=True)] + \
        [r.id for r in sorted(early, key=lambda r: r.id, reverse=True)]
    assert [r.id for r in list_runs(clocked)] == expected
    pages, before = [], None
    while page := list_runs(clocked, limit=3, before=before):
        pages.append([r.id for r in page])
        before = (page[-1].triggered_at, page[-1].id)
    assert pages == [expected[0:3], expected[3:6], expected[6:9], expected[9:]]
    first = list_runs(clocked, limit=2, since="30m")
    assert [r.id for r in list_runs(clocked, since="30m", before=(first[-1].triggered_at, first[-1].id))] == \
        expected[2:3]


def test_since_lists_a_run_triggered_at_that_very_instant(clocked):
    """``since`` is "triggered at or after": a run triggered exactly at it is listed, the
    moment given as a datetime or as the duration back from now that reaches it."""
    early = Fans.trigger(1)
    clocked.clock.advance(timedelta(hours=1))
    late = Waits.trigger(1)
    late_at, early_at = (r.triggered_at for r in list_runs(clocked))
    assert [r.id for r in list_runs(clocked, since=late_at)] == [late.id]
    assert [r.id for r in list_runs(clocked, since=early_at)] == [late.id, early.id]
    assert [r.id for r in list_runs(clocked, since="1h")] == [late.id, early.id]
    assert [r.id for r in list_runs(clocked, since="59m")] == [late.id]


def test_pages_follow_trigger_time_when_a_run_finishes_after_a_later_trigger(clocked):
    """``before`` is the previous page's last (triggered_at, id): a run triggered before it
    but finished (its row written) after it is still on the next page."""
    first = Keyed.trigger(1)
    clocked.clock.advance(timedelta(hours=1))
    second = Waits.trigger(1)
    clocked.clock.advance(timedelta(hours=1))
    drain(clocked)  # the first run completes after the second's trigger
    page = list_runs(clocked, limit=1)
    assert [r.id for r in page] == [second.id]
    assert [r.id for r in list_runs(clocked, before=(page[-1].triggered_at, page[-1].id))] == [first.id]


@pytest.mark.parametrize(("argv", "message"), [
    (["runs", "--status", "done"], "ductwork runs: RunFilterError: --status='done': expected one of"),
    (["runs", "--since", "yesterday"], "ductwork runs: RunFilterError: --since='yesterday': expected a duration"),
    (["runs", "--since", "2026-02-30"], "ductwork runs: RunFilterError: --since='2026-02-30': expected a duration"),
    (["runs", "--limit", "0"], "ductwork runs: RunFilterError: --limit=0: expected a whole number from 1"),
    (["runs", "--limit", "ten"], "ductwork runs: RunFilterError: --limit='ten': expected a whole number"),
    (["show", "nope"], "ductwork show: UnknownRunError: no run 'nope' (never triggered, or pruned)"),
    (["prune", "--finished-before", "1mo"], "ductwork prune: RunFilterError: --finished-before='1mo':"),
    (["prune", "--finished-before", "1d", "--batch-size", "0"],
     "ductwork prune: RunFilterError: --batch-size=0: expected a whole number of runs, at least 1"),
])
def test_bad_values_are_one_named_line_and_exit_1(app, db_url, capsys, argv, message):  # noqa: ARG001 - app: migrated, empty tables
    code, out, err = _cli(capsys, db_url, *argv)
    assert (code, out) == (1, "")
    assert err.startswith(message), err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize("argv", [["runs"], ["show", "x"], ["prune", "--finished-before", "1d"]])
def test_inspection_and_prune_never_create_a_sqlite_file(tmp_path, capsys, argv):
    url = f"sqlite:///{tmp_path}/absent.sqlite3"
    code, _, err = _cli(capsys, url, *argv)
    assert code == 1
    assert "MissingDatabaseError" in err
    assert list(tmp_path.iterdir()) == []


def test_history_of_an_unknown_run(app):
    with pytest.raises(UnknownRunError, match="no run 'x'"):
        ductwork.pipelines.history.run_history(app, "x")
    with pytest.raises(RunFilterError, match="--status='done'"):
        list_runs(app, status="done")



def test_a_run_handle_on_no_run_and_a_wait_that_times_out(app):
    """``app.run(id)`` of no run names it; a handle whose run was pruned since refuses
    ``resume``; ``wait`` on a run nobody works raises TimeoutError saying its status (no
    fleet here: the run stays in progress)."""
    from ductwork.errors import RunStateError

    with pytest.raises(UnknownRunError, match=r"^no run 'x' \(never triggered, or pruned\)$"):
        app.run("x")
    done = Keyed.trigger(1)
    drain(app)
    assert pruning.prune(app, timedelta(0)).runs == 1
    with pytest.raises(RunStateError, match=rf"^run {done.id} does not exist$"):
        done.resume()
    run = Later.trigger(2)
    assert repr(run) == f"Run({run.id!r}, pipeline='tests.integration.test_inspection:Later', status='in_progress')"
    with pytest.raises(TimeoutError, match=rf"^run {run.id} still in_progress after 0\.05 s$"):
        run.wait(timeout=0.05, poll=0.01)


# --------------------------------------------------------------------------- prune


def _rows_of(app, run_ids) -> dict[str, int]:
    with app.begin(readonly=True) as tx:
        return pruning._count(tx, sorted(run_ids))


def test_prune_deletes_old_final_runs_whole_and_never_a_live_one(clocked):
    done, halted, waiting = Fans.trigger(2), Fails.trigger(1), Waits.trigger(1)
    drain(clocked)
    later = Later.trigger(1)  # its delayed step stays pending: in progress
    _work_now(clocked)
    clocked.clock.advance(timedelta(days=2))
    fresh = Fans.trigger(1)
    _work_now(clocked)
    assert [r.refresh().status for r in (done, halted, waiting, later, fresh)] == [
        "completed", "halted", "dampened", "in_progress", "completed"]
    kept_before = _rows_of(clocked, [waiting.id, later.id, fresh.id])
    gone_before = _rows_of(clocked, [done.id, halted.id])

    dry = pruning.prune(clocked, timedelta(days=1), dry_run=True)  # the CLI's, on this app's clock
    out = pruning.render(dry)
    assert out.startswith("would delete 2 runs finished before 2026-01-02 12:00:00")
    assert dry.rows == gone_before
    assert _rows_of(clocked, [done.id, halted.id]) == gone_before  # a dry run deletes nothing

    batches = []
    result = pruning.prune(clocked, timedelta(days=1), batch_size=1, on_batch=lambda n, _rows: batches.append(n))
    assert (result.runs, result.batches, batches, result.rows) == (2, 2, [1, 1], gone_before)
    assert pruning.render(result).startswith("deleted 2 runs finished before 2026-01-02 12:00:00")
    assert " UTC in 2 batches\n" in pruning.render(result)
    assert set(_rows_of(clocked, [done.id, halted.id]).values()) == {0}  # [INV-PRN-2] no row behind
    assert _rows_of(clocked, [waiting.id, later.id, fresh.id]) == kept_before  # [INV-PRN-1]
    with pytest.raises(UnknownRunError):
        done.history()
    assert pruning.prune(clocked, timedelta(days=1)).runs == 0  # a second prune finds nothing


def test_the_prune_command_prints_counts_per_table(app, db_url, capsys):
    done, waiting = Fans.trigger(2), Waits.trigger(1)
    drain(app)
    rows = _rows_of(app, [done.id])
    code, out, err = _cli(capsys, db_url, "prune", "--finished-before", "0", "--dry-run")
    assert (code, err) == (0, "")
    assert out.startswith("would delete 1 runs finished before ")
    code, out, _ = _cli(capsys, db_url, "prune", "--finished-before", "0", "--pipeline", "Fails")
    assert code == 0
    assert "deleted 0 runs finished before " in out  # only Fails runs: there are none
    code, out, err = _cli(capsys, db_url, "prune", "--finished-before", "0", "--batch-size", "1")
    assert (code, err) == (0, "")
    assert "deleted 1 runs finished before " in out
    assert " in 1 batches" in out
    for name, n in rows.items():
        assert f"\n  {name:<21}  {n}" in out
    assert waiting.refresh().status == "dampened"


def test_a_batch_rechecks_each_run_under_its_lock(clocked):
    """Candidates chosen, then the run resumed before the batch: the batch leaves it [INV-PRN-1]."""
    waiting, done = Waits.trigger(1), Fans.trigger(1)
    drain(clocked)
    clocked.clock.advance(timedelta(days=1))
    cutoff = clocked.now()
    with clocked.begin() as tx:  # as if chosen while the run was final: the lock re-reads it
        deleted = pruning.prune_batch(tx, [waiting.id, done.id], cutoff)
    assert deleted["ductwork_runs"] == 1
    assert waiting.refresh().status == "dampened"
    assert set(_rows_of(clocked, [done.id]).values()) == {0}


def _rows_naming(app, run_ids, step_ids) -> dict[str, int]:
    """Rows of every table that names one of these runs or steps by a ``run_id`` or a
    ``step_id`` column, counted from the schema alone (not from ``RUN_TABLES``)."""
    counts = {}
    with app.begin(readonly=True) as tx:
        for table in schema.metadata.sorted_tables:
            for column, ids in (("run_id", run_ids), ("step_id", step_ids)):
                if column in table.c:
                    counts[f"{table.name}.{column}"] = tx.execute(
                        sa.select(sa.func.count()).select_from(table).where(table.c[column].in_(ids))).scalar_one()
    return counts


def test_a_pruned_run_leaves_no_row_in_any_table_that_names_it(clocked):
    """A completed run with a context key and a halted run with its on_halt hook: after the
    prune, no table of the schema holds a row naming either run or any of their steps,
    counted by the columns themselves, so a table missing from ``RUN_TABLES`` shows
    [INV-PRN-2]; a run that is not pruned keeps its context."""
    from tests.workloads.hooks import HaltingPipeline

    done, halted, kept = Fans.trigger(2), HaltingPipeline.trigger(1), Waits.trigger(1)
    drain(clocked, skip_delays=True)
    for run in (done, kept):
        ductwork.Context(clocked, run.id).set("noted", run.id)
    run_ids = [done.id, halted.id]
    step_ids = [step.id for run in (done, halted) for step in run.steps()]
    before = _rows_naming(clocked, run_ids, step_ids)
    assert (done.refresh().status, halted.refresh().status, halted.history().hook is not None,
            before["ductwork_context.run_id"] > 0) == ("completed", "halted", True, True)
    with clocked.begin(readonly=True) as tx:  # only these two runs are final
        assert tx.execute(sa.select(sa.func.count()).select_from(schema.runs).where(
            schema.runs.c.status.in_(["completed", "halted"]))).scalar_one() == 2
    clocked.clock.advance(timedelta(days=2))
    assert pruning.prune(clocked, timedelta(days=1)).runs == 2
    assert {name: n for name, n in _rows_naming(clocked, run_ids, step_ids).items() if n} == {}  # [INV-PRN-2]
    assert ductwork.Context(clocked, kept.id).get("noted") == kept.id


def test_prune_rows_cover_every_table_that_references_a_run():
    """A table with a foreign key into a run's tables must be in RUN_TABLES (else a prune
    would fail on it, or leave its rows behind) [INV-PRN-2]."""
    listed = {t.table.name for t in pruning.RUN_TABLES}
    for table in schema.metadata.sorted_tables:
        if any(fk.column.table.name in listed for fk in table.foreign_keys):
            assert table.name in listed, table.name


def test_a_prune_killed_inside_a_batch_leaves_whole_runs(app, db_url):
    """SIGKILL inside the second batch's transaction: the first batch's run is gone, every
    other run is whole, and a second prune finishes the job [INV-PRN-2]."""
    runs = [Fans.trigger(2) for _ in range(3)]
    drain(app)
    before = {run.id: _rows_of(app, [run.id]) for run in runs}
    env = {**os.environ, "DUCTWORK_FAULT": "inside_prune_batch:kill:2"}
    child = subprocess.run([sys.executable, "-m", "ductwork.cli", "prune", "--finished-before", "0",
                            "--batch-size", "1", "--database-url", db_url, "-c", "/dev/null"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert "FAULT FIRING inside_prune_batch:kill" in child.stderr, child.stderr[-2000:]
    assert child.returncode == -9
    after = {run.id: _rows_of(app, [run.id]) for run in runs}
    gone = [run_id for run_id, rows in after.items() if set(rows.values()) == {0}]
    assert len(gone) == 1, after
    assert all(after[run_id] == before[run_id] for run_id in after if run_id not in gone)  # whole
    result = pruning.prune(app, timedelta(0))
    assert result.runs == 2
    assert all(set(_rows_of(app, [run.id]).values()) == {0} for run in runs)


def test_prune_waits_for_an_on_halt_hook_and_then_deletes_it_with_its_run(clocked):
    """A halted run whose on_halt hook is still pending or running is live work: a prune
    leaves it (the hook's outcome is not recorded yet) [INV-PRN-1]; once the hook is final
    the run goes with its hook row [INV-PRN-2]."""
    import sqlalchemy as sa

    from tests.workloads.hooks import HaltingPipeline

    run = HaltingPipeline.trigger(1)
    drain(clocked, skip_delays=True)
    h = schema.halt_hooks
    with clocked.begin() as tx:
        assert tx.execute(sa.select(h.c.status).where(h.c.run_id == run.id)).scalar_one() == "succeeded"
        for status in ("pending", "running"):  # the hook owed and not yet run, or being run
            tx.execute(h.update().where(h.c.run_id == run.id).values(status=status, completed_at=None))
    clocked.clock.advance(timedelta(days=2))
    for status in ("running", "pending"):
        with clocked.begin() as tx:
            tx.execute(h.update().where(h.c.run_id == run.id).values(status=status))
        assert pruning.prune(clocked, timedelta(days=1)).runs == 0
        cutoff = clocked.now()
        with clocked.begin() as tx:  # candidates chosen while the hook was final: the batch re-checks
            assert pruning.prune_batch(tx, [run.id], cutoff) == {}
        assert run.refresh().status == "halted"
    now = clocked.now()
    with clocked.begin() as tx:
        tx.execute(h.update().where(h.c.run_id == run.id).values(status="succeeded", completed_at=now))
    result = pruning.prune(clocked, timedelta(days=1))
    assert (result.runs, result.rows["ductwork_halt_hooks"]) == (1, 1)
    assert set(_rows_of(clocked, [run.id]).values()) == {0}


def test_a_prune_leaves_every_row_of_the_runs_it_keeps_as_it_was(clocked):
    """Two old runs to delete (a fan-out that completed, a run that halted) beside runs a
    prune keeps: a fan-out that completed recently (its branches linked to their parent and
    barrier), a dampened run, and a halted one whose on_halt hook is still pending. The
    prune deletes exactly the two old runs, whole (another run's open hook does not hold
    them) [INV-PRN-2], and every row of each kept run, in every table, is as it was: a
    batch's writes touch only its own runs' rows [INV-PRN-1]."""
    import sqlalchemy as sa

    from tests.factories import run_rows
    from tests.workloads.hooks import HaltingPipeline

    old = [Fans.trigger(3), Fails.trigger(1)]
    drain(clocked, skip_delays=True)
    clocked.clock.advance(timedelta(days=2))
    fresh, waiting, hooked = Fans.trigger(2), Waits.trigger(1), HaltingPipeline.trigger(1)
    drain(clocked, skip_delays=True)
    h = schema.halt_hooks
    with clocked.begin() as tx:  # its hook owed and not yet run
        tx.execute(h.update().where(h.c.run_id == hooked.id).values(status="pending", completed_at=None))
    assert [r.refresh().status for r in (*old, fresh, waiting, hooked)] == [
        "completed", "halted", "completed", "dampened", "halted"]
    kept = {run.id: run_rows(clocked, run.id) for run in (fresh, waiting, hooked)}
    b = schema.branches
    with clocked.begin() as tx:  # (the kept fan-out's links, which a batch unlinks in its own runs)
        assert tx.execute(sa.select(sa.func.count()).where(b.c.run_id == fresh.id, b.c.parent_id.is_not(None),
                                                           b.c.barrier_id.is_not(None))).scalar_one() == 2
    result = pruning.prune(clocked, timedelta(days=1))
    assert result.runs == 2
    assert all(set(rows.values()) == {0} for rows in (_rows_of(clocked, [run.id]) for run in old))
    assert {run_id: run_rows(clocked, run_id) for run_id in kept} == kept


def test_history_and_show_name_the_on_halt_hook(clocked, db_url, capsys):
    """A halted run's hook (status, counters, last error) is in Run.history(), `ductwork
    show` and its --json; a run that owes none has hook None."""
    from tests.workloads.hooks import HaltingPipeline

    run, done = HaltingPipeline.trigger(1), Fans.trigger(1)
    drain(clocked, skip_delays=True)
    hook = run.history().hook
    assert hook is not None
    assert (hook.klass, hook.status, hook.last_outcome) == (
        "tests.workloads.hooks:HaltRecorder", "succeeded", "success")
    assert done.history().hook is None
    code, out, _ = _cli(capsys, db_url, "show", run.id)
    assert code == 0
    assert "  on_halt hook  tests.workloads.hooks:HaltRecorder  succeeded  retries 0 crashes 0  ended " in out
    code, out, _ = _cli(capsys, db_url, "show", run.id, "--json")
    assert json.loads(out)["hook"]["status"] == "succeeded"
    code, out, _ = _cli(capsys, db_url, "show", done.id, "--json")
    assert json.loads(out)["hook"] is None


def test_a_closed_pipe_stops_a_command_quietly(app, db_url):
    """`ductwork runs | true`: the reader is gone before the first write; no traceback,
    exit status 141 (SIGPIPE in a shell); a prune stopped so has deleted nothing or whole
    runs (its batches' own guarantee, tested above)."""
    for i in range(3):
        Fans.trigger(i)
    drain(app)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    for argv in (["runs", "--limit", "30"], ["prune", "--finished-before", "0", "--batch-size", "1"]):
        done = subprocess.run(f"{sys.executable} -m ductwork.cli {' '.join(argv)} --database-url '{db_url}' "
                              "-c /dev/null | true; echo \"${PIPESTATUS[0]}\"",
                              shell=True, executable="/bin/bash", env=env, capture_output=True, text=True,
                              timeout=120)
        assert "Traceback" not in done.stderr, done.stderr
        assert done.stdout.strip() == "141", (argv, done.stdout, done.stderr)
    assert {run.status for run in list_runs(app, limit=100)} <= {"completed"}


@pytest.mark.parametrize(("kwargs", "option", "value", "message"), [
    ({"finished_before": timedelta(seconds=-1)}, "--finished-before", timedelta(seconds=-1), "must not be negative"),
    ({"finished_before": timedelta(0), "batch_size": 0}, "--batch-size", 0,
     "expected a whole number of runs, at least 1"),
    ({"finished_before": timedelta(0), "batch_size": True}, "--batch-size", True,
     "expected a whole number of runs, at least 1"),
])
def test_prune_from_python_refuses_a_negative_age_or_a_bad_batch_size(app, kwargs, option, value, message):
    """``prune`` called from Python (the CLI's parser refuses these before it) names the
    option and the value, before it reads or deletes anything."""
    with pytest.raises(RunFilterError) as info:
        pruning.prune(app, **kwargs)
    assert (info.value.option, info.value.value) == (option, value)
    assert str(info.value) == f"{option}={value!r}: {message}"


# --------------------------------------------------------------------------- show: every wait and error


class Pager(Step):
    """An on_halt handler that always fails (its last error is shown)."""

    def __init__(self, halt):
        self.halt = halt

    def execute(self):
        raise ConnectionError("pager down")


class FailsAndPages(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Boom).on_halt(Pager)


class Hourly(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Square, limit_by="hourly")


@pytest.fixture
def waits_app(db_url):
    """A ManualClock app with a concurrency key and a rate key, expands in batches of one."""
    yield from installed_on_manual_clock(
        db_url,
        job_worker={"limits": {"one_at_a_time": {"concurrency": 1},
                               "hourly": {"rate": {"limit": 1, "per": "1h"}}}},
        pipeline_advancer={"expand_batch": 1})


def _shown(run) -> str:
    """``ductwork show``'s text of the run at the app's clock (the CLI renders the same record)."""
    return render_history(run.history())


def test_show_names_what_each_step_of_a_run_in_progress_waits_for(waits_app):
    """``ductwork show`` of runs in progress: the line under each waiting step or branch
    (delay, dampened, queued on a free key, running, full key, rate-blocked key, waiting for
    an advancer), with no finish time and no duration for an execution still running."""
    from ductwork.fleet.worker import Worker

    app = waits_app
    later, waiting = Later.trigger(1), Waits.trigger(1)
    _work_now(app)
    text = _shown(later)
    assert f"run {later.id}  in_progress\n" in text
    assert "  in_progress   " not in text  # not finished: no finish line
    assert "    waits: not eligible until 2026-01-31 12:00:00.000 (2592000.000s from now)" in text
    (branch,) = waiting.history().branches
    assert (f"branch {branch.id}  dampened\n  waits: Run.resume() (dampened; nothing resumes it by itself)"
            in _shown(waiting))

    queued = Keyed.trigger(1)
    assert "    waits: a worker to claim it key 'one_at_a_time' (eligible, nothing holds it back)" in _shown(queued)
    holder = register(app, role="test", label="holder")
    assert claim(app, holder) is not None  # the key's one slot: queued's step is running
    full = Keyed.trigger(2)
    text = _shown(queued)
    (running,) = [x for s in queued.history().steps for x in s.executions]
    assert (f"    running key 'one_at_a_time' since {running.claimed_at.isoformat(sep=' ', timespec='milliseconds')}"
            " (0.000s)") in text
    assert "    #1 running         claimed 2026-01-01 12:00:00.000  ended -  retries 0 crashes 0" in text
    assert "    waits: key 'one_at_a_time' has 1 of 1 in flight (its concurrency)" in _shown(full)
    assert "    #1 pending         claimed -  ended -  retries 0 crashes 0" in _shown(full)

    second, step = _rate_blocked_second(app)
    until = step.wait.until.isoformat(sep=" ", timespec="milliseconds")
    assert f"    waits: key 'hourly' is rate-blocked until {until} (3600.000s from now)" in _shown(second)

    fans = Fans.trigger(2)
    while Worker(app).run_once() is not None:  # Items succeeds; no advancer has run
        pass
    (emit,) = fans.history().steps
    assert (emit.status, emit.wait) == ("advancing", ductwork.Wait(kind="advance"))
    assert "    waits: an advancer to move its branch on" in _shown(fans)


def test_show_names_advancer_errors_context_keys_and_the_hooks_last_error(waits_app, db_url, capsys):
    """An advancer's error on a branch (an expand stopped between batches), the run's
    context keys, and the last error of its failing on_halt hook, in Run.history() and
    ``ductwork show`` (with the backtraces on request)."""
    from ductwork import Context
    from ductwork.errors import FaultInjection
    from ductwork.faults import BETWEEN_EXPAND_BATCHES
    from ductwork.fleet.worker import Worker
    from ductwork.pipelines.advance import Advancer

    app = waits_app
    fans = Fans.trigger(2)
    assert Worker(app).run_once() is not None  # Items succeeds: the expand is the advancer's
    ductwork.faults.arm(BETWEEN_EXPAND_BATCHES, "raise", nth=1)
    try:
        assert Advancer(app).run_once() == "error"  # one child created, then the error
    finally:
        ductwork.faults.disarm()
    capsys.readouterr()  # the checkpoint's FAULT FIRING line
    Context(app, fans.id).set("region", "eu")
    Context(app, fans.id).set("attempt", 1)
    paged = FailsAndPages.trigger(3)
    drain(app, skip_delays=True)  # (the expand's branch was released: drain finishes it too)
    history = fans.history()
    (expand, *_children) = history.branches
    (error,) = expand.advancement_errors
    assert (error.error.klass, error.error.message, error.error.backtrace) == (
        f"{FaultInjection.__module__}.FaultInjection", f"FaultInjection: {BETWEEN_EXPAND_BATCHES}", None)
    assert error.completed_at is not None
    (emit,) = [s for s in history.steps if s.node == "Items#0"]
    assert error.step_id == emit.id
    hook = paged.history().hook
    assert hook is not None
    assert (hook.status, hook.error) == ("failed", ductwork.pipelines.history.ErrorRecord(
        klass="builtins.ConnectionError", message="pager down", backtrace=None))

    code, out, err = _cli(capsys, db_url, "show", fans.id)  # (the CLI's app is the default after it)
    assert (code, err) == (0, "")
    assert "  context keys  attempt, region\n" in out
    assert (f"  advancer error on step {emit.id} at {error.started_at.isoformat(sep=' ', timespec='milliseconds')}: "
            f"{error.error.klass}: {error.error.message}\n") in out
    assert "raise FaultInjection" not in out
    _, out, _ = _cli(capsys, db_url, "show", fans.id, "--backtrace")
    assert ", in _expand\n" in out
    assert "        raise FaultInjection(name)\n" in out
    code, out, _ = _cli(capsys, db_url, "show", paged.id)
    assert code == 0
    assert "  on_halt hook  tests.integration.test_inspection:Pager  failed  " in out
    assert "\n    last error builtins.ConnectionError: pager down\n" in out
    _, out, _ = _cli(capsys, db_url, "show", paged.id, "--backtrace")
    assert 'raise ConnectionError("pager down")' in out


def test_the_runs_command_with_no_runs(app, db_url, capsys):  # noqa: ARG001 - app: migrated, empty tables
    assert _cli(capsys, db_url, "runs") == (0, "(no runs)\n", "")


# --------------------------------------------------------------------------- history: order, waits, its own run


def test_a_history_lists_branches_steps_and_executions_in_start_order(clocked):
    """Branches and steps in start order (ties by id), each step's executions in creation
    order, whatever their other time columns say: the divide's first child ends an attempt
    after its sibling has finished and arrived at the combine; a failed attempt's retry,
    not yet claimed, is the step's last execution and what it waits for."""
    run = Staggered.trigger(3)
    _work_now(clocked)  # FailsOnce failed once (its retry not yet eligible); its sibling arrived
    history = run.history()
    start, slow, fast = history.branches
    assert (start.parent_id, slow.barrier_index, fast.barrier_index) == (None, 0, 1)
    (failing,) = [s for s in history.steps if s.node == "FailsOnce#1"]
    assert [x.outcome for x in failing.executions] == ["failure", None]
    assert failing.wait is not None
    assert failing.wait.kind == "delay"
    assert failing.wait.until > clocked.now()
    drain(clocked, skip_delays=True)
    history = run.history()
    assert [b.id for b in history.branches][:3] == [start.id, slow.id, fast.id]
    assert [s.node for s in history.steps] == ["Square#0", "FailsOnce#1", "Square#2", "Sum#3"]
    assert [x.outcome for x in history.steps[1].executions] == ["failure", "success"]


def test_a_historys_advancer_errors_of_one_instant_are_in_id_order(app):
    """Two failed advancements of a branch that started at the same instant (a frozen or
    coarse clock) are listed in id order (creation order), not as the database happens to
    return them: here the later id was written first."""
    from ductwork.db.ids import new_id
    from ductwork.pipelines.history import run_history
    from tests.factories import make_executions, make_run

    run_id, parent = make_run(app)
    make_executions(app, run_id, parent, None, AT)
    e, s = schema.executions, schema.steps
    with app.begin() as tx:
        branch_id, step_id = tx.execute(sa.select(s.c.branch_id, s.c.id).join(e, e.c.step_id == s.c.id)
                                        .where(s.c.run_id == run_id)).one()
        first, second = new_id(), new_id()
        tx.execute(schema.advancements.insert(), [
            {"id": i, "branch_id": branch_id, "step_id": step_id, "claim_token": new_id(), "started_at": AT,
             "completed_at": AT, "error_klass": "builtins.RuntimeError", "error_message": f"attempt {i}",
             "crash_count": 0, "created_at": AT, "updated_at": AT} for i in (second, first)])
    (branch,) = [b for b in run_history(app, run_id).branches if b.id == branch_id]
    assert [x.error.message for x in branch.advancement_errors] == [f"attempt {first}", f"attempt {second}"]


def test_a_history_lists_a_branch_an_advancer_holds_in_its_start_order(clocked):
    """A branch claimed by an advancer (``claimed_at`` set, its siblings' NULL) keeps its
    place among the branches."""
    from ductwork.fleet.worker import Worker
    from ductwork.pipelines.branches import claim_branches

    run = Staggered.trigger(3)
    _work_now(clocked)
    clocked.clock.advance(timedelta(seconds=10))
    assert Worker(clocked).run_once() is not None  # FailsOnce's retry succeeds: its branch may advance
    start, slow, fast = run.history().branches
    assert claim_branches(clocked, [slow.id], register(clocked, role="test", label="advancer"))
    assert [(b.id, b.status) for b in run.history().branches] == [
        (start.id, "completed"), (slow.id, "advancing"), (fast.id, fast.status)]


def _rate_blocked_second(app):
    """Two runs of ``Hourly`` worked now: the key's one token an hour goes to the first, so
    the second's step waits, rate-blocked; the second run and its step's record."""
    Hourly.trigger(1)
    second = Hourly.trigger(2)
    _work_now(app)
    (step,) = second.history().steps
    assert step.wait is not None
    assert step.wait.kind == "rate"
    return second, step


def test_a_key_rate_blocked_until_exactly_now_holds_its_step_no_longer(waits_app):
    """A key is rate-blocked while its ``blocked_until`` is after now: at that instant the
    step is queued again."""
    app = waits_app
    second, step = _rate_blocked_second(app)
    app.clock.advance(step.wait.until - app.now())
    (step,) = second.history().steps
    assert step.wait == ductwork.Wait(kind="queued", key="hourly")


def test_an_unkeyed_step_after_a_keyed_one_that_completed_waits_for_no_key(clocked):
    """A run whose keyed step completed and whose next step is unkeyed: that step's wait
    names no key (only a keyed execution still open has its key's rows read)."""
    run = KeyedThenDelayed.trigger(2)
    _work_now(clocked)
    done, later = run.history().steps
    assert (done.status, done.limit_key, later.limit_key) == ("completed", "one_at_a_time", None)
    assert later.wait is not None
    assert later.wait.kind == "delay"
    clocked.clock.advance(timedelta(hours=1))
    assert run.history().steps[1].wait == ductwork.Wait(kind="queued")


def test_a_history_lists_only_its_own_runs_context_keys(clocked):
    first, second = Waits.trigger(1), Waits.trigger(2)
    ductwork.Context(clocked, first.id).set("region", "eu")
    ductwork.Context(clocked, second.id).set("attempt", 1)
    assert (first.history().context_keys, second.history().context_keys) == (("region",), ("attempt",))
