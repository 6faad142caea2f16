"""Every time predicate measures the right column: rows whose candidate columns disagree by far.

Each decision that compares a row's time with the database's now reads one column of
it: the orphan sweep a claim's ``claimed_at`` (an advancement's ``started_at``), the
runner's reconciliation the same against its grace, the reaper a process's
``last_heartbeat_at``, a prune a run's finish time (``completed_at`` or ``halted_at``),
a trigger key window its holder's finish time, a claim an execution's ``eligible_at``
and a hook claim the hook's. The advisory predicates are tabled the same way: a
trigger's count of other live job workers and ``ductwork start``'s warning of another
supervisor on this host (a heartbeat, judged at its instant as the reaper judges it), a
supervisor's judgement of its child's lease (its last heartbeat) and an idle worker's wait
(an eligible time to come, a key's rate stamp).
Tests whose rows were all written at one moment cannot tell that column from another
(the trigger time, the creation time, the last update). Here each test writes two rows
on a ManualClock (STYLE §7, no sleeping): one young by the measured column and old by
every other, one old by it and young by every other, and runs the operation once: only
the second is taken. The guarded end of an execution reads a time column too (a claim
time, present or not): a pending execution, old by every other time, is no orphan to end;
its test tables every state against every name a crash can be recorded in. The engine
mutants ``recovery_measures_creation``, ``hook_recovery_measures_creation``,
``reap_measures_registration``, ``prune_measures_trigger_time``,
``key_window_measures_trigger_time``, ``claim_measures_creation`` and
``hook_claim_measures_creation`` (tests/mutants.py)
each read a wrong column, and each is killed here.

Checks: INV-EXE-1 (the sweep, the reaper and reconciliation recover only claims old by
their claim or heartbeat time, and only their own: a live process's claims stay however
old), INV-EXE-2 (an ending ends only an open claim, in its holder's name), INV-EXE-5 (a
claim made just now under a reaped process is not swept while its body may still run; a
child past its lease is judged by its heartbeat), INV-LIM-5 (an idle worker waits for
the stamp a key's rate set), INV-HLT-2 (an orphaned hook is swept by its claim time),
INV-PRN-1 (a prune measures a run from its finish time), INV-TRG-1 (a key window
measures its holder from its finish time), INV-CLK-1 (every such time is the database
clock's, here the injected one).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from types import SimpleNamespace

import sqlalchemy as sa

from ductwork.db import schema
from ductwork.db.hosts import other_job_workers
from ductwork.db.ids import new_id
from ductwork.fleet.processes import register, supervisors_on_this_host
from ductwork.fleet.reaper import reap, reap_dead, reconcile, sweep_orphans
from ductwork.fleet.supervisor import Child, Supervisor, lease_margin
from ductwork.limits.claims import claim, claim_batch
from ductwork.limits.lanes import seconds_to_next_due
from ductwork.pipelines.hooks import claim_hook, next_hook_at
from ductwork.pipelines.outcomes import record_crash
from ductwork.pipelines.prune import prune
from tests.factories import PIPELINE_CLASS, make_executions, make_run, run_rows
from tests.workloads import Unkeyed

#: far enough that every threshold below lies between the two rows of a test
FAR = timedelta(days=10)


def _set(app, table, row_id, **values) -> None:
    with app.begin() as tx:
        assert tx.execute(table.update().where(table.c.id == row_id).values(**values)).rowcount == 1


def _open(app, table, row_id) -> bool:
    with app.begin() as tx:
        return tx.execute(sa.select(table.c.completed_at).where(table.c.id == row_id)).scalar_one() is None


def _claims(app, process_id, claimed: dict[str, timedelta], others: dict[str, timedelta]) -> dict[str, dict]:
    """Per name, an execution, an advancement and a running on_halt hook held by
    ``process_id`` (None: an orphan), claimed ``claimed[name]`` ago, every other time
    of theirs ``others[name]`` ago."""
    now = app.clock.now()
    made: dict[str, dict] = {}
    for name in claimed:
        at, other = now - claimed[name], now - others[name]
        run_id, branch_id = make_run(app)
        (execution_id,) = make_executions(app, run_id, branch_id, None, other)
        _set(app, schema.executions, execution_id, claimed_at=at, process_id=process_id, created_at=other,
             updated_at=other)
        with app.begin() as tx:
            step_id = tx.execute(sa.select(schema.steps.c.id).where(schema.steps.c.run_id == run_id)).scalar_one()
            token, advancement_id, hook_id = new_id(), new_id(), new_id()
            tx.execute(schema.branches.update().where(schema.branches.c.id == branch_id)
                       .values(status="advancing", claim_token=token, claimed_at=at))
            tx.execute(schema.advancements.insert().values(
                id=advancement_id, branch_id=branch_id, step_id=step_id, process_id=process_id, claim_token=token,
                started_at=at, crash_count=0, created_at=other, updated_at=other))
            tx.execute(schema.halt_hooks.insert().values(
                id=hook_id, run_id=run_id, klass="tests.factories:Noop", status="running", eligible_at=other,
                claim_token=new_id(), claimed_at=at, process_id=process_id, retry_count=0, crash_count=0,
                created_at=other, updated_at=other))
        made[name] = {"execution": execution_id, "advancement": advancement_id, "hook": hook_id}
    return made


def _hook_running(app, hook_id) -> bool:
    h = schema.halt_hooks
    with app.begin() as tx:
        return tx.execute(sa.select(h.c.status).where(h.c.id == hook_id)).scalar_one() == "running"


def _taken(app, made: dict) -> tuple[bool, bool, bool]:
    return (not _open(app, schema.executions, made["execution"]),
            not _open(app, schema.advancements, made["advancement"]),
            not _hook_running(app, made["hook"]))


def test_the_orphan_sweep_measures_a_claim_from_its_claim_time(manual_app):
    """Orphaned claims (their process row reaped): one claimed just now under a process
    reaped long ago, its execution created and last updated long ago, is not swept (its
    body may still run: a second would run beside it) [INV-EXE-5]; one claimed four
    reaper timeouts ago but created and updated just now is swept, execution, advancement
    and hook alike [INV-EXE-1, INV-HLT-2]."""
    app = manual_app
    timeout = timedelta(seconds=app.config.supervisor.reaper_timeout)
    made = _claims(app, None, {"young": timedelta(seconds=1), "old": 4 * timeout},
                   {"young": FAR, "old": timedelta(0)})
    assert sweep_orphans(app) == 3
    assert _taken(app, made["young"]) == (False, False, False)
    assert _taken(app, made["old"]) == (True, True, True)


def test_the_reaper_and_the_sweep_take_only_their_own_claims(manual_app):
    """Claims all four reaper timeouts old: a dead process's, a live process's (still
    heartbeating) and an orphan's. Reaping the dead one takes its claims only, once (a
    second reap finds nothing); the sweep takes the orphan's only, not the live process's
    however old; a live process is not reaped, and the reaper never reaps its own
    process [INV-EXE-1, INV-EXE-2]."""
    app = manual_app
    now, timeout = app.clock.now(), timedelta(seconds=app.config.supervisor.reaper_timeout)
    dead, live, own = (register(app, role="test", label=label) for label in ("dead", "live", "own"))
    _set(app, schema.processes, dead, last_heartbeat_at=now - 2 * timeout)
    _set(app, schema.processes, own, last_heartbeat_at=now - 2 * timeout)
    old = {"claim": 4 * timeout}
    held = {holder: _claims(app, pid, old, old)["claim"] for holder, pid in
            (("dead", dead), ("live", live), ("orphan", None))}
    assert reap(app, dead, force=True)
    assert not reap(app, dead, force=True)  # gone: nothing left to reap
    assert {holder: _taken(app, made) for holder, made in held.items()} == {
        "dead": (True, True, True), "live": (False, False, False), "orphan": (False, False, False)}
    assert sweep_orphans(app) == 3
    assert {holder: _taken(app, made) for holder, made in held.items()} == {
        "dead": (True, True, True), "live": (False, False, False), "orphan": (True, True, True)}
    assert not reap(app, live, force=False)  # its heartbeat is fresh
    assert reap_dead(app, own) == []  # never its own process, however stale
    assert reap_dead(app, None) == [own]


def test_reconciliation_measures_a_claim_from_its_claim_time(manual_app):
    """A live process's claims that no thread holds: one claimed within the grace, though
    created long ago, is left (its thread may not have registered it yet); one claimed
    past the grace, though created just now, is recovered [INV-EXE-1]."""
    app = manual_app
    process_id = register(app, role="test", label="reconciled")
    made = _claims(app, process_id, {"young": timedelta(seconds=1), "old": timedelta(minutes=2)},
                   {"young": FAR, "old": timedelta(0)})
    reconcile(app, process_id, set(), grace_s=60)
    assert _taken(app, made["young"]) == (False, False, False)
    assert _taken(app, made["old"]) == (True, True, True)


#: (the execution's state, whose name its crash is recorded in) -> what the guarded end does:
#: only an open claim ends, and only in its holder's name (no process for an orphan)
ENDINGS: dict[tuple[str, str | None], str] = {
    (state, named): "crashed" if (state, named) in {("held", "holder"), ("orphaned", None)} else "left"
    for state in ("pending", "held", "orphaned", "ended") for named in ("holder", "another", None)}


def test_an_ending_ends_only_an_open_claim_in_its_holders_name(manual_app):
    """The guarded end of an execution (a recorded crash, ``record_crash``, as the reaper,
    the sweep and a runner record one) over every state x every name: an execution pending
    (never claimed: no claim time, no process, though eligible, created and last updated
    long ago), held by a live process, orphaned (claimed, no process: its row reaped) or
    ended already, its crash recorded in its holder's name, another live process's, or no
    process's (an orphan's recovery). Only an open claim ends, and only in its holder's
    name (none for an orphan); every other cell returns False and leaves every row of its
    run exactly as it was [INV-EXE-2]: a pending execution is no orphan, however old its
    other times (its claim time is the column that says it was claimed)."""
    app = manual_app
    now = app.clock.now()
    holder, another = (register(app, role="test", label=label) for label in ("holder", "another"))
    names = {"holder": holder, "another": another, None: None}
    got: dict[tuple[str, str | None], str] = {}
    for state, named in ENDINGS:
        run_id, branch_id = make_run(app)
        (execution_id,) = make_executions(app, run_id, branch_id, None, now - FAR)
        values: dict = {"created_at": now - FAR, "updated_at": now - FAR}
        if state != "pending":
            values.update(claimed_at=now - timedelta(seconds=1), process_id=None if state == "orphaned" else holder)
        if state == "ended":
            values.update(completed_at=now - timedelta(seconds=1), outcome="failure")
        _set(app, schema.executions, execution_id, **values)
        before = run_rows(app, run_id)
        crashed = record_crash(app, execution_id, names[named], "ductwork.ProcessCrash", "recorded in a name")
        if crashed:
            got[state, named] = "crashed" if not _open(app, schema.executions, execution_id) else "still open"
        else:
            got[state, named] = "left" if run_rows(app, run_id) == before else "refused, yet written"
    assert got == ENDINGS


def _process(app, label: str, *, beating: bool, role: str = "test", pid: int | None = None) -> str:
    """A process row: ``beating``, one that heartbeat just now though it registered (and was
    last updated) long ago; else one whose heartbeat is two reaper timeouts old though
    its row was written just now."""
    now, timeout = app.clock.now(), timedelta(seconds=app.config.supervisor.reaper_timeout)
    process_id = register(app, role=role, label=label, pid=pid)
    if beating:
        _set(app, schema.processes, process_id, last_heartbeat_at=now, created_at=now - FAR, updated_at=now - FAR)
    else:
        _set(app, schema.processes, process_id, last_heartbeat_at=now - 2 * timeout, created_at=now, updated_at=now)
    return process_id


def test_the_reaper_measures_a_process_from_its_last_heartbeat(manual_app):
    """A process registered long ago that heartbeat just now is not reaped; one whose
    heartbeat is two reaper timeouts old, though its row was written just now, is, on
    this machine and on a lost host alike (no proof of death there: its heartbeat alone),
    by the supervisors' reaper and by ``reap(force=False)`` alike [INV-EXE-1]."""
    app = manual_app
    beating = _process(app, "beating", beating=True)
    silent, lost = (_process(app, label, beating=False) for label in ("silent", "lost"))
    _set(app, schema.processes, lost, machine_identifier="a-lost-host")
    assert sorted(reap_dead(app, None)) == sorted([silent, lost])
    silent = _process(app, "silent", beating=False)
    assert (reap(app, beating, force=False), reap(app, silent, force=False)) == (False, True)


