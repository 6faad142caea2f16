"""The limits layer's queue: executions enqueued in lanes, released by their outcome, and
each limit key's header row.

    >>> enqueue(tx, [Pending(step_id, "vendor_api", eligible_at)])
    >>> release_and_claim(app, tx, "vendor_api", owner, [Ending(execution_id, "success")]).ended   # False: not ours

An execution is one attempt at a step, pending in a lane (its limit key, or the unkeyed
lane) until a claim takes it (``claims.py``) and open until its release ends it
(``claims.release_and_claim``), the one guard of every outcome, for a batch of any size (a
batch of one is the single case): the executions must still be open (``completed_at IS NULL``)
and held by the owner that claimed them, every one of them, or the caller rolls its
transaction back [INV-EXE-2]. A keyed release first takes its key's lock and reads the
clock again, and each execution released takes the key's next sequence number, so every
change to a key's in-flight set is ordered under one lock, in time as in sequence
[INV-LIM-1, INV-LIM-3, INV-CLK-1]; in-flight is derived from ``completed_at``, never a
stored counter, so a release frees its slot by ending its execution.

A key's header row (its lock, sequence number, rate-block stamp and config digest) is
written by one function, :func:`write_header`, with what the transaction holding its
lock changed (:class:`KeyHeader`).

Not done here: what an outcome means for the pipeline (the step's output, its
status, a retry or a re-run: ``pipelines.outcomes`` decides, releases and calls
:func:`enqueue`), or claiming (``claims.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa

from ductwork.db import dialects, schema
from ductwork.db.ids import new_id

if TYPE_CHECKING:
    from ductwork.db.database import Database, Tx

log = logging.getLogger("ductwork.limits")

MESSAGE_LIMIT = 255
#: the longest error class name recorded (``error_klass``, a ``schema.Name``)
CLASS_LIMIT = 255
BACKTRACE_FRAMES = 10
_e, _k = schema.executions, schema.limit_keys


@dataclass(frozen=True)
class Claimed:
    """An execution this process holds, with what running it needs."""

    execution_id: str
    step_id: str
    #: what ``Step.idempotency_key`` returns: the step's id, or the key a revive carried
    #: over from the failed step this one re-runs [INV-EXE-3]
    idempotency_key: str
    run_id: str
    branch_id: str
    node: str
    klass: str
    pipeline_klass: str
    definition_sha1: str
    input_json: str
    limit_key: str | None
    timeout_us: int | None
    retry_count: int
    crash_count: int
    process_id: str
    claimed_at: datetime
    #: the claim spent its key's last token: seconds (database time, from the claim) until
    #: the rate admits the next claim (the key's ``blocked_until`` stamp); None: a token is
    #: left, or the key has no rate. A hint for waking a poller then (``TokenAlarm``)
    next_token_in_s: float | None = None

    @classmethod
    def from_row(cls, row: sa.Row[Any]) -> Claimed:
        """From a row whose columns are labelled with the field names (``claims._load``);
        ``next_token_in_s`` is no column: its default (an unkeyed claim's)."""
        mapping = row._mapping
        return cls(**{name: mapping[name] for name in CLAIM_COLUMNS})


#: the fields of :class:`Claimed` read from a row, by name: all but ``next_token_in_s``,
#: the claim's own decision, never stored
CLAIM_COLUMNS = tuple(f.name for f in dataclasses.fields(Claimed) if f.name != "next_token_in_s")


@dataclass(frozen=True)
class ErrorInfo:
    """An error as recorded: class, message (cut to 255) and backtrace (first frames).
    ``text`` is the whole traceback, chained errors included, for the log only (not stored).

    Made to fit its columns on every database, whoever makes it: a class name longer than
    :data:`CLASS_LIMIT` keeps its end (the class's own name) after ``…``, the message its
    first :data:`MESSAGE_LIMIT` characters, and a NUL character, which PostgreSQL's text
    cannot hold, is written ``\\x00``. (SQLite stores whatever it is given: a class or a
    message the servers refused made the failure unrecordable there, and the execution
    was crashed instead, within the crash budget, its error lost.)"""

    klass: str
    message: str
    backtrace: str | None
    text: str | None = None

    def __post_init__(self) -> None:
        klass = self.klass.replace("\0", "\\x00")
        fitted = {"klass": klass if len(klass) <= CLASS_LIMIT else "…" + klass[1 - CLASS_LIMIT:],
                  "message": self.message.replace("\0", "\\x00")[:MESSAGE_LIMIT],
                  "backtrace": self.backtrace and self.backtrace.replace("\0", "\\x00")}
        for name, value in fitted.items():
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, error: BaseException) -> ErrorInfo:
        frames = traceback.format_tb(error.__traceback__)
        if len(frames) > BACKTRACE_FRAMES:
            frames = [*frames[:BACKTRACE_FRAMES], f"... {len(frames) - BACKTRACE_FRAMES} more frames\n"]
        return cls(f"{type(error).__module__}.{type(error).__qualname__}",
                   str(error), "".join(frames) or None,
                   "".join(traceback.format_exception(error)).rstrip("\n"))

    def log_traceback(self) -> str | None:
        """The log's traceback (a step's or a hook's): the whole text when known, else one
        made of the recorded backtrace, class and message (None without a backtrace)."""
        return self.text or (f"Traceback (most recent call last):\n{self.backtrace}{self.klass}: {self.message}"
                             if self.backtrace else None)


