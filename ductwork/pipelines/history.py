"""A run's history without SQL: what ``ductwork runs`` and ``ductwork show`` print.

    >>> for record in list_runs(app, status="halted", limit=10):
    ...     print(record.id, record.pipeline, record.halt_reasons)
    >>> history = run.history(backtraces=True)     # a RunHistory
    >>> [(s.node, s.status, s.wait) for s in history.steps]

Every record is a frozen dataclass whose fields name the columns a query selects
(:func:`_columns`) and reads back by name (:func:`_record`); the CLI renders these and
nothing else, so the command line and Python see one truth.

Guarantees: each call is one read-only transaction (a consistent snapshot as of
the database time ``now`` it reports); it writes nothing and creates nothing (a
missing table or SQLite file raises :class:`~ductwork.errors.MissingTablesError`).
A run that does not exist (never triggered, or pruned by ``ductwork prune``)
raises :class:`~ductwork.errors.UnknownRunError`; a bad filter raises
:class:`~ductwork.errors.RunFilterError` naming the value.

Not done: payloads (step inputs and outputs) are not part of the history
(``Run.steps()`` has them); a key's rate tokens are ``ductwork status``'s; the
``wait`` of a step is what the rows say at ``now``, not a prediction (a step
queued behind a free key is claimed by the next worker poll).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import sqlalchemy as sa

from ductwork.db import schema
from ductwork.durations import parse_period
from ductwork.errors import DurationError, RunFilterError, UnknownRunError
from ductwork.limit_entries import has_whitespace_around

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from _typeshed import DataclassInstance

    from ductwork.db.database import Database, Tx
    from ductwork.limit_entries import LimitEntry

#: the statuses ``list_runs(status=…)`` and ``ductwork runs --status`` accept
RUN_STATUSES = ("in_progress", "dampened", "completed", "halted")
#: ``list_runs``'s default and largest ``limit``
DEFAULT_LIMIT = 50
MAX_LIMIT = 10_000
#: a record type (:func:`_record`)
R = TypeVar("R", bound="DataclassInstance")

#: what a step or branch waits for (``Wait.kind``):
#: ``delay``: its execution is not eligible before ``until`` (``delay=``, retry or crash back-off);
#: ``concurrency``: its key has ``in_flight`` of ``concurrency`` executions running;
#: ``rate``: its key is rate-blocked until ``until``;
#: ``queued``: eligible and nothing in the rows holds it back (the next worker poll claims it);
#: ``running``: an execution is claimed and running since ``since``;
#: ``advance``: it succeeded and waits for an advancer to move its branch on;
#: ``resume``: its branch is dampened and waits for ``Run.resume`` (``ductwork`` has no timer for it)
WaitKind = Literal["delay", "concurrency", "rate", "queued", "running", "advance", "resume"]


@dataclass(frozen=True, kw_only=True)
class Wait:
    """What holds a step (or a dampened branch) back at ``RunHistory.now``."""

    kind: WaitKind
    #: the step's limit key (``concurrency``, ``rate``, ``queued``, ``running``); None: unkeyed
    key: str | None = None
    #: ``delay`` and ``rate``: the moment the wait ends (database time)
    until: datetime | None = None
    #: ``running``: when the execution was claimed
    since: datetime | None = None
    #: ``concurrency``: executions of the key in flight, and the key's configured concurrency
    in_flight: int | None = None
    concurrency: int | None = None


@dataclass(frozen=True, kw_only=True)
class ErrorRecord:
    """An exception a step execution or an advancement ended with."""

    #: ``module.QualName`` of the exception
    klass: str
    #: its text, cut to 255 characters
    message: str
    #: the formatted traceback; None unless asked for (``backtraces=True``, ``--backtrace``)
    backtrace: str | None


@dataclass(frozen=True, kw_only=True)
class ExecutionRecord:
    """One attempt at a step's job (the first run, a retry, a re-run after a crash)."""

    id: str
    #: the key it was claimed under; None: the unkeyed lane
    limit_key: str | None
    eligible_at: datetime
    claimed_at: datetime | None
    completed_at: datetime | None
    #: success | failure | timed_out | process_crashed; None while pending or running
    outcome: str | None
    error: ErrorRecord | None
    retry_count: int
    crash_count: int


