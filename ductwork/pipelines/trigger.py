"""Triggering a run: the run, its start branch, start step, job and first execution,
written in one transaction (ductwork's own or the caller's), at most once per pipeline
and trigger key.

    run = Orders.trigger(order_id, key=f"order-{order_id}")   # a second call returns this run
    with engine.begin() as conn:                                # the caller's transaction
        conn.execute(orders.insert().values(id=order_id))
        Orders.trigger(order_id, connection=conn)               # commits (or not) with the order

What is written is the model's ``PipelinesModel.trigger``: the run row (with its
definition snapshot and its key), the start branch, and the start step with its input and
first execution; a trigger either fully happened or not at all.

Idempotent [INV-TRG-1]: a trigger with ``key`` first looks for the run of its pipeline
holding that key and returns it, writing nothing (the arguments are not compared: the
first trigger's win). The unique index ``uq_run_trigger_key`` on ``(pipeline_klass,
trigger_key)`` is the guarantee behind the look-up: of callers racing with one key whose
look-ups all found nothing, one inserts the run and the index refuses the others (on
PostgreSQL and MySQL the loser's insert waits for the winner's commit). The refusal is
mapped by name (``dialects.translate_db_errors``) to
:class:`~ductwork.errors.TriggeredConcurrently`; the insert ran in a savepoint
(``dialects.statement_savepoint``), so the transaction goes on and reads the winner's run.
A key is held as long as its run exists: ``ductwork prune`` deletes the row and frees the
key. With ``key_window`` (a positive duration) a trigger may also take the key from its
run: when that run finished (completed or halted; a dampened or running run never) at
least the window before the transaction's database time (``rules.key_expired``), a
conditional UPDATE fenced on the run's id, key, status and finish time sets its
``trigger_key`` NULL (the run keeps its history), checked by row count, and a new run is
inserted with the key in the same transaction. Racing windowed triggers: the index still
decides; a loser's UPDATE matches no row once the winner committed (PostgreSQL and MySQL
re-read the locked row; SQLite writers are serialized), and it reads the winner's run (or
gets :class:`TriggeredConcurrently` when its snapshot is older).

In the caller's transaction [INV-TRG-2]: :func:`trigger_in` writes through the caller's
SQLAlchemy ``Connection`` and never commits or rolls back: nothing is visible to others
before the caller commits, and a rollback leaves nothing. Workers learn of the run once it
is committed: on PostgreSQL by the transaction's ``NOTIFY`` (delivered at commit, never
before, never after a rollback); on MySQL and SQLite, which have no such channel, at their
next poll (``job_worker.polling_timeout``). ``AsyncConnection.run_sync`` can call it.

Not done: comparing arguments, checking
that the caller's connection reaches the app's database (only its kind is compared), or
retrying the caller's transaction (a trigger in ductwork's own transaction with a key is
retried on a deadlock or a lost connection: it is idempotent).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ductwork.db import dialects, schema
from ductwork.db.database import Tx
from ductwork.db.ids import new_id
from ductwork.durations import parse_interval_us
from ductwork.errors import (
    DefinitionError,
    DurationError,
    TriggerConnectionError,
    TriggeredConcurrently,
    TriggerKeyError,
    TriggerKeyWindowError,
)
from ductwork.pipelines import payloads
from ductwork.pipelines.rules import KeyHolder, key_expired
from ductwork.pipelines.steps import NewStep, create_branches, create_steps, limit_key
from ductwork.values import Json

if TYPE_CHECKING:
    from ductwork.db.database import Database
    from ductwork.pipelines.snapshot import Definition

_r = schema.runs


@dataclass(frozen=True)
class Triggered:
    """What a trigger did: the run it returns and, when it wrote that run, the pipeline's
    name and the trigger time it wrote (None: the run that holds the key, found; nothing
    written)."""

    run_id: str
    written: tuple[str, datetime] | None = None


def check_key(pipeline: str, key: object) -> str | None:
    """``key`` if it may be a trigger key, else :class:`TriggerKeyError` naming ``pipeline``
    and the key: a non-empty string of at most 255 characters, no NUL (PostgreSQL text
    cannot hold one), no whitespace around it (MySQL's comparison ignores trailing spaces,
    so ``"a "`` and ``"a"`` would be one key there and two elsewhere). ``None``: no key."""
    if key is None:
        return None
    if not isinstance(key, str):
        raise TriggerKeyError(pipeline, key, f"not a string but {type(key).__name__}")
    if not key:
        raise TriggerKeyError(pipeline, key, "empty")
    if len(key) > TriggerKeyError.MAX_TRIGGER_KEY:
        raise TriggerKeyError(pipeline, key, f"{len(key)} characters long")
    if "\x00" in key:
        raise TriggerKeyError(pipeline, key, "contains a NUL character")
    if key != key.strip():
        raise TriggerKeyError(pipeline, key, "has whitespace around it")
    return key


def check_window(pipeline: str, key: str | None, window: object) -> int | None:
    """``window`` in whole microseconds, or :class:`TriggerKeyWindowError` naming ``pipeline``
    and the window: a positive duration in ``parse_interval_us``'s forms (seconds, a
    ``timedelta``, a duration string such as ``"1d"`` or ``"1h30m"``), and only with a key.
    ``None``: no window (the key is held until its run is pruned)."""
    if window is None:
        return None
    if key is None:
        raise TriggerKeyWindowError(pipeline, window, "given without a key")
    try:
        return parse_interval_us(window)
    except DurationError as error:
        raise TriggerKeyWindowError(pipeline, window, error.reason) from None


def keyed_run(tx: Tx, pipeline: str, key: str) -> str | None:
    """The id of the run of ``pipeline`` that holds ``key``, if it is visible to ``tx``
    (at most one: ``uq_run_trigger_key``)."""
    found: str | None = tx.execute(
        sa.select(_r.c.id).where(_r.c.pipeline_klass == pipeline, _r.c.trigger_key == key)).scalar()
    return found


def key_holder(tx: Tx, pipeline: str, key: str) -> KeyHolder | None:
    """:func:`keyed_run` with the holder's status and finish times."""
    row = tx.execute(sa.select(_r.c.id.label("run_id"), _r.c.status, _r.c.completed_at, _r.c.halted_at).where(
        _r.c.pipeline_klass == pipeline, _r.c.trigger_key == key)).first()
    return None if row is None else schema.from_row(KeyHolder, row)