@dataclass
class KeyHeader:
    """A limit key's header row as the transaction that holds its lock has left it:
    ``seq``, the key's last sequence number (a claim or release takes the next), the
    ``config_digest`` of the values its buckets follow, and ``changed``: the columns this
    transaction changed and :func:`write_header` has not written yet."""

    seq: int
    config_digest: str | None
    changed: dict[str, Any] = field(default_factory=dict)

    def set(self, **values: Any) -> None:
        """Change columns of the header (written by :func:`write_header`)."""
        self.changed.update(values)
        self.seq = values.get("seq", self.seq)
        self.config_digest = values.get("config_digest", self.config_digest)


def _held(tx: Tx) -> dict[str, KeyHeader]:
    """The headers of the keys whose lock ``tx`` holds (kept on the transaction)."""
    return cast("dict[str, KeyHeader]", tx.held_keys)


def lock_key(tx: Tx, key: str, *, create: bool = False) -> KeyHeader | None:
    """Lock the key's header row (``SELECT … FOR UPDATE``; SQLite: the write lock taken at
    ``BEGIN IMMEDIATE``) and return its ``seq`` and ``config_digest``; None if the key has
    no row. The one key lock: claims, releases and recoveries take it, each as the first
    statement on the key, so a key's in-flight set changes under it [INV-LIM-1].
    A transaction that holds it already gets the header as it has left it, with no
    statement (the lock is held to the end of the transaction). With ``create`` (a claim,
    on SQLite: the servers' routines do the same), a partition's missing row is inserted first, as
    :func:`enqueue` would have: a sweep may have forgotten the partition between an
    enqueue's read of its row and its commit (:func:`forget_partition`) [INV-LIM-9].
    A partition's row that never numbered an event resumes above its family's ``seq``,
    where a forget left the highest number its earlier rows used [INV-CLK-1]."""
    held = _held(tx).get(key)
    if held is not None:
        return held  # locked by this transaction already: held until it ends
    row = tx.execute(dialects.prepared(tx.conn, _lock_key_statement), {"k_key": key}).first()  # the key's lock
    if row is None and create and "[" in key:  # [INV-LIM-9] a forgotten partition's row, created again
        ensure_keys(tx, {key})
        row = tx.execute(dialects.prepared(tx.conn, _lock_key_statement), {"k_key": key}).first()
    if row is None:
        return None
    header = _held(tx)[key] = KeyHeader(int(row.seq), row.config_digest)
    if header.seq == 0 and "[" in key:  # [INV-CLK-1] a new partition row numbers on from its family's
        header.seq = int(tx.execute(sa.select(_k.c.seq).where(_k.c.key == family_row(key))).scalar() or 0)
    return header