@dataclass(frozen=True, kw_only=True)
class AdvancementRecord:
    """An advancer's attempt to move a branch past a step that ended with an error (an
    invalid transition, an advancer crash); successful advancements are not listed."""

    step_id: str
    started_at: datetime
    completed_at: datetime | None
    error: ErrorRecord
    crash_count: int


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """A step of the run with every execution of it, in creation order."""

    id: str
    branch_id: str
    node: str
    klass: str
    #: in_progress | advancing | completed | failed
    status: str
    #: the transition that created it (start, chain, expand, dampen, ...)
    to_transition: str
    limit_key: str | None
    created_at: datetime
    completed_at: datetime | None
    executions: tuple[ExecutionRecord, ...]
    #: what holds it back now; None when it is completed or failed
    wait: Wait | None
    #: what ``Step.idempotency_key`` returns to its executions: its id, or for a step a
    #: revive re-ran, the key of the failed step it re-runs
    idempotency_key: str
    #: the halted run it was carried over from by a revive, as history: its executions are
    #: that run's (``executions`` is empty); None: created, or re-run, in this run. The run
    #: it names may have been pruned since.
    carried_from: str | None = None


@dataclass(frozen=True, kw_only=True)
class BranchRecord:
    """A thread of the run: the start branch, a fan-out child or a fan-in target."""

    id: str
    #: in_progress | advancing | dampened | completed | halted
    status: str
    #: why it halted (job_retries_exhausted, transition_invalid, ...); None unless halted
    halt_reason: str | None
    #: the branch whose fan-out created it, and its position there; None: top level or a fan-in target
    parent_id: str | None
    barrier_index: int | None
    started_at: datetime
    completed_at: datetime | None
    #: the failed advancements of this branch, oldest first
    advancement_errors: tuple[AdvancementRecord, ...]
    #: ``resume`` while dampened; None otherwise
    wait: Wait | None


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """One run as ``list_runs`` and ``ductwork runs`` report it."""

    id: str
    #: the pipeline class, ``module:QualName``
    pipeline: str
    #: in_progress | dampened | completed | halted
    status: str
    triggered_at: datetime
    completed_at: datetime | None
    halted_at: datetime | None
    #: the halted run this run was revived from; None: triggered. The run it names may
    #: have been pruned since (``ductwork prune``), so it may not exist any more.
    revived_from: str | None
    #: why each halted branch halted, sorted; empty unless a branch halted
    halt_reasons: tuple[str, ...]
    #: the run revived from this one (at most one: ``uq_run_revived_from``); None while
    #: not revived (or once that run is pruned)
    revived_as: str | None = None

    @property
    def finished_at(self) -> datetime | None:
        """When it completed or halted; None while in progress or dampened."""
        return self.completed_at or self.halted_at


@dataclass(frozen=True, kw_only=True)
class HookRecord:
    """The ``on_halt`` hook a halted run owes (docs/semantics.md §6): one per halted run
    whose definition names a handler."""

    id: str
    #: the handler, ``module:qualname``
    klass: str
    #: pending | running | succeeded | failed (the last two are final: the recorded outcome)
    status: str
    retry_count: int
    crash_count: int
    #: success | failure | invalid | process_crashed; None before the first attempt ends
    last_outcome: str | None
    #: the last failed attempt's error; None if none failed
    error: ErrorRecord | None
    eligible_at: datetime
    completed_at: datetime | None


@dataclass(frozen=True, kw_only=True)
class RunHistory:
    """Everything ``ductwork show`` prints about one run, as of ``now`` (database time)."""

    now: datetime
    run: RunRecord
    branches: tuple[BranchRecord, ...]
    #: every step, in start order
    steps: tuple[StepRecord, ...]
    #: the run's context keys, sorted (their values are ``Context``'s)
    context_keys: tuple[str, ...]
    #: its ``on_halt`` hook; None unless it halted with a handler declared
    hook: HookRecord | None = None


