"""``PipelinesModelMachine``: the pipelines model alone, on random definitions, with
executions, advancement, advancer errors and crashes, stale tokens, resumes, context
writes and clock moves interleaved at random; every invariant after every step.

Rules (verbs): ``trigger``, ``trigger_with_key`` (in its own transaction, or in the
caller's, committed or rolled back; with or without a key window), ``trigger_rolled_back``, ``drive_a_little`` (the
fault-free scheduler, three actions), ``run_execution`` (oracle or forced
failure/timeout/crash/bad return), ``run_completed_execution_again``, ``advance``
(commit, crash holding the claim, routing error, TransitionError),
``advancer_crash_mid_expand``, ``children_run_while_their_expand_is_parked`` (a child of
an expand held between batches runs and arrives at its fan-in), ``advance_with_stale_token``, ``group_commit`` and
``advance_batch`` (each against the single operations one by one on a copy),
``advance_clock``, ``resume``, ``context_set``, ``prune`` (a batch at a random cutoff,
sometimes asked about live runs too), ``revive`` (a halted run, twice, or a run that is
not halted); ``teardown`` drives every run to rest with the oracle (liveness).

Checks: INV-ADV-1, INV-ADV-2, INV-ADV-3, INV-ADV-4, INV-EXE-1, INV-EXE-2, INV-EXE-3,
INV-EXE-4, INV-RUN-1, INV-CTX-1, INV-PRN-1, INV-PRN-2, INV-REV-1, INV-REV-2, INV-REV-3,
INV-TRG-1, INV-TRG-2.
"""

from __future__ import annotations

import copy
import os
import re
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

# the model as ductwork_model, the name the shipped strategies (its oracles and configs) use: one set
# of model classes in this test, never `model`'s beside them
from ductwork_model.errors import CommitFailed, DefinitionError, OverwriteError, PreconditionError, StaleClaim
from ductwork_model.invariants import INVARIANT_FUNCTIONS, check_all
from ductwork_model.pipelines import (
    CRASH,
    FAILURE,
    INVALID,
    NO_INPUT,
    TIMED_OUT,
    Definition,
    PipelinesModel,
    run_to_quiescence,
    success,
)
from ductwork_proof.conformance.strategies import pipeline_configs, pipeline_scenarios

#: steps per example: 40 keeps the ci profile at a few seconds; deep explores longer runs
STEPS = 100 if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else 40
FORCED = {"failure": FAILURE, "timed_out": TIMED_OUT, "crash": CRASH, "invalid": INVALID,
          "not_json": success(object())}
HOW = st.sampled_from(["oracle"] * 8 + list(FORCED))
ADVANCER = st.sampled_from(["advance"] * 6 + ["crash", "error", "transition_error"])