#: pids no process of this test has (the rows below are only read, never signalled)
NO_SUCH_PIDS = (4_000_001, 4_000_002)


def test_a_live_job_worker_is_one_whose_heartbeat_is_fresh(manual_app):
    """A trigger's count of other live job workers (``hosts.other_job_workers``, which
    decides whether a class of ``__main__`` is refused) counts a worker registered long ago
    that heartbeat just now, and not one whose heartbeat is stale though it registered
    just now."""
    app = manual_app
    beating = _process(app, "beating", beating=True, role="job_worker", pid=NO_SUCH_PIDS[0])
    assert other_job_workers(app) == 1
    assert reap(app, beating, force=True)
    _process(app, "silent", beating=False, role="job_worker", pid=NO_SUCH_PIDS[1])
    assert other_job_workers(app) == 0


def test_another_supervisor_on_this_host_is_one_whose_heartbeat_is_fresh(manual_app):
    """``ductwork start``'s warning of another supervisor on this host
    (``processes.supervisors_on_this_host``) names one registered long ago that heartbeat
    just now, and not one whose heartbeat is stale though it registered just now (both of
    a pid that runs: this test's parent)."""
    app = manual_app
    beating = _process(app, "beating", beating=True, role="supervisor", pid=os.getppid())
    _process(app, "silent", beating=False, role="supervisor", pid=os.getppid())
    assert [row.id for row in supervisors_on_this_host(app)] == [beating]


