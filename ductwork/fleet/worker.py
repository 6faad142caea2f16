"""The job worker's loop: claim executions, run each (``fleet/execute.py``), record
what it did, and take what its completions hand on.

    >>> worker = Worker(app)
    >>> worker.run_once()          # None when nothing may run now
    Performed(execution_id='…', node='Charge#1', outcome='success')

One thread's loop, one :meth:`Worker.run_once` at a time. How much a claim takes and
when a group of successes is recorded are pure rules (``fleet/batching.py``); what the
process's threads share (the token alarm, the refusal counts) is in
``fleet/shared.py``; running one step and the failure rules (which error becomes which
outcome) in ``fleet/execute.py``. Here: the claims, the queue of what was claimed and not
yet performed, the commits of successes (alone or in the thread's group) and the crash of
whatever an escaping error left unrecorded, so that nothing stays held by a thread that
gave up on it [INV-EXE-1].
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from ductwork import faults
from ductwork.db.dialects import retry_transient
from ductwork.errors import CommitFailed
from ductwork.fleet import batching
from ductwork.fleet.execute import NOT_AWAITED, await_together, awaitable, record_failed, run_step
from ductwork.fleet.hooks import run_due_hook
from ductwork.limits.claims import Refusal, claim_batch
from ductwork.limits.lanes import seconds_to_next_due
from ductwork.pipelines.outcomes import HandOff, Success, record_crash, record_successes
from ductwork.pipelines.runs import cached_definition

if TYPE_CHECKING:
    from ductwork.db.database import Database
    from ductwork.fleet.shared import TokenAlarm
    from ductwork.limits.executions import Claimed

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


class LeaseLost(Exception):
    """The worker's process no longer holds its lease: no step code may start
    (:meth:`Worker._may_start_code`)."""


class Worker:
    """Claims and runs executions: one claim (or batch) per :meth:`run_once`, and what its
    completions hand on.

    Batches (``batch_size`` > 1): a claim takes up to as many executions as this worker's
    recent steps could run in ``batch_window`` seconds (one, until a step has been timed;
    never more than ``batch_size``), of a key no more than the thread's share of its
    concurrency (:func:`batching.keyed_batch`: a key's slots are not held by executions
    waiting in one thread while others could run them), and of several lanes only past keys
    it saturated (``claims.claim_batch``: one each of many ``concurrency: 1`` partitions);
    their successes are recorded together in one transaction at the batch's end, or as soon
    as the oldest unrecorded success is ``batch_window`` old; that transaction's hand-off
    (a group of one lane) takes the lane's next executions, as many as it released, if a
    poll would [INV-LIM-6]. A claimed execution
    therefore waits behind its siblings for about ``batch_window`` at the recent pace, and a
    success stays unrecorded about as long: a crash in that time re-runs it (at-least-once,
    as for any crash before the commit). A claim that took something wakes one more idle
    thread of the process (there may be more to take), so that work arriving wakes threads
    one at a time, as many as find some, never all of them for one execution. Not done:
    handing back claimed executions that a stopping worker has not started (it runs them;
    they were sized to take ``batch_window``).
    """

    def __init__(self, app: Database, *, process_id: str | None = None,
                 hand_off: Callable[[], bool] | None = None, batch_size: int = 1, batch_window: float = 0.05,
                 threads: int = 1, tokens: TokenAlarm | None = None,
                 lease: Callable[[], bool] | None = None, refused: Callable[[Refusal], None] | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")
        from ductwork.fleet.boot import load_pipelines

        # Only configured code runs: the classes of these pipelines (and of those this
        # process's own code defined) are the only ones a stored name resolves to.
        load_pipelines(app.config)
        self.app = app
        self._process_id = process_id
        #: asked after each success: may this worker take its lane's next execution in
        #: the same transaction (``claims.release_and_claim``)? Without ``hand_off``: never (one per run_once)
        self._hands_off = hand_off or (lambda: False)
        self._batch_size = batch_size
        self._batch_window = batch_window
        #: the process's worker threads: what a thread's share of a key's concurrency is of
        self._threads = threads
        #: the process's token alarm: set when a claim spends a rated key's last token
        self._tokens = tokens
        #: whether the process still holds its lease (``Runner.holds_lease``), asked before
        #: any step code starts; without ``lease`` (a worker of no runner: in-process, tests), always
        self._holds_lease = lease or (lambda: True)
        #: told of each keyed claim a poll was refused (the process's ``shared.Refusals``); None: not counted
        self._refused = refused
        #: how many executions the next claim may take (from the recent pace)
        self.batch = 1
        #: the recent bodies' pace (what sizes the batch)
        self._pace = batching.Pace(batch_window, batch_size)
        #: claimed, not yet performed: handed on by a completion, or the rest of a batch
        self._queue: deque[Claimed] = deque()
        #: performed successes not yet recorded (the batch's group commit)
        self._group: list[Success] = []
        self._group_started = 0.0
        #: after an idle poll: seconds until time alone may let a poll claim (a rate-blocked
        #: key's next token, a delayed execution's eligible time), if any: ``seconds_to_next_due``
        self.next_due_s: float | None = None
        #: the execution this worker is performing
        self.current: str | None = None
        #: the executions this worker is running (``_run``: one, or async steps awaited together)
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
        held = {claimed.execution_id for claimed in [*self._queue, *self._together]}
        held.update(success.claimed.execution_id for success in list(self._group))
        held.update(running for running in (self.current, self.current_hook) if running is not None)
        return held

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
        done = run_due_hook(self.app, self.process_id, partial(setattr, self, "current_hook"))  # (the hook it holds)
        return None if done is None else Performed(done.hook_id, "on_halt", done.outcome)

    def run_once(self) -> Performed | None:
        """Claim and run one execution (or one batch), then every execution its
        completions hand to this worker (only while ``hand_off()`` says yes, so a stopping
        worker performs only what it already holds). Everything it ran is recorded when
        this returns; when it raises, what failed was crashed, and the executions still
        queued stay held and run at the next call. Never sleeps (except inside the step)."""
        if self._group and not self._queue:
            self._flush()  # successes left unrecorded when an exception left the last call
        # busy or not, a halted run's hook waits at most a second for a poll
        polled = not self._queue and not self._group and time.monotonic() >= self._next_hook_poll
        if polled and (hooked := self._hook()) is not None:
            return hooked
        if not self._queue:
            self._claim()
        if not self._queue:
            self.next_due_s = seconds_to_next_due(self.app)
            return None if polled else self._hook()  # idle: an owed hook is the work
        try:
            return self._run_queued()
        except LeaseLost:  # the watchdog ends the process: nothing more starts here meanwhile
            log.warning("worker %s: lease lost; not starting step code", self.process_id)
            return None
        except Exception:
            raise  # what failed was crashed (_run, _flush); the rest stays held for the next call
        except BaseException:
            self._abandon()  # the thread is leaving: nothing may stay held by it
            raise

    def _run_queued(self) -> Performed | None:
        """Run what is queued, one execution (or one awaited batch: an async step and the
        queued async steps after it, of any lane) at a time, recording the group of successes
        when :func:`batching.flush_due`, until nothing is queued."""
        performed = None
        while self._queue:
            batch = [self._queue.popleft()]
            together = awaitable(batch[0])
            while together and self._queue and awaitable(self._queue[0]):
                batch.append(self._queue.popleft())
            performed = self._run(batch, together=together)
            if self._group and batching.flush_due(bool(self._queue), time.monotonic() - self._group_started,
                                                  self._batch_window):
                self._flush()
        return performed

    def _claim(self) -> None:
        """Claim a batch: unkeyed, as many as the pace says; of a key, no more than the
        thread's share of it (:func:`batching.keyed_batch`: the process's, if its bodies are
        CPU-bound). One that took something wakes one more idle thread: there may be more to
        take."""
        # (a family's share applies to each of its partitions)
        config, cpu_share = self.app.config, self._pace.cpu_share
        entries = [*config.limits.items(), *((family, f.per_partition) for family, f in config.families.items())]
        per_key = {key: batching.keyed_batch(self.batch, entry, self._threads, cpu_share=cpu_share,
                                             processes=config.job_worker.processes) for key, entry in entries}
        claimed = claim_batch(self.app, self.process_id, self.batch, self.batch, per_key, self._refused)
        self._queue_claimed(claimed)
        if claimed:
            self.app.wakeup.notify(1)  # the baton: one more thread looks, not all of them

    def _queue_claimed(self, claimed: list[Claimed]) -> None:
        """Queue what a claim (or hand-off) took. One that spent its key's last token sets
        the process's alarm for the next one (``shared.TokenAlarm``; of a batch of several
        keys, the soonest)."""
        times = [c.next_token_in_s for c in claimed if c.next_token_in_s is not None]
        if self._tokens is not None and times:
            self._tokens.at(min(times))
        self._queue.extend(claimed)

    def _run(self, batch: list[Claimed], *, together: bool) -> Performed:
        """Run claimed executions and record each outcome in order (with batches, successes
        wait for the batch's group commit): one plain step, or (``together``) async steps
        awaited together on the step loop first. On any escape, crash every execution
        of the batch not recorded yet. A claim of async steps then takes ``batch_size``
        executions: they run side by side, so none waits behind its siblings (what pacing a
        batch of plain steps is for)."""
        recorded: set[str] = set()
        self._together = batch
        try:
            if not together:
                faults.hit(faults.AFTER_JOB_CLAIM)
            self._may_start_code()  # [INV-EXE-5] no body starts once the lease is lost
            outcomes = await_together(self.app, batch) if together else [NOT_AWAITED]
            for claimed, outcome in zip(batch, outcomes, strict=True):
                self.current = claimed.execution_id
                performed = Performed(claimed.execution_id, claimed.node, self._perform(claimed, outcome))
                recorded.add(claimed.execution_id)
            if together:
                self.batch = self._batch_size
            return performed
        finally:
            self.current = None
            self._together = []
            self._crash(c for c in batch if c.execution_id not in recorded)  # an exception (or thread exit) escaped

    def _abandon(self) -> None:
        """The thread is leaving run_once (KeyboardInterrupt, SystemExit): crash what this
        worker holds and has not recorded (each re-runs within its crash budget). What
        cannot be crashed now is no longer held, so the runner's reconciliation crashes
        it later."""
        left = [success.claimed for success in self._group] + list(self._queue)
        self._group.clear()
        self._queue.clear()
        self._crash(left)

    def _crash(self, left: Iterable[Claimed], message: str = "execution abandoned by its worker thread") -> None:
        """Crash the executions of ``left`` (each re-runs within its crash budget). If the
        database is unreachable this fails too; the runner's reconciliation crashes the
        orphaned claims once it answers again."""
        for claimed in left:
            record_crash(self.app, claimed.execution_id, claimed.process_id, ABANDONED, message)

    def _flush(self) -> None:
        """Record the group of successes in one transaction; take what it hands on."""
        hand_off = HandOff(self.batch, len(self._group)) if not self._queue and self._hands_off() else None
        try:
            self._record(lambda: record_successes(self.app, self._group, hand_off))
        except CommitFailed as failed:  # a group of one, reaped under it (larger groups log each)
            log.warning("%s", failed)
        except Exception:
            # As for one execution (_run): crash what could not be recorded. The crash is
            # guarded, so the successes that were recorded are left as they are.
            group, self._group = self._group, []
            self._crash((success.claimed for success in group), "success could not be recorded")
            raise
        self._group.clear()

    def _record(self, commit: Callable[[], list[Claimed]]) -> None:
        """Commit successes (repeated on a lost connection) and queue what is handed on."""
        self._queue_claimed(retry_transient(commit))
        faults.hit(faults.AFTER_JOB_COMMIT)

    def _paced(self, seconds: float, cpu_s: float) -> None:
        """Size the next batch from the recent pace (:class:`batching.Pace`)."""
        self.batch = self._pace.note(seconds, cpu_s)

    def _perform(self, claimed: Claimed, awaited: Any = NOT_AWAITED) -> str:
        """Run the step (or take ``awaited``: what its coroutine returned or raised on the
        step loop) and record its outcome; returns the outcome's name."""
        definition = cached_definition(self.app, claimed.definition_sha1)
        try:
            try:
                output = run_step(self.app, claimed, definition, awaited, self._paced)
            except Exception as error:  # noqa: BLE001 - recorded by the failure rules, never lost
                return record_failed(self.app, claimed, error)
            self._succeeded(Success(claimed, output))
            return "success"
        except CommitFailed as failed:
            log.warning("%s", failed)
            return "commit_failed"

    def _succeeded(self, success: Success) -> None:
        """Record a success: with the batch's group commit (batches: :meth:`run_once`
        flushes it), or alone, in one transaction.

        AT-LEAST-ONCE: execute() has run and its side effects are durable. The commit can
        still fail (CommitFailed) if the reaper took the claim; then the reaper's re-run is
        the live execution and the step runs again. Repeated on a lost connection: a commit
        whose acknowledgement was lost is seen as CommitFailed the second time (the guarded
        update matches nothing)."""
        if self._batch_size > 1:
            if not self._group:
                self._group_started = time.monotonic()
            self._group.append(success)
            return
        hand_off = HandOff(self.batch) if self._hands_off() else None
        self._record(lambda: record_successes(self.app, [success], hand_off))