# --------------------------------------------------------------------------- rows


def _columns(table: sa.Table, cls: type[DataclassInstance], backtraces: bool = False,
             **named: sa.ColumnElement[Any]) -> list[sa.ColumnElement[Any]]:
    """What :func:`_record` reads for ``cls`` from a row of ``table``: for each field, the column
    of its name or the expression ``named`` gives (labelled with it), and for an ``error`` field
    the error columns (the traceback only with ``backtraces``, else NULL). A field of neither
    (a record's parts, read from other rows) is given to :func:`_record`."""
    names = [field.name for field in fields(cls)]
    columns: list[sa.ColumnElement[Any]] = [named[name].label(name) if name in named else table.c[name]
                                            for name in names if name in named or name in table.c]
    if "error" in names:
        columns += [table.c.error_klass, table.c.error_message,
                    (table.c.error_backtrace if backtraces else sa.null()).label("error_backtrace")]
    return columns


def _record(cls: type[R], row: sa.Row[Any], **values: Any) -> R:
    """A record of ``cls`` from a query row, each field read by its column's name (never
    by position; a column the query does not select raises KeyError) unless ``values``
    gives it; a record with an ``error`` gets one from the ``error_klass``,
    ``error_message`` and ``error_backtrace`` columns (None without a class)."""
    columns, names = row._mapping, [field.name for field in fields(cls)]
    if "error" in names:
        values["error"] = None if columns["error_klass"] is None else ErrorRecord(
            klass=columns["error_klass"], message=columns["error_message"] or "", backtrace=columns["error_backtrace"])
    return cls(**{name: columns[name] for name in names if name not in values}, **values)


#: a run's columns, as :class:`RunRecord`'s fields
_RUN_COLUMNS = _columns(schema.runs, RunRecord, pipeline=schema.runs.c.pipeline_klass)


def _grouped(rows: Iterable[sa.Row[Any]], key: str) -> dict[str, list[sa.Row[Any]]]:
    """``rows`` by their column ``key``, each list in the rows' order."""
    grouped: dict[str, list[sa.Row[Any]]] = {}
    for row in rows:
        grouped.setdefault(row._mapping[key], []).append(row)
    return grouped


def _run_records(tx: Tx, rows: Sequence[sa.Row[Any]]) -> list[RunRecord]:
    """The records of run rows read with :data:`_RUN_COLUMNS`: each with why its halted branches
    halted, sorted (every halt writes its reason), and the run revived from it (by
    ``uq_run_revived_from``). A halted branch's reason is in any run not completed (in progress
    or dampened too); a revival only of a halted run, one of them."""
    b, r = schema.branches, schema.runs
    ids = [row.id for row in rows if row.status != "completed"]  # (the others have neither)
    halted = _grouped(tx.execute(sa.select(b.c.run_id, b.c.halt_reason).where(
        b.c.run_id.in_(ids), b.c.status == "halted", b.c.halt_reason.is_not(None))), "run_id") if ids else {}
    revivals = {row.revived_from: row.id for row in tx.execute(sa.select(r.c.id, r.c.revived_from)
                                                               .where(r.c.revived_from.in_(ids)))}
    return [_record(RunRecord, row, halt_reasons=tuple(sorted(x.halt_reason for x in halted.get(row.id, []))),
                    revived_as=revivals.get(row.id)) for row in rows]


# --------------------------------------------------------------------------- filters


def parse_since(value: str, now: datetime) -> datetime:
    """``--since``: a duration back from ``now`` (``"90m"``, ``"1d"``: the project's duration
    grammar) or an ISO 8601 moment (``2026-01-01``, ``2026-01-01T12:00:00+02:00``; without an
    offset it is UTC). Returns naive UTC; :class:`RunFilterError` naming the value otherwise."""
    with contextlib.suppress(DurationError):
        return now - timedelta(seconds=parse_period(value))
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}([T ][0-9:.]+([+-]\d{2}:?\d{2}|Z)?)?", value):
        with contextlib.suppress(ValueError):
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
            return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment
    raise RunFilterError("--since", value, "expected a duration back from now (e.g. '90m', '1d', '1w') "
                                           "or an ISO 8601 time (e.g. '2026-01-01T12:00:00Z')")


