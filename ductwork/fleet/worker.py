"""The job worker: claim one execution, run the step's code, record the outcome.

    >>> worker = Worker(app)
    >>> worker.run_once()          # None when nothing may run now
    Performed(execution_id='…', node='Charge#1', outcome='success')

At-least-once: ``execute`` runs *before* its outcome is committed, so a crash
between the two (or a reaper that took the claim) means the step runs again; its
side effects must be made harmless with ``idempotency_key`` or ``Context``. The
outcome itself is recorded at most once [INV-EXE-2].

Rescue layering, one owner per failure:

- the step's ``execute`` raising is a **failure**: retried within ``max_retry``
  [INV-EXE-4];
- returning what its edge cannot carry (:class:`StepReturnError`: not JSON, longer
  than ``payloads.MAX_PAYLOAD_BYTES``, not a list before an expand) is a failure
  that is not retried, since the same code returns the same value again: the step
  fails at once and its branch halts (``step_return_invalid``,
  ``payload_too_large``);
- running past ``timeout=`` is **timed_out** (counts like a failure); the step
  ran in a child process, which is killed and reaped *before* the outcome is
  recorded, so a freed slot never has code still running behind it [INV-EXE-5];
- a step that can never succeed is **invalid**: recorded once, never retried, its
  step failed at once [INV-EXE-4]. That is a stored class (or its run's pipeline)
  that is not one of the classes of the pipelines this process runs: it is never
  built and nothing is imported for it (``unknown_step_class``,
  :class:`~ductwork.errors.UnknownStepClassError`); stored input that does not bind
  to the class's ``__init__`` (``job_invalid``); and a return value that cannot be
  stored (``step_return_invalid``, ``payload_too_large``);
- anything else — the step's ``__init__`` raised, ductwork's own code raised, the
  thread is leaving, the process died — is a **crash** of the execution, re-run
  within ``max_crash``.

Steps without ``timeout=`` run in the worker's thread: Python threads cannot be
killed, so only a process kill stops them.

Async steps (``async def execute``) without ``timeout=`` run on the process's step
loop (``fleet.steploop``): the executions of one claim that are async steps of the
same lane are awaited together, concurrently, and then each outcome is recorded
exactly as a plain step's (the same fences, budgets, group commits and hand-offs);
since each claimed execution already holds its limit slot and token, running them
together never exceeds a limit. With ``timeout=`` an async step runs in a child
process like a plain one (``fleet.child``), which a kill really stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ductwork import faults
from ductwork.db.dialects import retry_transient
from ductwork.db.wakeup import Wakeup
from ductwork.errors import CommitFailed, StepReturnError
from ductwork.fleet.hooks import run_due_hook
from ductwork.fleet.invoke import (
    AsyncStepInterrupted,
    BuildFailed,
    ChildStepError,
    ReturnRejected,
    StepInvalid,
    StepTimedOut,
    build_step,
    check_configured,
    is_async_step,
    returned,
)
from ductwork.fleet.steploop import STEP_LOOP
from ductwork.limits.claims import claim_batch, seconds_to_next_due
from ductwork.limits.executions import Claimed, ErrorInfo
from ductwork.pipelines import payloads
from ductwork.pipelines.advance import Inline, advance_released_steps
from ductwork.pipelines.outcomes import (
    HandOff,
    Success,
    advanced_later,
    record_crash,
    record_failure,
    record_invalid,
    record_successes,
)
from ductwork.pipelines.payloads import Output
from ductwork.pipelines.runs import cached_definition

if TYPE_CHECKING:
    from ductwork.db.database import Database as App
    from ductwork.pipelines.definition import Definition

log = logging.getLogger("ductwork.execute")

ABANDONED = "ductwork.AbandonedClaim"
#: how often a busy worker polls for a due on_halt hook, at most (an idle one polls each time)
HOOK_POLL_S = 1.0


@dataclass(frozen=True)
class Performed:
    """What :meth:`Worker.run_once` did."""

    execution_id: str
    node: str
    outcome: str  # success | failure | timed_out | invalid | process_crashed | commit_failed


#: ``Worker._perform`` without an awaited outcome: the step is run there
_NOT_AWAITED: Any = object()


def _value_of(awaited: Any) -> Any:
    """An awaited step's value, or raise what it raised; a ``CancelledError`` nobody
    asked for (the step cancelled itself) is the step's failure, not the thread's exit."""
    if isinstance(awaited, asyncio.CancelledError):
        raise AsyncStepInterrupted(f"the step's coroutine was cancelled: {awaited!r}") from awaited
    if isinstance(awaited, BaseException):
        raise awaited
    return awaited


def make_output(klass: str, definition: Definition, node: str, value: Any) -> Output:
    """Validate a return value against the step's edge; raises :class:`StepReturnError`
    (a :class:`~ductwork.errors.PayloadError` when it breaks the payload rule)."""
    text = payloads.dump(value, returned(klass, value))
    edge = definition.edges.get(node)
    if edge is not None and edge.type == "expand":
        if not isinstance(value, list):
            raise StepReturnError(klass, value, "a step followed by expand must return a list")
        return Output(expand_items=[json.dumps(v, allow_nan=False) for v in value])
    return Output(text)


def batch_for(pace_s: float, window_s: float, size: int) -> int:
    """How many executions a batch may take: as many as run in ``window_s`` at ``pace_s``
    seconds each, at least one and at most ``size``.

    >>> batch_for(0.0001, 0.05, 16), batch_for(0.02, 0.05, 16), batch_for(3.0, 0.05, 16)
    (16, 2, 1)
    """
    if pace_s * size <= window_s:  # (also a zero pace: no division by it, nor an overflow)
        return size
    return max(1, int(window_s / pace_s))


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
    key is in progress in this process, it commits at once (the leader); otherwise it
    waits, and the commit in progress, once done, wakes the first waiting thread to
    commit every success of the key waiting by then in one transaction
    (``outcomes.record_successes``: the outputs and inline advancement first, then the key
    lock, the clock again, each release with its own sequence number in order, then one
    hand-off of up to as many executions as the successes that asked for one). Each
    waiting thread gets one handed-on execution (in order); what is left goes to
    ``overflow`` (the process inbox). The result (or the error) of the commit is each
    thread's own: a reaped execution in the group makes it fall back to one transaction
    per success, so only that one is not recorded [INV-EXE-2].

    Not done: waiting for more successes than are ready (a commit starts as soon as the
    previous one of its key ends; those that become ready during it wait for the next), or
    grouping across keys."""

    def __init__(self, overflow: Callable[[list[Claimed]], None]):
        self._lock = threading.Lock()
        self._waiting: dict[str, list[_Waiting]] = {}
        self._leading: set[str] = set()
        self._overflow = overflow

    def record(self, success: Success, take: bool,
               commit: Callable[[list[Success], int], list[Claimed]]) -> list[Claimed]:
        """Record ``success`` (keyed) with the others of its key that are ready; ``take``:
        this thread wants a handed-on execution. ``commit(successes, n)`` records them in
        one transaction and hands on up to ``n``. Returns what this thread is handed."""
        key = success.claimed.limit_key
        assert key is not None, "keyed group commits are for keyed successes"
        me = _Waiting(success, take)
        with self._lock:
            self._waiting.setdefault(key, []).append(me)
            lead = key not in self._leading
            self._leading.add(key)
        if not lead:
            me.done.wait()
            if not me.lead:
                return me.result()
        with self._lock:
            group = self._waiting.pop(key)
        try:
            handed = commit([w.success for w in group], sum(1 for w in group if w.take))
        except BaseException as error:  # noqa: BLE001 - raised in each thread, which crashes its own
            for w in group:
                w.error = error
            handed = []
        rest = list(handed)
        for w in group:
            if w.take and rest:
                w.handed = [rest.pop(0)]
        with self._lock:
            following = self._waiting.get(key)
            if following:
                following[0].lead = True
                following[0].done.set()  # the next round: every success waiting by now
            else:
                self._leading.discard(key)
        if rest:  # pragma: no cover  defensive: the commit hands on at most take(), one per taker
            self._overflow(rest)
        for w in group:
            if w is not me:
                w.done.set()
        return me.result()


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

    def __init__(self, app: App, wakeup: Wakeup, batch: int = 500):
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