def test_a_heartbeat_exactly_reaper_timeout_old_is_alive_to_neither_count(manual_app):
    """Both advisory counts judge a heartbeat as the reaper does (it reaps one exactly
    ``reaper_timeout`` old, ``test_each_recovery_threshold_includes_its_instant``): a job
    worker and a supervisor that heartbeat exactly ``reaper_timeout`` ago are neither
    another live job worker nor another supervisor on this host; one microsecond later
    (younger), each is."""
    app = manual_app
    now, timeout = app.clock.now(), timedelta(seconds=app.config.supervisor.reaper_timeout)
    worker = _process(app, "worker", beating=True, role="job_worker", pid=NO_SUCH_PIDS[0])
    supervisor = _process(app, "supervisor", beating=True, role="supervisor", pid=os.getppid())
    for process_id in (worker, supervisor):
        _set(app, schema.processes, process_id, last_heartbeat_at=now - timeout)
    assert (other_job_workers(app), supervisors_on_this_host(app)) == (0, [])
    for process_id in (worker, supervisor):
        _set(app, schema.processes, process_id, last_heartbeat_at=now - timeout + timedelta(microseconds=1))
    assert (other_job_workers(app), [row.id for row in supervisors_on_this_host(app)]) == (1, [supervisor])


def test_a_supervisor_judges_its_childs_lease_from_its_last_heartbeat(manual_app):
    """A supervisor's child (``Supervisor._stale``, which kills a child past its lease) is
    live when it heartbeat just now though it registered long ago, and stale when its
    heartbeat is two reaper timeouts old though it registered just now [INV-EXE-5]."""
    app = manual_app
    supervisor = Supervisor(app, [], role="worker")
    children = {}
    for label, pid in zip(("beating", "silent"), NO_SUCH_PIDS, strict=True):
        _process(app, label, beating=label == "beating", role="job_worker", pid=pid)
        children[label] = Child("job_worker", label, 1, proc=SimpleNamespace(pid=pid), started=time.monotonic() - 3600)
    assert {label: supervisor._stale(child) for label, child in children.items()} == {"beating": False,
                                                                                      "silent": True}


