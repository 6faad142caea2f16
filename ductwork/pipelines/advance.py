"""Advancement: moving a branch past a finished step, exactly once.

    >>> advancer = Advancer(app)
    >>> advancer.run_once()        # "idle" | "contended" | "advanced" | "stale" | "error"
    'advanced'

A branch whose latest step is ``advancing`` (its job succeeded) or ``failed`` is
claimed with a conditional UPDATE that re-asserts every predicate of the
candidate query and writes a fresh claim token. Every mutation after that runs
in a *fence*: one transaction that locks the branch row, compares its token with
the one taken at claim, and only then writes [INV-ADV-2]. Completing the step,
creating what follows it (next step, fan-out children, fan-in target, their inputs
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
from collections.abc import Iterator
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy import exc

from ductwork import faults, logs
from ductwork.db import dialects, schema
from ductwork.db.ids import new_id
from ductwork.errors import PayloadTooLargeError, StaleClaim, TransitionError
from ductwork.limits.executions import ErrorInfo
from ductwork.pipelines import payloads
from ductwork.pipelines.branches import (
    CRASH_CLASSES,
    THREAD_CRASH,
    BranchClaim,
    Move,
    candidates,
    claim_branches,
    close_advancement,
    fence,
    move_branches,
    release_advancement,
    value_json_of,
)
from ductwork.pipelines.rules import (
    advancer_crashes_exhausted,
    advancer_retries_exhausted,
    job_halt_reason,
    simple_move,
)
from ductwork.pipelines.runs import cached_definition, lock_run, resolve_run
from ductwork.pipelines.steps import (
    ADVANCEABLE,
    NewStep,
    create_branches,
    create_steps,
    latest_step,
    payload_json,
    step_complete,
    step_output_json,
)

if TYPE_CHECKING:
    from ductwork.db.database import Database, Tx
    from ductwork.pipelines.snapshot import Definition

log = logging.getLogger("ductwork.advance")


def fan_in_size(stored: int, count: int) -> int:
    """Length of the JSON list of ``count`` outputs whose stored envelopes
    (``payloads.payload_envelope``) are ``stored`` characters long in all."""
    return stored - count * len(payloads.payload_envelope("")) + max(count - 1, 0) + len("[]")


_b, _a = schema.branches, schema.advancements


class Advancer:
    """Claims and advances branches, a batch per :meth:`run_once`."""

    def __init__(self, app: Database, *, process_id: str | None = None, rng: random.Random | None = None):
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

        The simple transitions (:meth:`_simple_move`: halts of a failed step or of a spent
        crash budget, a leaf, ``chain``, ``converge``, a ``divert`` with a target,
        ``dampen``) commit together in one fenced transaction (the model's
        ``advance_batch``: equal to advancing them one by one). The fence is per branch:
        every branch row is locked (FOR UPDATE, branch-id order) and its token compared;
        a branch whose token is stale commits nothing and only it is refused
        [INV-ADV-2]; then every run row of the batch is locked (run-id order) before any
        write, the order :func:`advance_on_successes` takes too (:func:`move_branches`).
        Fan-out, expand, fan-in, a divert without a target, a lone simple move and a
        batch whose transaction fails are advanced one by one (:meth:`advance`), where
        errors are recorded.
        """
        moves: list[tuple[BranchClaim, Move]] = []
        results: dict[str, str] = {}
        outputs = self._outputs([c for c in claims if c.step.status == "advancing"])
        for c in claims:
            move = self._simple_move(c, outputs.get(c.step.id))
            if move is not None:
                moves.append((c, move))
        if len(moves) > 1:  # (a batch of one is advanced alone, below: one attempt, its errors recorded)
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
        s = schema.steps
        with self.app.begin(readonly=True) as tx:
            rows = tx.execute(sa.select(s.c.id, s.c.output_payload)
                              .where(s.c.id.in_(dialects.inline_ids([c.step.id for c in claims])))).all()
        return {row.id: value for row in rows if (value := value_json_of(row.output_payload)) is not None}

    def _simple_move(self, c: BranchClaim, value_json: str | None) -> Move | None:
        """The move of a claimed branch when it is a simple transition, in the decision
        order of semantics §3 (a spent crash budget, a failed step, then the edge); None:
        a fan-out, an expand or a fan-in, routed by :meth:`_route`."""
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
        """One fenced transaction for the batch's moves (:func:`move_branches`, by this
        advancer's claims); returns each branch's result: ``advanced``, or ``stale`` for a
        branch whose claim was lost (nothing of it committed)."""
        claims = {c.branch_id: c for c, _ in moves}
        with self.app.begin() as tx:
            definitions = {c.run_id: cached_definition(self.app, c.definition_sha1) for c, _ in moves}
            made, ended = move_branches(tx, [m for _, m in moves], definitions, held=claims)
        results = dict.fromkeys(claims, "stale")
        for m in made:
            c = claims[m.branch_id]
            c.closed = True
            results[c.branch_id] = "advanced"
            if m.halt_reason is not None:
                self._log_halt(c, m.halt_reason, ended[m.run_id], m.error)
        for c, _ in moves:
            if results[c.branch_id] == "stale":
                log.warning("branch %s: claim %s is stale; nothing committed", c.branch_id, c.token)
                c.closed = True  # someone else holds it now: nothing of ours to clean up
        return results

    def advance(self, c: BranchClaim) -> str:
        """Advance a claimed branch past its latest step (the decision order of semantics §3)."""
        try:
            if c.step.status not in ADVANCEABLE:
                # Stale-claim backstop: nothing to route. Release without an error so a
                # healthy branch's budgets are not burnt.
                with self._fence(c) as tx:
                    self._close(tx, c)
                    self._set_branch(tx, c, "in_progress")
                log.warning("branch %s claimed with no advanceable step; released", c.branch_id)
                return "stale"
            move = self._simple_move(c, self._outputs([c]).get(c.step.id))
            # A transaction the database rolled back for contention (a deadlock) is repeated,
            # not recorded as the transition's error: each is fenced, and an expand resumes at
            # its cursor [INV-ADV-4], so a repeat is safe.
            if move is not None:  # a halt, a leaf, chain, converge, divert, dampen: one function for all
                return str(dialects.retry_transient(lambda: self._commit_batch([(c, move)]))[c.branch_id])
            dialects.retry_transient(lambda: self._route(c))  # fan-out, expand, fan-in
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
    def _fence(self, c: BranchClaim, *, ends_branch: bool = False, barrier: bool = False) -> Iterator[Tx]:
        """A transaction that commits only while ``c.token`` still holds the branch.

        ``barrier`` (a fan-in): the branch's barrier (the fan-out branch its siblings share)
        is locked with it, in branch-id order; ``ends_branch``: the block may end the
        branch and so decide the run's state, and the run row is locked next, before any
        write. One lock order (branches in id order, then the run) for every such
        transaction [lock order] means two siblings ending at once queue instead of
        deadlocking (on InnoDB, earlier writes take shared locks on the run row that a later
        exclusive lock would have to upgrade), and so do a fan-in and the expand still
        creating its siblings (which holds the barrier, its own branch, before the run).

        ``c.closed``, set by :meth:`_close` inside the block, is put back when the
        transaction does not commit: the advancement is open again, and if recording the
        error fails too, ``run_once`` must still release it (:meth:`_abandon`).
        """
        closed = c.closed
        try:
            with self.app.begin() as tx:
                # a fan-in's barrier (the fan-out branch its siblings share) is locked with it,
                # in branch-id order [lock order]; it never changes once the branch exists
                shared = tx.execute(sa.select(_b.c.barrier_id).where(_b.c.id == c.branch_id)).scalar() \
                    if barrier else None
                if c.branch_id not in fence(tx, {c.branch_id: c.token}, barrier=shared):
                    raise StaleClaim(c.branch_id, c.token)  # [INV-ADV-2] a stale token commits nothing
                if ends_branch:
                    lock_run(tx, c.run_id)  # [lock order] the run after the branches
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
                .where(e.c.step_id == c.step.id, e.c.completed_at.is_not(None))
                .order_by(e.c.completed_at.desc(), e.c.id.desc()).limit(1)
            ).first()
        return job_halt_reason(last.outcome, last.error_klass) if last else job_halt_reason(None, None)

    def _halt(self, c: BranchClaim, reason: str, error: ErrorInfo | None = None) -> None:
        """Halt the held branch ``reason`` (an error the routing raised), through the one
        move function; a lost claim commits nothing."""
        completes = "advancing" if c.step.status == "advancing" else None
        self._commit_batch([(c, Move(c.branch_id, c.run_id, c.step.id, completes, "halted", halt_reason=reason,
                                     error=error))])

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
                self._close(tx, c, info)
                if advancer_retries_exhausted(failures, max_retry):
                    if c.step.status == "advancing":
                        step_complete(tx, c.step.id)
                    self._set_branch(tx, c, "halted", halt_reason="advancer_retries_exhausted",
                                     completed_at=tx.now)
                    run_status = resolve_run(tx, c.run_id)
                else:
                    self._set_branch(tx, c, "in_progress")
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
        """The transitions that are not simple moves: fan-out, expand, fan-in."""
        definition = cached_definition(self.app, c.definition_sha1)
        edge = definition.edges.get(c.step.node)
        assert edge is not None, "a leaf is a simple move"
        if edge.type == "divide":
            return self._divide(c, definition, list(edge.to))
        if edge.type == "expand":
            return self._expand(c, definition, edge.first())
        if edge.type in ("combine", "collapse"):
            return self._fan_in(c, definition, edge.type)
        raise TransitionError(  # pragma: no cover  Definition requires a divert's 'otherwise'; the rest are moves
            f"no transition for a {edge.type!r} edge from node {c.step.node}")

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
                    sa.select(schema.steps.c.output_payload).where(schema.steps.c.id == c.step.id)
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
                    .where(schema.expand_items.c.step_id == c.step.id,
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
        with self._fence(c, ends_branch=True, barrier=True) as tx:
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
            s = schema.steps
            joined = _b.join(s, s.c.branch_id == _b.c.id)
            arrived = (_b.c.barrier_id == barrier_id, _b.c.fanin_arrived_at.is_not(None), s.c.node.in_(sources))
            what = f"{kind} into {edge.first()}: the outputs of {barrier.fanout_width} branches"
            # Measured in the database first: outputs too large together are never loaded.
            stored = tx.execute(
                sa.select(sa.func.sum(sa.func.length(s.c.output_payload))).select_from(joined).where(*arrived)
            ).scalar_one()
            payloads.check_size(fan_in_size(int(stored or 0), barrier.fanout_width), what)
            outputs = tx.execute(
                sa.select(s.c.output_payload).select_from(joined).where(*arrived).order_by(_b.c.barrier_index)
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