def of_pipeline(pipeline: str) -> sa.ColumnElement[bool]:
    """Runs of ``pipeline``: ``module:QualName`` exactly, or a bare class name as the part
    after the colon (``ductwork runs --pipeline``, ``ductwork prune --pipeline``).
    :class:`RunFilterError` for a name with whitespace around it, which no pipeline has:
    MySQL-family would match ``"m:Ledger "`` to ``m:Ledger``'s runs (PAD SPACE)."""
    if has_whitespace_around(pipeline):
        raise RunFilterError("--pipeline", pipeline, "a pipeline's name has no whitespace around it")
    klass = schema.runs.c.pipeline_klass
    return klass == pipeline if ":" in pipeline else klass.endswith(f":{pipeline}", autoescape=True)


def list_runs(app: Database, *, status: str | None = None, pipeline: str | None = None,
              since: str | datetime | None = None, limit: int = DEFAULT_LIMIT,
              before: tuple[datetime, str] | None = None) -> list[RunRecord]:
    """Runs, newest trigger first: at most ``limit`` (1..MAX_LIMIT) of them, of ``status``
    (one of RUN_STATUSES) and ``pipeline`` (``module:QualName``, or the bare class name) if
    given, triggered at or after ``since`` (a datetime in naive UTC, or :func:`parse_since`'s
    text). One read-only transaction.

    ``before``: keyset pagination, the ``(triggered_at, id)`` of the last run of the page
    before (``(page[-1].triggered_at, page[-1].id)``): only runs after it in this order.
    Each page is one range of an index on ``triggered_at``, as fast on the ten-thousandth
    page as on the first, and no run is listed on two pages."""
    if status is not None and status not in RUN_STATUSES:
        raise RunFilterError("--status", status, f"expected one of {', '.join(RUN_STATUSES)}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise RunFilterError("--limit", limit, f"expected a whole number from 1 to {MAX_LIMIT}")
    r = schema.runs
    with app.begin(readonly=True) as tx:
        query = sa.select(*_RUN_COLUMNS)
        if status is not None:
            query = query.where(r.c.status == status)
        if pipeline is not None:
            query = query.where(of_pipeline(pipeline))
        if since is not None:
            query = query.where(r.c.triggered_at >= (since if isinstance(since, datetime)
                                                     else parse_since(since, tx.now)))
        if before:  # after the previous page's last run, in (triggered_at, id) order
            query = query.where(sa.tuple_(r.c.triggered_at, r.c.id) < tuple(before))
        return _run_records(tx, tx.execute(query.order_by(r.c.triggered_at.desc(), r.c.id.desc()).limit(limit)).all())


# --------------------------------------------------------------------------- one run


def run_history(app: Database, run_id: str, *, backtraces: bool = False) -> RunHistory:
    """The run's branches, steps, executions, errors, timings, limit keys and waits, in one
    read-only transaction. ``backtraces``: include each error's traceback (else None)."""
    s, e, a, b, h = schema.steps, schema.executions, schema.advancements, schema.branches, schema.halt_hooks
    with app.begin(readonly=True) as tx:
        run = tx.execute(sa.select(*_RUN_COLUMNS).where(schema.runs.c.id == run_id)).first()
        if run is None:
            raise UnknownRunError(run_id)
        branch_rows = tx.execute(sa.select(*_columns(b, BranchRecord)).where(b.c.run_id == run_id)
                                 .order_by(b.c.started_at, b.c.id)).all()
        step_rows = tx.execute(sa.select(*_columns(s, StepRecord, idempotency_key=schema.step_idempotency_key(s)))
                               .where(s.c.run_id == run_id).order_by(s.c.started_at, s.c.id)).all()
        # the run's executions by step id, oldest first
        executions = _grouped(tx.execute(
            sa.select(e.c.step_id, *_columns(e, ExecutionRecord, backtraces))
            .join(s, s.c.id == e.c.step_id).where(s.c.run_id == run_id).order_by(e.c.created_at, e.c.id)), "step_id")
        # the run's failed advancements by branch id, oldest first
        advancements = _grouped(tx.execute(
            sa.select(a.c.branch_id, *_columns(a, AdvancementRecord, backtraces)).join(b, b.c.id == a.c.branch_id)
            .where(b.c.run_id == run_id, a.c.error_klass.is_not(None)).order_by(a.c.started_at, a.c.id)), "branch_id")
        waits = _Waits.read(tx, app.config.entry_for, executions)
        context_keys = tuple(sorted(tx.execute(sa.select(schema.context.c.key)
                                               .where(schema.context.c.run_id == run_id)).scalars()))
        hook = tx.execute(sa.select(*_columns(h, HookRecord, backtraces)).where(h.c.run_id == run_id)).first()
        record = _run_records(tx, [run])[0]
    # In a revived run a step without executions of its own was carried over from the halted
    # run (INV-REV-2: a revive copies steps without their executions, and every step created
    # in a run is created with its first one).
    steps = tuple(_record(StepRecord, row, executions=tuple(_record(ExecutionRecord, x) for x in mine),
                          wait=waits.of(row.status, mine), carried_from=None if mine else run.revived_from)
                  for row in step_rows for mine in [executions.get(row.id, [])])
    branches = tuple(
        _record(BranchRecord, row, advancement_errors=tuple(_record(AdvancementRecord, x)
                                                            for x in advancements.get(row.id, [])),
                wait=Wait(kind="resume") if row.status == "dampened" else None)
        for row in branch_rows)
    return RunHistory(now=waits.now, run=record, branches=branches, steps=steps, context_keys=context_keys,
                      hook=None if hook is None else _record(HookRecord, hook))


@dataclass(frozen=True)
class _Waits:
    """What the rows say about the limit keys of the run's unfinished executions, at ``now``."""

    now: datetime
    #: a key's entry (a partition's: its family's ``per_partition``)
    limits: Callable[[str], LimitEntry | None]
    #: executions in flight per key
    in_flight: dict[str, int]
    #: each key's ``blocked_until`` (rate)
    blocked: dict[str, datetime | None]

    @classmethod
    def read(cls, tx: Tx, limits: Callable[[str], LimitEntry | None],
             executions: dict[str, list[sa.Row[Any]]]) -> _Waits:
        e, k = schema.executions, schema.limit_keys
        keys = sorted({x.limit_key for xs in executions.values() for x in xs
                       if x.limit_key is not None and x.completed_at is None})
        if not keys:
            return cls(tx.now, limits, {}, {})
        in_flight = {row.inflight_key: row.n for row in tx.execute(
            sa.select(e.c.inflight_key, sa.func.count().label("n"))
            .where(e.c.inflight_key.in_(keys)).group_by(e.c.inflight_key))}
        blocked = {row.key: row.blocked_until for row in tx.execute(
            sa.select(k.c.key, k.c.blocked_until).where(k.c.key.in_(keys)))}
        return cls(tx.now, limits, in_flight, blocked)

    def of(self, status: str, mine: list[sa.Row[Any]]) -> Wait | None:
        """What holds a step of ``status`` (with its executions ``mine``) back; None when nothing does."""
        if status == "advancing":
            return Wait(kind="advance")
        if status != "in_progress" or not mine or mine[-1].completed_at is not None:
            return None
        last = mine[-1]
        if last.claimed_at is not None:
            return Wait(kind="running", key=last.limit_key, since=last.claimed_at)
        if last.eligible_at > self.now:
            return Wait(kind="delay", key=last.limit_key, until=last.eligible_at)
        if last.limit_key is not None:
            until = self.blocked.get(last.limit_key)
            if until is not None and until > self.now:
                return Wait(kind="rate", key=last.limit_key, until=until)
            entry = self.limits(last.limit_key)
            running = self.in_flight.get(last.limit_key, 0)
            if entry is not None and entry.concurrency is not None and running >= entry.concurrency:
                return Wait(kind="concurrency", key=last.limit_key, in_flight=running,
                            concurrency=entry.concurrency)
        return Wait(kind="queued", key=last.limit_key)
