"""How a worker thread batches, as pure rules: how many executions a claim takes, how
many of a key the thread runs in a row, which successes wait for a group commit, when
that group is recorded, and whether a first claim is topped up.

    >>> pace = Pace(window_s=0.05, size=16)
    >>> pace.note(0.02, 0.0)        # a 20 ms body that mostly waited: two fit in 50 ms
    2

No database and no threads: the worker (``fleet/worker.py``) asks these with what it
knows, and ``tests/unit/test_batching.py`` checks them alone. What a batch claims is
decided by ``limits.claims.claim_batch`` under the keys' locks [INV-LIM-1, INV-LIM-6];
nothing here can admit more than a claim does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ductwork.limit_entries import LimitEntry
    from ductwork.limits.executions import Claimed


def batch_for(pace_s: float, window_s: float, size: int) -> int:
    """How many executions a batch may take: as many as run in ``window_s`` at ``pace_s``
    seconds each, at least one and at most ``size``.

    >>> batch_for(0.0001, 0.05, 16), batch_for(0.02, 0.05, 16), batch_for(3.0, 0.05, 16)
    (16, 2, 1)
    """
    if pace_s * size <= window_s:  # (also a zero pace: no division by it, nor an overflow)
        return size
    return max(1, int(window_s / pace_s))


@dataclass
class Pace:
    """A thread's recent bodies: their pace (seconds each) and how much of their time was
    this thread's own CPU (0 to 1), each a running average of the last and the new one;
    None until a body has been timed."""

    window_s: float
    size: int
    pace_s: float | None = None
    cpu_share: float | None = None

    def note(self, seconds: float, cpu_s: float) -> int:
        """Note a body that took ``seconds``, ``cpu_s`` of them this thread's CPU (1 for a
        body that did nothing); returns the next batch (:func:`batch_for`)."""
        self.pace_s = seconds if self.pace_s is None else (self.pace_s + seconds) / 2
        share = min(1.0, cpu_s / seconds) if seconds > 0 else 1.0
        self.cpu_share = share if self.cpu_share is None else (self.cpu_share + share) / 2
        return batch_for(self.pace_s, self.window_s, self.size)


def in_a_row(batch: int, entry: LimitEntry | None, *, cpu_share: float | None, threads: int,
             processes: int) -> int:
    """How many executions of a key one thread of a process of ``threads`` may run one
    after the other (a keyed batch of its own, recorded by one group commit): ``batch``
    (as many as an unkeyed batch at the recent pace, so none waits behind its siblings
    longer than ``batch_window``), but no more than the thread's share of the key's
    ``concurrency`` (at least one), and one for a key with a rate (its tokens go to
    whichever thread is free).

    The share: bodies that mostly wait (sleep, I/O: less than half their time this
    thread's CPU, ``cpu_share``) run side by side in threads, so each of the process's
    threads gets an equal share (a key that binds is not held by executions waiting in one
    thread while others could run them). Bodies that mostly run Python hold the GIL, so
    the process's threads would run them one at a time anyway: spreading them buys nothing
    and costs a key-lock hold per thread, so the share is the process's, one of the
    supervisor's ``processes`` equal shares (processes do run side by side). Either way
    the executions are ones the process claimed under the key's lock: the key's
    ``concurrency`` holds as for any claim [INV-LIM-1].

    >>> wide, shares = LimitEntry("wide", 10, ()), {"threads": 5, "processes": 1}
    >>> in_a_row(64, wide, cpu_share=0.0, **shares), in_a_row(64, wide, cpu_share=1.0, **shares)
    (2, 10)
    """
    if entry is not None and entry.rates:
        return 1
    if entry is None or entry.concurrency is None:
        return batch
    shares = processes if cpu_share is not None and cpu_share >= 0.5 else threads
    return max(1, min(batch, entry.concurrency // max(1, shares)))


def groups(batch_size: int, *, keyed: bool, alone: bool, in_a_row: bool) -> bool:
    """Whether a success waits for its thread's group commit (recorded with its batch's
    others): with batches, an unkeyed one, a keyed one of a worker alone (no process
    inbox: its keyed batch is its own group), or one the thread runs in a row. Otherwise a
    keyed success goes to its process's keyed group commit (``shared.KeyedCommits``)."""
    return batch_size > 1 and (not keyed or alone or in_a_row)


def flush_due(queued: bool, waited_s: float, window_s: float) -> bool:
    """Whether a thread's group of successes is recorded now: when nothing of its batch is
    left to run, or once the oldest has waited ``window_s``."""
    return not queued or waited_s >= window_s


def tops_up(queued: Sequence[Claimed], batch: int, batch_size: int) -> bool:
    """Whether a thread's first claim (one execution: its pace is unknown) is topped up to
    ``batch_size`` by the polls that would follow it, when that one turns out to be an
    unkeyed async step (``Worker._top_up``; the caller asks whether it is async, last,
    as that resolves its class)."""
    return len(queued) == 1 and batch < batch_size and queued[0].limit_key is None
