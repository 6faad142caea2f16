"""Test helpers: run the fleet's work in this process until every run settles.

    >>> run = Orders.trigger(7)
    >>> ductwork.testing.drain(app, timeout=30)
    >>> run.refresh().status
    'completed'

:func:`drain` alternates an advancer and a worker in the calling thread until
every run is completed, halted or dampened and every ``on_halt`` hook owed has its
outcome (the worker runs due hooks). When nothing is runnable but work is
waiting on time (``delay=``, retry or crash back-off, a rate limit's next token),
it waits that time out: with a :class:`~ductwork.db.clock.ManualClock` it moves the
clock to the next eligible moment; with ``skip_delays=True`` it moves an
:class:`~ductwork.db.clock.OffsetClock` past delays and back-offs (never past a rate
limit's wait, which it sleeps through); otherwise it waits for the clock to get
there. Raises :class:`~ductwork.errors.DrainTimeout` at the deadline, naming each
unsettled run and what it waits for (:func:`waiting_for`). This and the pytest
plugin (``ductwork.pytest_plugin``) are the public test helpers.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ductwork.db import schema
from ductwork.db.clock import ManualClock, OffsetClock
from ductwork.errors import ConfigError, DrainTimeout
from ductwork.fleet.processes import heartbeat
from ductwork.fleet.worker import Worker
from ductwork.pipelines.advance import Advancer
from ductwork.pipelines.hooks import next_hook_at, open_hooks

if TYPE_CHECKING:
    from ductwork.app import App, Tx

__all__ = ["drain", "waiting_for"]

#: runs (and branches per run) that a DrainTimeout message describes, at most
DESCRIBED = 20
_ACTIVE = ("in_progress", "advancing", "dampened")


def _unsettled(app: App) -> bool:
    """A run in progress, or an on_halt hook owed without its outcome yet."""
    with app.begin(readonly=True) as tx:
        return tx.execute(sa.select(schema.runs.c.id).where(schema.runs.c.status == "in_progress")
                          .limit(1)).first() is not None or open_hooks(tx)


def _next_wake(app: App) -> tuple[datetime | None, datetime]:
    """The next moment something waiting on time may run: a delayed or backed-off execution
    becoming eligible, or a rate-blocked key's next token (the conformance tests' drive)."""
    eligible, blocked, now = _wake_moments(app)
    moments = [m for m in (eligible, blocked) if m is not None]
    return (min(moments) if moments else None), now


def _wake_moments(app: App) -> tuple[datetime | None, datetime | None, datetime]:
    """When the next delayed or backed-off execution becomes eligible, when the next
    rate-blocked key gets a token (None: nothing waits so), and the clock's reading."""
    e, k = schema.executions, schema.limit_keys
    with app.begin(readonly=True) as tx:
        now = tx.now
        eligible = tx.execute(sa.select(sa.func.min(e.c.eligible_at))
                              .where(e.c.claimed_at.is_(None), e.c.eligible_at > now)).scalar()
        blocked = tx.execute(sa.select(sa.func.min(k.c.blocked_until)).where(k.c.blocked_until > now)).scalar()
        hook = next_hook_at(tx)
    if hook is not None and (eligible is None or hook < eligible):
        eligible = hook  # a backed-off on_halt hook waits like an execution
    return eligible, blocked, now


def drain(app: App, timeout: float = 30.0, *, skip_delays: bool = False) -> None:
    """Do every run's work in this thread until all are completed, halted or dampened.

    ``skip_delays=True``: a retry's ``retry_delay``, a crash back-off and a transition's
    ``delay=`` are not waited for: the app's clock, an :class:`~ductwork.db.clock.OffsetClock`
    (the pytest plugin's ``ductwork_app`` has one) or a ``ManualClock``, is moved to the
    moment the work becomes eligible, so a failure path runs at once. Limits still hold:
    concurrency is never skipped and a rate limit's next token is waited for in real time
    (an OffsetClock moves with real time). Raises :class:`ConfigError` when the clock
    cannot be moved, and :class:`DrainTimeout` after ``timeout`` seconds with runs
    still in progress, saying what each waits for.
    """
    if skip_delays and not isinstance(app.clock, (ManualClock, OffsetClock)):
        raise ConfigError("clock", app.clock, "drain(skip_delays=True) needs a clock it can move: "
                          "connect(..., clock=ductwork.db.clock.OffsetClock()) or a ManualClock")
    deadline = time.monotonic() + timeout
    worker, advancer = Worker(app, hand_off=lambda: app.config.job_worker.hand_off), Advancer(app)
    beat_every = app.config.supervisor.heartbeat_interval
    next_beat = time.monotonic() + beat_every
    while True:
        next_beat = _heartbeat_when_due(app, next_beat, beat_every)
        progressed = _advance_and_work(advancer, worker, deadline)
        if time.monotonic() > deadline:
            raise DrainTimeout(f"drain: runs still in progress after {timeout} s:\n"
                               + "\n".join(f"- {line}" for line in waiting_for(app)))
        if progressed:
            continue
        if not _unsettled(app):
            return
        _wait_for_time(app, skip_delays, deadline)