def family_row(key: str) -> str:
    """The header row locked as ``key``'s family (written by :func:`enqueue` with a
    partition's row): the name before its first ``[``; the key itself for any other key."""
    return key.partition("[")[0]


def _lock_key_statement(bind: Any) -> sa.Select[Any]:
    """The key lock (:func:`lock_key`): its header row ``FOR UPDATE``, the key bound as ``k_key``."""
    stmt = sa.select(_k.c.seq, _k.c.config_digest).where(_k.c.key == sa.bindparam("k_key", type_=_k.c.key.type))
    return dialects.for_update(stmt, bind)  # [INV-LIM-1] the key's lock


def write_header(tx: Tx, key: str) -> None:
    """Write what this transaction changed in ``key``'s header row (:meth:`KeyHeader.set`),
    in one UPDATE with ``updated_at``; nothing if it changed nothing. The one writer of the
    header row (its creation aside: :func:`enqueue`)."""
    header = _held(tx).get(key)
    if header is None or not header.changed:
        return
    values = {**header.changed, "updated_at": tx.now}
    header.changed = {}
    tx.execute(_header_update(tuple(values)), {"k_key": key, **{f"k_{name}": v for name, v in values.items()}})


@functools.lru_cache(maxsize=16)
def _header_update(columns: tuple[str, ...]) -> sa.Update:
    """The header's UPDATE of ``columns``, each bound as ``k_<column>``, the key as ``k_key``."""
    return (_k.update().where(_k.c.key == sa.bindparam("k_key", type_=_k.c.key.type))
            .values(**{name: sa.bindparam(f"k_{name}", type_=_k.c[name].type) for name in columns}))


@dataclass(frozen=True)
class Ending:
    """One execution to end, and how: ``outcome`` (``success``, ``failure``, ``timed_out``,
    ``invalid``, ``process_crashed``) with its ``error``, if any."""

    execution_id: str
    outcome: str = "success"
    error: ErrorInfo | None = None


@dataclass(frozen=True)
class Pending:
    """An execution to enqueue: an attempt at ``step_id`` in lane ``key`` (None: unkeyed),
    eligible at ``eligible_at``, after ``retry_count`` failures and ``crash_count`` crashes."""

    step_id: str
    key: str | None
    eligible_at: datetime
    retry_count: int = 0
    crash_count: int = 0


def enqueue(tx: Tx, pending: Sequence[Pending]) -> list[str]:
    """Insert these executions, pending, and the header rows of their keys if missing (the
    row every keyed claim locks); returns their ids, in order; wakes idle workers once
    ``tx`` commits. The header rows are read first without a lock: once a key exists this
    takes no lock at all, so an advancement never waits on a claimer holding the key."""
    if not pending:
        return []
    keys = {p.key for p in pending if p.key}
    ensure_keys(tx, keys | {family_row(key) for key in keys})  # (a partition's family's lock)
    now, ids = tx.now, [new_id() for _ in pending]
    dialects.insert_rows(tx.conn, _e, [{
        "id": execution_id, "step_id": p.step_id, "limit_key": p.key, "eligible_at": p.eligible_at,
        "retry_count": p.retry_count, "crash_count": p.crash_count, "created_at": now, "updated_at": now}
        for execution_id, p in zip(ids, pending, strict=True)])
    tx.wake()  # an execution was created: an idle worker may claim it
    return ids


