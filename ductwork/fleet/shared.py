"""What the worker threads of one process share: the token alarm and the refusal counts.

    >>> Worker(app, tokens=TokenAlarm(app.wakeup.notify), refused=Refusals().count)

Each is thread-safe, and made once per worker process by its runner
(``fleet/supervisor.py``); a worker alone (tests, ``ductwork.testing.drain``) has none.
What each may lose when its process dies is said on its class: nothing recorded, only
hints, claims that the reaper crashes, and the refusals counted since the last heartbeat.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from ductwork.db.wakeup import Wakeup

if TYPE_CHECKING:
    from ductwork.limits.claims import Refusal


class TokenAlarm:
    """Wakes one idle worker thread of the process when a rate-limited key's next token
    is due, after a claim of this process spent the key's last one
    (``Claimed.next_token_in_s``, the stamp that claim wrote). Thread-safe.

    Without it a spent bucket's next token waited for a thread that happened to poll:
    a refused poll learns the time (``seconds_to_next_due``), but an admitted one left
    the others sleeping until a wakeup or their polling interval, and the token went
    unused (at ``burst: 1``, lost). A thread of its own (the runner's
    ``ductwork.job_worker.tokens`` loop) waits for the earliest time set and then calls
    ``wake(1)``: one poll per due token, not one per idle thread. A hint like any
    wakeup: the poll decides under the key's lock as always [INV-LIM-1, INV-LIM-2].
    Not done: other processes (they learn the time from their own refused polls), and a
    token per key (one time is kept, the earliest: the woken poll stamps the next)."""

    def __init__(self, wake: Callable[[int], None], clock: Callable[[], float] = time.monotonic):
        self._wake, self._clock = wake, clock
        self._lock = threading.Lock()
        self._due: float | None = None
        #: notified when an earlier time is set (what the alarm's loop waits on)
        self.changed = Wakeup()

    def at(self, seconds: float) -> None:
        """Wake a thread ``seconds`` from now, unless an earlier wake is already set."""
        due = self._clock() + max(0.0, seconds)
        with self._lock:
            if self._due is not None and self._due <= due:
                return
            self._due = due
        self.changed.notify()

    def seconds_left(self) -> float | None:
        """Seconds until the wake that is set (0 once due); None: none is set."""
        due = self._due
        return None if due is None else max(0.0, due - self._clock())

    def run_once(self) -> bool:
        """Wake one idle thread if the time set has come (and clear it); False if not."""
        with self._lock:
            if self._due is None or self._clock() < self._due:
                return False
            self._due = None
        self._wake(1)
        return True


class Refusals:
    """The keyed claims this process's polls were refused (``claims.Refusal``), per key and
    reason, since its heartbeat last added them to ``ductwork_key_refusals``
    (``processes.heartbeat``): the claim path writes nothing. An observability counter,
    not a guarantee: a process that dies loses what it counted since its last heartbeat,
    and a heartbeat that fails puts what it took back. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def count(self, refusal: Refusal) -> None:
        with self._lock:
            self._counts[(refusal.key, refusal.reason)] += 1

    def take(self) -> Counter[tuple[str, str]]:
        """What was counted since the last take (:meth:`add` it back if it was not written)."""
        with self._lock:
            taken, self._counts = self._counts, Counter()
        return taken

    def add(self, counts: Counter[tuple[str, str]]) -> None:
        with self._lock:
            self._counts.update(counts)
