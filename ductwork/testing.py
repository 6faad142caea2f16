"""Test helpers: run the fleet's work in this process until every run settles.

    >>> run = Orders.trigger(7)
    >>> ductwork.testing.drain(app, timeout=30)
    >>> run.refresh().status
    'completed'

:func:`drain` alternates an advancer and a worker in the calling thread until
every run is completed, halted or dampened. When nothing is runnable but work is
waiting on time (``delay=``, retry or crash back-off), it waits that time out:
with a :class:`~ductwork.clock.ManualClock` it moves the clock to the next
eligible moment, otherwise it waits for the database clock to get there. Raises
:class:`~ductwork.errors.DrainTimeout` naming the unsettled runs at the
deadline. This is the only public test helper.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ductwork import schema
from ductwork.advance import Advancer
from ductwork.clock import ManualClock
from ductwork.errors import DrainTimeout
from ductwork.execute import Worker
from ductwork.processes import heartbeat

if TYPE_CHECKING:
    from ductwork.app import App

__all__ = ["drain"]


def _unsettled(app: App) -> list[str]:
    with app.begin(readonly=True) as tx:
        return list(tx.execute(
            sa.select(schema.runs.c.id).where(schema.runs.c.status == "in_progress").limit(20)
        ).scalars())


def _next_wake(app: App) -> tuple[datetime | None, datetime]:
    """The next moment something waiting on time may run: a delayed or backed-off execution
    becoming eligible, or a rate-blocked key's next token."""
    e, k = schema.executions, schema.limit_keys
    with app.begin(readonly=True) as tx:
        now = tx.now
        at = tx.execute(sa.select(sa.func.min(e.c.eligible_at))
                        .where(e.c.claimed_at.is_(None), e.c.eligible_at > now)).scalar()
        blocked = tx.execute(sa.select(sa.func.min(k.c.blocked_until)).where(k.c.blocked_until > now)).scalar()
    moments = [m for m in (at, blocked) if m is not None]
    return (min(moments) if moments else None), now


def drain(app: App, timeout: float = 30.0) -> None:
    """Do every run's work in this thread until all are completed, halted or dampened."""
    deadline = time.monotonic() + timeout
    worker, advancer = Worker(app, hand_off=lambda: app.config.job_worker.hand_off), Advancer(app)
    beat_every = app.config.supervisor.heartbeat_interval
    next_beat = time.monotonic() + beat_every
    while True:
        if time.monotonic() >= next_beat:  # a live fleet on this database must not reap us
            next_beat = time.monotonic() + beat_every
            if not heartbeat(app, app.process_id()):
                app.forget_process()
        progressed = False
        while advancer.run_once() != "idle":
            progressed = True
            if time.monotonic() > deadline:
                break
        if worker.run_once() is not None:
            progressed = True
        if time.monotonic() > deadline:
            raise DrainTimeout(f"drain: runs still in progress after {timeout} s: {_unsettled(app)}")
        if progressed:
            continue
        if not _unsettled(app):
            return
        wake, now = _next_wake(app)
        if wake is None:
            time.sleep(0.005)  # waiting on work another process holds (its completion or reap)
        elif isinstance(app.clock, ManualClock):
            app.clock.set(wake)
        else:
            time.sleep(min((wake - now).total_seconds(), max(0.0, deadline - time.monotonic())))