def release_key(tx: Tx, pipeline: str, key: str, holder: KeyHolder, window_us: int) -> bool:
    """Take ``key`` from ``holder`` (its ``trigger_key`` set NULL; its history kept) if it
    still holds it and finished at least ``window_us`` before ``tx.now``: a conditional
    UPDATE fenced on id, key, status and finish time; True when it matched the one row.
    False: another transaction took the key first (or the row changed)."""
    cutoff = tx.now - timedelta(microseconds=window_us)
    finished = sa.or_(sa.and_(_r.c.status == "completed", _r.c.completed_at <= cutoff),
                      sa.and_(_r.c.status == "halted", _r.c.halted_at <= cutoff))
    result = tx.execute(_r.update().where(
        _r.c.id == holder.run_id, _r.c.pipeline_klass == pipeline, _r.c.trigger_key == key,
        finished,  # [INV-TRG-1] fenced on the finish time, not only on the Python decision
    ).values(trigger_key=None, updated_at=tx.now))
    return bool(result.rowcount == 1)


def trigger(app: Database, tx: Tx, pipeline: type, args: list[Json], key: str | None = None,
            key_window: object = None) -> Triggered:
    """The trigger in ``tx``, whoever's transaction it is; commits nothing.

    With ``key_window`` (:func:`check_window`), a key whose run finished at least the
    window before ``tx.now`` is taken from it (:func:`release_key`) and a new run is
    written; otherwise the key's run is returned as without a window.

    ``pipeline`` is a Pipeline subclass (anything with a ``definition``). Checked before
    anything is written: the key (:func:`check_key`), the arguments (``payloads.dump``: JSON,
    at most ``MAX_PAYLOAD_BYTES``), the first step's partition (``steps.limit_key``).
    :class:`TriggeredConcurrently` when the key's run was committed by a transaction ``tx``
    cannot see (its snapshot is older); nothing written.
    """
    definition: Definition | None = getattr(pipeline, "definition", None)
    if definition is None:  # pragma: no cover  Pipeline.trigger, the only way here, refuses it first
        raise DefinitionError(pipeline.__qualname__, "trigger", "pipeline has no definition (define() missing)")
    key = check_key(pipeline.__qualname__, key)
    window_us = check_window(pipeline.__qualname__, key, key_window)
    snapshot = json.dumps(definition.to_json(), sort_keys=True)
    sha1 = hashlib.sha1(snapshot.encode()).hexdigest()
    input_json = payloads.dump(list(args), f"{pipeline.__qualname__}.trigger arguments")
    limit_key(definition, definition.start, input_json)  # PartitionValueError before anything is written
    if key is not None:
        existing = _key_kept_by(tx, definition.pipeline, key, window_us)
        if existing is not None:  # [INV-TRG-1] the key's run: nothing written
            return Triggered(existing)
    run_id, branch_id = new_id(), new_id()
    now = tx.now
    insert = _r.insert().values(
        id=run_id, pipeline_klass=definition.pipeline, definition=snapshot, definition_sha1=sha1,
        status="in_progress", triggered_at=now, completed_at=None, halted_at=None,
        trigger_key=key,  # [INV-TRG-1] uq_run_trigger_key: one run per pipeline and key
        created_at=now, updated_at=now)
    if key is None:
        tx.execute(insert)
    else:
        try:
            with dialects.translate_db_errors(
                {"uq_run_trigger_key": lambda _: TriggeredConcurrently(definition.pipeline, key)}  # [INV-TRG-1]
            ), dialects.statement_savepoint(tx.conn):
                tx.execute(insert)
        except TriggeredConcurrently:
            existing = keyed_run(tx, definition.pipeline, key)
            if existing is None:  # committed after this transaction's snapshot: not ours to see
                raise
            return Triggered(existing)
    create_branches(tx, run_id, [{"id": branch_id}])
    create_steps(tx, run_id, definition, [NewStep(branch_id, definition.start, "start", input_json)])
    app._definitions.setdefault(sha1, definition)
    return Triggered(run_id, (definition.pipeline, now))