class LeaseLost(Exception):
    """The worker's process no longer holds its lease: no step code may start
    (:meth:`Worker._may_start_code`)."""


class Worker:
    """Claims and runs executions: one claim (or batch) per :meth:`run_once`, and what its
    completions hand on.

    Batches (``batch_size`` > 1): when the oldest lane is the unkeyed one, a claim takes
    up to as many unkeyed executions as this worker's recent steps could run in
    ``batch_window`` seconds (one, until a step has been timed; never more than
    ``batch_size``), and their successes are recorded together in one transaction at the
    batch's end, or as soon as the oldest unrecorded success is ``batch_window`` old. A
    claimed execution therefore waits behind its siblings for about ``batch_window`` at
    the recent pace, and a success stays unrecorded about as long: a crash in that time
    re-runs it (at-least-once, as for any crash before the commit). A keyed success is
    recorded by its process's keyed group commit (``inbox.commits``,
    :class:`KeyedCommits`): with the other successes of its key that threads of the
    process have ready by the time the key's lock is granted, under one hold of that
    lock, each with its own release
    sequence number, and one hand-off of up to one execution per thread that asked; a
    worker alone (no inbox) groups the successes of its own keyed batch instead, as it
    groups unkeyed ones. A keyed claim takes up to as many executions of its key as
    the process has idle threads (``inbox``: they wait there for them) plus as many as
    this thread runs in a row (:meth:`in_a_row`: one, or with fast steps up to its share
    of the key's concurrency, a thread's or, for bodies that mostly run Python, the
    process's, recorded by one group commit as a worker alone records
    its batch), or, for a worker alone, as many as an unkeyed batch. Not done: handing back
    claimed executions that a stopping worker has not started (it runs them; they were
    sized to take ``batch_window``).
    """

    def __init__(self, app: App, *, process_id: str | None = None,
                 hand_off: Callable[[], bool] | None = None, batch_size: int = 1, batch_window: float = 0.05,
                 inbox: Inbox | None = None, released: ReleasedSteps | None = None,
                 tokens: TokenAlarm | None = None, lease: Callable[[], bool] | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")
        from ductwork.fleet.boot import load_pipelines

        # Only configured code runs: the classes of these pipelines (and of those this
        # process's own code defined) are the only ones a stored name resolves to.
        load_pipelines(app.config)
        self.app = app
        self._process_id = process_id
        #: asked after each success: may this worker take its lane's next execution in
        #: the same transaction (``claims.hand_off``)? None: never (one per run_once)
        self._may_hand_off = hand_off
        self._batch_size = batch_size
        self._batch_window = batch_window
        self._inbox = inbox
        #: the process's released keyed steps, advanced by a thread of their own; None: this
        #: worker advances them itself, right after each release commits
        self._released = released
        #: the process's token alarm: set when a claim spends a rated key's last token
        self._tokens = tokens
        #: whether the process still holds its lease (``Runner.holds_lease``), asked before
        #: any step code starts; None: a worker of no runner (in-process, tests), always
        self._lease = lease
        #: how many unkeyed executions the next claim may take (from the recent pace)
        self.batch = 1
        self._pace_s: float | None = None
        #: how much of the recent bodies' time was this thread's CPU (0 to 1; None: none timed)
        self._cpu_share: float | None = None
        #: claimed, not yet performed: handed on by a completion, or the rest of a batch
        self._queue: deque[Claimed] = deque()
        #: queued keyed executions this thread runs in a row (their successes: one group commit)
        self._in_a_row: set[str] = set()
        #: performed successes not yet recorded (the batch's group commit)
        self._group: list[Success] = []
        self._group_started = 0.0
        #: after an idle poll: seconds until time alone may let a poll claim (a rate-blocked
        #: key's next token, a delayed execution's eligible time), if any: ``seconds_to_next_due``
        self.next_due_s: float | None = None
        #: the execution this worker is performing
        self.current: str | None = None
        #: the async steps this worker is awaiting together (``_run_together``)
        self._together: list[Claimed] = []
        #: the on_halt hook this worker is running (ductwork.fleet.hooks)
        self.current_hook: str | None = None
        self._next_hook_poll = 0.0

    @property
    def process_id(self) -> str:
        return self._process_id or self.app.process_id()

    def held(self) -> set[str]:
        """The executions this worker holds (what a runner's reconciliation skips): the one
        it runs, those claimed and queued, and those run but not yet recorded."""
        held = {claimed.execution_id for claimed in list(self._queue)}
        held.update(success.claimed.execution_id for success in list(self._group))
        held.update(claimed.execution_id for claimed in list(self._together))
        current = self.current
        if current is not None:
            held.add(current)
        hook = self.current_hook
        if hook is not None:
            held.add(hook)
        return held

    def _holds_lease(self) -> bool:
        return self._lease is None or self._lease()

    def _may_start_code(self) -> None:
        """Raise :class:`LeaseLost` if this worker's process no longer holds its lease.

        Asked right before a step's body (or a batch of awaited ones) starts. A process
        frozen past its lease (SIGSTOP, a paused VM) has had its claims crashed and handed
        on by the reaper; when it thaws, its threads run on for the moment its lease
        watchdog takes to end it, and a thread between a claim and its body would start
        the body beside its re-run: one more body than a key's limit [INV-EXE-5,
        INV-LIM-1]. Not done: stopping a body already running (the freeze caught it
        there; INV-EXE-5 states it)."""
        if not self._holds_lease():
            raise LeaseLost("this process has lost its lease: no step code starts")

    def _hook(self) -> Performed | None:
        """Run one due on_halt hook (``fleet.hooks``); at most one poll a second while busy."""
        self._next_hook_poll = time.monotonic() + HOOK_POLL_S
        if not self._holds_lease():
            return None  # [INV-EXE-5] a handler is step code too: its claim is the reaper's
        done = run_due_hook(self.app, self.process_id, self._holding_hook)
        return None if done is None else Performed(done.hook_id, "on_halt", done.outcome)

    def _holding_hook(self, hook_id: str | None) -> None:
        self.current_hook = hook_id

    def run_once(self) -> Performed | None:
        """Claim and run one execution (or one batch), then every execution its
        completions hand to this worker (only while ``hand_off()`` says yes, so a stopping
        worker performs only what it already holds). Everything it ran is recorded when
        this returns; when it raises, what failed was crashed, and the executions still
        queued stay held and run at the next call. Never sleeps (except inside the step)."""
        if self._group and not self._queue:
            self._flush()  # successes left unrecorded when an exception left the last call
        if not self._queue and self._inbox is not None and (given := self._inbox.take()) is not None:
            self._queue.append(given)
        polled = False
        if not self._queue and not self._group and time.monotonic() >= self._next_hook_poll:
            polled = True  # busy or not, a halted run's hook waits at most a second for a poll
            if (hooked := self._hook()) is not None:
                return hooked
        if not self._queue:
            self._claim()
            self._top_up()
        if not self._queue:
            self.next_due_s = seconds_to_next_due(self.app)
            return None if polled else self._hook()  # idle: an owed hook is the work
        performed = None
        try:
            while self._queue:
                if self._group and self._group[0].claimed.limit_key != self._queue[0].limit_key:
                    self._flush()  # pragma: no cover  defensive: a queue holds one lane (claims, hand-offs)
                claimed = self._queue.popleft()
                # alone (no inbox), a worker's keyed batch is its own keyed group commit, and
                # so is a keyed batch a thread runs in a row
                in_a_row = claimed.execution_id in self._in_a_row
                self._in_a_row.discard(claimed.execution_id)
                keyed_group = claimed.limit_key is None or self._inbox is None or in_a_row
                group = self._batch_size > 1 and keyed_group
                if self._awaitable(claimed):
                    performed = self._run_together(self._async_batch(claimed, in_a_row), group=group)
                else:
                    performed = self._run(claimed, group=group)
                if self._group and (not self._queue
                                    or time.monotonic() - self._group_started >= self._batch_window):
                    self._flush()
                if not self._queue and self._inbox is not None and (given := self._inbox.take()) is not None:
                    self._queue.append(given)  # claimed for this process: before anything new
        except LeaseLost:  # the watchdog ends the process: nothing more starts here meanwhile
            log.warning("worker %s: lease lost; not starting step code", self.process_id)
            return None
        except Exception:
            raise  # what failed was crashed (_run, _flush); the rest stays held for the next call
        except BaseException:
            self._abandon()  # the thread is leaving: nothing may stay held by it
            raise
        return performed

    def in_a_row(self, key: str) -> int:
        """How many executions of ``key`` this thread may run one after the other (a
        keyed batch of its own, recorded by one group commit): as many as an unkeyed batch
        at the recent pace (so none waits behind its siblings longer than ``batch_window``),
        but no more than the thread's share of the key's ``concurrency``, and one for a key
        with a rate (its tokens go to whichever thread is free). A worker alone: its batch.

        The share: bodies that mostly wait (sleep, I/O: less than half their time this
        thread's CPU) run side by side in threads, so each of the process's threads gets an
        equal share (a key that binds is not held by executions waiting in one thread while
        others could run them). Bodies that mostly run Python hold the GIL, so the
        process's threads would run them one at a time anyway: spreading them buys nothing
        and costs a key-lock hold per thread, so the share is the process's, one of the
        supervisor's ``job_worker.processes`` equal shares (processes do run side by side).
        Either way the executions are ones this process claimed under the key's lock: the
        key's ``concurrency`` holds as for any claim [INV-LIM-1]."""
        if self._inbox is None:  # pragma: no cover  _claim, the only caller, asks only with an inbox
            return self.batch
        entry = self.app.config.limits.get(key)
        if entry is not None and entry.rates:
            return 1
        if entry is None or entry.concurrency is None:
            return self.batch
        mostly_cpu = self._cpu_share is not None and self._cpu_share >= 0.5
        shares = self.app.config.job_worker.processes if mostly_cpu else self._inbox.threads
        return max(1, min(self.batch, entry.concurrency // max(1, shares)))

    def _claim(self) -> None:
        """Claim a batch; what a keyed batch took beyond what this thread runs in a row
        (:meth:`in_a_row`) goes to the inbox, for idle threads."""
        inbox = self._inbox
        if inbox is None:
            claimed = claim_batch(self.app, self.process_id, self.batch, self.batch)
            self._note_tokens(claimed)
            self._queue.extend(claimed)
            return
        spare = inbox.spare()
        per_key = {key: self.in_a_row(key) + spare for key in self.app.config.limits}
        claimed = claim_batch(self.app, self.process_id, self.batch, self.batch + spare, per_key)
        self._note_tokens(claimed)
        if not claimed or claimed[0].limit_key is None:
            self._queue.extend(claimed)
            return
        own = self.in_a_row(claimed[0].limit_key)
        self._queue.extend(claimed[:own])
        if own > 1:
            self._in_a_row.update(c.execution_id for c in claimed[:own])
        if len(claimed) > own:
            inbox.put(claimed[own:])

    def _top_up(self) -> None:
        """A thread's first claim takes one execution, its pace being unknown. When that one
        is an unkeyed async step, the polls that would follow it are made now, up to
        ``batch_size`` in all, so that what they take is awaited with it, as every later
        claim of async steps is, instead of one await later (1,000 runs of
        ``asyncio.sleep(0.1)`` on five fresh threads: five in the first await). They are
        those polls' claims, in lane order [INV-LIM-6]: ``claim_batch`` again, in a second
        transaction. Not done: a claim cannot know that what it takes is async before it
        takes it, so plain steps claimed here wait behind the batch, as the plain steps of
        any claim after an async batch do until their pace is known."""
        if (len(self._queue) == 1 and self.batch < self._batch_size and self._queue[0].limit_key is None
                and self._awaitable(self._queue[0])):
            self.batch = self._batch_size - 1
            self._claim()
            self.batch = self._batch_size

    def _note_tokens(self, claimed: list[Claimed]) -> None:
        """A claim (or hand-off) that spent its key's last token sets the process's alarm
        for the next one (:class:`TokenAlarm`)."""
        if self._tokens is not None and claimed and claimed[-1].next_token_in_s is not None:
            self._tokens.at(claimed[-1].next_token_in_s)

    def _run(self, claimed: Claimed, *, group: bool) -> Performed:
        """Run a claimed execution and record its outcome (``group``: leave a success to
        the batch's group commit); on any escape, crash it."""
        recorded = False
        self.current = claimed.execution_id
        try:
            faults.hit(faults.AFTER_JOB_CLAIM)
            self._may_start_code()  # [INV-EXE-5] no body starts once the lease is lost
            outcome = self._perform(claimed, group)
            recorded = True
            return Performed(claimed.execution_id, claimed.node, outcome)
        finally:
            self.current = None
            if not recorded:  # an exception (or thread exit) escaped: never leave the claim held
                # (if the database is unreachable this fails too; the runner's
                # reconciliation crashes the orphaned claim once it answers again)
                record_crash(self.app, claimed.execution_id, claimed.process_id, ABANDONED,
                             "execution abandoned by its worker thread")

    def _awaitable(self, claimed: Claimed) -> bool:
        """Whether ``claimed`` is awaited on the step loop: an async step without ``timeout=``."""
        return not claimed.timeout_us and is_async_step(claimed)

    def _async_batch(self, first: Claimed, in_a_row: bool) -> list[Claimed]:
        """``first`` and the queued executions after it that are awaited with it: async
        steps of its lane, recorded the same way (in a row or not) and, with successes
        waiting for the group commit, the same group."""
        batch = [first]
        while (self._queue and self._queue[0].limit_key == first.limit_key and self._awaitable(self._queue[0])
               and (self._queue[0].execution_id in self._in_a_row) == in_a_row):
            claimed = self._queue.popleft()
            self._in_a_row.discard(claimed.execution_id)
            batch.append(claimed)
        return batch

    def _run_together(self, batch: list[Claimed], *, group: bool) -> Performed:
        """Await the async steps of ``batch`` together on the step loop, then record each
        outcome in order as :meth:`_run` does (``group``: successes to the group commit).
        On any escape, crash every execution of the batch not recorded yet. A claim of
        async steps then takes ``batch_size`` executions: they run side by side, so none
        waits behind its siblings (what pacing a batch of plain steps is for)."""
        recorded: set[str] = set()
        self._together = batch
        try:
            self._may_start_code()  # [INV-EXE-5] no body starts once the lease is lost
            awaiting = STEP_LOOP.start([self._awaited(claimed) for claimed in batch])
            try:
                faults.hit(faults.WHILE_ASYNC_STEPS_AWAIT)
            except BaseException:
                STEP_LOOP.result(awaiting)  # no execution is crashed (below) while its step still runs
                raise
            outcomes = STEP_LOOP.result(awaiting)
            performed = None
            for claimed, outcome in zip(batch, outcomes, strict=True):
                self.current = claimed.execution_id
                performed = Performed(claimed.execution_id, claimed.node, self._perform(claimed, group, outcome))
                recorded.add(claimed.execution_id)
            self.batch = self._batch_size
            assert performed is not None
            return performed
        finally:
            self.current = None
            self._together = []
            for claimed in batch:
                if claimed.execution_id not in recorded:  # an exception (or thread exit) escaped
                    record_crash(self.app, claimed.execution_id, claimed.process_id, ABANDONED,
                                 "execution abandoned by its worker thread")

    async def _awaited(self, claimed: Claimed) -> Any:
        """On the step loop: check, build and await one async step; its value, or raises
        what :meth:`_invoke` would (``StepInvalid``, ``BuildFailed``, the step's error)."""
        check_configured(claimed)
        instance = build_step(self.app, claimed.klass, claimed.input_json, claimed.idempotency_key,
                              claimed.run_id)
        try:
            return await instance.execute()
        except (KeyboardInterrupt, SystemExit) as error:  # would stop the loop of every thread's steps
            raise AsyncStepInterrupted(f"the step raised {error!r}") from error

    def _abandon(self) -> None:
        """The thread is leaving run_once (KeyboardInterrupt, SystemExit): crash what this
        worker holds and has not recorded (each re-runs within its crash budget). What
        cannot be crashed now is no longer held, so the runner's reconciliation crashes
        it later."""
        left = [success.claimed for success in self._group] + list(self._queue)
        self._group.clear()
        self._queue.clear()
        self._in_a_row.clear()
        for claimed in left:
            record_crash(self.app, claimed.execution_id, claimed.process_id, ABANDONED,
                         "execution abandoned by its worker thread")

    def _hands_off(self) -> bool:
        """Whether the completion being recorded may take its lane's next execution: not
        while executions claimed for this process wait in the inbox (they come first)."""
        return self._may_hand_off is not None and self._may_hand_off() and not self._inbox_waiting()

    def _inbox_waiting(self) -> bool:
        return self._inbox is not None and self._inbox.waiting()

    def _flush(self) -> None:
        """Record the group of successes in one transaction; take what it hands on."""
        take = not self._queue and self._hands_off()
        try:
            if take:
                hand_off = HandOff(self.batch, len(self._group))
                handed = self._record(lambda: record_successes(self.app, self._group, hand_off), self._group)
                if self._inbox is not None and self._group[0].claimed.limit_key is not None:
                    self._in_a_row.update(c.execution_id for c in handed)  # the thread's keyed batch goes on
            else:
                self._record(lambda: record_successes(self.app, self._group), self._group)
        except CommitFailed as failed:  # a group of one, reaped under it (larger groups log each)
            log.warning("%s", failed)
        except Exception:
            # As for one execution (_run): crash what could not be recorded. The crash is
            # guarded, so the successes that were recorded are left as they are.
            group, self._group = self._group, []
            for success in group:
                record_crash(self.app, success.claimed.execution_id, success.claimed.process_id, ABANDONED,
                             "success could not be recorded")
            raise
        self._group.clear()

    def _record(self, commit: Callable[[], list[Claimed]], released: list[Success] | None = None) -> list[Claimed]:
        """Commit successes (repeated on a lost connection) and queue what is handed on;
        then advance the keyed ones of ``released`` (:meth:`_advance_released`)."""
        handed: list[Claimed] = retry_transient(commit)
        self._note_tokens(handed)
        self._queue.extend(handed)
        faults.hit(faults.AFTER_JOB_COMMIT)
        if released:
            self._advance_released(released)
        return handed

    def _advance_released(self, successes: list[Success]) -> None:
        """The second transaction of keyed successes whose release has committed (their
        steps left ``advancing``): ``advance.advance_released`` of those that advance inline,
        by the process's :class:`ReleasedSteps` thread, or here and now for a worker
        without one. A crash before it leaves them to an advancer [INV-ADV-1]."""
        later = advanced_later(self.app, successes)
        if not later:
            return
        faults.hit(faults.BETWEEN_RELEASE_AND_ADVANCE)
        if self._released is not None:
            self._released.put(later)
        else:
            advance_released_steps(self.app, later)

    def _commit_keyed(self, successes: list[Success], take: int) -> list[Claimed]:
        """A keyed group commit (:class:`KeyedCommits`): record ``successes`` and hand on
        up to ``take`` executions of their key; then advance them (:meth:`_advance_released`).
        Not repeated here on a lost connection: each thread of the group repeats its own
        :meth:`KeyedCommits.record` (``_record``)."""
        handed = record_successes(self.app, successes, HandOff(keyed_limit=take))
        self._advance_released(successes)
        return handed

    def _paced(self, seconds: float, cpu_s: float) -> None:
        """Size the next batch from the recent pace, and note how much of a body's time is
        this thread's own CPU (``cpu_s`` of ``seconds``: 1 for a body that did nothing)."""
        self._pace_s = seconds if self._pace_s is None else (self._pace_s + seconds) / 2
        share = min(1.0, cpu_s / seconds) if seconds > 0 else 1.0
        self._cpu_share = share if self._cpu_share is None else (self._cpu_share + share) / 2
        self.batch = batch_for(self._pace_s, self._batch_window, self._batch_size)

    def _invoke(self, claimed: Claimed, definition: Definition) -> Output:
        if claimed.timeout_us:
            from ductwork.fleet.child import run_in_child

            value = run_in_child(self.app, claimed)
        else:
            instance = build_step(self.app, claimed.klass, claimed.input_json, claimed.idempotency_key,
                                  claimed.run_id)
            value = instance.execute()
            if asyncio.iscoroutine(value):  # (an async step is awaited by _run_together; not one built here)
                value = _value_of(STEP_LOOP.run([value])[0])
        return self._output(claimed, definition, value)

    @staticmethod
    def _output(claimed: Claimed, definition: Definition, value: Any) -> Output:
        try:
            return make_output(claimed.klass, definition, claimed.node, value)
        except StepReturnError as error:  # (not one that execute() itself raised)
            raise ReturnRejected(ErrorInfo.of(error)) from error

    def _perform(self, claimed: Claimed, group: bool, awaited: Any = _NOT_AWAITED) -> str:
        """Run the step (or take ``awaited``: what its coroutine returned or raised on the
        step loop) and record its outcome; returns the outcome's name."""
        definition = cached_definition(self.app, claimed.definition_sha1)
        ran_s: float | None = None  # (an awaited body is not timed here)
        try:
            try:
                if awaited is _NOT_AWAITED:
                    check_configured(claimed)  # before anything is built here or in a child process
                    started, cpu = time.monotonic(), time.thread_time()
                    output = self._invoke(claimed, definition)
                    ran_s = time.monotonic() - started
                    self._paced(ran_s, time.thread_time() - cpu)
                    faults.hit(faults.DURING_JOB_EXECUTION)
                else:
                    output = self._output(claimed, definition, _value_of(awaited))
            except StepInvalid as invalid:  # can never succeed: fail the step at once [INV-EXE-4]
                info = invalid.info  # bound here: the name `invalid` ends with this block
                retry_transient(lambda: record_invalid(self.app, claimed, info))
                return "invalid"
            except BuildFailed as failed:
                info = failed.info
                retry_transient(lambda: record_crash(self.app, claimed.execution_id, claimed.process_id,
                                                     info.klass, info.message, info.backtrace, info.text))
                return "process_crashed"
            except StepTimedOut as timed_out:
                info = ErrorInfo.of(timed_out)
                retry_transient(lambda: record_failure(self.app, claimed, info, outcome="timed_out"))
                return "timed_out"
            except ChildStepError as child_error:
                info = child_error.info
                retry_transient(lambda: record_failure(self.app, claimed, info))
                return "failure"
            except Exception as error:  # noqa: BLE001 - the step's own failure: retried, never lost
                info = ErrorInfo.of(error)
                retry_transient(lambda: record_failure(self.app, claimed, info))
                return "failure"
            # AT-LEAST-ONCE: execute() has run and its side effects are durable. The
            # commit below can still fail (CommitFailed) if the reaper took the claim;
            # then the reaper's re-run is the live execution and the step runs again.
            # Repeated on a lost connection: a commit whose acknowledgement was lost is seen
            # as CommitFailed the second time (the guarded update matches nothing).
            success = Success(claimed, output, ran_s=ran_s)
            if group:  # recorded with the batch's group commit (run_once flushes it)
                if not self._group:
                    self._group_started = time.monotonic()
                self._group.append(success)
                return "success"
            if claimed.limit_key is not None and self._inbox is not None:  # the process's keyed group commit
                commits = self._inbox.commits
                self._record(lambda: commits.record(success, self._hands_off(), self._commit_keyed))
                return "success"
            hand_off = HandOff(self.batch) if self._hands_off() else None
            self._record(lambda: record_successes(self.app, [success], hand_off), [success])
            return "success"
        except CommitFailed as failed:
            log.warning("%s", failed)
            return "commit_failed"