class PipelinesModelMachine(RuleBasedStateMachine):
    """Nouns: runs, branches, executions, claim tokens. ``model_class`` is swapped for mutants."""

    model_class: type[PipelinesModel] = PipelinesModel

    @initialize(scenario=pipeline_scenarios(), config=pipeline_configs())
    def configure(self, scenario, config):
        self.definition, self.args, self.oracle = scenario
        self.model = self.model_class(config)
        self.model.trigger(self.definition, self.args)
        self.rejected = 0

    def _pick(self, data, items):
        return data.draw(st.sampled_from(sorted(items, key=str)))

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: len(self.model.runs) < 4)
    @rule(args=st.lists(st.integers(0, 9), max_size=2))
    def trigger(self, args):
        self.model.trigger(self.definition, args)

    @precondition(lambda self: len(self.model.runs) < 6)
    @rule(args=st.lists(st.integers(0, 9), max_size=2), key=st.sampled_from(["order-1", "order-2"]),
          in_transaction=st.sampled_from([None, True, False]),
          window_us=st.sampled_from([None, None, 1, 1_000_000, 10_000_000]))
    def trigger_with_key(self, args, key, in_transaction, window_us):
        """A keyed trigger in its own transaction (``None``) or the caller's, committed or
        rolled back, with or without a key window: the key's run when one holds it (and,
        with a window, has not finished at least the window ago), else a new run, or
        nothing at all."""
        holder = self.model._keyed_run(Definition.parse(self.definition).pipeline, key)
        expired = holder is not None and window_us is not None and self.model._key_expired(holder, window_us)
        if in_transaction is None:
            got = self.model.trigger(self.definition, args, key=key, key_window_us=window_us)
        else:
            got = self.model.trigger_in(self.definition, args, key=key, commit=in_transaction,
                                        key_window_us=window_us)
        if in_transaction is False:
            assert got is None, "[INV-TRG-2] a rolled-back trigger returned a run"
        elif holder is not None and not expired:
            assert got == holder, f"[INV-TRG-1] key {key!r} returned {got}, not its run {holder}"
        elif holder is not None:
            assert got != holder, f"[INV-TRG-1] key {key!r}: {holder} finished a window ago but was returned"
            assert self.model.runs[holder].key_released_at_us == self.model.now_us, (
                f"[INV-TRG-1] key {key!r}: {holder} was not released by the trigger that took its key")

    @precondition(lambda self: len(self.model.runs) < 6)
    @rule(args=st.lists(st.integers(0, 9), max_size=2))
    def trigger_rolled_back(self, args):
        """A trigger without a key whose caller rolls back: nothing of it stays."""
        assert self.model.trigger_in(self.definition, args, commit=False) is None

    @precondition(lambda self: self.model.runnable_executions())
    @rule(data=st.data(), times=st.integers(1, 3))
    def run_execution(self, data, times):
        """Workers run one to three eligible executions; the oracle decides most outcomes."""
        for _ in range(times):
            if not self.model.runnable_executions():
                return
            exec_id = self._pick(data, self.model.runnable_executions())
            how = data.draw(HOW)
            outcome = self.oracle(*self.model.execution_input(exec_id)) if how == "oracle" else FORCED[how]
            self.model.run_execution(exec_id, outcome)

    @precondition(lambda self: self.model.outcomes and self.rejected < 3)
    @rule(data=st.data())
    def run_completed_execution_again(self, data):
        done = [e.id for e in self.model.executions.values() if e.state == "completed"]
        exec_id = self._pick(data, done)
        before = self.model.snapshot()
        self.rejected += 1
        with pytest.raises(CommitFailed):
            self.model.run_execution(exec_id, success(0))
        assert self.model.snapshot() == before, f"[INV-EXE-2] a rejected commit on {exec_id} changed state"

    @precondition(lambda self: self.model.advanceable_branches())
    @rule(data=st.data(), times=st.integers(1, 3))
    def advance(self, data, times):
        """Advancers take one to three branches: each commits one transaction, or crashes
        holding the claim, or routing raises (a TransitionError now and then)."""
        for _ in range(times):
            if not self.model.advanceable_branches():
                return
            how = data.draw(ADVANCER)
            branch_id = self._pick(data, self.model.advanceable_branches())
            if how == "advance":
                self.model.advance(branch_id)
            elif how == "crash":
                self.model.advancer_crash(branch_id)
            else:  # only routing raises TransitionError: not for a failed step
                routing = self.model.steps[self.model.branches[branch_id].latest_step].status == "advancing"
                self.model.advancer_error(branch_id, transition_error=how == "transition_error" and routing)

    @precondition(lambda self: self._mid_expand())
    @rule()
    def advancer_crash_mid_expand(self):
        """The advancer holding a half-done expand dies between two batches [INV-ADV-4]."""
        self.model.advancer_crash(self._mid_expand()[0])

    def _mid_expand(self) -> list[str]:
        return [b.id for b in self.model.branches.values() if b.status == "advancing" and b.expand_cursor]

    @precondition(lambda self: self._children_of_parked())
    @rule(data=st.data())
    def children_run_while_their_expand_is_parked(self, data):
        """A child of an expand parked between batches runs (the oracle's outcome) and is
        advanced, arriving at its fan-in while later batches do not exist yet [INV-ADV-3]."""
        branch = self.model.branches[self._pick(data, self._children_of_parked())]
        pending = [e for e in self.model.runnable_executions()
                   if self.model.executions[e].step_id == branch.latest_step]
        if pending:
            self.model.run_execution(pending[0], self.oracle(*self.model.execution_input(pending[0])))
        if branch.id in self.model.claimable_branches():
            self.model.advance(branch.id)

    def _children_of_parked(self) -> list[str]:
        parked = set(self._mid_expand())
        runnable = {self.model.executions[e].step_id for e in self.model.runnable_executions()}
        claimable = set(self.model.claimable_branches())
        return [b.id for b in self.model.branches.values() if b.barrier in parked
                and (b.latest_step in runnable or b.id in claimable)]

    @precondition(lambda self: self._stale())
    @rule(data=st.data())
    def advance_with_stale_token(self, data):
        branch_id, token = self._pick(data, self._stale())
        before = self.model.snapshot()
        try:
            self.model.advance(branch_id, token)
        except StaleClaim:
            pass
        else:
            raise AssertionError(f"[INV-ADV-2] stale token {token} on {branch_id} was accepted")
        assert self.model.snapshot() == before, f"[INV-ADV-2] a stale token on {branch_id} changed state"

    def _stale(self) -> list[tuple[str, int]]:
        """(branch, old token) pairs for branches an advancer could be working on right now."""
        live = set(self.model.advanceable_branches())
        current = {b: self.model.branches[b].claim_token for b in live}
        return sorted({(b, t) for kind, b, t in self.model.fence_log
                       if kind == "claim" and b in live and t != current[b]})

    @precondition(lambda self: self.model.runnable_executions())
    @rule(data=st.data(), with_done=st.booleans())
    def group_commit(self, data, with_done):
        """A worker's group commit of one to four outcomes, each success advancing its
        branch inline: equal to each success alone (a group of one) in turn; a batch holding an
        execution already ended is refused whole and changes nothing."""
        ids = data.draw(st.lists(st.sampled_from(self.model.runnable_executions()), min_size=1, max_size=4,
                                 unique=True))
        items = [(i, self.oracle(*self.model.execution_input(i))) for i in ids]
        done = [e.id for e in self.model.executions.values() if e.state == "completed"]
        if with_done and done and self.rejected < 3:
            self.rejected += 1
            before = self.model.snapshot()
            with pytest.raises(CommitFailed):
                self.model.advance_on_successes([*items, (self._pick(data, done), success(0))])
            assert self.model.snapshot() == before, "[INV-EXE-2] a refused group commit changed state"
        alone = copy.deepcopy(self.model)
        singles = [done for i, outcome in items for done in alone.advance_on_successes([(i, outcome)])]
        batch = self.model.advance_on_successes(items)
        assert self.model.snapshot() == alone.snapshot(), "a group commit differs from its successes one by one"
        assert batch == singles

    @precondition(lambda self: self._batchable())
    @rule(data=st.data(), stale=st.booleans())
    def advance_batch(self, data, stale):
        """An advancer claims one to four simple branches in one transaction and advances
        them in one fenced transaction: equal to claiming and advancing them one by one;
        a branch whose claim went stale meanwhile (its advancer was reaped and another
        claimed it) is refused alone [INV-ADV-2]."""
        ids = data.draw(st.lists(st.sampled_from(self._batchable()), min_size=1, max_size=4, unique=True))
        alone = copy.deepcopy(self.model)
        tokens = self.model.claim_branches(ids)
        assert tokens == {b: alone.claim_branch(b) for b in ids}
        assert self.model.snapshot() == alone.snapshot(), "claim_branches differs from claim_branch one by one"
        victim = self._pick(data, tokens) if stale else None
        for model in (self.model, alone):
            if victim is not None:
                model.advancer_crash(victim)
                model.claim_branch(victim)
        singles = {}
        for branch_id in sorted(tokens, key=alone._id_order):
            try:
                singles[branch_id] = alone.advance(branch_id, tokens[branch_id])
            except StaleClaim:
                singles[branch_id] = None
        batch = self.model.advance_batch(tokens)
        assert self.model.snapshot() == alone.snapshot(), "an advancer batch differs from its branches one by one"
        assert batch == singles
        if victim is not None:
            assert batch[victim] is None, f"[INV-ADV-2] stale token on {victim} committed in a batch"

    def _batchable(self) -> list[str]:
        return [b for b in self.model.claimable_branches() if self.model.batchable(b)]

    @precondition(lambda self: self.model.pending_executions() != self.model.runnable_executions()
                  or self.model.is_quiescent())
    @rule(dt=st.sampled_from([0, 1, 999, 1_000_000, 10_000_000, 40_000_000]))
    def advance_clock(self, dt):
        """Time moves while something waits (a delay or back-off), or when all is at rest;
        0 and 1 µs steps included."""
        self.model.advance_clock(dt)

    @precondition(lambda self: any(b.status == "dampened" for b in self.model.branches.values()))
    @rule(data=st.data(), given_input=st.booleans(), value=st.integers(0, 9))
    def resume(self, data, given_input, value):
        runs = {b.run_id for b in self.model.branches.values() if b.status == "dampened"}
        assert self.model.resume(self._pick(data, runs), value if given_input else NO_INPUT) > 0

    @precondition(lambda self: any(r.status == "halted" and not r.pruned for r in self.model.runs.values())
                  and len(self.model.runs) < 6)
    @rule(data=st.data(), duplicate_context=st.booleans())
    def revive(self, data, duplicate_context):
        """Revive a halted run (a second revive of it returns the same run, changing nothing)."""
        source = self._pick(data, [r.id for r in self.model.runs.values() if r.status == "halted" and not r.pruned])
        already = [r.id for r in self.model.runs.values() if r.revived_from == source]
        before = self.model.snapshot()
        new = self.model.revive(source, duplicate_context)
        assert new != source
        if already:
            assert [new] == already, f"[INV-REV-1] revive of {source} returned {new}, not {already}"
            assert self.model.snapshot() == before, "[INV-REV-1] a second revive changed the state"
        else:
            assert self.model.runs[new].status == "in_progress"
            want = self.model.runs[source].context if duplicate_context else {}
            assert self.model.runs[new].context == want

    @rule(data=st.data(), duplicate_context=st.booleans())
    def revive_a_run_that_is_not_halted(self, data, duplicate_context):
        """Refused, changing nothing: a run that is not halted, or was pruned."""
        candidates = [r.id for r in self.model.runs.values() if r.status != "halted" or r.pruned]
        if not candidates:
            return
        run_id = self._pick(data, candidates)
        before = self.model.snapshot()
        try:
            self.model.revive(run_id, duplicate_context)
        except PreconditionError:
            assert self.model.snapshot() == before
        else:
            raise AssertionError(f"revive of {self.model.runs[run_id].status} run {run_id} accepted")

    @precondition(lambda self: len(self.model.context_writes) < 6 and self.model.live_runs())
    @rule(data=st.data(), key=st.sampled_from(["k1", "k2"]), value=st.integers(0, 9), overwrite=st.booleans())
    def context_set(self, data, key, value, overwrite):
        run_id = self._pick(data, self.model.live_runs())
        before = self.model.context_get(run_id, key)
        existed = key in self.model.runs[run_id].context
        try:
            self.model.context_set(run_id, key, value, overwrite)
        except OverwriteError:
            assert existed, f"[INV-CTX-1] set of fresh key {key!r} refused"
            assert not overwrite, f"[INV-CTX-1] set of fresh key {key!r} refused"
            assert self.model.context_get(run_id, key) == before, f"[INV-CTX-1] refused set changed {key!r}"
        else:
            assert overwrite or not existed, f"[INV-CTX-1] second plain set of {key!r} in {run_id} accepted"
            assert self.model.context_get(run_id, key) == value

    @precondition(lambda self: self.model.live_runs())
    @rule(back_us=st.sampled_from([0, 1, 1_000_000]), limit=st.sampled_from([None, 1, 2]), ask_live=st.booleans())
    def prune(self, back_us, limit, ask_live):
        """A prune batch at now − back_us; ``ask_live``: its candidates are every run not yet
        pruned (as if chosen before a resume), so the guard must refuse the live ones."""
        cutoff = self.model.now_us - back_us
        candidates = sorted(self.model.live_runs(), key=str) if ask_live else None
        before = {r: self.model.runs[r].status for r in self.model.live_runs()}
        pruned = self.model.prune(cutoff, limit, candidates)
        assert all(before[r] in ("completed", "halted") for r in pruned), f"[INV-PRN-1] pruned {pruned} of {before}"

    @precondition(lambda self: not self.model.is_quiescent())
    @rule()
    def drive_a_little(self):
        """The fleet does three things in the scheduler's order (waiting out delays).

        No arguments on purpose: hypothesis tries argument-free rules first, so
        runs make progress by default and the other rules interleave faults."""
        self.model.drive(self.oracle, stop_after=3)

    def teardown(self):
        """Liveness: from wherever the rules left it, the oracle drives every run to rest."""
        if hasattr(self, "model"):
            self.model.drive(self.oracle, max_actions=5_000)
            assert self.model.is_quiescent()
            check_all(self.model)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def inv_adv_1_successors_exactly_once(self):
        INVARIANT_FUNCTIONS["INV-ADV-1"](self.model)

    @invariant()
    def inv_adv_2_stale_token_commits_nothing(self):
        INVARIANT_FUNCTIONS["INV-ADV-2"](self.model)

    @invariant()
    def inv_adv_3_fan_in_once(self):
        INVARIANT_FUNCTIONS["INV-ADV-3"](self.model)

    @invariant()
    def inv_adv_4_expand_children(self):
        INVARIANT_FUNCTIONS["INV-ADV-4"](self.model)

    @invariant()
    def inv_exe_1_no_lost_work(self):
        INVARIANT_FUNCTIONS["INV-EXE-1"](self.model)

    @invariant()
    def inv_exe_2_outcome_once(self):
        INVARIANT_FUNCTIONS["INV-EXE-2"](self.model)

    @invariant()
    def inv_exe_3_idempotency_keys(self):
        INVARIANT_FUNCTIONS["INV-EXE-3"](self.model)

    @invariant()
    def inv_exe_4_budgets(self):
        INVARIANT_FUNCTIONS["INV-EXE-4"](self.model)

    @invariant()
    def inv_run_1_terminal_final(self):
        INVARIANT_FUNCTIONS["INV-RUN-1"](self.model)

    @invariant()
    def inv_ctx_1_set_once(self):
        INVARIANT_FUNCTIONS["INV-CTX-1"](self.model)

    @invariant()
    def inv_prn_1_prune_never_touches_a_live_run(self):
        INVARIANT_FUNCTIONS["INV-PRN-1"](self.model)

    @invariant()
    def inv_prn_2_pruned_run_leaves_nothing(self):
        INVARIANT_FUNCTIONS["INV-PRN-2"](self.model)
    def inv_rev_1_one_run_per_revive(self):
        INVARIANT_FUNCTIONS["INV-REV-1"](self.model)

    @invariant()
    def inv_rev_2_no_succeeded_step_reexecuted(self):
        INVARIANT_FUNCTIONS["INV-REV-2"](self.model)

    @invariant()
    def inv_rev_3_revived_branch_resumes(self):
        INVARIANT_FUNCTIONS["INV-REV-3"](self.model)

    @invariant()
    def inv_trg_1_one_run_per_trigger_key(self):
        INVARIANT_FUNCTIONS["INV-TRG-1"](self.model)

    @invariant()
    def inv_trg_2_rolled_back_trigger_leaves_nothing(self):
        INVARIANT_FUNCTIONS["INV-TRG-2"](self.model)


