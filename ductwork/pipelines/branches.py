"""Branches moved past their steps, fenced: the one fence, and the one function behind
every simple transition.

    >>> made, ended = move_branches(tx, moves, definitions, held=claims)   # an advancer's
    >>> advance_on_successes(tx, [Inline(claimed, definition, "3")])      # a worker's success

A branch is moved only by a transaction that holds it: an advancer by the claim token it
wrote when it claimed the branch, a worker's success on a free branch (unclaimed, in
progress, which no advancer can hold while the step's execution is open). :func:`fence`
locks the branch rows and keeps those still held as their caller says [INV-ADV-2];
:func:`move_branches` then makes the simple moves (a halt, a leaf, chain, converge, divert,
dampen) of the branches it kept: each step completed and what follows it created in the same
transaction [INV-ADV-1], an advancer's advancements closed, the branches moved on or ended,
their runs resolved [INV-RUN-1]. An advancer's batch and single advancement
(``advance.Advancer``) and a worker's inline advancement (:func:`advance_on_successes`)
all go through it. Lock order
[lock order]: every branch row first, in branch-id order, then every run row of the
moves, in run-id order, before any write.

Claims: :func:`claim_branches` takes branches whose latest step is done for an advancer,
with a fresh claim token, one conditional UPDATE for a batch [INV-ADV-2]. Not done here:
routing, fan-out, expand and fan-in (``advance.py``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import exc

from ductwork import faults
from ductwork.db import dialects, schema
from ductwork.db.ids import new_id, new_token
from ductwork.limits.executions import Claimed, ErrorInfo
from ductwork.pipelines.rules import simple_move
from ductwork.pipelines.runs import lock_runs, resolve_runs
from ductwork.pipelines.steps import ADVANCEABLE, NewStep, StepRow, create_steps_across, renders

if TYPE_CHECKING:
    from ductwork.db.database import Database, Tx
    from ductwork.pipelines.snapshot import Definition

log = logging.getLogger("ductwork.advance")

_b, _a = schema.branches, schema.advancements

PROCESS_CRASH = "ductwork.ProcessCrash"
THREAD_CRASH = "ductwork.ThreadCrash"
CRASH_CLASSES = (PROCESS_CRASH, THREAD_CRASH)

#: :func:`set_status_if` writes with one UPDATE per distinct output while there are at most
#: this many distinct outputs (steps that return the same value: ``None``, ``True``, a
#: status), else with one UPDATE per step in one ``executemany``
DISTINCT_OUTPUTS = 4


def close_advancement(tx: Tx, advancement_id: str, **error: str | None) -> bool:
    """Close an open advancement now, with ``error_klass``, ``error_message`` and
    ``error_backtrace`` as given (an advancement that failed or crashed); True when this
    call closed it, False when it was already closed. The one close: fences, abandoned
    and reaped advancements all go through it. Not done: releasing the branch."""
    closed = tx.execute(
        _a.update().where(_a.c.id == advancement_id, _a.c.completed_at.is_(None))
        .values(completed_at=tx.now, updated_at=tx.now, **error)
    )
    return bool(closed.rowcount == 1)


def release_advancement(tx: Tx, advancement_id: str, branch_id: str, token: str, message: str,
                        klass: str = PROCESS_CRASH) -> None:
    """Close an open advancement as a crash (``klass``) and release its branch if that claim
    still holds it, so a fresh advancer re-runs the transition; for a dead process (the
    reaper), a claim no thread holds (the supervisor) and a thread that left (the advancer)."""
    if close_advancement(tx, advancement_id, error_klass=klass, error_message=message):
        tx.execute(
            _b.update()
            .where(_b.c.id == branch_id,
                   _b.c.claim_token == token,  # [INV-ADV-2] only if that claim still holds it
                   _b.c.status == "advancing")
            .values(status="in_progress", claim_token=None, claimed_at=None, last_advanced_at=tx.now,
                    updated_at=tx.now)
        )


@dataclass
class BranchClaim:
    """A branch this advancer holds, with the token captured at claim time."""

    branch_id: str
    run_id: str
    token: str
    advancement_id: str
    crash_count: int
    step: StepRow
    definition_sha1: str
    #: set once a fence committed the advancement's close; cleanup then has nothing to do
    closed: bool = field(default=False)


def candidates(tx: Tx, window: int) -> list[str]:
    """Branches that look claimable, least recently advanced first (a read; the claim re-checks)."""
    s = schema.steps
    return list(tx.execute(
        sa.select(_b.c.id)
        .join(s, s.c.branch_id == _b.c.id)
        .where(s.c.status.in_(ADVANCEABLE),  # its job is done
               _b.c.status == "in_progress",  # not finished, not held
               _b.c.claim_token.is_(None))  # unclaimed
        .order_by(_b.c.last_advanced_at)
        .limit(window)
    ).scalars())


def claim_branch(app: Database, branch_id: str, process_id: str) -> BranchClaim | None:
    """Claim one branch; None if another advancer won it or it no longer qualifies."""
    claims = claim_branches(app, [branch_id], process_id)
    return claims[0] if claims else None


def claim_branches(app: Database, branch_ids: Sequence[str], process_id: str) -> list[BranchClaim]:
    """Claim several branches in one transaction; returns those won, in branch-id order.

    Equal to :func:`claim_branch` of each in turn (the model's ``claim_branches``): one
    conditional UPDATE re-asserts every predicate of :func:`candidates` for each branch
    and writes this claim's fresh token, and the branches that carry the token after it
    are the ones won (a branch another advancer won, or that was advanced and released
    since it was read, is skipped). The token is this transaction's: the claims of one
    batch share it, and a branch and its token still name one claim. Empty if this
    process's row was reaped meanwhile (the whole claim rolls back). Not done: advancing
    them.
    """
    ids = sorted(set(branch_ids))
    token = new_token()
    s = schema.steps
    try:
        with app.begin() as tx:
            # [lock order] the branch rows first, in id order, skipping those another
            # transaction holds (a fence, a success moving it): the UPDATE below then waits on
            # none of them. (It takes a shared lock on each branch's run row on InnoDB; had it
            # waited on a branch that a fence holds while that fence waits for the run, the
            # two deadlocked.) A branch skipped is someone else's now, as a lost race is.
            ids = list(tx.execute(dialects.for_update(
                sa.select(_b.c.id).where(_b.c.id.in_(dialects.inline_ids(ids))).order_by(_b.c.id),
                tx.conn, skip_locked=True)).scalars())
            if not ids:
                return []
            tx.execute(
                _b.update()
                .where(_b.c.id.in_(dialects.inline_ids(ids)),
                       # Re-assert every predicate of `candidates`: a branch advanced and
                       # released since we read it must not be claimed off its new step.
                       _b.c.status == "in_progress",  # [INV-ADV-2] not ended, not held
                       _b.c.claim_token.is_(None),  # [INV-ADV-2] unclaimed: one winner per branch
                       sa.exists().where(s.c.branch_id == _b.c.id, s.c.status.in_(ADVANCEABLE)))
                .values(status="advancing", claim_token=token, claimed_at=tx.now, updated_at=tx.now)
            )
            won = sorted(tx.execute(sa.select(_b.c.id).where(
                _b.c.id.in_(dialects.inline_ids(ids)), _b.c.claim_token == token)).scalars())  # [INV-ADV-2]
            if not won:
                return []
            claims = _claims_of(tx, won, token)
            faults.hit(faults.BEFORE_ADVANCEMENT_CREATE)
            tx.execute(_a.insert(), [{
                "id": c.advancement_id, "branch_id": c.branch_id, "step_id": c.step.id, "process_id": process_id,
                "claim_token": token, "started_at": tx.now, "crash_count": c.crash_count,
                "created_at": tx.now, "updated_at": tx.now} for c in claims])
    except exc.IntegrityError as error:
        # PostgreSQL names the foreign key too: only the unique constraints mean something else
        if dialects.violated_constraint(error) not in schema.CONSTRAINT_COLUMNS:
            # Our process row was reaped mid-claim: the foreign key failed and the
            # whole claim rolled back. A lost race, not a failure.
            log.warning("branch claim lost: process %s no longer registered", process_id)
            return []
        raise  # pragma: no cover  [INV-ADV-2] a claimable branch has no open advancement (a release closes it)
    return claims


def _claims_of(tx: Tx, won: list[str], token: str) -> list[BranchClaim]:
    """The claims of the branches ``won`` under ``token``: each one's latest step, its
    crash count carried from the step's latest advancement, and its run's definition."""
    s, r = schema.steps, schema.runs
    # latest_step's order: each branch's last row is its latest step (the last one a dict keeps)
    latest = {row.branch_id: schema.from_row(StepRow, row) for row in tx.execute(
        sa.select(s.c.id, s.c.run_id, s.c.branch_id, s.c.node, s.c.klass, s.c.status)
        .where(s.c.branch_id.in_(dialects.inline_ids(won)))
        .order_by(s.c.branch_id, s.c.started_at, s.c.id))}  # ix_step_branch_started
    # each step's last row is its latest advancement (as for the steps above): its crash
    # count, one more when that advancement crashed
    crashes = {row.step_id: row.crash_count + (1 if row.error_klass in CRASH_CLASSES else 0) for row in tx.execute(
        sa.select(_a.c.step_id, _a.c.crash_count, _a.c.error_klass)
        .where(_a.c.step_id.in_(dialects.inline_ids([latest[b].id for b in won])))
        .order_by(_a.c.step_id, _a.c.started_at, _a.c.id))}
    run_ids = sorted({latest[b].run_id for b in won})
    sha1s: dict[str, str] = {row.id: row.definition_sha1 for row in tx.execute(
        sa.select(r.c.id, r.c.definition_sha1).where(r.c.id.in_(dialects.inline_ids(run_ids))))}
    return [BranchClaim(b, latest[b].run_id, token, new_id(), crashes.get(latest[b].id, 0), latest[b],
                        sha1s[latest[b].run_id]) for b in won]


@dataclass(frozen=True)
class Move:
    """A simple transition, decided before the transaction that makes it: the branch goes
    on to ``node`` (reached by ``kind``, with ``value_json`` as its input) and stays
    ``in_progress``, or ends with ``status`` (``completed``, ``dampened``, ``halted`` with
    ``halt_reason``). ``complete_from``: the step's status that completing it requires
    (None: a failed step stays failed)."""

    branch_id: str
    run_id: str
    step_id: str
    complete_from: str | None
    status: str = "in_progress"
    node: str | None = None
    kind: str | None = None
    value_json: str | None = None
    halt_reason: str | None = None
    #: the output its step stores as it completes (a worker's success; None: stored before)
    output: str | None = None
    #: the routing error a halt records on its advancement (an advancer's move only)
    error: ErrorInfo | None = None

    @property
    def ends(self) -> bool:
        return self.status != "in_progress"


def fence(tx: Tx, held: Mapping[str, str | None], *, barrier: str | None = None) -> dict[str, sa.Row[Any]]:
    """The branch fence [INV-ADV-2]: lock the branch rows (one statement, branch-id order
    [lock order]) and return those still held as ``held`` says, each by its caller's claim
    token, or, for None, free (unclaimed and in progress: a worker's success may move it).
    A branch not returned is someone else's now (another claim, or it moved on): nothing of
    it may be written. Every advancement locks its branches through this one function;
    ``barrier``: one more row locked in the same statement, not checked (a fan-in's
    barrier, which it bumps)."""
    locked = sorted({*held, *([barrier] if barrier else [])})  # [lock order] in branch-id order, a barrier too
    rows = tx.execute(dialects.prepared(tx.conn, _branch_locks), {"batch_ids": locked})
    return {row.id: row for row in rows if row.id in held and _held_as(row, held[row.id])}  # [INV-ADV-2] the fence


def _held_as(row: sa.Row[Any], token: str | None) -> bool:
    """Whether a locked branch row is held as its caller says: by ``token``, or, for None,
    free (unclaimed, and in progress: not ended)."""
    if token is None:
        return row.claim_token is None and row.status == "in_progress"
    return bool(row.claim_token == token)


def _branch_locks(bind: Any) -> sa.Select[Any]:
    stmt = sa.select(_b.c.id, _b.c.claim_token, _b.c.status).where(_b.c.id.in_(dialects.ids_param())).order_by(_b.c.id)
    return dialects.for_update(stmt, bind)


class StepMovedOn(Exception):
    """A step to be completed was no longer in the status its move required: for a worker's
    inline advancement, its execution was taken and another attempt moved the step on
    (the success's transaction rolls back: ``outcomes``); for an advancer, whose branch
    fence checked the token, it cannot happen [INV-ADV-1]."""


def _make_moves(tx: Tx, moves: list[Move], definitions: Mapping[str, Definition]) -> None:
    """Complete the moves' steps and create their successors; the branches' own rows are
    the caller's (each path guards them its own way). Raises :class:`StepMovedOn` when a
    step's status is not the one its move completes it from."""
    for status in sorted({m.complete_from for m in moves if m.complete_from is not None}):
        outputs = {m.step_id: m.output for m in moves if m.complete_from == status}
        done = set_status_if(tx, outputs, status, "completed")
        if done != len(outputs):  # [INV-ADV-1] the step's status guard: moved past once
            raise StepMovedOn(f"steps {list(outputs)}: {done} of {len(outputs)} were {status}")
    new: list[tuple[str, Definition, NewStep]] = []
    for m in moves:
        if m.node is not None:
            assert m.kind is not None, m
            assert m.value_json is not None, m
            step = NewStep(m.branch_id, m.node, m.kind, "[" + m.value_json + "]")
            new.append((m.run_id, definitions[m.run_id], step))
    # [INV-ADV-1] each step completes and its successor exists in one transaction
    create_steps_across(tx, new)


def set_status_if(tx: Tx, outputs: Mapping[str, str | None], status: str, to: str) -> int:
    """Move the steps ``outputs`` names (by id) from ``status`` to ``to``, each storing its
    output (payload JSON; None keeps the stored one) in the same write: each write is
    guarded by the status, so a step no longer ``status`` is left as it is. Returns how many
    moved; the caller compares it with how many it asked [INV-ADV-1, INV-EXE-2].
    ``completed`` stamps ``completed_at``. One UPDATE per distinct output while there are
    at most :data:`DISTINCT_OUTPUTS`, else one UPDATE per step in one ``executemany``."""
    now = tx.now
    params = {"b_status": status, "b_to": to, "b_now": now, "b_completed": now if to == "completed" else None}
    by_output: dict[str | None, list[str]] = {}
    for step_id, output in outputs.items():
        by_output.setdefault(output, []).append(step_id)
    if len(by_output) <= DISTINCT_OUTPUTS:
        return sum(tx.execute(dialects.prepared(tx.conn, _set_status_in),
                              {**params, "batch_ids": ids, "b_payload": output}).rowcount
                   for output, ids in by_output.items())
    return int(tx.execute(dialects.prepared(tx.conn, _set_status_each),
                          [{**params, "b_id": i, "b_payload": output} for i, output in outputs.items()]).rowcount)


def _set_status(bind: Any, which: sa.ColumnElement[bool]) -> sa.Update:
    s = schema.steps
    stamp = sa.bindparam("b_completed", type_=schema.Timestamp)
    return (s.update()
            .where(which, dialects.by_primary_key(s.c.status, bind) == sa.bindparam("b_status", type_=s.c.status.type))
            .values(status=sa.bindparam("b_to", type_=s.c.status.type),
                    output_payload=sa.func.coalesce(sa.bindparam("b_payload", type_=s.c.output_payload.type),
                                                    s.c.output_payload),
                    completed_at=sa.func.coalesce(stamp, s.c.completed_at),
                    updated_at=sa.bindparam("b_now", type_=schema.Timestamp)))


def _set_status_in(bind: Any) -> sa.Update:
    return _set_status(bind, schema.steps.c.id.in_(dialects.ids_param()))


def _set_status_each(bind: Any) -> sa.Update:
    return _set_status(bind, schema.steps.c.id == sa.bindparam("b_id", type_=schema.steps.c.id.type))


def _end_branches(tx: Tx, moves: list[Move], tokens: list[str] | None) -> None:
    """Move each branch on (``in_progress``) or to its move's end status, dropping any claim
    and stamping ``last_advanced_at``: one UPDATE per status and halt reason, guarded by
    the claim that holds the branches (``tokens``; None: free, ``claim_token IS NULL``),
    and every row must match it (the fence locked them)."""
    groups: dict[tuple[str, str | None], list[str]] = {}
    for m in moves:
        groups.setdefault((m.status, m.halt_reason), []).append(m.branch_id)
    for (status, reason), ids in sorted(groups.items(), key=str):
        params: dict[str, Any] = {"batch_ids": ids, "b_now": tx.now, "b_status": status, "b_reason": reason}
        if tokens is None:
            moved = tx.execute(dialects.prepared(tx.conn, _MOVE_FREE[status in _ENDED]), params)
        else:
            moved = tx.execute(_move_held(status in _ENDED).where(_b.c.claim_token.in_(tokens)), params)
        if moved.rowcount != len(ids):  # pragma: no cover  [INV-ADV-2] rows locked and guarded before: all match
            raise AssertionError(f"branches {ids}: {moved.rowcount} moved inside the batch [INV-ADV-2]")


#: the end statuses that stamp ``completed_at``
_ENDED = frozenset({"completed", "halted"})


def _move_held(ends: bool) -> sa.Update:
    """The UPDATE that moves branches (``batch_ids``) to ``b_status`` (``b_reason``: a halt's),
    unclaimed, at ``b_now``; ``ends``: it stamps ``completed_at``. The caller adds the guard."""
    now = sa.bindparam("b_now", type_=schema.Timestamp)
    values: dict[str, Any] = {"status": sa.bindparam("b_status", type_=_b.c.status.type), "claim_token": None,
                              "claimed_at": None, "last_advanced_at": now, "updated_at": now,
                              "halt_reason": sa.bindparam("b_reason", type_=_b.c.halt_reason.type)}
    if ends:
        values["completed_at"] = now
    return _b.update().where(_b.c.id.in_(dialects.ids_param())).values(**values)


#: builders (``dialects.prepared``) of :func:`_move_held` for free branches, by ``ends``
_MOVE_FREE = {ends: lambda _, ends=ends: _move_held(ends).where(_b.c.claim_token.is_(None)) for ends in (False, True)}


def advance_on_successes(tx: Tx, successes: Sequence[Inline]) -> set[str]:
    """Advance the branches of a success transaction's steps past them, in that
    transaction (``outcomes.record_successes``); returns the ids of the steps advanced.

    The model's ``advance_on_successes`` (one success is a group of one, on both sides):
    equal to advancing each in turn. Each success whose edge is a simple transition
    (:func:`simple_move`: ``chain``, ``converge``, a ``divert`` with a target, a leaf,
    ``dampen``) and whose branch is free (unclaimed, in progress) has its step go straight
    from ``in_progress`` to ``completed``, with its successor (step, first execution)
    created, or its branch ended (``completed`` for a leaf, ``dampened``) and its run
    resolved [INV-RUN-1]; no advancement row is written (a worker's move holds no claim, and
    a closed advancement without an error is read by nothing). The others are left to the
    caller (their steps become ``advancing``, for an advancer), and so are those whose next
    step's partition cannot be rendered (``steps.renders``). Exactly once as for a fenced
    advancement [INV-ADV-1]: the branch row is locked and must be unclaimed (no advancer can
    hold it: until this transaction commits its step is not advanceable), the step's
    completion is guarded by its status (a step an earlier attempt moved on raises
    :class:`StepMovedOn`), and ``uq_step_branch_node`` forbids a second successor.

    Lock order [lock order]: every branch row first, in branch-id order, then every run
    row of the moves, in run-id order (``runs.lock_runs``), before any write; an
    advancer's batch takes the same order, and a single fence its own branch, then its
    run. The runs of branches that go on are locked too: on InnoDB inserting their steps
    takes shared locks on the run rows, and two batches each holding one run and
    inserting under the other's would deadlock. Not done here: fan-out, fan-in and expand
    edges.
    """
    planned = [(i, move) for i in successes
               if (move := simple_move(i.definition, i.claimed.node, i.value_json)) is not None
               and renders(i.definition, move[1], i.value_json)]  # else an advancer halts it, naming why
    if not planned:
        return set()
    definitions = {i.claimed.run_id: i.definition for i, _ in planned}
    # a branch an advancer holds, or that ended, is not ours to move (the fence keeps only
    # free ones): its step waits for an advancer
    moves = [Move(i.claimed.branch_id, i.claimed.run_id, i.claimed.step_id, "in_progress", status, node, kind,
                  i.value_json, output=i.output) for i, (status, node, kind) in planned]
    made, _ = move_branches(tx, moves, definitions)
    return {m.step_id for m in made}


def move_branches(tx: Tx, moves: Sequence[Move], definitions: Mapping[str, Definition], *,
                  held: Mapping[str, BranchClaim] | None = None) -> tuple[list[Move], dict[str, str]]:
    """Make simple moves (:class:`Move`), fenced: the one function behind every simple
    transition, an advancer's (``held``: its claims by branch id) or a worker's (None: the
    branches must be free). Returns the moves made and the status of each run a move ended
    a branch of.

    The fence (:func:`fence`) keeps the moves whose branch is still held as the caller
    says [INV-ADV-2]; then their run rows are locked (run-id order), before any write
    [lock order]; each step is completed (from the status its move requires) and what
    follows it created in this transaction [INV-ADV-1]; an advancer's advancements are
    closed; each branch goes on (``in_progress``, unclaimed) or ends, and the runs of the branches
    that ended are resolved [INV-RUN-1]."""
    live = fence(tx, {m.branch_id: None if held is None else held[m.branch_id].token for m in moves})
    made = [m for m in moves if m.branch_id in live]
    if not made:
        return [], {}
    runs = lock_runs(tx, [m.run_id for m in made])  # [lock order] the runs after every branch
    faults.hit(faults.INSIDE_ADVANCE_BATCH)
    _make_moves(tx, made, definitions)
    if held is not None:
        _close_advancements(tx, made, held)
    tokens = None if held is None else [held[m.branch_id].token for m in made]
    _end_branches(tx, made, tokens)  # [INV-ADV-2] only the holders may move them
    return made, resolve_runs(tx, {m.run_id: runs[m.run_id] for m in made if m.ends})


def _close_advancements(tx: Tx, made: list[Move], held: Mapping[str, BranchClaim]) -> None:
    """The advancer's open advancements of moves made, closed (with a halt's error)."""
    now = tx.now
    ids = [held[m.branch_id].advancement_id for m in made if m.error is None]
    closed = tx.execute(_a.update().where(_a.c.id.in_(dialects.inline_ids(ids)), _a.c.completed_at.is_(None))
                        .values(completed_at=now, updated_at=now)).rowcount if ids else 0
    closed += sum(close_advancement(tx, held[m.branch_id].advancement_id, error_klass=m.error.klass,
                                    error_message=m.error.message, error_backtrace=m.error.backtrace)
                  for m in made if m.error is not None)
    if closed != len(made):  # pragma: no cover  [INV-ADV-2] tokens checked under the locks: none closed
        raise AssertionError(f"advancements of {made}: {closed} open inside their fence [INV-ADV-2]")


def value_json_of(output_payload: str | None) -> str | None:
    """The JSON text of a succeeded step's value from its stored output; None when
    there is none, or it is an expand's item count (never a simple move)."""
    if output_payload is None:
        return None  # pragma: no cover  read only for advancing steps, whose success stored the output
    stored = json.loads(output_payload)
    return json.dumps(stored["payload"]) if "payload" in stored else None


@dataclass(frozen=True)
class Inline:
    """A success's step to advance past in a worker's transaction (:func:`advance_on_successes`):
    its claim, its run's definition, the JSON text of its value and its output (the payload
    JSON its step stores)."""

    claimed: Claimed
    definition: Definition
    value_json: str
    output: str