def test_a_supervisor_judges_a_child_stale_only_past_its_threshold_and_never_while_young(manual_app):
    """A child whose last heartbeat is exactly the threshold old (``reaper_timeout`` less half
    the lease margin) is not stale yet; a microsecond older, it is. A child younger than the
    threshold is never stale, whatever rows its pid has (here that stale row, of a process
    before it) [INV-EXE-5]."""
    app = manual_app
    cfg = app.config.supervisor
    threshold = timedelta(seconds=cfg.reaper_timeout - lease_margin(cfg.reaper_timeout, cfg.heartbeat_interval) / 2)
    supervisor = Supervisor(app, [], role="worker")
    process_id = register(app, role="job_worker", label="child", pid=NO_SUCH_PIDS[0])
    child = Child("job_worker", "child", 1, proc=SimpleNamespace(pid=NO_SUCH_PIDS[0]), started=time.monotonic() - 3600)
    now, judged = app.clock.now(), []
    for age in (threshold, threshold + timedelta(microseconds=1)):
        _set(app, schema.processes, process_id, last_heartbeat_at=now - age)
        judged.append(supervisor._stale(child))
    assert judged == [False, True]
    young = Child("job_worker", "young", 1, proc=SimpleNamespace(pid=NO_SUCH_PIDS[0]), started=time.monotonic())
    assert not supervisor._stale(young)