PipelinesModelMachine.TestCase.settings = settings(stateful_step_count=STEPS)
TestPipelinesModel = PipelinesModelMachine.TestCase


@given(pipeline_scenarios(), pipeline_configs())
def test_run_to_quiescence_is_deterministic_and_resolved(scenario, config):
    """The summary is a pure function of (definition, args, oracle, config); runs end resolved.

    Two drives with different interleavings (batch-by-batch vs. the default
    order) give equal summaries: fan-in inputs are ordered by fanout_index,
    not by arrival [INV-ADV-3]; the run ends completed, halted or dampened
    [INV-RUN-1].
    """
    definition, args, oracle = scenario
    summary = run_to_quiescence(definition, args, oracle, config, resumes=[NO_INPUT, 5])
    assert summary == run_to_quiescence(definition, args, oracle, config, resumes=[NO_INPUT, 5])
    assert summary.status in ("completed", "halted", "dampened")
    model = PipelinesModel(config)
    run_id = model.trigger(definition, args)
    while not model.is_quiescent():  # newest branch and newest execution first
        if model.advanceable_branches():
            model.advance(model.advanceable_branches()[-1])
        elif model.runnable_executions():
            exec_id = model.runnable_executions()[-1]
            model.run_execution(exec_id, oracle(*model.execution_input(exec_id)))
        else:
            model.set_clock(model.executions[model.pending_executions()[0]].eligible_at_us)
        check_all(model)
    for value in (NO_INPUT, 5):
        if model.runs[run_id].status == "dampened":
            model.resume(run_id, value)
            model.drive(oracle)
    reordered = model.summary(run_id)
    assert reordered == summary, (reordered.as_json(), summary.as_json())
    assert sum(reordered.steps.values()) == len(model.steps)
    by_status: Counter = Counter()
    for (_, status, _), n in reordered.branches.items():
        by_status[status] += n
    assert Counter(b.status for b in model.branches.values()) == by_status