def _key_kept_by(tx: Tx, pipeline: str, key: str, window_us: int | None) -> str | None:
    """The run that holds ``key`` and keeps it, which a trigger returns without writing
    anything [INV-TRG-1]; None when the key is free, or, with a window, was taken here from
    a run that finished at least ``window_us`` before ``tx.now`` (:func:`release_key`).
    :class:`TriggeredConcurrently` when the key's holder is not ours to see yet."""
    if window_us is None:
        return keyed_run(tx, pipeline, key)
    holder = key_holder(tx, pipeline, key)
    if holder is None or (key_expired(holder, tx.now, window_us)
                          and release_key(tx, pipeline, key, holder, window_us)):
        return None
    existing = keyed_run(tx, pipeline, key)  # another trigger may have taken it
    if existing is None or (existing == holder.run_id and key_expired(holder, tx.now, window_us)):
        raise TriggeredConcurrently(pipeline, key)  # [INV-TRG-1] its run is not ours to see yet
    return existing


def trigger_in(conn: Connection, app: Database, pipeline: type, args: list[Json], key: str | None = None,
               key_window: object = None) -> Triggered:
    """The trigger written through the caller's ``conn`` inside the transaction it has begun,
    which the caller commits or rolls back [INV-TRG-2]; this never ends it.

    ``app`` gives the clock, the definitions cache and the kind of database. Raises
    :class:`TriggerConnectionError` before anything is written when ``conn`` is not a
    SQLAlchemy ``Connection`` (pass ``session.connection()`` for a Session, or call this
    through ``AsyncConnection.run_sync``), has no transaction begun, or is on another kind
    of database than ``app``. A violation of the key's index leaves the caller's
    transaction usable (a savepoint on PostgreSQL; a statement rollback elsewhere).
    """
    name = getattr(pipeline, "__qualname__", repr(pipeline))
    check_window(name, check_key(name, key), key_window)
    if not isinstance(conn, Connection):
        raise TriggerConnectionError(name, f"{type(conn).__name__} is not a SQLAlchemy Connection (for a Session "
                                           "pass session.connection(); for an AsyncConnection use its run_sync)")
    if not conn.in_transaction():
        raise TriggerConnectionError(name, "the connection has no transaction begun; begin one "
                                           "(engine.begin() or conn.begin()) and commit it after the trigger")
    kind = dialects.backend(conn)
    if kind != app.backend:
        raise TriggerConnectionError(name, f"the connection is to {kind}, but the app's database is "
                                           f"{app.backend} ({app.database})")
    tx = Tx(conn, app.clock)
    triggered = trigger(app, tx, pipeline, args, key, key_window)  # [INV-TRG-2]
    tx.send_wakeups()  # heard once the caller commits
    return triggered