def _heartbeat_when_due(app: App, next_beat: float, beat_every: float) -> float:
    """Beat this process's heartbeat once ``next_beat`` has passed (a live fleet on this
    database must not reap us); returns when the next beat is due."""
    if time.monotonic() < next_beat:
        return next_beat
    if not heartbeat(app, app.process_id()):
        app.forget_process()
    return time.monotonic() + beat_every


def _advance_and_work(advancer: Advancer, worker: Worker, deadline: float) -> bool:
    """Advance until the advancer is idle (or the deadline passes), then one worker pass;
    whether either did anything."""
    progressed = False
    while advancer.run_once() != "idle":
        progressed = True
        if time.monotonic() > deadline:
            break
    if worker.run_once() is not None:
        progressed = True
    return progressed


def _wait_for_time(app: App, skip_delays: bool, deadline: float) -> None:
    """Nothing is runnable and a run is unsettled: wait for the next moment something may
    run, by moving a ManualClock there, by skipping an OffsetClock past a delay or back-off
    (``skip_delays``; never past a rate limit's wait), or by sleeping (at most until the
    deadline)."""
    eligible, blocked, now = _wake_moments(app)
    waits = [m for m in (eligible, blocked) if m is not None]
    if not waits:
        time.sleep(0.005)  # waiting on work another process holds (its completion or reap)
    elif isinstance(app.clock, ManualClock):
        app.clock.set(min(waits))
    elif skip_delays and isinstance(app.clock, OffsetClock) and eligible is not None \
            and (blocked is None or eligible <= blocked):
        app.clock.skip_to(eligible, now)  # a delay or back-off, never a rate limit's wait
    else:
        time.sleep(min((min(waits) - now).total_seconds(), max(0.0, deadline - time.monotonic())))


# --------------------------------------------------------------------------- what a run waits for


def waiting_for(app: App) -> list[str]:
    """One line per run still in progress (oldest first, at most :data:`DESCRIBED`): its id,
    pipeline and status, and what each of its active branches waits for.

    Read from the tables in one read-only transaction, as ``ductwork status`` would: a
    retry at a time (and the error that caused it), a ``delay=``, a limit key's rate or
    concurrency, a step queued that no worker claimed, a step running, a succeeded step
    waiting for an advancer, an expand part-way through its children, a dampened branch
    waiting for ``run.resume()``.
    """
    r, b = schema.runs, schema.branches
    with app.begin(readonly=True) as tx:
        runs = tx.execute(sa.select(r.c.id, r.c.pipeline_klass, r.c.status)
                          .where(r.c.status == "in_progress")
                          .order_by(r.c.triggered_at, r.c.id).limit(DESCRIBED + 1)).all()
        lines = []
        for run in runs[:DESCRIBED]:
            branches = tx.execute(
                sa.select(b.c.id, b.c.status, b.c.claimed_at, b.c.fanout_cursor, b.c.fanout_width)
                .where(b.c.run_id == run.id, b.c.status.in_(_ACTIVE))
                .order_by(b.c.started_at, b.c.id).limit(DESCRIBED + 1)).all()
            waits = [f"branch {branch.id}: {_branch_waits(app, tx, branch)}" for branch in branches[:DESCRIBED]]
            if len(branches) > DESCRIBED:
                waits.append(f"more than {DESCRIBED} active branches")
            lines.append(f"run {run.id} ({run.pipeline_klass}) {run.status}: "
                         + ("; ".join(waits) if waits else "no active branch left (its status is being resolved)"))
        if len(runs) > DESCRIBED:
            lines.append(f"and more runs in progress (only the {DESCRIBED} oldest are shown)")
    return lines