def test_an_idle_worker_waits_for_the_next_eligible_time_or_stamp_to_come(manual_app):
    """An idle worker's wait (``lanes.seconds_to_next_due``): an execution created long
    ago but eligible in an hour is the next due, not one created earlier still and eligible
    in two hours, nor one created just now and eligible a second ago (it is due already);
    a key created long ago whose rate stamp lifts in half an hour, with pending work, comes
    first, not a key written just now whose stamp lifted a second ago [INV-LIM-5]."""
    app = manual_app
    now = app.clock.now()
    run_id, branch_id = make_run(app)
    # (the later one written first and created long before: an order by anything but the
    # eligible time picks it)
    for eligible, other in ((now + timedelta(hours=2), now - FAR), (now + timedelta(hours=1), now - FAR / 2),
                            (now - timedelta(seconds=1), now)):
        (execution_id,) = make_executions(app, run_id, branch_id, None, eligible)
        _set(app, schema.executions, execution_id, created_at=other, updated_at=other)
    assert seconds_to_next_due(app) == 3600
    k = schema.limit_keys
    for key, stamp, other in (("stamped", now + timedelta(minutes=30), now - FAR),
                              ("lifted", now - timedelta(seconds=1), now)):
        make_executions(app, run_id, branch_id, key, now - FAR)  # its pending work, eligible long ago
        with app.begin() as tx:
            tx.execute(k.update().where(k.c.key == key).values(blocked_until=stamp, created_at=other,
                                                               updated_at=other))
    assert seconds_to_next_due(app) == 1800


def test_each_recovery_threshold_includes_its_instant(manual_app):
    """A heartbeat exactly ``reaper_timeout`` old is stale (reaped); a claim exactly three
    reaper timeouts old whose process is gone is swept, its execution and its advancement
    alike; one microsecond younger, neither [INV-EXE-1]."""
    app = manual_app
    now, timeout = app.clock.now(), timedelta(seconds=app.config.supervisor.reaper_timeout)
    at, younger = (register(app, role="test", label=label) for label in ("at", "younger"))
    _set(app, schema.processes, at, last_heartbeat_at=now - timeout)
    _set(app, schema.processes, younger, last_heartbeat_at=now - timeout + timedelta(microseconds=1))
    made = _claims(app, None, {"at": 3 * timeout, "younger": 3 * timeout - timedelta(microseconds=1)},
                   {"at": timedelta(0), "younger": timedelta(0)})
    assert reap_dead(app, None) == [at]
    sweep_orphans(app)
    assert _taken(app, made["at"]) == (True, True, True)
    assert _taken(app, made["younger"]) == (False, False, False)