@settings(max_examples=60 if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else 25, deadline=None)
@given(scenario=pipeline_scenarios(), config=pipeline_configs(), batch=st.sampled_from([1, 2, 5, 50]))
def test_batched_fleet_ends_every_run_where_the_one_by_one_fleet_does(scenario, config, batch):
    """Driven by the batched operations (group commits advancing inline, advancer
    batches), every run ends exactly where the one-by-one drive ends it."""
    definition, args, oracle = scenario
    singles = run_to_quiescence(definition, args, oracle, config, resumes=(NO_INPUT,))
    batched = run_to_quiescence(definition, args, oracle, config, resumes=(NO_INPUT,), batch=batch)
    assert batched == singles


def _snapshot(**changes):
    snapshot = {"format": 1, "start": "a",
                "nodes": {"a": {"klass": "A", "delay_us": 0}, "b": {"klass": "B", "delay_us": 0}},
                "edges": {"a": {"type": "chain", "to": ["b"]}}}
    snapshot.update(changes)
    return snapshot


@pytest.mark.parametrize(("snapshot", "message"), [
    ([], "snapshot must be a mapping with format 1"),
    (_snapshot(format=2), "snapshot must be a mapping with format 1"),
    (_snapshot(start="z"), "start 'z' is not a node"),
    (_snapshot(nodes={"a": {"klass": "A"}}), "node 'a' lacks klass/delay_us"),
    (_snapshot(edges={"a": {"type": "teleport", "to": ["b"]}}), "edge from 'a': unknown node or type 'teleport'"),
    (_snapshot(edges={"z": {"type": "chain", "to": ["b"]}}), "edge from 'z': unknown node or type 'chain'"),
    (_snapshot(edges={"a": {"type": "divert", "to": {"x": "b"}}}), "divert from 'a' lacks 'otherwise'"),
    (_snapshot(edges={"a": {"type": "chain", "to": ["z"]}}), "edge from 'a' targets an unknown node"),
    (_snapshot(edges={"a": {"type": "combine", "to": ["b"]}}), "combine from 'a' lacks barrier"),
    (_snapshot(on_halt=""), "on_halt must be a class name, got ''"),
], ids=["not-a-mapping", "format", "start", "node", "edge-type", "edge-node", "divert", "target", "barrier",
        "on-halt"])
def test_a_malformed_snapshot_is_refused_naming_the_problem(snapshot, message):
    with pytest.raises(DefinitionError, match=f"^{re.escape(message)}$"):
        Definition.parse(snapshot)
