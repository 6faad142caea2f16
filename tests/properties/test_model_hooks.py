"""``HaltHooksModelMachine``: the pipelines model alone with ``on_halt`` hooks, on random
definitions that name a handler; runs are made to halt (forced invalid executions), and
hook claims, outcomes, reaps (a worker dying mid-hook), stale records and clock moves
are interleaved at random; every invariant after every step.

Rules (verbs): ``trigger``, ``drive_a_little``, ``halt_a_step`` (an execution forced
``invalid`` or failed), ``run_hook`` (claim, then success/failure/invalid),
``crash_hook`` (claim, then the reaper), ``record_with_stale_token`` (claim, reap,
re-claim: the first claimer's record is refused and changes nothing), ``claim_twice``
(a running hook cannot be claimed again), ``advance_clock``; ``teardown`` drives every
run and hook to rest (liveness: each halted run's hook ends with its outcome recorded).

Checks: INV-HLT-1, INV-HLT-2 (and every other pipeline invariant).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

# the model as ductwork_model, the name the shipped strategies (its oracles and configs) use: one set
# of model classes in this test, never `model`'s beside them
from ductwork_model.errors import PreconditionError, StaleClaim
from ductwork_model.invariants import INVARIANT_FUNCTIONS, check_all
from ductwork_model.pipelines import CRASH, FAILURE, INVALID, PipelinesModel, run_and_model, success
from ductwork_proof.conformance.strategies import pipeline_configs, pipeline_scenarios

STEPS = 100 if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else 40
HANDLER = "ductwork_proof.conformance.oracle_steps:OnHalt"
HOOK_OUTCOMES = {"success": success(None), "failure": FAILURE, "invalid": INVALID}


def with_hook(definition: dict) -> dict:
    return {**definition, "on_halt": HANDLER}


class HaltHooksModelMachine(RuleBasedStateMachine):
    """Nouns: runs, hooks, hook claim tokens. ``model_class`` is swapped for mutants."""

    model_class: type[PipelinesModel] = PipelinesModel

    @initialize(scenario=pipeline_scenarios(), config=pipeline_configs())
    def configure(self, scenario, config):
        definition, self.args, self.oracle = scenario
        self.definition = with_hook(definition)
        self.model = self.model_class(config)
        self.model.trigger(self.definition, self.args)

    def _pick(self, data, items):
        return data.draw(st.sampled_from(sorted(items, key=str)))

    @precondition(lambda self: len(self.model.runs) < 3)
    @rule(args=st.lists(st.integers(0, 9), max_size=2))
    def trigger(self, args):
        self.model.trigger(self.definition, args)

    @precondition(lambda self: self.model.runnable_executions() or self.model.advanceable_branches())
    @rule()
    def drive_a_little(self):
        """The fault-free fleet does three things (hooks are the other rules')."""
        self.model.drive(self.oracle, stop_after=3, hooks=False)

    @precondition(lambda self: self.model.runnable_executions())
    @rule(data=st.data(), how=st.sampled_from(["invalid", "failure", "crash"]))
    def halt_a_step(self, data, how):
        """An execution ends badly (``invalid`` fails its step at once, so its run halts)."""
        exec_id = self._pick(data, self.model.runnable_executions())
        self.model.run_execution(exec_id, {"invalid": INVALID, "failure": FAILURE, "crash": CRASH}[how])

    @precondition(lambda self: self.model.runnable_hooks())
    @rule(data=st.data(), how=st.sampled_from(list(HOOK_OUTCOMES)))
    def run_hook(self, data, how):
        hook_id = self._pick(data, self.model.runnable_hooks())
        token = self.model.claim_hook(hook_id)
        status = self.model.run_hook(hook_id, token, HOOK_OUTCOMES[how])
        if how == "success":
            assert status == "succeeded"
        if how == "invalid":
            assert status == "failed", "[INV-HLT-2] a handler that cannot be built is not retried"

    @precondition(lambda self: self.model.runnable_hooks())
    @rule(data=st.data())
    def crash_hook(self, data):
        """The worker running the hook dies; the reaper crashes its claim."""
        hook_id = self._pick(data, self.model.runnable_hooks())
        self.model.claim_hook(hook_id)
        assert self.model.reap_hook(hook_id) in ("pending", "failed")

    @precondition(lambda self: self.model.runnable_hooks())
    @rule(data=st.data(), how=st.sampled_from(list(HOOK_OUTCOMES)))
    def record_with_stale_token(self, data, how):
        """A claimer presumed dead (reaped) records after another worker re-claimed the hook:
        refused, nothing changes [INV-HLT-1]."""
        hook_id = self._pick(data, self.model.runnable_hooks())
        stale = self.model.claim_hook(hook_id)
        self.model.reap_hook(hook_id)
        if hook_id not in self.model.runnable_hooks():
            return  # failed by its crash budget, or backing off
        fresh = self.model.claim_hook(hook_id)
        before = self.model.snapshot()
        try:
            self.model.run_hook(hook_id, stale, HOOK_OUTCOMES[how])
        except StaleClaim:
            assert self.model.snapshot() == before, f"[INV-HLT-1] a stale record on {hook_id} changed state"
            self.model.run_hook(hook_id, fresh, success(None))
        else:  # the invariant names what went wrong; failing here too keeps a broken model red
            INVARIANT_FUNCTIONS["INV-HLT-1"](self.model)
            raise AssertionError(f"[INV-HLT-1] hook {hook_id}: a stale token {stale} recorded an attempt")

    @precondition(lambda self: self.model.runnable_hooks())
    @rule(data=st.data())
    def claim_twice(self, data):
        hook_id = self._pick(data, self.model.runnable_hooks())
        token = self.model.claim_hook(hook_id)
        before = self.model.snapshot()
        with pytest.raises(PreconditionError):
            self.model.claim_hook(hook_id)
        assert self.model.snapshot() == before
        self.model.run_hook(hook_id, token, success(None))

    @rule(dt=st.sampled_from([0, 1, 1_000_000, 10_000_000, 40_000_000]))
    def advance_clock(self, dt):
        self.model.advance_clock(dt)

    def teardown(self):
        """Liveness: every run and every hook comes to rest with its outcome recorded."""
        if hasattr(self, "model"):
            self.model.drive(self.oracle, max_actions=5_000)
            assert self.model.is_quiescent()
            check_all(self.model)
            for run in self.model.runs.values():
                if run.status == "halted":
                    hook = self.model.hook_of(run.id)
                    assert hook is not None, f"[INV-HLT-2] halted run {run.id} owes no hook"
                    assert hook.status in ("succeeded", "failed"), f"[INV-HLT-2] hook {hook.id} is {hook.status}"

    @invariant()
    def inv_hlt_1_hook_outcome_once(self):
        INVARIANT_FUNCTIONS["INV-HLT-1"](self.model)

    @invariant()
    def inv_hlt_2_halted_run_gets_its_hook(self):
        INVARIANT_FUNCTIONS["INV-HLT-2"](self.model)


HaltHooksModelMachine.TestCase.settings = settings(stateful_step_count=STEPS, deadline=None)
TestHaltHooksModel = HaltHooksModelMachine.TestCase

ATTEMPT = st.sampled_from(["success", "failure", "process_crashed", "invalid"])


@settings(max_examples=60 if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else 25, deadline=None)
@given(scenario=pipeline_scenarios(), config=pipeline_configs(), attempts=st.lists(ATTEMPT, max_size=6))
def test_every_halted_run_has_its_hook_delivered_once(scenario, config, attempts):
    """Driven to rest with hooks whose attempts fail, crash or cannot be built: a run that
    halted has exactly one hook, ended ``succeeded`` or ``failed`` with one recorded
    outcome, after the attempts its budgets allow; a run that did not halt has none."""
    definition, args, oracle = scenario
    plan = {"success": success(None), "failure": FAILURE, "process_crashed": CRASH, "invalid": INVALID}

    def hook_oracle(_run_id, attempt):
        return plan[attempts[attempt]] if attempt < len(attempts) else success(None)

    summary, model, run_id = run_and_model(with_hook(definition), args, oracle, config, hook_oracle=hook_oracle)
    check_all(model)
    hook = model.hook_summary(run_id)
    if summary.status != "halted":
        assert hook is None
        return
    assert hook is not None
    assert hook["status"] in ("succeeded", "failed")
    assert len(model.hook_outcomes) == 1
    assert hook["attempts"] == attempts[:len(hook["attempts"])] + ["success"] * (
        len(hook["attempts"]) - min(len(attempts), len(hook["attempts"])))