def test_a_prune_measures_a_run_from_its_finish_time(manual_app):
    """``finished_before=30m``: a run triggered long ago that finished a minute ago stays;
    one that finished two hours ago goes, though its trigger, creation and last update
    (an on_halt hook recorded since, say) are recent; completed and halted alike
    [INV-PRN-1]."""
    app = manual_app
    now = app.clock.now()
    runs = {}
    for status, column in (("completed", "completed_at"), ("halted", "halted_at")):
        for age, other in (("recent", FAR), ("old", timedelta(0))):
            run_id, _ = make_run(app)
            finished = now - (timedelta(minutes=1) if age == "recent" else timedelta(hours=2))
            _set(app, schema.runs, run_id, status=status, **{column: finished}, triggered_at=now - other,
                 created_at=now - other, updated_at=now - other)
            runs[status, age] = run_id
    result = prune(app, timedelta(minutes=30))
    with app.begin() as tx:
        left = set(tx.execute(sa.select(schema.runs.c.id)).scalars())
    assert left == {runs["completed", "recent"], runs["halted", "recent"]}
    assert result.runs == 2


def test_a_prune_keeps_a_run_finished_at_its_cutoff(manual_app):
    """``finished_before=30m``: a completed run that finished exactly 30 minutes ago stays
    (the cutoff is strict), one a microsecond older goes; a dry run counts the same, with
    and without a pipeline filter, and neither counts a run of that pipeline finished just
    now nor one still in progress (triggered long ago) [INV-PRN-1]."""
    app = manual_app
    now, age = app.clock.now(), timedelta(minutes=30)
    older, at_cutoff, recent, live = (make_run(app)[0] for _ in range(4))
    for run_id, finished in ((older, now - age - timedelta(microseconds=1)), (at_cutoff, now - age),
                             (recent, now)):
        _set(app, schema.runs, run_id, status="completed", completed_at=finished, triggered_at=now - FAR,
             created_at=now - FAR, updated_at=finished)
    _set(app, schema.runs, live, triggered_at=now - FAR, created_at=now - FAR, updated_at=now - FAR)
    for pipeline in (None, PIPELINE_CLASS, PIPELINE_CLASS.rpartition(":")[2]):  # (a prune that counted more
        dry = prune(app, age, dry_run=True, pipeline=pipeline)  # would loop on it below: its batches refuse it)
        assert (dry.runs, dry.rows["ductwork_runs"]) == (1, 1), pipeline
    assert prune(app, age, pipeline=PIPELINE_CLASS).runs == 1
    with app.begin() as tx:
        left = set(tx.execute(sa.select(schema.runs.c.id)).scalars())
    assert left == {at_cutoff, recent, live}


def test_a_prune_takes_the_oldest_trigger_first_status_by_status(manual_app):
    """Three completed and three halted runs (the halted ones triggered first), each three
    triggered, finished and last updated in three different orders, none of them their
    ids': a prune of one run per batch deletes the completed runs and then the halted ones
    (one walk of ``ix_run_status_triggered`` per status, in PRUNABLE's order), each by its
    trigger time, oldest first, not by its finish, its last update or its id."""
    app = manual_app
    now = app.clock.now()
    expected: list[str] = []
    for status, column, base in (("completed", "completed_at", 0), ("halted", "halted_at", 20)):
        a, b, c = sorted(make_run(app)[0] for _ in range(3))
        # days ago: triggered c, a, b; finished b, c, a; last updated b, a, c (created when triggered)
        for run_id, triggered, finished, updated in ((a, 29, 25, 21), (b, 28, 27, 22), (c, 30, 26, 20)):
            at = now - timedelta(days=base + triggered)
            _set(app, schema.runs, run_id, status=status, triggered_at=at, created_at=at,
                 **{column: now - timedelta(days=base + finished)}, updated_at=now - timedelta(days=base + updated))
        expected += [c, a, b]
    order: list[str] = []

    def on_batch(runs: int, _rows: dict[str, int]) -> None:
        with app.begin() as tx:
            left = set(tx.execute(sa.select(schema.runs.c.id)).scalars())
        order.extend(run_id for run_id in expected if run_id not in left and run_id not in order)
        assert runs == 1

    result = prune(app, timedelta(days=1), batch_size=1, on_batch=on_batch)
    assert (result.runs, result.batches, order) == (6, 6, expected)


