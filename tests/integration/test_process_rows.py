"""Process rows: a registration recovers its OS process's earlier incarnation and nobody
else, a heartbeat stamps its own row, and who counts as another live process.

A row names its OS process by machine and pid; with its label (the role and slot of a
runner), a row already there for the (machine, pid, label) being registered is a dead
incarnation whose pid the OS reused: ``processes.register`` reaps it at once, and only it
(not a row of the same label on another pid or another host, nor one of this pid under
another label, each of which may be a live process's). ``processes.heartbeat`` writes the
database's now into its own row and no other (a heartbeat stamping other rows would keep
the dead alive to the reaper), and says False once its row was reaped. The advisory
predicates, ``ductwork start``'s warning of another supervisor on this host
(``processes.supervisors_on_this_host``) and a trigger's count of other job workers
(``hosts.other_job_workers``), each take the rows of their role only, and leave out this
OS process (same machine and pid); the warning's only rows of this machine. Their time
terms are tabled in test_time_predicates.py.

Found missing by the generated mutants of ``fleet/processes.py`` and ``db/hosts.py``
(``python -m tests.guard_mutation``): each test below kills mutants the tier let through.

Checks: INV-EXE-1 (a dead incarnation's claims are recovered when its pid is registered
again, and a live process's never are), INV-CLK-1 (a heartbeat is the database's time).
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import sqlalchemy as sa

from ductwork.db import schema
from ductwork.db.hosts import machine_identifier, other_job_workers
from ductwork.fleet.processes import heartbeat, register, same_host_warning, supervisors_on_this_host
from ductwork.fleet.reaper import reap
from tests.factories import make_executions, make_run

#: pids no process of this test has (the rows below are only read or reaped, never signalled)
NO_SUCH_PIDS = (4_000_001, 4_000_002, 4_000_003)
ANOTHER_HOST = "another-host/0f0f"
_p, _e = schema.processes, schema.executions


def _set(app, process_id, **values) -> None:
    with app.begin() as tx:
        assert tx.execute(_p.update().where(_p.c.id == process_id).values(**values)).rowcount == 1


def _holding_a_claim(app, process_id) -> str:
    """An execution claimed just now by ``process_id``: its id."""
    run_id, branch_id = make_run(app)
    with app.begin(readonly=True) as tx:
        now = tx.now
    (execution_id,) = make_executions(app, run_id, branch_id, None, now)
    with app.begin() as tx:
        tx.execute(_e.update().where(_e.c.id == execution_id).values(claimed_at=tx.now, process_id=process_id))
    return execution_id


def _rows(app) -> set[str]:
    with app.begin(readonly=True) as tx:
        return set(tx.execute(sa.select(_p.c.id)).scalars())


def _outcome(app, execution_id) -> str | None:
    """The execution's outcome, None while it is open."""
    with app.begin(readonly=True) as tx:
        return tx.execute(sa.select(_e.c.outcome).where(_e.c.id == execution_id)).scalar_one()


def test_registering_a_pid_and_label_again_reaps_only_that_pids_earlier_incarnation(app):
    """``w`` of pid P registered again: the earlier ``w`` of P on this machine is a dead
    incarnation (its pid reused), reaped before the new row is written, its claim crashed at
    once though its heartbeat is fresh. The rows that share only a part of its name are
    other processes, maybe alive: ``w`` of another pid here, ``w`` of P on another host,
    ``v`` of P here; their rows and claims stay [INV-EXE-1]."""
    pid, other_pid, _ = NO_SUCH_PIDS
    others = {"w of another pid": register(app, role="job_worker", label="w", pid=other_pid),
              "w of P on another host": register(app, role="job_worker", label="w@there", pid=pid),
              "v of P": register(app, role="job_worker", label="v", pid=pid)}
    _set(app, others["w of P on another host"], label="w", machine_identifier=ANOTHER_HOST)
    claims = {name: _holding_a_claim(app, row) for name, row in others.items()}
    earlier = register(app, role="job_worker", label="w", pid=pid)
    assert _rows(app) == {*others.values(), earlier}  # no one of them was taken for w's earlier incarnation
    dead_claim = _holding_a_claim(app, earlier)
    again = register(app, role="job_worker", label="w", pid=pid)
    assert _rows(app) == {*others.values(), again}
    assert _outcome(app, dead_claim) == "process_crashed"
    assert {name: _outcome(app, execution) for name, execution in claims.items()} == dict.fromkeys(claims)


