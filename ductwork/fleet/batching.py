"""How a worker thread batches, as pure rules: how many executions a claim takes (of a
key: the thread's share of it) and when the group of successes is recorded.

    >>> pace = Pace(window_s=0.05, size=16)
    >>> pace.note(0.02, 0.001)      # a 20 ms body (1 ms of it on the CPU): two fit in 50 ms
    2

No database and no threads: the worker (``fleet/worker.py``) asks these with what it
knows, and ``tests/unit/test_batching.py`` checks them alone. What a batch claims is
decided by ``limits.claims.claim_batch`` under the keys' locks [INV-LIM-1, INV-LIM-6];
nothing here can admit more than a claim does.
"""

from __future__ import annotations

from dataclasses import dataclass

from ductwork.limit_entries import LimitEntry


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
    """A thread's recent bodies: their pace (seconds each) and the share of it spent on
    this thread's CPU, each a running average of the last and the new one; None and 0.0
    until a body has been timed."""

    window_s: float
    size: int
    pace_s: float | None = None
    cpu_share: float = 0.0

    def note(self, seconds: float, cpu_s: float) -> int:
        """Note a body that took ``seconds``, ``cpu_s`` of them on the CPU; returns the
        next batch (:func:`batch_for`)."""
        share = min(1.0, cpu_s / seconds) if seconds > 0 else 1.0  # an instant body is all CPU
        self.pace_s, self.cpu_share = ((seconds, share) if self.pace_s is None else
                                       ((self.pace_s + seconds) / 2, (self.cpu_share + share) / 2))
        return batch_for(self.pace_s, self.window_s, self.size)


#: the CPU share above which a thread's bodies are CPU-bound: its process's other threads
#: could not run them beside it (one interpreter lock), so it may hold the process's share
CPU_BOUND = 0.5


def keyed_batch(batch: int, entry: LimitEntry | None, threads: int, *, cpu_share: float = 0.0,
                processes: int = 1) -> int:
    """How many executions of a key one thread of a process of ``threads`` may claim at
    once (a batch of its own, recorded by one group commit): ``batch`` (as many as an
    unkeyed batch at the recent pace, so none waits behind its siblings longer than
    ``batch_window``), but no more than the thread's share of the key's ``concurrency``
    (at least one), so that a key that binds is not held by executions waiting in one thread
    while the others could run them: of bodies mostly waiting, the key's concurrency over
    the process's threads; of CPU-bound bodies (``cpu_share`` at least :data:`CPU_BOUND`),
    which the process's threads run one at a time anyway, over the fleet's ``processes``
    (its other processes could run them). One for a key with a rate when the process has
    other threads (its tokens go to whichever thread is free). Whatever it says, the claim
    is decided under the key's lock: the key's ``concurrency`` holds as for any claim
    [INV-LIM-1].

    >>> wide = LimitEntry("wide", 50, ())
    >>> keyed_batch(64, wide, 5), keyed_batch(64, LimitEntry("five", 5, ()), 10), keyed_batch(3, wide, 5)
    (10, 1, 3)
    >>> keyed_batch(64, wide, 5, cpu_share=0.9), keyed_batch(64, wide, 5, cpu_share=0.9, processes=2)
    (50, 25)
    """
    if entry is not None and entry.rates and threads > 1:
        return 1
    if entry is None or entry.concurrency is None:
        return batch
    return max(1, min(batch, entry.concurrency // max(1, processes if cpu_share >= CPU_BOUND else threads)))


def flush_due(queued: bool, waited_s: float, window_s: float) -> bool:
    """Whether a thread's group of successes is recorded now: when nothing of its batch is
    left to run, or once the oldest has waited ``window_s``."""
    return not queued or waited_s >= window_s