def _branch_waits(app: App, tx: Tx, branch: sa.Row[tuple[str, str, datetime | None, int | None, int | None]]
                  ) -> str:
    s = schema.steps
    step = tx.execute(
        sa.select(s.c.id, s.c.node, s.c.status).where(s.c.branch_id == branch.id)
        .order_by(s.c.started_at.desc(), s.c.id.desc()).limit(1)
    ).first()
    node = step.node if step is not None else "?"
    if branch.status == "dampened":
        return f"dampened after {node}, waiting for run.resume()"
    if branch.status == "advancing":
        return (f"held by an advancer since {branch.claimed_at} (at {node}), "
                "waiting for it to finish or for the reaper")
    if branch.fanout_cursor is not None and branch.fanout_width is not None \
            and branch.fanout_cursor < branch.fanout_width:
        return (f"expand after {node} in progress: {branch.fanout_cursor} of {branch.fanout_width} "
                "children created")
    if step is None:  # pragma: no cover  every branch is created with its first step in one transaction
        return "no step yet"
    if step.status == "advancing":
        return f"step {node} succeeded, waiting for an advancer"
    if step.status == "failed":
        return f"step {node} failed for good, waiting for an advancer to halt the branch"
    if step.status != "in_progress":  # pragma: no cover  defensive: completed only in the fence moving its branch
        return f"step {node} {step.status}, waiting for an advancer"
    return f"step {node} " + _step_waits(app, tx, step.id)


def _step_waits(app: App, tx: Tx, step_id: str) -> str:
    e = schema.executions
    executions = tx.execute(
        sa.select(e.c.limit_key, e.c.eligible_at, e.c.claimed_at, e.c.process_id, e.c.completed_at,
                  e.c.outcome, e.c.error_klass, e.c.error_message, e.c.retry_count, e.c.crash_count)
        .where(e.c.step_id == step_id).order_by(e.c.created_at, e.c.id)
    ).all()
    open_ = [x for x in executions if x.completed_at is None]
    ended = [x for x in executions if x.completed_at is not None]
    if not open_:  # pragma: no cover  an execution ends in the transaction that re-runs it or ends its step
        return "has no open execution"
    current = open_[-1]
    attempt = sum(1 for x in executions if x.claimed_at is not None)
    if current.claimed_at is not None:
        return f"running since {current.claimed_at} (attempt {attempt}, process {current.process_id})"
    now = tx.now
    if current.eligible_at > now:
        return _delay_waits(current, ended[-1] if ended else None)
    if current.limit_key is None:
        return f"queued since {current.eligible_at}, not claimed by any worker"
    return _key_waits(app, tx, current.limit_key, current.eligible_at)


def _delay_waits(current: sa.Row[tuple[object, ...]], last: sa.Row[tuple[object, ...]] | None) -> str:
    """What an open execution not yet eligible waits for, after the ``last`` one that ended
    (None: its first attempt): a ``delay=``, a crash back-off or a retry."""
    if last is None:
        return f"delayed (delay=) until {current.eligible_at}"
    if last.outcome == "process_crashed":
        return f"re-run {current.crash_count} after a crash ({last.error_klass}) at {current.eligible_at}"
    return (f"retry {current.retry_count} at {current.eligible_at} after {last.outcome}: "
            f"{last.error_klass}: {last.error_message}")


def _key_waits(app: App, tx: Tx, key: str, since: datetime) -> str:
    """What an eligible, unclaimed execution on limit key ``key`` waits for: the key's rate,
    its concurrency, or a worker."""
    e, k = schema.executions, schema.limit_keys
    header = tx.execute(sa.select(k.c.blocked_until).where(k.c.key == key)).first()
    if header is not None and header.blocked_until is not None and header.blocked_until > tx.now:
        return f"waits for limit key {key!r}: rate-blocked until {header.blocked_until}"
    in_flight = tx.execute(sa.select(sa.func.count()).where(e.c.inflight_key == key)).scalar_one()
    entry = app.config.entry_for(key)
    if entry is not None and entry.concurrency is not None and in_flight >= entry.concurrency:
        return f"waits for limit key {key!r}: concurrency {in_flight} of {entry.concurrency} in flight"
    return f"queued on limit key {key!r} since {since}, not claimed by any worker"
