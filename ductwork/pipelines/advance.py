"""Advancement: moving a branch past a finished step, exactly once.

    >>> advancer = Advancer(app)
    >>> advancer.run_once()        # "idle" | "contended" | "advanced" | "stale" | "error"
    'advanced'

A branch whose latest step is ``advancing`` (its job succeeded) or ``failed`` is
claimed with a conditional UPDATE that re-asserts every predicate of the
candidate query and writes a fresh claim token. Every mutation after that runs
in a *fence*: one transaction that locks the branch row, compares its token with
the one taken at claim, and only then writes [INV-ADV-2]. Completing the step,
creating what follows it (next step, fan-out children, fan-in target, their jobs
and executions) and closing the bookkeeping commit together [INV-ADV-1]; a crash
anywhere leaves all of it or none of it, and the branch is re-claimed and the
transition re-run from scratch after the reaper releases it.

Fan-in (combine, collapse) is a counter on the barrier branch, bumped inside each
arriving sibling's fence; the sibling whose bump makes it equal the fan-out width
creates the merge target, so the merge fires once and only after every sibling
arrived [INV-ADV-3]. An expand creates its children in batches of
``pipeline_advancer.expand_batch`` per fence, with a cursor on the branch, so a
million items never sit in one transaction or in memory, and a crash between
batches resumes without creating a child twice [INV-ADV-4].

Not done here: running steps (fleet/worker.py), or recovering the claims of dead
processes (reaper.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import exc

from ductwork import faults, logs
from ductwork.db import dialects, schema
from ductwork.db.ids import new_id, new_token
from ductwork.errors import PayloadTooLargeError, StaleClaim, TransitionError
from ductwork.limits.executions import UNKNOWN_CLASS, ErrorInfo, payload_envelope
from ductwork.pipelines import payloads
from ductwork.pipelines.definition import render_divert_key
from ductwork.pipelines.runs import cached_definition, lock_run, resolve_run
from ductwork.pipelines.steps import (
    ADVANCEABLE,
    NewStep,
    StepRow,
    create_branches,
    create_steps,
    latest_step,
    payload_json,
    step_complete,
    step_output_json,
)

if TYPE_CHECKING:
    from ductwork.db.database import Database as App
    from ductwork.db.database import Tx
    from ductwork.pipelines.definition import Definition

log = logging.getLogger("ductwork.advance")

PROCESS_CRASH = "ductwork.ProcessCrash"
THREAD_CRASH = "ductwork.ThreadCrash"
CRASH_CLASSES = (PROCESS_CRASH, THREAD_CRASH)
MAX_CLAIM_ATTEMPTS = 3

#: halt reasons of a step whose last execution was ``invalid``, by the error's class: a
#: stored class that is not of the configured pipelines (never imported), or a return
#: value that cannot be stored (fleet.invoke.ReturnRejected); any other ``invalid`` execution
#: (the input does not bind to ``__init__``) halts ``job_invalid``
INVALID_HALTS = {
    UNKNOWN_CLASS: "unknown_step_class",
    "ductwork.errors.PayloadTooLargeError": "payload_too_large",
    "ductwork.errors.NotJSONError": "step_return_invalid",
    "ductwork.errors.StepReturnError": "step_return_invalid",
}


def job_halt_reason(outcome: str | None, error_klass: str | None = None) -> str:
    """Why a branch halts on its failed step, from the step's last execution (semantics §3.1).

    >>> [job_halt_reason(o) for o in ("failure", "timed_out", "process_crashed", "invalid")]
    ['job_retries_exhausted', 'job_retries_exhausted', 'job_crashes_exhausted', 'job_invalid']
    >>> job_halt_reason("invalid", "ductwork.errors.PayloadTooLargeError")
    'payload_too_large'
    """
    if outcome == "process_crashed":
        return "job_crashes_exhausted"
    if outcome == "invalid":
        return INVALID_HALTS.get(error_klass or "", "job_invalid")
    return "job_retries_exhausted"


def fan_in_size(stored: int, count: int) -> int:
    """Length of the JSON list of ``count`` outputs whose stored envelopes
    (``executions.payload_envelope``) are ``stored`` characters long in all."""
    return stored - count * len(payload_envelope("")) + max(count - 1, 0) + len("[]")


_b, _a = schema.branches, schema.advancements


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


def claim_branch(app: App, branch_id: str, process_id: str) -> BranchClaim | None:
    """Claim one branch; None if another advancer won it or it no longer qualifies."""
    token = new_token()
    s = schema.steps
    try:
        with app.begin() as tx:
            won = tx.execute(
                _b.update()
                .where(_b.c.id == branch_id,
                       # Re-assert every predicate of `candidates`: a branch advanced and
                       # released since we read it must not be claimed off its new step.
                       _b.c.status == "in_progress",
                       _b.c.claim_token.is_(None),
                       sa.exists().where(s.c.branch_id == branch_id, s.c.status.in_(ADVANCEABLE)))
                .values(status="advancing", claim_token=token, claimed_at=tx.now, updated_at=tx.now)
            )
            if won.rowcount != 1:
                return None
            step = latest_step(tx, branch_id)
            assert step is not None, f"branch {branch_id} has no step"
            previous = tx.execute(
                sa.select(_a.c.crash_count, _a.c.error_klass).where(_a.c.step_id == step.id)
                .order_by(_a.c.started_at.desc(), _a.c.id.desc()).limit(1)
            ).first()
            crash_count = 0 if previous is None else (
                previous.crash_count + (1 if previous.error_klass in CRASH_CLASSES else 0))
            faults.hit(faults.BEFORE_ADVANCEMENT_CREATE)
            advancement_id = new_id()
            tx.execute(_a.insert().values(
                id=advancement_id, branch_id=branch_id, step_id=step.id, process_id=process_id,
                claim_token=token, started_at=tx.now, crash_count=crash_count,
                created_at=tx.now, updated_at=tx.now))
            sha1 = tx.execute(
                sa.select(schema.runs.c.definition_sha1).where(schema.runs.c.id == step.run_id)
            ).scalar_one()
    except exc.IntegrityError as error:
        if dialects.violated_constraint(error) is None:
            # Our process row was reaped mid-claim: the foreign key failed and the
            # whole claim rolled back. A lost race, not a failure.
            log.warning("branch claim lost: process %s no longer registered", process_id)
            return None
        raise
    return BranchClaim(branch_id, step.run_id, token, advancement_id, crash_count, step, sha1)


class Advancer:
    """Claims and advances branches, one per :meth:`run_once`."""

    def __init__(self, app: App, *, process_id: str | None = None, rng: random.Random | None = None):
        self.app = app
        self._process_id = process_id
        self.rng = rng or random.Random()
        self._unreleased: list[BranchClaim] = []
        #: the advancement this advancer is working on (what a runner's reconciliation skips)
        self.current: str | None = None

    def held(self) -> set[str]:
        """The advancement this advancer holds (what a runner's reconciliation skips)."""
        current = self.current
        return set() if current is None else {current}

    @property
    def process_id(self) -> str:
        return self._process_id or self.app.process_id()

    # -- the loop body ----------------------------------------------------------------

    def run_once(self) -> str:
        """Claim and advance at most one branch. Never sleeps.

        Returns ``idle`` (nothing to do), ``contended`` (candidates existed but others
        won them), ``advanced``, ``stale`` (the claim was lost mid-way; nothing
        committed) or ``error`` (routing raised; recorded, branch released).
        """
        self._retry_cleanups()
        cfg = self.app.config.pipeline_advancer
        window = max(20, min(100, 4 * cfg.count))
        with self.app.begin(readonly=True) as tx:
            ids = candidates(tx, window)
        if not ids:
            return "idle"
        faults.hit(faults.AFTER_BRANCH_CANDIDATE_SELECT)
        picks = ids[:1] if len(ids) == 1 else self.rng.sample(ids, min(MAX_CLAIM_ATTEMPTS, len(ids)))
        claim = None
        for branch_id in picks:
            claim = claim_branch(self.app, branch_id, self.process_id)
            if claim is not None:
                break
        if claim is None:
            return "contended"
        self.current = claim.advancement_id
        try:
            faults.hit(faults.AFTER_BRANCH_CLAIM)
            result = self.advance(claim)
        finally:
            self.current = None
            if not claim.closed:
                self._abandon(claim)
        faults.hit(faults.AFTER_BRANCH_ADVANCEMENT)
        return result

    def advance(self, c: BranchClaim) -> str:
        """Advance a claimed branch past its latest step (the decision order of semantics §3)."""
        cfg = self.app.config.pipeline_advancer
        try:
            if c.step.status not in ADVANCEABLE:
                # Stale-claim backstop: nothing to route. Release without an error so a
                # healthy branch's budgets are not burnt.
                with self._fence(c) as tx:
                    self._close(tx, c)
                    self._release(tx, c)
                log.warning("branch %s claimed with no advanceable step; released", c.branch_id)
                return "stale"
            if c.crash_count >= cfg.max_crash:
                self._halt(c, "advancer_crashes_exhausted")
            elif c.step.status == "failed":
                self._halt(c, self._job_halt_reason(c))
            else:
                self._route(c)
            return "advanced"
        except StaleClaim as stale:
            log.warning("%s; nothing committed", stale)
            c.closed = True  # someone else holds it now: nothing of ours to clean up
            return "stale"
        except TransitionError as error:
            self._halt(c, "transition_invalid", ErrorInfo.of(error))
            return "advanced"
        except PayloadTooLargeError as error:  # a fan-in's list: as large again on every retry
            self._halt(c, "payload_too_large", ErrorInfo.of(error))
            return "advanced"
        except Exception as error:  # noqa: BLE001 - any routing error is recorded, never lost
            self._record_error(c, error)
            return "error"

    # -- fences and bookkeeping ------------------------------------------------------------

    @contextlib.contextmanager
    def _fence(self, c: BranchClaim, *, ends_branch: bool = False) -> Iterator[Tx]:
        """A transaction that commits only while ``c.token`` still holds the branch.

        ``ends_branch``: the block may end the branch and so decide the run's state;
        the run row is then locked right after the branch row, before any write. One
        lock order (own branch, run, barrier) for every such transaction means two
        siblings ending at once queue instead of deadlocking (on InnoDB, earlier
        writes take shared locks on the run row that a later exclusive lock would
        have to upgrade).
        """
        with self.app.begin() as tx:
            found = tx.execute(
                dialects.for_update(sa.select(_b.c.claim_token).where(_b.c.id == c.branch_id), tx.conn)
            ).scalar_one()
            if found != c.token:
                raise StaleClaim(c.branch_id, c.token, found)  # [INV-ADV-2] a stale token commits nothing
            if ends_branch:
                lock_run(tx, c.run_id)
            yield tx
            faults.hit(faults.BEFORE_FENCE_COMMIT)

    def _close(self, tx: Tx, c: BranchClaim, error: ErrorInfo | None = None) -> None:
        closed = close_advancement(tx, c.advancement_id, error_klass=error.klass if error else None,
                                   error_message=error.message if error else None,
                                   error_backtrace=error.backtrace if error else None)
        if not closed:
            raise AssertionError(f"advancement {c.advancement_id} not open inside its fence [INV-ADV-2]")
        c.closed = True

    def _set_branch(self, tx: Tx, c: BranchClaim, status: str, **values: object) -> None:
        """Move the held branch to ``status`` and drop the claim (token-guarded)."""
        moved = tx.execute(
            _b.update()
            .where(_b.c.id == c.branch_id,
                   _b.c.claim_token == c.token)  # [INV-ADV-2] only the holder may move it
            .values(status=status, claim_token=None, claimed_at=None, last_advanced_at=tx.now,
                    updated_at=tx.now, **values)
        )
        if moved.rowcount != 1:
            raise AssertionError(f"branch {c.branch_id} lost inside its fence [INV-ADV-2]")

    def _release(self, tx: Tx, c: BranchClaim) -> None:
        self._set_branch(tx, c, "in_progress")

    def _abandon(self, c: BranchClaim, klass: str = THREAD_CRASH) -> None:
        """Close an advancement that an exception left open and release the branch."""
        try:
            with self.app.begin() as tx:
                release_advancement(tx, c.advancement_id, c.branch_id, c.token,
                                    "Advancement was abandoned by its thread", klass)
            c.closed = True
        except exc.DBAPIError:
            log.exception("could not release branch %s; will retry", c.branch_id)
            self._unreleased.append(c)

    def _retry_cleanups(self) -> None:
        pending, self._unreleased = self._unreleased, []
        for c in pending:
            self._abandon(c)

    def _job_halt_reason(self, c: BranchClaim) -> str:
        e = schema.executions
        with self.app.begin() as tx:
            last = tx.execute(
                sa.select(e.c.outcome, e.c.error_klass)
                .where(e.c.job_id == c.step.job_id, e.c.completed_at.is_not(None))
                .order_by(e.c.completed_at.desc(), e.c.id.desc()).limit(1)
            ).first()
        return job_halt_reason(last.outcome, last.error_klass) if last else job_halt_reason(None, None)

    def _halt(self, c: BranchClaim, reason: str, error: ErrorInfo | None = None) -> None:
        with self._fence(c, ends_branch=True) as tx:
            if c.step.status == "advancing":
                step_complete(tx, c.step.id)
            self._close(tx, c, error)
            self._set_branch(tx, c, "halted", halt_reason=reason, completed_at=tx.now)
            run_status = resolve_run(tx, c.run_id)
        self._log_halt(c, reason, run_status, error)

    def _log_halt(self, c: BranchClaim, reason: str, run_status: str, error: ErrorInfo | None) -> None:
        """The WARNING for a halt, once its fence committed."""
        logs.branch_halted(log, run_id=c.run_id, pipeline=cached_definition(self.app, c.definition_sha1).pipeline,
                           branch_id=c.branch_id, step=c.step.klass, node=c.step.node, step_id=c.step.id,
                           reason=reason, run_status=run_status, error=error.klass if error else None,
                           error_message=error.message if error else None, traceback=error.text if error else None)

    def _record_error(self, c: BranchClaim, error: Exception) -> None:
        """Record a routing error: the branch is released for another attempt, or halts
        ``advancer_retries_exhausted``; logged at WARNING once that committed."""
        info = ErrorInfo.of(error)
        max_retry = self.app.config.pipeline_advancer.max_retry
        run_status = None
        try:
            with self._fence(c, ends_branch=True) as tx:
                failures = tx.execute(
                    sa.select(sa.func.count()).select_from(_a)
                    .where(_a.c.step_id == c.step.id, _a.c.error_klass.is_not(None),
                           _a.c.error_klass.not_in(CRASH_CLASSES))
                ).scalar_one()
                if failures >= max_retry:
                    if c.step.status == "advancing":
                        step_complete(tx, c.step.id)
                    self._close(tx, c, info)
                    self._set_branch(tx, c, "halted", halt_reason="advancer_retries_exhausted",
                                     completed_at=tx.now)
                    run_status = resolve_run(tx, c.run_id)
                else:
                    self._close(tx, c, info)
                    self._release(tx, c)
        except StaleClaim:
            c.closed = True
            self._log_error(c, info, "not recorded: its claim was lost", "none")
            return
        except BaseException as failed:
            self._log_error(c, info, f"not recorded: recording it raised {type(failed).__name__}", "none")
            raise
        if run_status is not None:
            self._log_halt(c, "advancer_retries_exhausted", run_status, info)
        else:
            self._log_error(c, info, f"the branch is released for retry {failures + 1} of {max_retry}", "retry")

    def _log_error(self, c: BranchClaim, info: ErrorInfo, then: str, next_: str) -> None:
        logs.advancement_failed(log, run_id=c.run_id, branch_id=c.branch_id, node=c.step.node,
                                step_id=c.step.id, error=info.klass, error_message=info.message, then=then,
                                next_=next_, traceback=info.text)

    # -- routing ----------------------------------------------------------------------------

    def _route(self, c: BranchClaim) -> None:
        definition = cached_definition(self.app, c.definition_sha1)
        edge = definition.edges.get(c.step.node)
        if edge is None or not edge.to:
            return self._leaf(c)
        kind = edge.type
        if kind in ("chain", "converge"):
            return self._continue(c, definition, edge.first(), "chain" if kind == "chain" else kind)
        if kind == "divert":
            with self.app.begin() as tx:
                value = json.loads(step_output_json(tx, c.step.id))
            key = render_divert_key(value)
            node = edge.divert_target(key)
            if node is None:
                raise TransitionError(f"divert from {c.step.node}: no target for {key!r} and no otherwise")
            return self._continue(c, definition, node, "divert")
        if kind == "divide":
            return self._divide(c, definition, list(edge.to))
        if kind == "expand":
            return self._expand(c, definition, edge.first())
        if kind in ("combine", "collapse"):
            return self._fan_in(c, definition, kind)
        if kind == "dampen":
            with self._fence(c, ends_branch=True) as tx:
                step_complete(tx, c.step.id)
                self._close(tx, c)
                self._set_branch(tx, c, "dampened")
                resolve_run(tx, c.run_id)
            return None
        raise TransitionError(f"unknown edge type {kind!r} from node {c.step.node}")

    def _leaf(self, c: BranchClaim) -> None:
        with self._fence(c, ends_branch=True) as tx:
            step_complete(tx, c.step.id)
            self._close(tx, c)
            self._set_branch(tx, c, "completed", completed_at=tx.now)
            resolve_run(tx, c.run_id)

    def _continue(self, c: BranchClaim, definition: Definition, node: str, kind: str) -> None:
        """chain, converge, divert: the next step on the same branch."""
        with self._fence(c) as tx:
            args = "[" + step_output_json(tx, c.step.id) + "]"
            # [INV-ADV-1] the step completes and its successor exists in one fenced transaction
            step_complete(tx, c.step.id)
            create_steps(tx, c.run_id, definition, [NewStep(c.branch_id, node, kind, args)])
            self._close(tx, c)
            self._release(tx, c)

    def _new_branches(self, tx: Tx, c: BranchClaim, count: int, first_index: int) -> list[str]:
        ids = [new_id() for _ in range(count)]
        create_branches(tx, c.run_id, [
            {"id": bid, "parent_id": c.branch_id, "barrier_id": c.branch_id, "barrier_index": first_index + i}
            for i, bid in enumerate(ids)
        ])  # [INV-ADV-4] uq_branch_child_index: one child per (parent, index)
        return ids

    def _divide(self, c: BranchClaim, definition: Definition, nodes: list[str]) -> None:
        with self._fence(c) as tx:
            args = "[" + step_output_json(tx, c.step.id) + "]"
            step_complete(tx, c.step.id)
            children = self._new_branches(tx, c, len(nodes), 0)
            create_steps(tx, c.run_id, definition,
                         [NewStep(b, n, "divide", args) for b, n in zip(children, nodes, strict=True)])
            self._close(tx, c)
            self._set_branch(tx, c, "completed", completed_at=tx.now, fanout_width=len(nodes))

    def _expand(self, c: BranchClaim, definition: Definition, node: str) -> None:
        batch = self.app.config.pipeline_advancer.expand_batch
        while True:
            with self._fence(c, ends_branch=True) as tx:
                payload = tx.execute(
                    sa.select(schema.jobs.c.output_payload).where(schema.jobs.c.id == c.step.job_id)
                ).scalar_one()
                total = json.loads(payload)["expand_items"]
                if total == 0:
                    step_complete(tx, c.step.id)
                    self._close(tx, c)
                    self._set_branch(tx, c, "completed", completed_at=tx.now)
                    resolve_run(tx, c.run_id)
                    return
                cursor = tx.execute(sa.select(_b.c.fanout_cursor).where(_b.c.id == c.branch_id)).scalar_one() or 0
                items = tx.execute(
                    sa.select(schema.expand_items.c.item_index, schema.expand_items.c.value)
                    .where(schema.expand_items.c.job_id == c.step.job_id,
                           schema.expand_items.c.item_index >= cursor)  # [INV-ADV-4] resume at the cursor
                    .order_by(schema.expand_items.c.item_index).limit(batch)
                ).all()
                children = self._new_branches(tx, c, len(items), cursor)
                create_steps(tx, c.run_id, definition,
                             [NewStep(b, node, "expand", "[" + item.value + "]")
                              for b, item in zip(children, items, strict=True)])
                cursor += len(items)
                done = cursor >= total
                values = {"fanout_cursor": cursor, "fanout_width": total}
                if done:
                    step_complete(tx, c.step.id)
                    self._close(tx, c)
                    self._set_branch(tx, c, "completed", completed_at=tx.now, **values)
                else:
                    tx.execute(_b.update().where(_b.c.id == c.branch_id).values(updated_at=tx.now, **values))
            if done:
                return
            faults.hit(faults.BETWEEN_EXPAND_BATCHES)

    def _fan_in(self, c: BranchClaim, definition: Definition, kind: str) -> None:
        edge = definition.edges[c.step.node]
        with self._fence(c, ends_branch=True) as tx:
            barrier_id = tx.execute(sa.select(_b.c.barrier_id).where(_b.c.id == c.branch_id)).scalar_one()
            if barrier_id is None:
                raise TransitionError(f"{kind} from {c.step.node}: branch {c.branch_id} has no barrier")
            barrier = tx.execute(
                sa.select(_b.c.fanout_width, _b.c.barrier_id, _b.c.barrier_index).where(_b.c.id == barrier_id)
            ).one()
            fanned = latest_step(tx, barrier_id)
            if fanned is None or fanned.node not in (edge.barrier or ()):
                raise TransitionError(
                    f"{kind} from {c.step.node}: barrier {barrier_id} ran "
                    f"{fanned.node if fanned else None}, expected one of {edge.barrier}")
            step_complete(tx, c.step.id)
            self._close(tx, c)
            self._set_branch(tx, c, "completed", completed_at=tx.now, fanin_arrived_at=tx.now)
            faults.hit(faults.BEFORE_FANIN_BUMP)
            bumped = tx.execute(
                _b.update()
                .where(_b.c.id == barrier_id,
                       _b.c.fanin_arrivals < _b.c.fanout_width)  # never more arrivals than children
                .values(fanin_arrivals=_b.c.fanin_arrivals + 1, updated_at=tx.now)
            ).rowcount
            if bumped != 1:
                raise AssertionError(f"barrier {barrier_id}: more arrivals than its width [INV-ADV-3]")
            # We hold the barrier row's lock from the UPDATE until commit, so this read sees
            # our increment on top of every earlier one: exactly one sibling reads the width.
            arrivals = tx.execute(sa.select(_b.c.fanin_arrivals).where(_b.c.id == barrier_id)).scalar_one()
            fired = arrivals == barrier.fanout_width  # [INV-ADV-3] the last arrival fires
            faults.hit(faults.AFTER_FANIN_BUMP)
            if not fired:
                resolve_run(tx, c.run_id)
                return
            sources = [n for n, e in definition.edges.items() if e.type == kind and list(e.to) == list(edge.to)]
            s, j = schema.steps, schema.jobs
            joined = _b.join(s, s.c.branch_id == _b.c.id).join(j, j.c.step_id == s.c.id)
            arrived = (_b.c.barrier_id == barrier_id, _b.c.fanin_arrived_at.is_not(None), s.c.node.in_(sources))
            what = f"{kind} into {edge.first()}: the outputs of {barrier.fanout_width} branches"
            # Measured in the database first: outputs too large together are never loaded.
            stored = tx.execute(
                sa.select(sa.func.sum(sa.func.length(j.c.output_payload))).select_from(joined).where(*arrived)
            ).scalar_one()
            payloads.check_size(fan_in_size(int(stored or 0), barrier.fanout_width), what)
            outputs = tx.execute(
                sa.select(j.c.output_payload).select_from(joined).where(*arrived).order_by(_b.c.barrier_index)
            ).scalars().all()
            if len(outputs) != barrier.fanout_width:
                raise AssertionError(
                    f"barrier {barrier_id}: fired with {len(outputs)} of {barrier.fanout_width} inputs [INV-ADV-3]")
            merged = new_id()
            create_branches(tx, c.run_id, [{
                "id": merged, "barrier_id": barrier.barrier_id, "barrier_index": barrier.barrier_index,
                "merged_barrier_id": barrier_id,
            }])  # [INV-ADV-3] uq_branch_merge_per_barrier
            value_json = "[" + ",".join(payload_json(o) for o in outputs) + "]"
            payloads.check_size(len(value_json), what)  # the one rule, on the list itself
            create_steps(tx, c.run_id, definition, [NewStep(merged, edge.first(), kind, "[" + value_json + "]")])


def advance_on_success(claimed: Any, definition: Definition, value_json: str, tx: Tx) -> bool:
    """Advance a branch past a step inside the transaction that records the step's success.

    For linear edges only — ``chain``, ``converge``, and ``divert`` with a target — where
    advancing creates exactly one step on the same branch. The step goes straight from
    ``in_progress`` to ``completed`` and its successor (step, job, first execution) is
    created in the same commit as the job's outcome, so no advancer hop (three
    transactions and, in a fleet, a hand-off between processes) is needed.

    Exactly once for the same reasons as a fenced advancement [INV-ADV-1]: the branch row
    is locked and must be unclaimed — no advancer can hold it, since until this
    transaction commits its step is not advanceable — the step's completion is guarded by
    its status, and ``uq_step_branch_node`` forbids a second successor. An advancement
    row, opened and closed here by the worker's process, keeps the bookkeeping complete.

    Returns False, changing nothing, for every other edge (leaf, fan-out, fan-in,
    expand, dampen, a divert without a target) or a branch not free to advance: the step
    is then left ``advancing`` for an advancer, as without this shortcut. Not done here:
    ending a branch (that needs the run's lock, which an advancer takes in its fence).
    """
    edge = definition.edges.get(claimed.node)
    if edge is None or not edge.to:
        return False
    node: str | None
    if edge.type in ("chain", "converge"):
        node = edge.first()
    elif edge.type == "divert":
        node = edge.divert_target(render_divert_key(json.loads(value_json)))
        if node is None:
            return False
    else:
        return False
    branch = tx.execute(dialects.for_update(
        sa.select(_b.c.claim_token, _b.c.status).where(_b.c.id == claimed.branch_id), tx.conn)).one()
    if branch.claim_token is not None or branch.status != "in_progress":
        return False
    # [INV-ADV-1] the step completes and its successor exists in the outcome's own transaction
    step_complete(tx, claimed.step_id, from_status=("in_progress",))
    create_steps(tx, claimed.run_id, definition,
                 [NewStep(claimed.branch_id, node, edge.type, "[" + value_json + "]")])
    now = tx.now
    tx.execute(_a.insert().values(
        id=new_id(), branch_id=claimed.branch_id, step_id=claimed.step_id, process_id=claimed.process_id,
        claim_token=new_token(), started_at=now, completed_at=now, crash_count=0, created_at=now, updated_at=now))
    tx.execute(_b.update().where(_b.c.id == claimed.branch_id, _b.c.claim_token.is_(None))
               .values(last_advanced_at=now, updated_at=now))
    return True