def test_a_heartbeat_stamps_its_own_row_with_the_database_clock_and_no_other(manual_app):
    """Each heartbeat writes the database's now (the ManualClock's, moved on) into its own
    row's heartbeat and update times and leaves the other rows as they were; its refusals
    are added to the fleet-wide counts; a reaped row's heartbeat writes nothing and says
    False [INV-CLK-1]."""
    app = manual_app
    beating, silent = (register(app, role="job_worker", label=label) for label in ("beating", "silent"))
    registered = app.clock.now()

    def stamps() -> dict[str, tuple]:
        with app.begin(readonly=True) as tx:
            return {row.id: (row.last_heartbeat_at, row.updated_at)
                    for row in tx.execute(sa.select(_p.c.id, _p.c.last_heartbeat_at, _p.c.updated_at))}

    assert stamps() == {beating: (registered, registered), silent: (registered, registered)}
    app.clock.advance(timedelta(minutes=1))
    assert heartbeat(app, beating, {("k", "rate"): 2})
    app.clock.advance(timedelta(minutes=1))
    assert heartbeat(app, beating, {("k", "rate"): 1, ("k", "concurrency"): 4})
    now = app.clock.now()
    assert stamps() == {beating: (now, now), silent: (registered, registered)}
    k = schema.key_refusals
    with app.begin(readonly=True) as tx:
        assert dict(tx.execute(sa.select(k.c.reason, k.c.refusals).where(k.c.key == "k")).all()) == {
            "rate": 3, "concurrency": 4}
    assert reap(app, silent, force=True)
    assert not heartbeat(app, silent)
    assert stamps() == {beating: (now, now)}


def test_another_supervisor_on_this_host_is_a_live_supervisors_row_of_this_machine_not_this_process(app):
    """``ductwork start`` warns of a supervisor row with a fresh heartbeat, of this machine,
    of a pid that runs and is not its own: not of a job worker of that pid, nor of a
    supervisor of that pid on another host, nor of this process's own row, nor of one whose
    process exited (its heartbeat still fresh), nor of one whose heartbeat is stale. (Was
    test_cli.py's ``test_only_live_supervisors_on_this_host_are_found``: here the guard
    selection of ``fleet/processes.py`` runs it.)"""
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    alive = os.getppid()
    live = register(app, role="supervisor", label="live", pid=alive)
    register(app, role="supervisor", label="mine", pid=os.getpid())
    register(app, role="supervisor", label="exited", pid=exited.pid)
    register(app, role="job_worker", label="live.worker.0", pid=alive)
    stale = register(app, role="supervisor", label="stale", pid=alive)
    elsewhere = register(app, role="supervisor", label="elsewhere", pid=alive)
    with app.begin() as tx:
        old = tx.now - timedelta(seconds=app.config.supervisor.reaper_timeout + 1)
        tx.execute(_p.update().where(_p.c.id == stale).values(last_heartbeat_at=old))
    _set(app, elsewhere, machine_identifier=ANOTHER_HOST)
    (found,) = supervisors_on_this_host(app)
    assert (found.id, found.pid, found.machine_identifier) == (live, alive, machine_identifier())
    warning = same_host_warning(found)
    assert f"pid {alive}, label 'live'" in warning
    assert "share the work" in warning


def test_other_job_workers_are_the_job_worker_rows_of_other_os_processes(app):
    """A trigger's count of other live job workers counts the job worker rows of another
    pid on this machine and those of this pid on another host (another OS process there),
    and not a supervisor's row nor this process's own job worker row."""
    for label, pid in zip(("here-1", "here-2"), NO_SUCH_PIDS, strict=False):
        register(app, role="job_worker", label=label, pid=pid)
    for label in ("there-1", "there-2"):
        _set(app, register(app, role="job_worker", label=label, pid=os.getpid()), machine_identifier=ANOTHER_HOST)
    register(app, role="supervisor", label="supervisor", pid=NO_SUCH_PIDS[2])
    register(app, role="job_worker", label="own")
    assert other_job_workers(app) == 4
