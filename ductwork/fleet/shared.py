"""What the worker threads of one process share: the inbox of keyed executions claimed
for idle threads, the keyed group commits, the token alarm, the released steps and the
refusal counts.

    >>> inbox = Inbox(app.wakeup.notify, idle=lambda: 2, threads=4)   # one per process
    >>> Worker(app, inbox=inbox, released=ReleasedSteps(app, Wakeup()), tokens=TokenAlarm(app.wakeup.notify))

Each is thread-safe, and made once per worker process by its runner
(``fleet/supervisor.py``); a worker alone (tests, ``ductwork.testing.drain``) has none.
What each may lose when its process dies is said on its class: nothing recorded, only
hints, claims that the reaper crashes, and the refusals counted since the last heartbeat.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from ductwork.db.wakeup import Wakeup
from ductwork.pipelines.branches import Inline, advance_released_steps
from ductwork.pipelines.outcomes import Gathering

if TYPE_CHECKING:
    from ductwork.db.database import Database
    from ductwork.limits.claims import Refusal
    from ductwork.limits.executions import Claimed
    from ductwork.pipelines.outcomes import Success


class _Waiting:
    """One thread's keyed success in :class:`KeyedCommits`, and what its commit gave it."""

    __slots__ = ("done", "error", "handed", "lead", "success", "take")

    def __init__(self, success: Success, take: bool):
        self.success, self.take = success, take
        self.done = threading.Event()
        self.lead = False  # woken to commit the next round, not with its result
        self.handed: list[Claimed] = []
        self.error: BaseException | None = None

    def result(self) -> list[Claimed]:
        if self.error is not None:
            raise self.error
        return self.handed


class KeyedCommits:
    """Keyed group commits of one process: the successes of one key that its threads
    have ready are recorded together, under one hold of the key's lock (leader and
    followers). Thread-safe.

    A thread whose keyed success is ready calls :meth:`record`: when no commit of that
    key is in progress in this process, it commits at once (the leader); while one is,
    its success joins that commit if the commit does not hold the key's lock yet
    (``outcomes.Gathering``: a commit takes what joined when its transaction begins and
    once it holds the lock), else it waits for the next round, which the commit in
    progress, once done, wakes the first waiting thread to lead, with every success
    waiting by then. A commit (``outcomes.record_successes``) writes the outputs and
    inline advancement first, then takes the key's lock, the clock again, each release
    with its own sequence number in order, then one hand-off of up to as many executions
    as the successes that asked for one. Each thread that asked gets one handed-on
    execution (in order); what is left goes to ``overflow`` (the process inbox). The
    result (or the error) of the commit is each thread's own: a reaped execution in the
    group makes it fall back to one transaction per success, so only that one is not
    recorded [INV-EXE-2].

    Not done: waiting for successes that are not ready, or grouping across keys."""

    def __init__(self, overflow: Callable[[list[Claimed]], None]):
        self._lock = threading.Lock()
        self._waiting: dict[str, list[_Waiting]] = {}
        #: each key's commit in progress (or about to start, its leader woken): its gathering
        #: and every thread it records
        self._rounds: dict[str, tuple[Gathering, list[_Waiting]]] = {}
        self._overflow = overflow

    def record(self, success: Success, take: bool,
               commit: Callable[[list[Success], int, Gathering], list[Claimed]]) -> list[Claimed]:
        """Record ``success`` (keyed) with the others of its key that are ready; ``take``:
        this thread wants a handed-on execution. ``commit(successes, n, gathering)``
        records them, and what joins ``gathering``, in one transaction and hands on up to
        ``n`` plus the joiners' takers. Returns what this thread is handed."""
        key = success.claimed.limit_key
        assert key is not None, "keyed group commits are for keyed successes"
        me = _Waiting(success, take)
        with self._lock:
            current = self._rounds.get(key)
            if current is not None and current[0].join(success, take):
                current[1].append(me)  # joins the commit on its way
            elif current is not None:
                self._waiting.setdefault(key, []).append(me)  # the next round
            else:
                me.lead = True
                self._rounds[key] = (Gathering(), [me])
        if not me.lead:
            me.done.wait()
            if not me.lead:
                return me.result()
        with self._lock:
            gathering, group = self._rounds[key]  # (made by whoever made this thread lead)
        handed, error = _commit(group, gathering, commit)
        with self._lock:  # (every joiner is in ``group`` by now: it joins under this lock)
            rest = _hand_out(group, handed, error)
            following = self._waiting.pop(key, None)
            if following:  # the next round: every success waiting by now, and what joins it
                self._rounds[key] = (Gathering(), following)
                following[0].lead = True
                following[0].done.set()
            else:
                del self._rounds[key]
        if rest:  # pragma: no cover  defensive: the commit hands on at most one per taker
            self._overflow(rest)
        for w in group:
            if w is not me:
                w.done.set()
        return me.result()


