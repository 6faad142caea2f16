"""The recorded history of a chaos round: committed rows, as plain records.

    >>> history = read_history(engine, config.limits, witness_table="chaos_witnesses")
    >>> history.to_jsonl(tmp / "round-17.jsonl")
    >>> check_all(History.from_jsonl(tmp / "round-17.jsonl"))     # rerun offline

After a round (faults off, quiet phase over) :func:`read_history` reads what the
checkers of :mod:`ductwork_proof.checkers` need from a migrated ductwork database:
executions (claims and completions in database time, with the per-key
``claim_seq``/``release_seq`` taken under the key's lock), steps with their job's
input and output, branches, runs with their definition snapshot, token buckets,
the ``on_halt`` hooks halted runs owe, and the witness rows that chaos step bodies write in their own transactions.
Everything is data a committed transaction left behind; a SIGKILL or rollback
erased its own events with it. What the harness did to the fleet (``kills``) and
how to replay the round (``seed``, ``meta``: database version, commit, kill plan)
are passed in by the harness and travel with the history.

Times are integer microseconds since the epoch, converted exactly:
``(dt - datetime(1970, 1, 1)) // timedelta(microseconds=1)`` (naive UTC, as the
schema stores them; an aware value is converted to UTC first).

The JSONL file holds one header line (``{"record": "history", "seed", "meta",
"limits", "families"}``; a file without ``families`` has none) and then one line per
record, ``{"record": "<kind>", ...fields}``.
Reading it back gives an equal :class:`History`.

Pure data and reading only: no checker logic here, nothing is written to the
database. Does not import ``model/``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, overload

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ductwork.db import schema
from ductwork.limit_entries import FamilyEntry, LimitEntry, RateEntry

EPOCH = datetime(1970, 1, 1)
ONE_US = timedelta(microseconds=1)
#: 2: executions and steps no longer name a job (a step holds its job, revision 0011)
FORMAT = 2


# a timestamp gives an int and only a NULL gives None (so a NOT NULL column's value is an int)
@overload
def to_us(value: datetime | str) -> int: ...
@overload
def to_us(value: None) -> None: ...
def to_us(value: datetime | str | None) -> int | None:
    """Exact microseconds since the epoch of a naive-UTC timestamp; None stays None.

    Text (a driver that hands back SQLite's stored string) is parsed with
    ``datetime.fromisoformat``.
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return (value - EPOCH) // ONE_US


# --------------------------------------------------------------------------- records


@dataclass
class Execution:
    """One attempt at a step: a claim event (and its release, once completed).

    ``key`` is the execution's ``limit_key`` (None: the unkeyed lane). ``claim_seq``
    and ``release_seq`` are the key's event counter at claim and completion, taken
    under the key's lock (None: unkeyed, pending or still open).
    """

    execution_id: str
    step_id: str
    run_id: str | None
    key: str | None
    claimed_at_us: int | None
    completed_at_us: int | None
    outcome: str | None
    claim_seq: int | None
    release_seq: int | None
    #: not claimable before this time; bounds when the key's buckets can have been created
    eligible_at_us: int | None = None
    retry_count: int = 0
    crash_count: int = 0


#: The brief's name for an execution seen as a claim event.
ClaimEvent = Execution


@dataclass
class StepRow:
    """One visit of a node on a branch, with its input and output (decoded JSON).

    ``output_payload`` is the step's envelope: ``{"payload": value}`` after a success,
    ``{"expand_items": N}`` for a step whose edge expands (the values are then in
    ``expand_items``, in index order), None before any success.
    """

    step_id: str
    run_id: str
    branch_id: str
    node: str
    status: str
    to_transition: str
    limit_key: str | None = None
    input: Any = None
    output_payload: dict | None = None
    expand_items: list | None = None
    started_at_us: int = 0
    completed_at_us: int | None = None
    #: the key its executions get when a revive set one (the failed step's); None: its id
    idempotency_key: str | None = None

    @property
    def key(self) -> str:
        """What ``Step.idempotency_key`` returned to its executions."""
        return self.idempotency_key or self.step_id

    @property
    def has_output(self) -> bool:
        return isinstance(self.output_payload, dict) and "payload" in self.output_payload

    @property
    def output(self) -> Any:
        """The step's return value; KeyError/TypeError if it has none (see ``has_output``)."""
        return self.output_payload["payload"]  # type: ignore[index]

    @property
    def expand_count(self) -> int | None:
        """N of an expand step's ``{"expand_items": N}``; None for any other payload."""
        payload = self.output_payload
        if isinstance(payload, dict) and type(payload.get("expand_items")) is int:
            return payload["expand_items"]
        return None


@dataclass
class BranchRow:
    """One thread of execution (schema ``ductwork_branches``)."""

    branch_id: str
    run_id: str
    status: str
    halt_reason: str | None = None
    #: the advancer's fencing token; not None while a claim holds the branch
    claim_token: str | None = None
    parent_id: str | None = None
    barrier_id: str | None = None
    barrier_index: int | None = None
    merged_barrier_id: str | None = None
    fanout_width: int | None = None
    fanout_cursor: int | None = None
    fanin_arrivals: int = 0
    fanin_arrived_at_us: int | None = None
    started_at_us: int = 0
    completed_at_us: int | None = None


@dataclass
class RunRow:
    """One run, with its definition snapshot (format 1, decoded)."""

    run_id: str
    status: str
    definition: Any
    pipeline: str = ""
    triggered_at_us: int = 0
    completed_at_us: int | None = None
    halted_at_us: int | None = None
    #: the halted run this run revives; None: triggered
    revived_from: str | None = None


@dataclass
class Witness:
    """A step body's own record of running: written at start, closed at end.

    ``ended_at_us`` is None when the process died before the body returned.
    """

    step_id: str
    idempotency_key: str
    pid: int
    key: str | None
    started_at_us: int
    ended_at_us: int | None = None


@dataclass
class BucketRow:
    """A token bucket as the round left it (units of ``1/(period_s × 10⁶)`` token)."""

    key: str
    period_s: int
    level_units: int
    refilled_at_us: int


@dataclass
class HookRow:
    """The ``on_halt`` hook a halted run owes, as the round left it (issue 16)."""

    hook_id: str
    run_id: str
    klass: str
    status: str
    retry_count: int
    crash_count: int
    last_outcome: str | None = None
    claim_token: str | None = None
    completed_at_us: int | None = None


_RECORDS: dict[str, tuple[str, type]] = {
    "execution": ("executions", Execution),
    "step": ("steps", StepRow),
    "branch": ("branches", BranchRow),
    "run": ("runs", RunRow),
    "witness": ("witnesses", Witness),
    "bucket": ("buckets", BucketRow),
    "hook": ("hooks", HookRow),
}


@dataclass
class History:
    """Everything one round committed, plus what the harness did and how to replay it."""

    executions: list[Execution] = field(default_factory=list)
    steps: list[StepRow] = field(default_factory=list)
    branches: list[BranchRow] = field(default_factory=list)
    runs: list[RunRow] = field(default_factory=list)
    witnesses: list[Witness] = field(default_factory=list)
    buckets: list[BucketRow] = field(default_factory=list)
    hooks: list[HookRow] = field(default_factory=list)
    #: the ``job_worker.limits`` the fleet ran with (one config for the whole round)
    limits: dict[str, LimitEntry] = field(default_factory=dict)
    #: its key families (an entry with ``per_partition``, docs/semantics.md §5.1): family → entry
    families: dict[str, FamilyEntry] = field(default_factory=dict)
    #: the harness's log of what it killed: ``{"pid", "role", "at_us", "how", ...}``
    kills: list[dict] = field(default_factory=list)
    seed: int | None = None
    #: database version, commit, kill plan, counts: whatever replaying the round needs
    meta: dict = field(default_factory=dict)

    def to_jsonl(self, path: str | Path) -> None:
        """Write the history as JSONL (header line first), so it can be checked offline."""
        header = {"record": "history", "format": FORMAT, "seed": self.seed, "meta": self.meta,
                  "limits": {key: _limit_to_json(entry) for key, entry in self.limits.items()},
                  "families": {name: {"per_partition": _limit_to_json(family.per_partition),
                                      "concurrency": family.concurrency}
                               for name, family in self.families.items()}}
        with open(path, "w", encoding="utf-8") as out:
            out.write(json.dumps(header) + "\n")
            for kind, (attr, _) in _RECORDS.items():
                for record in getattr(self, attr):
                    out.write(json.dumps({"record": kind, **asdict(record)}) + "\n")
            for kill in self.kills:
                out.write(json.dumps({"record": "kill", **kill}) + "\n")

    @classmethod
    def from_jsonl(cls, path: str | Path) -> History:
        """Read a file :meth:`to_jsonl` wrote; ValueError on an unknown record or format."""
        with open(path, encoding="utf-8") as source:
            lines = [json.loads(line) for line in source if line.strip()]
        if not lines or lines[0].get("record") != "history" or lines[0].get("format") != FORMAT:
            raise ValueError(f"{path}: not a format-{FORMAT} history (first line must be the header)")
        header = lines[0]
        history = cls(seed=header["seed"], meta=header["meta"],
                      limits={key: _limit_from_json(key, raw) for key, raw in header["limits"].items()},
                      families={name: FamilyEntry(name, _limit_from_json(name, raw["per_partition"]),
                                                  raw["concurrency"])
                                for name, raw in header.get("families", {}).items()})
        for line in lines[1:]:
            kind = line.pop("record")
            if kind == "kill":
                history.kills.append(line)
            elif kind in _RECORDS:
                attr, record_type = _RECORDS[kind]
                getattr(history, attr).append(record_type(**line))
            else:
                raise ValueError(f"{path}: unknown record {kind!r}")
        return history


def _limit_to_json(entry: LimitEntry) -> dict:
    return {"concurrency": entry.concurrency,
            "rates": [[rate.limit, rate.per_s, rate.burst] for rate in entry.rates]}


def _limit_from_json(key: str, raw: dict) -> LimitEntry:
    return LimitEntry(key, raw["concurrency"], tuple(RateEntry(*rate) for rate in raw["rates"]))


# --------------------------------------------------------------------------- witnesses


def make_witness_table(metadata: sa.MetaData | None = None, name: str = "chaos_witnesses") -> sa.Table:
    """The witness table chaos step bodies write (create it next to ductwork's tables).

    A body inserts a row when it starts (``ended_at`` NULL) and sets ``ended_at`` when
    it returns, each in its own short transaction, with database time.
    """
    return sa.Table(
        name,
        metadata if metadata is not None else sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("step_id", schema.Id, nullable=False),
        sa.Column("idempotency_key", schema.Name, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("limit_key", schema.Name, nullable=True),  # NULL: unkeyed step
        sa.Column("started_at", schema.Timestamp, nullable=False),
        sa.Column("ended_at", schema.Timestamp, nullable=True),  # NULL: did not return
    )


def _column(table: sa.Table, *names: str) -> sa.Column:
    for name in names:
        if name in table.c:
            return table.c[name]
    raise KeyError(f"witness table {table.name!r} has none of the columns {names}")


def _time_column(table: sa.Table, name: str) -> tuple[sa.Column, bool]:
    """``name`` (a timestamp) or ``name_us`` (integer µs); the flag says which."""
    if f"{name}_us" in table.c:
        return table.c[f"{name}_us"], True
    return _column(table, name), False


def _read_witnesses(conn: sa.Connection, table: sa.Table | str) -> list[Witness]:
    if isinstance(table, str):
        table = sa.Table(table, sa.MetaData(), autoload_with=conn)
    started, started_is_us = _time_column(table, "started_at")
    ended, ended_is_us = _time_column(table, "ended_at")
    key = _column(table, "limit_key", "key")
    order = [table.c.id] if "id" in table.c else [started]
    rows = conn.execute(
        sa.select(table.c.step_id, table.c.idempotency_key, table.c.pid, key, started, ended).order_by(*order)
    )
    return [
        Witness(step_id, idem, int(pid), limit_key,
                start if started_is_us else to_us(start),
                end if ended_is_us or end is None else to_us(end))
        for step_id, idem, pid, limit_key, start, end in rows
    ]


# --------------------------------------------------------------------------- reading


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def read_history(engine: Engine, limits: dict[str, LimitEntry], witness_table: sa.Table | str | None = None,
                 *, kills: list[dict] | None = None, seed: int | None = None,
                 meta: dict | None = None, families: dict[str, FamilyEntry] | None = None) -> History:
    """Read a round's history from a migrated ductwork database (one read transaction).

    ``witness_table`` is a :class:`sqlalchemy.Table` or a table name (reflected); its
    columns are those of :func:`make_witness_table` (``key`` is accepted for ``limit_key``,
    and ``started_at_us``/``ended_at_us`` integers for the timestamps). Rows come in id
    order, so the same database gives the same history.
    """
    e, s, b, r = schema.executions, schema.steps, schema.branches, schema.runs
    history = History(limits=dict(limits), families=dict(families or {}), kills=list(kills or []), seed=seed,
                      meta=dict(meta or {}))
    with engine.connect() as conn:
        for row in conn.execute(
            sa.select(e.c.id, e.c.step_id, s.c.run_id, e.c.limit_key, e.c.claimed_at, e.c.completed_at,
                      e.c.outcome, e.c.claim_seq, e.c.release_seq, e.c.eligible_at, e.c.retry_count,
                      e.c.crash_count)
            .select_from(e.outerjoin(s, s.c.id == e.c.step_id))
            .order_by(e.c.id)
        ):
            history.executions.append(Execution(
                row[0], row[1], row[2], row[3], to_us(row[4]), to_us(row[5]), row[6],
                None if row[7] is None else int(row[7]), None if row[8] is None else int(row[8]),
                to_us(row[9]), row[10], row[11]))
        items: dict[str, list] = {}
        x = schema.expand_items
        for step_id, value in conn.execute(
            sa.select(x.c.step_id, x.c.value).order_by(x.c.step_id, x.c.item_index)
        ):
            items.setdefault(step_id, []).append(json.loads(value))
        for row in conn.execute(
            sa.select(s.c.id, s.c.run_id, s.c.branch_id, s.c.node, s.c.status, s.c.to_transition,
                      s.c.limit_key, s.c.input_args, s.c.output_payload, s.c.started_at, s.c.completed_at,
                      s.c.idempotency_key)
            .order_by(s.c.id)
        ):
            history.steps.append(StepRow(
                row[0], row[1], row[2], row[3], row[4], row[5], row[6], _json(row[7]),
                _json(row[8]), items.get(row[0]), to_us(row[9]), to_us(row[10]), row[11]))
        for row in conn.execute(
            sa.select(b.c.id, b.c.run_id, b.c.status, b.c.halt_reason, b.c.claim_token, b.c.parent_id,
                      b.c.barrier_id, b.c.barrier_index, b.c.merged_barrier_id, b.c.fanout_width,
                      b.c.fanout_cursor, b.c.fanin_arrivals, b.c.fanin_arrived_at, b.c.started_at,
                      b.c.completed_at).order_by(b.c.id)
        ):
            history.branches.append(BranchRow(
                row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], row[9], row[10], row[11],
                fanin_arrived_at_us=to_us(row[12]), started_at_us=to_us(row[13]), completed_at_us=to_us(row[14])))
        for run in conn.execute(
            sa.select(r.c.id, r.c.status, r.c.definition, r.c.pipeline_klass, r.c.triggered_at, r.c.completed_at,
                      r.c.halted_at, r.c.revived_from).order_by(r.c.id)
        ):
            history.runs.append(RunRow(run[0], run[1], json.loads(run[2]), run[3], to_us(run[4]),
                                       to_us(run[5]), to_us(run[6]), run[7]))
        lb = schema.limit_buckets
        for key, period, level, refilled in conn.execute(
            sa.select(lb.c.key, lb.c.period_s, lb.c.level_units, lb.c.refilled_at_us)
            .order_by(lb.c.key, lb.c.period_s)
        ):
            history.buckets.append(BucketRow(key, period, int(level), int(refilled)))
        if witness_table is not None:
            history.witnesses = _read_witnesses(conn, witness_table)
        h = schema.halt_hooks
        for hook in conn.execute(
            sa.select(h.c.id, h.c.run_id, h.c.klass, h.c.status, h.c.retry_count, h.c.crash_count,
                      h.c.last_outcome, h.c.claim_token, h.c.completed_at).order_by(h.c.id)
        ):
            history.hooks.append(HookRow(*hook[:8], completed_at_us=to_us(hook[8])))
    return history


__all__ = [
    "BranchRow", "BucketRow", "ClaimEvent", "Execution", "History", "HookRow", "RunRow", "StepRow", "Witness",
    "make_witness_table", "read_history", "to_us",
]