def ensure_keys(tx: Tx, keys: set[str]) -> None:
    """Create the header rows of ``keys`` that are missing (the row every keyed claim
    locks), read first without a lock: once a key exists this takes no lock at all."""
    existing = set(tx.execute(sa.select(_k.c.key).where(_k.c.key.in_(sorted(keys)))).scalars()) if keys else set()
    if missing := sorted(keys - existing):
        tx.execute(dialects.insert_ignore(tx.conn, _k),
                   [{"key": k, "seq": 0, "created_at": tx.now, "updated_at": tx.now} for k in missing])


def forget(tx: Tx, where: sa.ColumnElement[bool]) -> int:
    """Delete the executions ``where`` selects (those of runs a prune deletes: they all
    ended long ago) and return how many: the history of the queue goes with its runs.
    Not done: checking that they ended (the prune re-checked its runs under their locks)."""
    return int(tx.execute(_e.delete().where(where)).rowcount)


# --------------------------------------------------------------------------- forgetting idle partitions


def _busy(key: str | sa.ColumnElement[str]) -> sa.ColumnElement[bool]:
    """Whether ``key`` has an execution pending in its lane or in flight (two index probes)."""
    return sa.or_(sa.exists().where(_e.c.pending_lane == key), sa.exists().where(_e.c.inflight_key == key))


def forget_partition(app: Database, key: str) -> bool:
    """Remove an idle partition's rows, its buckets and its header row, in a transaction of
    its own: ``LimitsModel.forget_partition`` (docs/semantics.md §5.1, "Forgetting idle
    partitions"). True: forgotten (or it had no row); False: busy, or no partition (a static
    key or a family's own row is never forgotten), and nothing changed.

    The family's row is locked first, then the partition's, the order of every claim
    [INV-LIM-8]; idleness is re-checked under the partition's lock, so no claim or release
    of it runs meanwhile, and an enqueue that commits after the delete finds its row
    created again by the claim (:func:`lock_key`, the routines). Nothing is lost: in-flight
    counts derive from execution rows, and a bucket created again starts empty, so no
    token is added [INV-LIM-9]. The family's ``seq`` keeps the highest the partition used,
    so its next row numbers on above it [INV-CLK-1]."""
    if "[" not in key or key in app.config.limits:
        return False  # a static key's and a family's rows are bounded by the config
    with app.begin() as tx:
        family = lock_key(tx, family_row(key))  # [INV-LIM-8] the family's lock before the partition's
        header = lock_key(tx, key)
        if header is None:
            return True
        if tx.execute(sa.select(_busy(key))).scalar_one():  # [INV-LIM-9] idle, re-checked under the key's lock
            return False
        if family is not None and header.seq > family.seq:  # [INV-CLK-1] the highest seq the partition used
            family.set(seq=header.seq)
            write_header(tx, family_row(key))
        tx.execute(schema.limit_buckets.delete().where(schema.limit_buckets.c.key == key))
        tx.execute(_k.delete().where(_k.c.key == key))
        del _held(tx)[key]
    return True


def forget_idle_partitions(app: Database, after: str = "", limit: int = 100,
                           idle_for: timedelta = timedelta(hours=1)) -> tuple[list[str], str]:
    """One bounded step of the sweep (the supervisor's, every tick): of the ``limit`` header
    rows after key ``after`` (key order), forget each partition whose row no claim or
    release changed for ``idle_for`` and that looks idle (:func:`forget_partition`
    re-checks under its lock). Returns the keys forgotten, logged, and where the next step
    starts ("": the first key again), so a sweep never reads more than ``limit`` rows."""
    with app.begin(readonly=True) as tx:
        rows = tx.execute(sa.select(_k.c.key, _k.c.updated_at, _busy(_k.c.key).label("busy"))
                          .where(_k.c.key > after).order_by(_k.c.key).limit(limit)).all()
        before = tx.now - idle_for
    forgotten = [row.key for row in rows
                 if not row.busy and row.updated_at <= before and forget_partition(app, row.key)]
    if forgotten:
        log.info("forgot %d idle partitions: %s", len(forgotten), ", ".join(forgotten))
    return forgotten, rows[-1].key if len(rows) == limit else ""