def test_a_key_window_measures_its_holder_from_its_finish_time(manual_app):
    """``key_window="1h"``: the key of a run triggered long ago that finished a minute ago
    stays with it; the key of a run that finished two hours ago, though triggered and
    updated just now, goes to a new run [INV-TRG-1]."""
    app = manual_app
    now = app.clock.now()
    recent, old = Unkeyed.trigger(1, key="recent"), Unkeyed.trigger(2, key="old")
    _set(app, schema.runs, recent.id, status="completed", completed_at=now - timedelta(minutes=1),
         triggered_at=now - FAR, created_at=now - FAR, updated_at=now - FAR)
    _set(app, schema.runs, old.id, status="completed", completed_at=now - timedelta(hours=2),
         triggered_at=now, created_at=now, updated_at=now)
    assert Unkeyed.trigger(3, key="recent", key_window="1h").id == recent.id
    assert Unkeyed.trigger(4, key="old", key_window="1h").id != old.id


def test_a_key_window_releases_a_key_finished_exactly_the_window_before(manual_app):
    """``key_window="1h"``: a run completed, or halted, exactly an hour before the trigger
    gives its key to a new run: the decision and the release's fence both count the
    window's own instant [INV-TRG-1] (a fence that did not would refuse the release the
    decision made, and the trigger would raise)."""
    app = manual_app
    now = app.clock.now()
    completed, halted = Unkeyed.trigger(1, key="completed"), Unkeyed.trigger(2, key="halted")
    _set(app, schema.runs, completed.id, status="completed", completed_at=now - timedelta(hours=1))
    _set(app, schema.runs, halted.id, status="halted", halted_at=now - timedelta(hours=1))
    assert Unkeyed.trigger(3, key="completed", key_window="1h").id != completed.id
    assert Unkeyed.trigger(4, key="halted", key_window="1h").id != halted.id


def test_a_claim_measures_an_execution_from_its_eligible_time(manual_app):
    """An execution created long ago but eligible only in an hour (a retry's back-off) is
    not claimed; one created just now and eligible since a second ago is [INV-CLK-1]."""
    app = manual_app
    now = app.clock.now()
    run_id, branch_id = make_run(app)
    (later,) = make_executions(app, run_id, branch_id, None, now + timedelta(hours=1))
    (due,) = make_executions(app, run_id, branch_id, None, now - timedelta(seconds=1))
    _set(app, schema.executions, later, created_at=now - FAR, updated_at=now - FAR)
    _set(app, schema.executions, due, created_at=now, updated_at=now)
    process_id = register(app, role="test", label="claimer")
    assert [c.execution_id for c in claim_batch(app, process_id, 2)] == [due]  # (a batch with room for both)
    assert claim(app, process_id) is None


def test_a_hook_claim_measures_a_hook_from_its_eligible_time(manual_app):
    """An on_halt hook owed long ago but backed off for an hour is not claimed; one owed
    just now and eligible since a second ago is [INV-HLT-2]."""
    app = manual_app
    now = app.clock.now()
    hooks = {}
    for name, eligible, other in (("later", now + timedelta(hours=1), now - FAR),
                                  ("due", now - timedelta(seconds=1), now)):
        run_id, _ = make_run(app)
        hooks[name] = new_id()
        with app.begin() as tx:
            tx.execute(schema.halt_hooks.insert().values(
                id=hooks[name], run_id=run_id, klass="tests.factories:Noop", status="pending", eligible_at=eligible,
                retry_count=0, crash_count=0, created_at=other, updated_at=other))
    process_id = register(app, role="test", label="hooks")
    assert claim_hook(app, process_id).hook_id == hooks["due"]
    assert claim_hook(app, process_id) is None


