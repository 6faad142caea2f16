"""Runs: triggering one, watching it, resuming it, and deciding when it is over.

    >>> run = SyncOrders.trigger("2026-01-01")
    >>> run.wait(timeout=60).status
    'completed'

``trigger`` writes, in one transaction, the run (with its definition snapshot),
its start branch, and the start step with its input and first execution: a
trigger either fully happened or not at all.

A run's state follows from its branches [INV-RUN-1]: while any branch is
``in_progress`` or ``advancing`` the run is ``in_progress``; otherwise it is
``dampened`` if a branch waits in ``dampen``, else ``halted`` if a branch
halted, else ``completed`` (``rules.resolve_run_status``, a pure function).
``completed`` and ``halted`` are final. The decision is taken under the run row's
lock by every transaction that ends a branch, so the last two branches to end cannot
both think the other is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ductwork.db import dialects, schema
from ductwork.db.database import default_app
from ductwork.errors import RunStateError, UnknownRunError
from ductwork.pipelines import payloads
from ductwork.pipelines.history import RunHistory, _grouped, run_history
from ductwork.pipelines.hooks import owe_hooks
from ductwork.pipelines.rules import resolve_run_status
from ductwork.pipelines.snapshot import Definition
from ductwork.pipelines.steps import NewStep, create_steps, latest_step, step_output_json
from ductwork.pipelines.trigger import Triggered, trigger, trigger_in
from ductwork.values import Json

if TYPE_CHECKING:
    from ductwork.db.database import Database, Tx

TERMINAL = ("completed", "halted")
SETTLED = ("completed", "halted", "dampened")
_UNSET: Any = object()  # resume() without input


def trigger_run(app: Database | None, pipeline: type, args: list[Json], key: str | None = None,
                connection: Connection | None = None, key_window: object = None) -> Run:
    """Start a run of ``pipeline`` (a Pipeline subclass) with ``args`` as the start step's
    positional arguments, or return the run that holds ``key`` [INV-TRG-1]
    (``ductwork.pipelines.trigger``).

    Without ``connection``, in a transaction of its own, committed on return (with a key,
    retried on a deadlock or a lost connection: a repeat returns the same run). With one,
    through the caller's transaction [INV-TRG-2]: the handle is read through it too (the
    run is not visible elsewhere before the caller commits). Arguments that break the
    payload rule (``payloads.dump``: not JSON, or longer than ``MAX_PAYLOAD_BYTES``) and bad
    keys raise before anything is written.
    """
    app = app or default_app()
    if connection is not None:
        triggered = trigger_in(connection, app, pipeline, args, key, key_window)
    else:
        def once() -> Triggered:
            with app.begin() as tx:
                return trigger(app, tx, pipeline, args, key, key_window)

        triggered = once() if key is None else dialects.retry_transient(once)
    return Run.of(app, triggered, connection)


def cached_definition(app: Database, sha1: str, text: str | None = None, *, tx: Tx | None = None) -> Definition:
    """The parsed definition snapshot with this digest (cached per Database).

    Read, when not cached and ``text`` is not given, through ``tx`` if given, else in
    a read-only transaction of its own. A caller inside a transaction passes it: a
    second connection opened while the first holds SQLite's write lock would wait
    for that lock until ``busy_timeout`` and fail (``database is locked``).
    """
    cached: Definition | None = app._definitions.get(sha1)
    if cached is not None:
        return cached
    if text is None:
        if not app._schema_checked:
            app.check_schema()
        with contextlib.nullcontext(tx) if tx is not None else app.begin(readonly=True) as reading:
            text = reading.execute(sa.select(schema.runs.c.definition)
                                   .where(schema.runs.c.definition_sha1 == sha1).limit(1)).scalar_one()
    parsed = Definition.from_json(json.loads(text))
    app._definitions[sha1] = parsed
    return parsed


def lock_run(tx: Tx, run_id: str) -> str:
    """Lock the run row (FOR NO KEY UPDATE on PostgreSQL) and return its status."""
    r = schema.runs
    status: str = tx.execute(dialects.for_update_run(sa.select(r.c.status).where(r.c.id == run_id),
                                                     tx.conn)).scalar_one()
    return status


def resolve_run(tx: Tx, run_id: str) -> str:
    """Decide the run's state after a branch ended; returns it (:func:`resolve_runs` for
    one run).

    Takes the run row lock (callers that end branches take it earlier, right after
    their fence: see ``advance.Advancer._fence``).
    """
    return resolve_runs(tx, {run_id: lock_run(tx, run_id)})[run_id]


def lock_runs(tx: Tx, run_ids: Iterable[str]) -> dict[str, str]:
    """Lock several run rows in run-id order (one statement) and return their statuses:
    the run lock of a batch that ends branches of several runs. Every batch takes its run
    locks in this order after all its branch locks, so two batches never wait on each other."""
    locked = tx.execute(dialects.prepared(tx.conn, _run_locks), {"batch_ids": sorted(set(run_ids))})
    return {row.id: row.status for row in locked}


def _run_locks(bind: Any) -> sa.Select[Any]:
    r = schema.runs
    return dialects.for_update_run(sa.select(r.c.id, r.c.status).where(r.c.id.in_(dialects.ids_param()))
                                   .order_by(r.c.id), bind)


def resolve_runs(tx: Tx, locked: dict[str, str]) -> dict[str, str]:
    """:func:`resolve_run` for several runs whose rows this transaction locked
    (:func:`lock_runs`, given its result): one read of the branch statuses grouped by
    run, then one UPDATE per resulting status. Returns each run's status. A final run
    is left as it is [INV-RUN-1]."""
    r = schema.runs
    open_runs = sorted(run_id for run_id, status in locked.items() if status not in TERMINAL)  # [INV-RUN-1]
    result = dict(locked)
    if not open_runs:
        return result
    statuses: dict[str, set[str]] = {run_id: set() for run_id in open_runs}
    # Read after the locks: every branch ended by a transaction that held them before us is visible.
    for row in tx.execute(dialects.prepared(tx.conn, _branch_statuses), {"batch_ids": open_runs}):
        statuses[row.run_id].add(row.status)
    moved: dict[str, list[str]] = {}
    for run_id in open_runs:
        new = resolve_run_status(statuses[run_id])
        result[run_id] = new
        if new != locked[run_id]:  # read before write: no needless writes to a shared row
            moved.setdefault(new, []).append(run_id)
    for new, ids in sorted(moved.items()):
        if new == "completed":
            tx.execute(dialects.prepared(tx.conn, _complete_runs), {"batch_ids": ids, "b_now": tx.now})
            continue
        values: dict[str, Any] = {"status": new, "updated_at": tx.now}
        if new == "halted":
            values["halted_at"] = tx.now
        tx.execute(r.update().where(r.c.id.in_(dialects.inline_ids(ids)),
                                    r.c.status.not_in(TERMINAL))  # [INV-RUN-1] a final run never changes
                   .values(**values))
        if new == "halted":
            owe_hooks(tx, ids)  # [INV-HLT-2] the halt's own transaction owes the on_halt hook
    return result


def _branch_statuses(_: Any) -> sa.Select[Any]:
    b = schema.branches
    return (sa.select(b.c.run_id, b.c.status).where(b.c.run_id.in_(dialects.ids_param()))
            .group_by(b.c.run_id, b.c.status))


def _complete_runs(_: Any) -> sa.Update:
    r, now = schema.runs, sa.bindparam("b_now", type_=schema.Timestamp)
    return (r.update().where(r.c.id.in_(dialects.ids_param()),
                             r.c.status.not_in(TERMINAL))  # [INV-RUN-1] a final run never changes
            .values(status="completed", updated_at=now, completed_at=now))


#: a run's status: ``in_progress`` until every branch ended, then one of the other three
RunStatus = Literal["in_progress", "completed", "halted", "dampened"]
#: a step's status: its code runs while ``in_progress``; ``advancing`` once it succeeded and
#: until the branch moved past it; ``completed`` then; ``failed`` when its budget was spent
StepStatus = Literal["in_progress", "advancing", "completed", "failed"]


@dataclass(frozen=True)
class StepError:
    """How one execution of a step ended badly, as ``StepInfo.error`` reports it."""

    #: ``module.QualName`` of the exception (``ductwork.AbandonedClaim``, ``ProcessCrash``, ...
    #: for crashes ductwork detected itself)
    klass: str
    #: the exception's text, cut to 255 characters
    message: str
    #: ``failure`` (raised), ``timed_out`` (ran past ``timeout=``) or ``process_crashed``
    outcome: str


@dataclass(frozen=True, kw_only=True)
class StepInfo:
    """A step of a run, as ``Run.steps()`` reports it: a snapshot, not a live view."""

    id: str
    branch_id: str
    #: the node's name in the definition: the class name and its position (``Charge#1``)
    node: str
    #: the step class, ``module:QualName``
    klass: str
    status: StepStatus
    #: the transition that created the step (``start``, ``chain``, ``expand``, ...)
    to_transition: str
    #: the positional arguments the step's ``__init__`` got
    input: list[Json]
    #: what ``execute`` returned; None before a success
    output: Json
    #: the error of the step's latest finished execution; None when that one succeeded or
    #: none has finished (a step retried after a failure shows the failure while it waits)
    error: StepError | None
    #: executions claimed so far: the first run, retries and re-runs after crashes
    attempts: int
    #: when the step was created (its job became eligible then, or after its ``delay=``)
    created_at: datetime
    #: when its first execution was claimed; None while none was
    started_at: datetime | None
    #: when it completed, or when its last execution failed for good; None before
    finished_at: datetime | None
    #: what ``Step.idempotency_key`` returns to its executions: the step's id, or for a step a
    #: revive re-enqueued, the key of the failed step it re-runs
    idempotency_key: str


class Run:
    """A handle on one run. Attributes reflect the last :meth:`refresh` (a trigger's
    handle: the run as the trigger wrote it, or found it)."""

    app: Database
    id: str
    status: RunStatus
    #: the pipeline class, ``module:QualName``
    pipeline: str
    triggered_at: datetime
    #: why each halted branch halted (e.g. ``job_retries_exhausted``), sorted; empty
    #: while no branch has halted
    halt_reasons: list[str]

    def __init__(self, app: Database, run_id: str | None = None, *, _read: bool = True):
        if isinstance(app, str) or run_id is None:
            # Run("…") reads as "the run with this id"; Python's own message ("missing
            # 'run_id'") would not say that the App comes first
            named = repr(app) if isinstance(app, str) else "RUN_ID"
            raise TypeError(f"Run(app, run_id) takes the App first; for a handle on run "
                            f"{named} use app.run({named})")
        self.app = app
        self.id = run_id
        if _read:
            self.refresh()

    @classmethod
    def of(cls, app: Database, triggered: Triggered, conn: Connection | None = None) -> Run:
        """The handle a trigger returns: a run it wrote is as it wrote it (in progress,
        nothing halted: no read); the run that holds the key is read, through ``conn`` when
        the trigger ran in the caller's open transaction (the run may not be committed yet),
        else through the app. :meth:`refresh` later reads through the app."""
        run = cls(app, triggered.run_id, _read=False)
        if triggered.written is None:
            return run.refresh() if conn is None else run._read(conn)
        (run.pipeline, run.triggered_at), run.status, run.halt_reasons = triggered.written, "in_progress", []
        return run

    def refresh(self) -> Run:
        """Read the run's status, pipeline, trigger time and halt reasons again; returns self."""
        with self.app.begin(readonly=True) as tx:
            return self._read(tx.conn)

    async def arefresh(self) -> Run:
        """:meth:`refresh`, awaited: the same reads through the async driver
        (``Database.aread``), never blocking the event loop; returns self. Like every async
        method, checks first that the async client's modules import
        (:class:`~ductwork.errors.MissingExtraError`, ``pip install 'ductwork[async]'``)."""
        self.app.require_async("Run.arefresh")
        await self.app.aread(self._read)
        return self

    def _read(self, conn: Connection) -> Run:
        b, r = schema.branches, schema.runs
        row = conn.execute(
            sa.select(r.c.status, r.c.pipeline_klass, r.c.triggered_at).where(r.c.id == self.id)
        ).first()
        if row is None:
            raise UnknownRunError(self.id)
        self.halt_reasons = sorted(conn.execute(sa.select(b.c.halt_reason).where(
            b.c.run_id == self.id, b.c.status == "halted", b.c.halt_reason.is_not(None))).scalars())
        self.status, self.pipeline, self.triggered_at = row.status, row.pipeline_klass, row.triggered_at
        return self

    def wait(self, timeout: float, poll: float = 0.1) -> Run:
        """Block until the run is completed, halted or dampened; TimeoutError after ``timeout`` s.

        Needs a fleet (``ductwork start``) or another thread doing the work; tests use
        ``ductwork.testing.drain`` instead.
        """
        deadline = time.monotonic() + timeout
        while self.refresh().status not in SETTLED:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"run {self.id} still {self.status} after {timeout} s")
            time.sleep(poll)
        return self

    async def await_completion(self, timeout: float, poll: float = 0.1) -> Run:
        """:meth:`wait`, awaited: until the run is completed, halted or dampened (the same
        three statuses), polling with :meth:`arefresh` every ``poll`` s and sleeping with
        ``asyncio.sleep``, so the event loop runs on; TimeoutError after ``timeout`` s.
        Cancelling the awaiting task stops the polling (the run goes on)."""
        self.app.require_async("Run.await_completion")
        deadline = time.monotonic() + timeout
        while (await self.arefresh()).status not in SETTLED:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"run {self.id} still {self.status} after {timeout} s")
            await asyncio.sleep(poll)
        return self

    def steps(self) -> list[StepInfo]:
        """Every step of the run, in start order, with inputs and outputs (an expanding
        step's output is the list it returned; None before a success), its latest error,
        attempts and times. One read-only transaction: a consistent snapshot."""
        s, x, e = schema.steps, schema.expand_items, schema.executions
        with self.app.begin(readonly=True) as tx:
            rows = tx.execute(
                sa.select(s.c.id, s.c.branch_id, s.c.node, s.c.klass, s.c.status, s.c.to_transition,
                          s.c.input_args, s.c.output_payload, s.c.created_at, s.c.completed_at,
                          schema.step_idempotency_key(s).label("idempotency_key"))
                .where(s.c.run_id == self.id)
                .order_by(s.c.started_at, s.c.id)
            ).all()
            # output_payload is {"payload": value}, or {"expand_items": n} with the items in their table
            payloads = {row.id: json.loads(row.output_payload) for row in rows if row.output_payload}
            items: dict[str, list[Any]] = {step: [] for step, p in payloads.items() if "expand_items" in p}
            if items:
                for item in tx.execute(sa.select(x.c.step_id, x.c.value).where(x.c.step_id.in_(list(items)))
                                       .order_by(x.c.step_id, x.c.item_index)):
                    items[item.step_id].append(json.loads(item.value))
            executions = _grouped(tx.execute(
                sa.select(e.c.step_id, e.c.claimed_at, e.c.completed_at, e.c.outcome, e.c.error_klass,
                          e.c.error_message)
                .join(s, s.c.id == e.c.step_id)
                .where(s.c.run_id == self.id)
                .order_by(e.c.created_at, e.c.id)
            ), "step_id")
        return [_step_info(row, items[row.id] if row.id in items
                           else payloads.get(row.id, {}).get("payload"), executions.get(row.id, []))
                for row in rows]

    def history(self, *, backtraces: bool = False) -> RunHistory:
        """The run's branches, steps, executions, errors, timings, limit keys and waits as
        typed records (what ``ductwork show`` prints), in one read-only transaction.
        ``backtraces``: include each error's traceback. Raises UnknownRunError once the run
        was pruned."""
        return run_history(self.app, self.id, backtraces=backtraces)

    def definition(self) -> Definition:
        """The definition snapshot this run follows: frozen when it was triggered (a revived
        run shares its halted run's), whatever ``define`` says now. One read-only
        transaction (the parse is cached per Database); UnknownRunError once the run was pruned."""
        r = schema.runs
        with self.app.begin(readonly=True) as tx:
            sha1 = tx.execute(sa.select(r.c.definition_sha1).where(r.c.id == self.id)).scalar_one_or_none()
            if sha1 is None:
                raise UnknownRunError(self.id)
            return cached_definition(self.app, sha1, tx=tx)

    def resume(self, input: Json = _UNSET) -> Run:  # noqa: A002 - public API name
        """Continue a dampened run: every dampened branch gets its next step.

        The next step's input is ``input`` if given (it replaces the previous step's
        output; ``None`` is a value), else the output of the step before the dampen.
        Exactly once: a second resume finds no dampened branch and raises
        :class:`RunStateError`.
        """
        value_json = payloads.dump(input, f"run {self.id} resume input") if input is not _UNSET else None
        r, b = schema.runs, schema.branches
        with self.app.begin() as tx:
            run = tx.execute(
                dialects.for_update_run(sa.select(r.c.status, r.c.definition_sha1).where(r.c.id == self.id),
                                        tx.conn)
            ).first()
            if run is None:
                raise RunStateError(f"run {self.id} does not exist")
            dampened = tx.execute(
                sa.select(b.c.id).where(b.c.run_id == self.id, b.c.status == "dampened").order_by(b.c.id)
            ).scalars().all()
            if run.status in TERMINAL or not dampened:
                raise RunStateError(f"run {self.id} is {run.status} with no dampened branch; nothing to resume")
            definition = cached_definition(self.app, run.definition_sha1, tx=tx)  # this connection: see there
            new = []
            for branch_id in dampened:
                step = latest_step(tx, branch_id)
                assert step is not None, branch_id  # (its dampen step, completed)
                args = "[" + (value_json if value_json is not None else step_output_json(tx, step.id)) + "]"
                new.append(NewStep(branch_id, definition.edges[step.node].first(), "dampen", args))
                moved = tx.execute(
                    b.update().where(b.c.id == branch_id, b.c.status == "dampened")
                    .values(status="in_progress", last_advanced_at=tx.now, updated_at=tx.now)
                )
                if moved.rowcount != 1:  # pragma: no cover  only resume, under the run lock, moves a dampened branch
                    raise RunStateError(f"run {self.id}: branch {branch_id} was resumed concurrently")
            create_steps(tx, self.id, definition, new)
            tx.execute(r.update().where(r.c.id == self.id).values(status="in_progress", updated_at=tx.now))
        return self.refresh()

    async def aresume(self, input: Json = _UNSET) -> Run:  # noqa: A002 - public API name
        """:meth:`resume`, awaited: the same one transaction, run in a thread
        (``asyncio.to_thread``) so the event loop runs on, as ``Pipeline.atrigger`` does;
        returns self. The same exactly-once: a second resume raises
        :class:`RunStateError`. Cancelling the awaiting task does not undo a resume the
        thread has begun (it commits or rolls back on its own)."""
        self.app.require_async("Run.aresume")
        return await asyncio.to_thread(self.resume, input)

    def revive(self, duplicate_context: bool = False) -> Run:
        """Continue this halted run as a new run; returns the new run (this one stays halted).

        One transaction: the new run, on the same definition snapshot, carries every
        branch and step over as history (no succeeded step runs or advances again) and
        resumes each halted branch where it stopped: a failed step is enqueued again with
        its original input, a fresh retry and crash budget and the same
        ``idempotency_key``; a step where advancing failed is advanced again. The context
        is copied only with ``duplicate_context``. Exactly once: reviving the same run
        again, from any process, returns the run that revived it and writes nothing.
        Raises :class:`~ductwork.errors.ReviveError` (naming the run and its status) when
        the run is not halted (running, completed, dampened) or does not exist.
        """
        from ductwork.pipelines.revive import revive_run

        return Run(self.app, revive_run(self.app, self.id, duplicate_context))

    def __repr__(self) -> str:
        return f"Run({self.id!r}, pipeline={self.pipeline!r}, status={self.status!r})"


def _step_info(row: sa.Row[Any], output: Any, executions: list[sa.Row[Any]]) -> StepInfo:
    """One StepInfo from its step row and its executions in creation order."""
    claimed = [x.claimed_at for x in executions if x.claimed_at is not None]
    ended = [x for x in executions if x.completed_at is not None]
    last = ended[-1] if ended else None
    error = None if last is None or last.outcome == "success" else StepError(
        klass=last.error_klass or "", message=last.error_message or "", outcome=last.outcome)
    # a failed step finished when its last execution failed for good
    finished = row.completed_at or (last.completed_at if row.status == "failed" and last is not None else None)
    return StepInfo(id=row.id, branch_id=row.branch_id, node=row.node, klass=row.klass, status=row.status,
                    to_transition=row.to_transition, input=json.loads(row.input_args), output=output,
                    error=error, attempts=len(claimed), created_at=row.created_at,
                    started_at=min(claimed) if claimed else None, finished_at=finished,
                    idempotency_key=row.idempotency_key)
