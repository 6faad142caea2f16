"""Waking idle workers when work may have become claimable, instead of at the next poll.

    >>> seen = app.wakeup.generation
    >>> if not unit_of_work():
    ...     app.wakeup.wait(seen, timeout=polling_timeout)

A transaction that creates an execution (a new step, a retry) or completes one
(which frees a concurrency slot) calls :meth:`ductwork.app.Tx.wake`; after it
commits, one idle thread of this process waiting on :attr:`App.wakeup` (job workers)
and every one waiting on :attr:`App.advancer_wakeup` (advancers) wake and poll. A
worker whose poll claimed something wakes one more (``fleet.worker.Worker._claim``):
work arriving wakes threads one at a time, as many as find some, never every idle
thread of the fleet for one execution (with a key saturated, each of them would scan
the lanes and find nothing). A
transaction that only gives advancers work (a success leaving its step
``advancing``, its slot handed on or never keyed) calls
:meth:`ductwork.app.Tx.wake_advancers` and wakes advancers alone: a job worker
woken by it would find nothing new, and with a key saturated every completion
would make every idle worker thread of the fleet scan the lanes for nothing.
On PostgreSQL the same transaction also sends ``NOTIFY ductwork_wakeup`` (job
workers) or ``NOTIFY ductwork_advance`` (delivered only if it commits,
coalesced per transaction), and each fleet process runs a :class:`PgListener`
that turns the notification into a local wakeup, so a slot freed on one host is
claimed promptly on another. MySQL and SQLite have no such channel: other
processes find the work at their next poll.

A wakeup is only a hint: it never grants anything, the claim re-checks
everything under its locks, and a lost wakeup costs one polling interval.
Generations make it race-free: a waiter passes the generation it saw *before*
doing its last unit of work, so a wakeup during that work is not missed.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from sqlalchemy.engine import Engine

log = logging.getLogger("ductwork.wakeup")

#: the channel of each kind of wakeup (``Tx.wake`` sends both, ``Tx.wake_advancers`` one)
WORKERS = "ductwork_wakeup"
ADVANCERS = "ductwork_advance"


class Wakeup:
    """An in-process wakeup with a generation counter. Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        #: how many notifies so far (moved under the condition, read without it)
        self.generation = 0

    def notify(self, n: int | None = None) -> None:
        """Wake every waiter, or only ``n`` of them (the others see the new generation
        when their own wait ends)."""
        with self._cond:
            self.generation += 1
            if n is None:
                self._cond.notify_all()
            else:
                self._cond.notify(n)

    def wait(self, seen: int, timeout: float) -> bool:
        """Wait until the generation moves past ``seen`` or ``timeout`` s; True if woken."""
        with self._cond:
            return self._cond.wait_for(lambda: self.generation != seen, timeout)


class Listened(Protocol):
    """What :class:`PgListener` needs of its app (a ``Database``, which holds a
    :class:`Wakeup` and so is defined above this module)."""

    engine: Engine
    wakeup: Wakeup
    advancer_wakeup: Wakeup


class PgListener(threading.Thread):
    """LISTEN on PostgreSQL and relay each notification to ``app.wakeup`` (fleet processes)."""

    def __init__(self, app: Listened, stop: threading.Event):
        super().__init__(name="ductwork.pg-listener", daemon=True)
        self.app, self.stop = app, stop

    def run(self) -> None:
        import psycopg

        url = self.app.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        while not self.stop.is_set():
            try:
                with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f"LISTEN {WORKERS}")
                    conn.execute(f"LISTEN {ADVANCERS}")
                    while not self.stop.is_set():
                        for note in conn.notifies(timeout=1.0, stop_after=1):
                            if note.channel == ADVANCERS:
                                self.app.advancer_wakeup.notify()
                            else:  # one idle worker looks; one that finds work wakes the next
                                self.app.wakeup.notify(1)
            except Exception:  # the listener is a hint; polling still works
                log.warning("wakeup listener lost its connection; reconnecting", exc_info=True)
                self.stop.wait(1.0)