def test_an_idle_worker_waits_for_no_stamp_without_work_nor_one_that_lifts_now(manual_app):
    """An idle worker's wait (``lanes.seconds_to_next_due``) counts a key's rate stamp only
    while it is still to come and the key has pending work: a key stamped until ten
    minutes from now whose work has all run, and a key with pending work whose stamp lifts
    at this very microsecond (a poll may claim it now), leave nothing to wait for (None)
    [INV-LIM-5]; nor does an execution delayed five minutes in a key this process has no
    config for (the polling interval finds it): each lane's probe reads its own lane."""
    app = manual_app
    now = app.clock.now()
    run_id, branch_id = make_run(app)
    make_executions(app, run_id, branch_id, "lifting", now - FAR)  # its pending work, eligible long ago
    make_executions(app, run_id, branch_id, "unconfigured", now + timedelta(minutes=5))
    k = schema.limit_keys
    with app.begin() as tx:
        tx.execute(k.insert().values(key="drained", blocked_until=now + timedelta(minutes=10), created_at=now,
                                     updated_at=now))
        tx.execute(k.update().where(k.c.key == "lifting").values(blocked_until=now))
    assert seconds_to_next_due(app) is None


def test_the_next_hook_time_is_the_earliest_hook_backed_off_past_now(manual_app):
    """``next_hook_at`` is when the earliest pending hook backed off past now becomes due:
    a hook due long ago and one due exactly now are claimable already and count for
    nothing (None while only they wait); once a hook backed off for an hour is owed too,
    its time is the answer. A running hook and a failed one wait for no time, whatever their
    ``eligible_at`` (here half an hour ahead, as after the database clock stepped back): they
    leave the answer as it was [INV-HLT-2]."""
    app = manual_app
    now = app.clock.now()

    def owe(eligible, status="pending") -> None:
        run_id, _ = make_run(app)
        with app.begin() as tx:
            tx.execute(schema.halt_hooks.insert().values(
                id=new_id(), run_id=run_id, klass="tests.factories:Noop", status=status, eligible_at=eligible,
                retry_count=0, crash_count=0, created_at=now - FAR, updated_at=now - FAR))

    def next_at():
        with app.begin() as tx:
            assert tx.now == now
            return next_hook_at(tx)

    owe(now - FAR)
    owe(now)
    assert next_at() is None
    owe(now + timedelta(hours=1))
    assert next_at() == now + timedelta(hours=1)
    owe(now + timedelta(minutes=30), "running")
    owe(now + timedelta(minutes=30), "failed")
    assert next_at() == now + timedelta(hours=1)


def test_the_hook_claimed_first_is_the_one_due_longest(manual_app):
    """Of two due on_halt hooks, the one eligible earliest is claimed first, though the other
    has the smaller id and was created and updated long before (a hook backed off and due
    again just now): the claim orders by eligible time, not by id or any other time [INV-HLT-2]."""
    app = manual_app
    now = app.clock.now()
    hooks = {"again": new_id(), "longest": new_id()}  # ids rise: "again" has the smaller
    for name, eligible, stamp in (("again", now - timedelta(seconds=1), now - FAR),
                                  ("longest", now - timedelta(hours=1), now)):
        run_id, _ = make_run(app)
        with app.begin() as tx:
            tx.execute(schema.halt_hooks.insert().values(
                id=hooks[name], run_id=run_id, klass="tests.factories:Noop", status="pending", eligible_at=eligible,
                retry_count=0, crash_count=0, created_at=stamp, updated_at=stamp))
    process_id = register(app, role="test", label="hooks")
    assert [claim_hook(app, process_id).hook_id for _ in hooks] == [hooks["longest"], hooks["again"]]
