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

Batches: an advancer claims up to ``pipeline_advancer.advance_batch`` branches in one
transaction (:func:`claim_branches`) and advances their simple transitions (halts, leaf,
chain, converge, divert, dampen) in one transaction fenced per branch
(:meth:`Advancer.advance_batch`); a worker's group commit advances the simple
transitions of its successes inline (:func:`advance_on_successes`). Each is equal to the
single operations one by one (the model's ``claim_branches``, ``advance_batch`` and
``advance_on_successes``), and every batch locks its branch rows, then its run rows,
before any write.

Not done here: running steps (fleet/worker.py), or recovering the claims of dead
processes (reaper.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import exc

from ductwork import faults, logs
from ductwork.db import dialects, schema
from ductwork.db.ids import new_id, new_token
from ductwork.errors import PayloadTooLargeError, StaleClaim, TransitionError
from ductwork.limits.executions import Claimed, ErrorInfo
from ductwork.pipelines import payloads
from ductwork.pipelines.definition import render_divert_key
from ductwork.pipelines.rules import (
    advancer_crashes_exhausted,
    advancer_retries_exhausted,
    job_halt_reason,
    simple_move,
)
from ductwork.pipelines.runs import cached_definition, lock_run, lock_runs, resolve_run, resolve_runs
from ductwork.pipelines.steps import (
    ADVANCEABLE,
    NewStep,
    StepRow,
    create_branches,
    create_steps,
    create_steps_across,
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

def fan_in_size(stored: int, count: int) -> int:
    """Length of the JSON list of ``count`` outputs whose stored envelopes
    (``payloads.payload_envelope``) are ``stored`` characters long in all."""
    return stored - count * len(payloads.payload_envelope("")) + max(count - 1, 0) + len("[]")


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
    claims = claim_branches(app, [branch_id], process_id)
    return claims[0] if claims else None


def claim_branches(app: App, branch_ids: Sequence[str], process_id: str) -> list[BranchClaim]:
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
    if not ids:
        return []  # pragma: no cover  both callers pass ids: claim_branch one, run_once a non-empty sample
    token = new_token()
    s, j = schema.steps, schema.jobs
    try:
        with app.begin() as tx:
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
            latest: dict[str, StepRow] = {}
            for row in tx.execute(
                    sa.select(s.c.id, s.c.run_id, s.c.branch_id, s.c.node, s.c.klass, s.c.status,
                              j.c.id.label("job_id"))
                    .join(j, j.c.step_id == s.c.id).where(s.c.branch_id.in_(dialects.inline_ids(won)))
                    .order_by(s.c.branch_id, s.c.started_at, s.c.id)):  # ix_step_branch_started
                # latest_step's order: each branch's last row is its latest step
                latest[row.branch_id] = StepRow(row.id, row.run_id, row.branch_id, row.node, row.klass,
                                                row.status, row.job_id)
            step_ids = [latest[b].id for b in won]
            previous: dict[str, tuple[Any, str, int, str | None]] = {}
            for row in tx.execute(
                    sa.select(_a.c.step_id, _a.c.started_at, _a.c.id, _a.c.crash_count, _a.c.error_klass)
                    .where(_a.c.step_id.in_(dialects.inline_ids(step_ids)))
                    .order_by(_a.c.step_id, _a.c.started_at, _a.c.id)):
                # each step's last row is its latest advancement (as for the steps above)
                previous[row.step_id] = (row.started_at, row.id, row.crash_count, row.error_klass)
            r, run_ids = schema.runs, sorted({latest[b].run_id for b in won})
            sha1s: dict[str, str] = {row.id: row.definition_sha1 for row in tx.execute(
                sa.select(r.c.id, r.c.definition_sha1).where(r.c.id.in_(dialects.inline_ids(run_ids))))}
            claims = []
            for branch_id in won:
                step = latest[branch_id]
                last = previous.get(step.id)
                crash_count = 0 if last is None else last[2] + (1 if last[3] in CRASH_CLASSES else 0)
                claims.append(BranchClaim(branch_id, step.run_id, token, new_id(), crash_count, step,
                                          sha1s[step.run_id]))
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


class Advancer:
    """Claims and advances branches, a batch per :meth:`run_once`."""

    def __init__(self, app: App, *, process_id: str | None = None, rng: random.Random | None = None):
        self.app = app
        self._process_id = process_id
        self.rng = rng or random.Random()
        self._unreleased: list[BranchClaim] = []
        #: the advancements this advancer is working on (what a runner's reconciliation skips)
        self.current: frozenset[str] = frozenset()

    def held(self) -> set[str]:
        """The advancements this advancer holds (what a runner's reconciliation skips)."""
        return set(self.current)

    @property
    def process_id(self) -> str:
        return self._process_id or self.app.process_id()

    # -- the loop body ----------------------------------------------------------------

    def run_once(self) -> str:
        """Claim up to ``advance_batch`` branches in one transaction and advance them
        (:meth:`advance_batch`). Never sleeps.

        Returns ``idle`` (nothing to do), ``contended`` (candidates existed but others
        won them), ``advanced`` (at least one branch advanced), ``error`` (routing raised;
        recorded, branch released) or ``stale`` (the claims were lost mid-way; nothing
        committed for them).
        """
        self._retry_cleanups()
        cfg = self.app.config.pipeline_advancer
        # room for every thread's batch, so threads sampling it overlap (and wait on each other) little
        window = max(20, min(100, 4 * cfg.count), cfg.advance_batch * cfg.count)
        with self.app.begin(readonly=True) as tx:
            ids = candidates(tx, window)
        if not ids:
            return "idle"
        faults.hit(faults.AFTER_BRANCH_CANDIDATE_SELECT)
        picks = ids if len(ids) <= cfg.advance_batch else self.rng.sample(ids, cfg.advance_batch)
        claims = claim_branches(self.app, picks, self.process_id)
        if not claims:
            return "contended"
        self.current = frozenset(c.advancement_id for c in claims)
        try:
            faults.hit(faults.AFTER_BRANCH_CLAIM)
            results = self.advance_batch(claims)
        finally:
            self.current = frozenset()
            for claim in claims:
                if not claim.closed:
                    self._abandon(claim)
        faults.hit(faults.AFTER_BRANCH_ADVANCEMENT)
        return next((r for r in ("advanced", "error", "stale") if r in results), "stale")

    def advance_batch(self, claims: list[BranchClaim]) -> list[str]:
        """Advance claimed branches; returns :meth:`advance`'s result for each.

        The simple transitions (:meth:`_batch_move`: halts of a failed step or of a spent
        crash budget, a leaf, ``chain``, ``converge``, a ``divert`` with a target,
        ``dampen``) commit together in one fenced transaction (the model's
        ``advance_batch``: equal to advancing them one by one). The fence is per branch:
        every branch row is locked (FOR UPDATE, branch-id order) and its token compared;
        a branch whose token is stale commits nothing and only it is refused
        [INV-ADV-2]; then every run row of the batch is locked (run-id order) before any
        write, the order :func:`advance_on_successes` takes too. Fan-out, expand, fan-in,
        a divert without a target, and a batch whose transaction fails are advanced one
        by one (:meth:`advance`), where errors are recorded.
        """
        moves: list[tuple[BranchClaim, Move]] = []
        results: dict[str, str] = {}
        outputs = self._outputs([c for c in claims if c.step.status == "advancing"])
        for c in claims:
            move = self._batch_move(c, outputs.get(c.step.id))
            if move is not None:
                moves.append((c, move))
        if len(moves) > 0:
            try:
                results.update(self._commit_batch(moves))
            except Exception as error:  # each is advanced alone below, where errors are recorded
                if dialects.is_disconnect(error):
                    raise
                log.warning("a batch of %d advancements failed (%s); advancing each alone", len(moves), error)
        return [results[c.branch_id] if c.branch_id in results else self.advance(c) for c in claims]

    def _outputs(self, claims: list[BranchClaim]) -> dict[str, str]:
        """The JSON text of each succeeded step's value, by step id (one read)."""
        if not claims:
            return {}
        j = schema.jobs
        with self.app.begin(readonly=True) as tx:
            rows = tx.execute(sa.select(j.c.step_id, j.c.output_payload)
                              .where(j.c.step_id.in_(dialects.inline_ids([c.step.id for c in claims])))).all()
        found = {row.step_id: _value_json(row.output_payload) for row in rows}
        return {step_id: value for step_id, value in found.items() if value is not None}

    def _batch_move(self, c: BranchClaim, value_json: str | None) -> Move | None:
        """The move of a claimed branch when it is a simple transition (decided as
        :meth:`advance` decides it); None: it is advanced alone."""
        cfg = self.app.config.pipeline_advancer
        if c.step.status not in ADVANCEABLE:
            return None  # the stale-claim backstop: alone
        completes = "advancing" if c.step.status == "advancing" else None
        if advancer_crashes_exhausted(c.crash_count, cfg.max_crash):
            return Move(c.branch_id, c.run_id, c.step.id, completes, "halted",
                        halt_reason="advancer_crashes_exhausted")
        if c.step.status == "failed":
            return Move(c.branch_id, c.run_id, c.step.id, None, "halted", halt_reason=self._job_halt_reason(c))
        if value_json is None:
            return None
        found = simple_move(cached_definition(self.app, c.definition_sha1), c.step.node, value_json)
        if found is None:
            return None
        status, node, kind = found
        return Move(c.branch_id, c.run_id, c.step.id, "advancing", status, node, kind, value_json)

    def _commit_batch(self, moves: list[tuple[BranchClaim, Move]]) -> dict[str, str]:
        """One fenced transaction for the batch's moves; returns each branch's result."""
        results: dict[str, str] = {}
        with self.app.begin() as tx:
            rows = _lock_branches(tx, [c.branch_id for c, _ in moves])
            live = [(c, m) for c, m in moves
                    if rows[c.branch_id].claim_token == c.token]  # [INV-ADV-2] a stale token commits nothing
            for c, _ in moves:
                if rows[c.branch_id].claim_token != c.token:
                    results[c.branch_id] = "stale"
            if not live:
                return self._stale(moves, results)
            runs = lock_runs(tx, [m.run_id for _, m in live])
            faults.hit(faults.INSIDE_ADVANCE_BATCH)
            definitions = {c.run_id: cached_definition(self.app, c.definition_sha1) for c, _ in live}
            _make_moves(tx, [m for _, m in live], definitions)
            ids = [c.advancement_id for c, _ in live]
            closed = tx.execute(
                _a.update().where(_a.c.id.in_(dialects.inline_ids(ids)), _a.c.completed_at.is_(None))
                .values(completed_at=tx.now, updated_at=tx.now)).rowcount
            if closed != len(ids):  # pragma: no cover  [INV-ADV-2] tokens checked under the locks: none closed
                raise AssertionError(f"advancements {ids}: {closed} open inside their fence [INV-ADV-2]")
            # [INV-ADV-2] only the holders may move them
            _end_branches(tx, [m for _, m in live], _b.c.claim_token.in_([c.token for c, _ in live]))
            ended = resolve_runs(tx, {m.run_id: runs[m.run_id] for _, m in live if m.ends})
        for c, m in live:
            c.closed = True
            results[c.branch_id] = "advanced"
            if m.halt_reason is not None:
                self._log_halt(c, m.halt_reason, ended[m.run_id], None)
        return self._stale(moves, results)

    @staticmethod
    def _stale(moves: list[tuple[BranchClaim, Move]], results: dict[str, str]) -> dict[str, str]:
        for c, _ in moves:
            if results.get(c.branch_id) == "stale":
                log.warning("branch %s: claim %s is stale; nothing committed", c.branch_id, c.token)
                c.closed = True  # someone else holds it now: nothing of ours to clean up
        return results

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
            if advancer_crashes_exhausted(c.crash_count, cfg.max_crash):
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

        ``c.closed``, set by :meth:`_close` inside the block, is put back when the
        transaction does not commit: the advancement is open again, and if recording the
        error fails too, ``run_once`` must still release it (:meth:`_abandon`).
        """
        closed = c.closed
        try:
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
        except BaseException:
            c.closed = closed  # rolled back: the close did not happen
            raise

    def _close(self, tx: Tx, c: BranchClaim, error: ErrorInfo | None = None) -> None:
        closed = close_advancement(tx, c.advancement_id, error_klass=error.klass if error else None,
                                   error_message=error.message if error else None,
                                   error_backtrace=error.backtrace if error else None)
        if not closed:  # pragma: no cover  [INV-ADV-2] the fence checked the token: every other close releases it
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
        if moved.rowcount != 1:  # pragma: no cover  [INV-ADV-2] the fence holds the row's lock, token checked
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
                if advancer_retries_exhausted(failures, max_retry):
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
            if node is None:  # pragma: no cover  Definition requires a divert's 'otherwise' (edge(), divert())
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
        raise TransitionError(  # pragma: no cover  Definition.edge() accepts EDGE_TYPES only, each routed above
            f"unknown edge type {kind!r} from node {c.step.node}")

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
            if bumped != 1:  # pragma: no cover  [INV-ADV-3] each child arrives once, in the fence that completes it
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
            if len(outputs) != barrier.fanout_width:  # pragma: no cover  [INV-ADV-3] fired at the last arrival
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

    @property
    def ends(self) -> bool:
        return self.status != "in_progress"


def _lock_branches(tx: Tx, branch_ids: list[str]) -> dict[str, sa.Row[Any]]:
    """Lock the branch rows, in branch-id order (one statement), and return them by id."""
    rows = tx.execute(dialects.prepared(tx.conn, _branch_locks), {"batch_ids": sorted(set(branch_ids))})
    return {row.id: row for row in rows}


def _branch_locks(bind: Any) -> sa.Select[Any]:
    stmt = sa.select(_b.c.id, _b.c.claim_token, _b.c.status).where(_b.c.id.in_(dialects.ids_param())).order_by(_b.c.id)
    return dialects.for_update(stmt, bind)


class StepMovedOn(Exception):
    """A step to be completed was no longer in the status its move required: for a worker's
    inline advancement, its execution was taken and another attempt moved the step on
    (the success's transaction rolls back: ``outcomes``); for an advancer, whose branch
    fence checked the token, it cannot happen [INV-ADV-1]."""


def _make_moves(tx: Tx, moves: list[Move], definitions: dict[str, Definition]) -> None:
    """Complete the moves' steps and create their successors; the branches' own rows are
    the caller's (each path guards them its own way). Raises :class:`StepMovedOn` when a
    step's status is not the one its move completes it from."""
    for status in sorted({m.complete_from for m in moves if m.complete_from is not None}):
        ids = [m.step_id for m in moves if m.complete_from == status]
        done = tx.execute(dialects.prepared(tx.conn, _complete_steps),
                          {"batch_ids": ids, "b_status": status, "b_now": tx.now}).rowcount
        if done != len(ids):  # [INV-ADV-1] the step's status guard: moved past once
            raise StepMovedOn(f"steps {ids}: {done} of {len(ids)} were {status}")
    new: list[tuple[str, Definition, NewStep]] = []
    for m in moves:
        if m.node is not None:
            assert m.kind is not None, m
            assert m.value_json is not None, m
            step = NewStep(m.branch_id, m.node, m.kind, "[" + m.value_json + "]")
            new.append((m.run_id, definitions[m.run_id], step))
    # [INV-ADV-1] each step completes and its successor exists in one transaction
    create_steps_across(tx, new)


def _complete_steps(_: Any) -> sa.Update:
    steps, now = schema.steps, sa.bindparam("b_now", type_=schema.Timestamp)
    return (steps.update().where(steps.c.id.in_(dialects.ids_param()),
                                 steps.c.status == sa.bindparam("b_status", type_=steps.c.status.type))
            .values(status="completed", completed_at=now, updated_at=now))


def _end_branches(tx: Tx, moves: list[Move], guard: Any) -> None:
    """Move each branch to its move's status (one UPDATE per status and halt reason),
    dropping any claim; ``guard`` is the caller's condition on the branch rows (None:
    unclaimed, ``claim_token IS NULL``), and every row must match it."""
    groups: dict[tuple[str, str | None], list[str]] = {}
    for m in moves:
        groups.setdefault((m.status, m.halt_reason), []).append(m.branch_id)
    for (status, reason), ids in sorted(groups.items(), key=str):
        if guard is None and reason is None and status in _END_FREE:
            moved = tx.execute(dialects.prepared(tx.conn, _END_FREE[status]), {"batch_ids": ids, "b_now": tx.now})
        else:
            values: dict[str, Any] = {"status": status, "claim_token": None, "claimed_at": None,
                                      "last_advanced_at": tx.now, "updated_at": tx.now}
            if status in ("completed", "halted"):
                values["completed_at"] = tx.now
            if reason is not None:
                values["halt_reason"] = reason
            where = _b.c.claim_token.is_(None) if guard is None else guard
            moved = tx.execute(_b.update().where(_b.c.id.in_(dialects.inline_ids(ids)), where).values(**values))
        if moved.rowcount != len(ids):  # pragma: no cover  [INV-ADV-2] rows locked and guarded before: all match
            raise AssertionError(f"branches {ids}: {moved.rowcount} moved inside the batch [INV-ADV-2]")


def _end_free(status: str, completed: bool) -> Any:
    """A builder (``dialects.prepared``) of the UPDATE that ends unclaimed branches with ``status``."""
    def build(_: Any) -> sa.Update:
        now = sa.bindparam("b_now", type_=schema.Timestamp)
        values: dict[str, Any] = {"status": status, "claim_token": None, "claimed_at": None,
                                  "last_advanced_at": now, "updated_at": now}
        if completed:
            values["completed_at"] = now
        return _b.update().where(_b.c.id.in_(dialects.ids_param()), _b.c.claim_token.is_(None)).values(**values)
    return build


#: the prepared UPDATEs of the branches a worker's inline advancement ends (a leaf, dampen)
_END_FREE = {"completed": _end_free("completed", True), "dampened": _end_free("dampened", False)}


def advance_on_successes(tx: Tx, successes: Sequence[Inline]) -> set[str]:
    """Advance the branches of a success transaction's steps past them, in that
    transaction (``outcomes.record_successes``); returns the ids of the steps advanced.

    The model's ``advance_on_successes`` (and, for one success, its ``advance_on_success``):
    equal to advancing each in turn. Each success whose edge is a simple transition
    (:func:`simple_move`: ``chain``, ``converge``, a ``divert`` with a target, a leaf,
    ``dampen``) and whose branch is free (unclaimed, in progress) has its step go straight
    from ``in_progress`` to ``completed``, with its successor (step, job, first execution)
    created, or its branch ended (``completed`` for a leaf, ``dampened``) and its run
    resolved [INV-RUN-1], and an advancement row opened and closed by the worker's
    process. The others are left to the caller (their steps become ``advancing``, for an
    advancer). Exactly once as for a fenced advancement [INV-ADV-1]: the branch row is
    locked and must be unclaimed (no advancer can hold it: until this transaction commits
    its step is not advanceable), the step's completion is guarded by its status (a step
    an earlier attempt moved on raises :class:`StepMovedOn`), and ``uq_step_branch_node``
    forbids a second successor.

    Lock order [lock order]: every branch row first, in branch-id order, then every run
    row of the moves, in run-id order (``runs.lock_runs``), before any write; an
    advancer's batch takes the same order, and a single fence its own branch, then its
    run. The runs of branches that go on are locked too: on InnoDB inserting their steps
    takes shared locks on the run rows, and two batches each holding one run and
    inserting under the other's would deadlock. Not done here: fan-out, fan-in and expand
    edges.
    """
    planned = [(i, move) for i in successes
               if (move := simple_move(i.definition, i.claimed.node, i.value_json)) is not None]
    if not planned:
        return set()
    definitions = {i.claimed.run_id: i.definition for i, _ in planned}
    branches = _lock_branches(tx, [i.claimed.branch_id for i, _ in planned])
    # a branch an advancer holds, or that ended, is not ours to move: its step waits for an advancer
    moves = [Move(i.claimed.branch_id, i.claimed.run_id, i.claimed.step_id, "in_progress", status, node, kind,
                  i.value_json)
             for i, (status, node, kind) in planned
             if branches[i.claimed.branch_id].claim_token is None  # [INV-ADV-2] free: no advancer holds it
             and branches[i.claimed.branch_id].status == "in_progress"]
    owner = {i.claimed.step_id: i.claimed.process_id for i, _ in planned}
    return _move_free(tx, moves, definitions, owner)


def _move_free(tx: Tx, moves: list[Move], definitions: dict[str, Definition], owner: dict[str, str]) -> set[str]:
    """Make the moves of free branches whose rows ``tx`` has locked (no advancer holds
    them): lock their runs, complete the steps, create what follows, write an advancement
    row per move (opened and closed by ``owner[step_id]``), end the branches that end and
    resolve their runs [INV-RUN-1]. Returns the ids of the steps moved."""
    if not moves:
        return set()
    runs = lock_runs(tx, [m.run_id for m in moves])
    faults.hit(faults.INSIDE_INLINE_BATCH)
    _make_moves(tx, moves, definitions)
    now = tx.now
    dialects.insert_rows(tx.conn, _a, [{
        "id": new_id(), "branch_id": m.branch_id, "step_id": m.step_id, "process_id": owner[m.step_id],
        "claim_token": new_token(), "started_at": now, "completed_at": now, "crash_count": 0, "created_at": now,
        "updated_at": now} for m in moves])
    going = [m.branch_id for m in moves if not m.ends]
    if going:
        tx.execute(dialects.prepared(tx.conn, _advance_free_branches), {"batch_ids": going, "b_now": now})
    ending = [m for m in moves if m.ends]
    if ending:
        _end_branches(tx, ending, None)  # [INV-ADV-2] still free: locked above
        resolve_runs(tx, {m.run_id: runs[m.run_id] for m in ending})
    return {m.step_id for m in moves}


def _advance_free_branches(_: Any) -> sa.Update:
    now = sa.bindparam("b_now", type_=schema.Timestamp)
    return (_b.update().where(_b.c.id.in_(dialects.ids_param()), _b.c.claim_token.is_(None))
            .values(last_advanced_at=now, updated_at=now))


def advance_released(tx: Tx, released: Sequence[Inline]) -> set[str]:
    """A worker's second transaction after a keyed release (the model's
    ``advance_released``): advance the branches past steps whose successes the worker
    recorded, with their slots released, in its transaction before, which left the
    steps ``advancing``. Returns the ids of the steps advanced.

    Each step moves exactly as :func:`advance_on_successes` would have moved it inline,
    from ``advancing`` instead of ``in_progress``, when, read under its branch's lock, the
    step is still ``advancing`` (no advancer advanced it meanwhile), no advancer has
    claimed it since it became so (no advancement row: a step an advancer failed or
    crashed on is the advancer's, with its budgets), its branch is free (unclaimed, in
    progress) and its edge is a simple transition. The value is the one stored with
    the step's job, not the worker's copy. Every other step is left as it is: an
    advancer claims it (``candidates``). Exactly once as for the inline path
    [INV-ADV-1]: the branch row is locked and must be unclaimed, the step's completion
    is guarded by its status, and ``uq_step_branch_node`` forbids a second successor.
    Lock order: branch rows, then run rows, as every advancement. Not done: fan-out,
    fan-in and expand edges (an advancer's).
    """
    by_step = {i.claimed.step_id: i for i in released}
    if not by_step:
        return set()  # pragma: no cover  its only caller, advance_released_steps, returns first on none
    branches = _lock_branches(tx, [i.claimed.branch_id for i in by_step.values()])
    step_ids = {"batch_ids": sorted(by_step)}
    touched = set(tx.execute(dialects.prepared(tx.conn, _advanced_steps), step_ids).scalars())
    moves: list[Move] = []
    for row in tx.execute(dialects.prepared(tx.conn, _released_steps), step_ids):
        i = by_step[row.id]
        branch = branches[i.claimed.branch_id]
        if (row.status != "advancing"  # [INV-ADV-1] advanced meanwhile: moved past once
                or row.id in touched  # an advancer's since: its budgets decide
                or branch.claim_token is not None or branch.status != "in_progress"):  # [INV-ADV-2] held, or ended
            continue
        value_json = _value_json(row.output_payload)
        found = None if value_json is None else simple_move(i.definition, i.claimed.node, value_json)
        if found is not None:  # pragma: no branch  outcomes.released_later passes simple moves only, of this value
            status, node, kind = found
            moves.append(Move(i.claimed.branch_id, i.claimed.run_id, row.id, "advancing", status, node, kind,
                              value_json))
    definitions = {i.claimed.run_id: i.definition for i in by_step.values()}
    return _move_free(tx, moves, definitions, {sid: i.claimed.process_id for sid, i in by_step.items()})


def _advanced_steps(_: Any) -> sa.Select[Any]:
    """Which of the steps (``batch_ids``) an advancer has claimed: they have an advancement row."""
    return sa.select(_a.c.step_id).where(_a.c.step_id.in_(dialects.ids_param()))


def _released_steps(_: Any) -> sa.Select[Any]:
    """The released steps (``batch_ids``): their status and their job's stored output."""
    s, j = schema.steps, schema.jobs
    return (sa.select(s.c.id, s.c.status, j.c.output_payload).join(j, j.c.step_id == s.c.id)
            .where(s.c.id.in_(dialects.ids_param())))


def _value_json(output_payload: str | None) -> str | None:
    """The JSON text of a succeeded step's value from its job's stored output; None when
    there is none, or it is an expand's item count (never a simple move)."""
    if output_payload is None:
        return None  # pragma: no cover  read only for advancing steps, whose success stored the output
    stored = json.loads(output_payload)
    return json.dumps(stored["payload"]) if "payload" in stored else None


def advance_released_steps(app: App, released: Sequence[Inline]) -> set[str]:
    """:func:`advance_released` in a transaction of its own, repeated on a lost
    connection; returns the ids of the steps advanced. An error is logged and changes
    nothing: the steps stay ``advancing`` and an advancer is woken for them (they were
    recorded; only what follows them waits). Steps it leaves without an error are an
    advancer's already (it advanced or holds them, or failed on them and polls again):
    no wakeup, which would only send advancers after the next releases too."""
    if not released:
        return set()  # pragma: no cover  its callers (ReleasedSteps.run_once, _advance_released) pass some

    def once() -> set[str]:
        with app.begin() as tx:
            return advance_released(tx, released)

    try:
        advanced: set[str] = dialects.retry_transient(once)
    except Exception:
        log.exception("advancing %d released steps failed; left to an advancer", len(released))
        with contextlib.suppress(Exception), app.begin() as tx:  # no poll interval to wait out
            tx.wake_advancers()
        return set()
    return advanced


@dataclass(frozen=True)
class Inline:
    """A success's step to advance past in a worker's transaction (:func:`advance_on_successes`,
    :func:`advance_released`): its claim, its run's definition and the JSON text of its value."""

    claimed: Claimed
    definition: Definition
    value_json: str