def _commit(group: list[_Waiting], gathering: Gathering,
            commit: Callable[[list[Success], int, Gathering], list[Claimed]]
            ) -> tuple[list[Claimed], BaseException | None]:
    """One round of :class:`KeyedCommits`: commit the ``group``'s successes and what joins
    ``gathering`` meanwhile; what it handed on, or its error. The gathering is closed
    when this returns (a commit that raised before its key's lock left it open)."""
    try:
        return commit([w.success for w in group], sum(1 for w in group if w.take), gathering), None
    except BaseException as error:  # noqa: BLE001 - raised in each thread, which crashes its own
        return [], error
    finally:
        gathering.close()


def _hand_out(group: list[_Waiting], handed: list[Claimed], error: BaseException | None) -> list[Claimed]:
    """Give each thread of the round that asked one handed-on execution (in order), or the
    commit's error to every one; returns what is left over."""
    rest = list(handed)
    for w in group:
        w.error = error
        if w.take and rest:
            w.handed = [rest.pop(0)]
    return rest


class Inbox:
    """Keyed executions one worker thread claimed for its process's idle threads (a keyed
    batch, ``claims.claim_batch``'s ``keyed_limit``): each is performed by the first
    thread that looks, before it polls. Thread-safe. ``idle()`` says how many threads
    are idle now; :meth:`spare`, those of them no execution here waits for yet: what a
    thread's keyed batch may take beyond its own one.

    Claimed executions wait here only as long as it takes an idle thread to wake; a
    process that dies or stops with some left has them crashed by its reaping (re-run
    within the crash budget), as for any execution held when a process ends."""

    def __init__(self, wake: Callable[[int], None], idle: Callable[[], int], threads: int = 1):
        self._items: deque[Claimed] = deque()
        self._wake = wake
        self._idle = idle
        #: the process's worker threads (what a thread's share of a key's concurrency is of)
        self.threads = threads
        #: the process's keyed group commits; what their hand-offs leave over comes here
        self.commits = KeyedCommits(self.put)

    def spare(self) -> int:
        return max(0, self._idle() - len(self._items))

    def put(self, claimed: list[Claimed]) -> None:
        self._items.extend(claimed)
        self._wake(len(claimed))

    def take(self) -> Claimed | None:
        try:
            return self._items.popleft()
        except IndexError:
            return None

    def held(self) -> set[str]:
        return {claimed.execution_id for claimed in list(self._items)}

    def waiting(self) -> bool:
        return bool(self._items)


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


class ReleasedSteps:
    """A process's keyed steps whose releases have committed, to be advanced past
    (``advance.advance_released``) by one thread of their own, many per transaction,
    while the worker threads that released them go on to their next bodies. Thread-safe.

    A step waits here only until that thread wakes; a process that dies or stops with
    some here leaves them ``advancing``, and an advancer advances them (they were
    recorded: only what follows them waits) [INV-ADV-1]. Not done: bounding the queue
    (it holds at most what the worker threads released since the last round)."""

    def __init__(self, app: Database, wakeup: Wakeup, batch: int = 500):
        self.app, self.wakeup, self.batch = app, wakeup, batch
        self._lock = threading.Lock()
        self._items: list[Inline] = []

    def put(self, released: list[Inline]) -> None:
        with self._lock:
            self._items.extend(released)
        self.wakeup.notify()

    def run_once(self) -> bool:
        """Advance up to ``batch`` of the queued steps in one transaction; False if none."""
        with self._lock:
            taken, self._items = self._items[:self.batch], self._items[self.batch:]
        if not taken:
            return False
        advance_released_steps(self.app, taken)
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
