"""Each invariant check of ``model/invariants.py`` can fail: fed a deliberately wrong
state (a model run to a legal state, then one record forged or dropped), it raises
``AssertionError`` with its INV id.

The model mutants (``model/mutants.py``) make some of these checks fail from a wrong
operation; the failing branches no mutant reaches are shown failing here, so that no
check in the file is one nobody has seen fail (issue 17). Pure and fast: no database.
"""

from __future__ import annotations

import dataclasses

import pytest

from model.explore import _OUTPUTS as OUTPUTS
from model.explore import CHAIN, CHAIN_AB, DIVIDE, EXPAND, HALTING
from model.invariants import (
    INVARIANT_FUNCTIONS,
    check_all,
    inv_lim_1_in_flight_within_concurrency,
    inv_lim_2_rate_window,
    inv_lim_3_no_leaked_slots,
    inv_lim_4_levels_in_range,
    inv_lim_5_stamp_exact,
    inv_lim_6_fifo,
    inv_lim_8_family_within_ceiling,
    inv_lim_9_forget_adds_no_tokens,
)
from model.limits import (
    Bucket,
    Claimed,
    Completed,
    Decided,
    Enqueued,
    Forgotten,
    KeyLimits,
    LaneVerdict,
    LimitsModel,
    Polled,
    RateEntry,
    partition_key,
)
from model.pipelines import FAILURE, HaltHook, PipelineConfig, PipelinesModel, Prune, run_and_model, success

KEY = "k"
T = 1_000_000  # 1 s in µs
LIMITS = {KEY: {"concurrency": 1, "rate": {"limit": 1, "per": "1s"}}}  # one at a time, one a second


def _fails(check, model, inv_id: str, text: str) -> None:
    with pytest.raises(AssertionError) as raised:
        check(model)
    message = str(raised.value)
    assert message.startswith(f"[{inv_id}] "), message
    assert text in message, message


def _claimed() -> LimitsModel:
    """Key k's job 1 claimed by worker w at 1 s (a bucket starts empty: the poll at 0 was
    refused), its bucket spent again, k stamped until 2 s, job 2 of k pending: every
    invariant holds."""
    model = LimitsModel(LIMITS)
    model.enqueue(1, KEY, 0)
    model.enqueue(2, KEY, 0)
    assert model.claim("w", 0) is None
    assert model.claim("w", T) == 1
    check_all(model)
    return model


def _seq(model: LimitsModel) -> int:
    return len(model.events) + 100


def test_the_legal_states_pass():
    model = _claimed()
    model.complete(1, 2 * T)
    assert model.claim("w", 2 * T) == 2
    check_all(model)


# --------------------------------------------------------------------------- limits


def test_inv_lim_1_fails_on_a_claim_over_concurrency():
    model = _claimed()
    model.events.append(Claimed(_seq(model), 2, KEY, "v", 0))
    _fails(inv_lim_1_in_flight_within_concurrency, model, "INV-LIM-1", "made 2 in flight > concurrency 1")


def test_inv_lim_2_fails_on_claims_over_burst():
    _fails(lambda times: inv_lim_2_rate_window(times, [RateEntry(1, 1, 1)]), [0, 500_000], "INV-LIM-2",
           "2 claims in [0, 500000] µs exceed burst 1")


def test_inv_lim_3_fails_on_a_second_claim_a_completion_out_of_flight_and_a_count_off_its_history():
    model = _claimed()
    model.events.append(Claimed(_seq(model), 1, KEY, "w", 0))
    _fails(inv_lim_3_no_leaked_slots, model, "INV-LIM-3", "job 1 claimed twice without completing")
    model = _claimed()
    model.events.append(Completed(_seq(model), 2, KEY, "w", 0, "success"))
    _fails(inv_lim_3_no_leaked_slots, model, "INV-LIM-3", "job 2 completed (success) while not in flight")
    model = _claimed()
    model.jobs[2].state = "in_flight"  # in flight with no claim in the history: a leaked slot
    _fails(inv_lim_3_no_leaked_slots, model, "INV-LIM-3", "key 'k': in_flight() = 2 but the history holds ['1']")


def test_inv_lim_4_fails_on_a_bucket_the_config_drops_and_on_a_level_out_of_range():
    model = _claimed()
    model.buckets[(KEY, 60)] = Bucket(0, 0, 1_000_000)
    _fails(inv_lim_4_levels_in_range, model, "INV-LIM-4", "bucket ('k', 60s) survives but config keeps no such period")
    model = _claimed()
    model.buckets[(KEY, 1)] = Bucket(-1, 0, 1_000_000)
    _fails(inv_lim_4_levels_in_range, model, "INV-LIM-4", "bucket ('k', 1s) holds -1 units, outside [0, 1000000]")


def test_inv_lim_5_fails_on_each_wrong_stamp():
    model = _claimed()
    model.stamps["other"] = 5
    _fails(inv_lim_5_stamp_exact, model, "INV-LIM-5", "key 'other' stamped 5 without a refill since the last restart")
    model = _claimed()
    del model.buckets[(KEY, 1)]
    _fails(inv_lim_5_stamp_exact, model, "INV-LIM-5", "key 'k' decided but missing a bucket")
    model = _claimed()
    model.stamps[KEY] += 1
    _fails(inv_lim_5_stamp_exact, model, "INV-LIM-5", "key 'k' stamped 2000001, next token at 2000000")
    model = _claimed()
    decided = next(e for e in model.events if isinstance(e, Decided))
    model.events.append(dataclasses.replace(decided, seq=_seq(model), at_us=1, admitted=True))
    _fails(inv_lim_5_stamp_exact, model, "INV-LIM-5", "key 'k' admitted at 1 before its stamp 2000000")


def test_inv_lim_5_fails_on_a_stamp_that_is_not_the_first_microsecond_with_a_token():
    """The stamp is the one the formula gives, but the entry in force was forged to a
    burst of 0: its bucket never holds a token, at the stamp or ever."""
    model = _claimed()
    model.config[KEY] = KeyLimits(1, (RateEntry(1, 1, 0),), (RateEntry(1, 1, 0),))
    _fails(inv_lim_5_stamp_exact, model, "INV-LIM-5",
           "key 'k' stamp 2000000 is not the first µs with a token in every bucket")


def _poll(model: LimitsModel) -> Polled:
    """The model's last poll."""
    return [e for e in model.events if isinstance(e, Polled)][-1]


def _with_poll(model: LimitsModel, **changes) -> LimitsModel:
    """The model with its first poll's record replaced by one with ``changes``."""
    poll = _poll(model)
    model.events[model.events.index(poll)] = dataclasses.replace(poll, **changes)
    return model


def test_inv_lim_6_fails_on_each_wrong_poll():
    model = _claimed()
    lane = _poll(model).lanes[0]
    _fails(inv_lim_6_fifo, _with_poll(_claimed(), lanes=()), "INV-LIM-6", "lanes {} but oldest eligible jobs {'k': 1}")
    _fails(inv_lim_6_fifo, _with_poll(_claimed(), lanes=(dataclasses.replace(lane, verdict="blocked"),)),
           "INV-LIM-6", "lane 'k' marked blocked but blocked=False saturated=False")
    _fails(inv_lim_6_fifo, _with_poll(_claimed(), job_id=2), "INV-LIM-6", "claimed 2, FIFO says 1")
    _fails(inv_lim_6_fifo, _with_poll(_claimed(), lanes=(dataclasses.replace(lane, verdict="untried"),)),
           "INV-LIM-6", "verdicts ['untried'] skip a permitted older lane")


def test_inv_lim_6_fails_on_lanes_out_of_fifo_order_and_a_refused_unkeyed_lane():
    model = LimitsModel(LIMITS)
    model.enqueue(1, None, 0)
    model.enqueue(2, KEY, 0)
    assert model.claim("w", 0) == 1
    check_all(model)
    lanes = _poll(model).lanes
    assert [lane.key for lane in lanes] == [None, KEY]
    _fails(inv_lim_6_fifo, _with_poll(model, lanes=tuple(reversed(lanes))), "INV-LIM-6",
           "lanes tried out of FIFO order")
    model = LimitsModel(LIMITS)
    model.enqueue(1, None, 0)
    assert model.claim("w", 0) == 1
    refused = (LaneVerdict(None, 1, 0, 0, "refused_rate"),)
    _fails(inv_lim_6_fifo, _with_poll(model, lanes=refused, job_id=None), "INV-LIM-6", "the unkeyed lane was refused")


#: a key family (semantics §5.1, model only: issue 34): each partition 1 per second, the family 1 at a time
FAMILY = {"p": {"per_partition": {"rate": {"limit": 1, "per": "1s"}}, "concurrency": 1}}
P1, P2 = partition_key("p", "x"), partition_key("p", "'")


def _partitioned() -> LimitsModel:
    """Partition P1's job 1 claimed at 1 s and completed, then P1 forgotten; job 2 of P2
    pending: every invariant holds."""
    model = LimitsModel(FAMILY)
    model.enqueue(1, P1, 0)
    assert model.claim("w", 0) is None
    assert model.claim("w", T) == 1
    model.complete(1, T)
    model.forget_partition(P1, T)
    model.enqueue(2, P2, T)
    check_all(model)
    return model


def test_inv_lim_8_fails_on_a_claim_over_the_family_ceiling():
    model = _partitioned()
    model.events.append(Claimed(_seq(model), 3, P1, "w", 2 * T))
    model.events.append(Claimed(_seq(model) + 1, 4, P2, "v", 2 * T))
    _fails(inv_lim_8_family_within_ceiling, model, "INV-LIM-8", "made 2 in flight > family concurrency 1")


def test_inv_lim_9_fails_on_a_busy_forget_and_on_rows_a_forget_left():
    model = _partitioned()
    model.events.append(Forgotten(_seq(model), P2, 2 * T))  # job 2 of P2 is pending
    _fails(inv_lim_9_forget_adds_no_tokens, model, "INV-LIM-9", "forgotten at 2000000 µs with work ['2']")
    model = _partitioned()
    model.buckets[(P1, 1)] = Bucket(1_000_000, T, 1_000_000)  # a full bucket after the forget
    _fails(inv_lim_9_forget_adds_no_tokens, model, "INV-LIM-9", "forgotten, not decided since, still has buckets")
    model = _partitioned()
    model.events.append(Enqueued(_seq(model), 3, P1, 2 * T, 3))
    model.events.append(Forgotten(_seq(model) + 1, P1, 2 * T))
    _fails(inv_lim_9_forget_adds_no_tokens, model, "INV-LIM-9", "with work ['3']")


# --------------------------------------------------------------------------- pipelines
#
# A model run to quiescence with the explorer's definitions, then one record forged:
# (builder, forgery, invariant, text the failure names).


def _ok(node, _input, _attempt):
    return success(OUTPUTS[node])


def _built(definition, oracle=_ok, config=None):
    def build():
        _, model, run_id = run_and_model(definition, [0], oracle, config)
        check_all(model)
        return model, run_id
    return build


def _halting_oracle(node, _input, _attempt):
    return FAILURE if node == "A" else success(1)


CHAIN_RUN = _built(CHAIN)
DIVIDE_RUN = _built(DIVIDE)
EXPAND_RUN = _built(EXPAND, config=PipelineConfig(expand_batch=1))
HALTED_RUN = _built(HALTING, _halting_oracle, PipelineConfig(max_retry=1))


def _step(model, node, run=None):
    return next(s for s in model.steps.values() if s.node == node and (run is None or s.run_id == run))


def _branch(model, node, run=None):
    return model.branches[_step(model, node, run).branch_id]


def _execution(model, node, run=None):
    return model.executions[_step(model, node, run).executions[-1]]


def _extra_step(model, node, **changes):
    step = _step(model, node)
    model.steps["forged"] = dataclasses.replace(step, id="forged", **changes)


def _first_step(model, step):
    """``step`` added to the model, first in its steps' order."""
    model.steps = {step.id: step, **model.steps}


def _set(obj, **changes):
    for name, value in changes.items():
        setattr(obj, name, value)


def _forge_hook(model, run_id, **changes):
    hook = model.hook_of(run_id)
    _set(hook, **changes)


CASES = {
    # INV-ADV-1
    "adv1_two_trigger_steps": (CHAIN_RUN, lambda m, _: _set(_step(m, "B"), origin="trigger"),
                               "INV-ADV-1", "has 2 trigger steps"),
    "adv1_no_predecessor": (CHAIN_RUN, lambda m, _: _first_step(m, dataclasses.replace(
        _step(m, "B"), id="forged", predecessors=())), "INV-ADV-1", "step forged (B) has no predecessor"),
    "adv1_fan_in_two_successors": (DIVIDE_RUN, lambda m, _: _extra_step(m, "D"),
                                   "INV-ADV-1", "has 2 successors"),
    "adv1_successor_lost": (CHAIN_RUN, lambda m, _: m.steps.pop(_step(m, "B").id),
                            "INV-ADV-1", "(A, chain, completed): missing successors [('B', '[[1,2]]', 'same')]"),
    "adv1_successor_on_a_stray_branch": (DIVIDE_RUN, lambda m, _: _set(_branch(m, "B"), barrier=None),
                                         "INV-ADV-1", "'stray branch branch2')"),
    # INV-ADV-2
    "adv2_claim_while_held": (CHAIN_RUN, lambda m, _: m.fence_log.extend([("claim", "b", 90), ("claim", "b", 91)]),
                              "INV-ADV-2", "branch b claimed with token 91 while held by 90"),
    "adv2_stale_commit": (CHAIN_RUN, lambda m, _: m.fence_log.extend([("claim", "b", 90), ("commit", "b", 89)]),
                          "INV-ADV-2", "branch b: commit with token 89, current token 90"),
    # INV-ADV-3
    "adv3_merge_of_two_barriers": (DIVIDE_RUN, lambda m, _: _set(_branch(m, "C"), barrier="elsewhere"),
                                   "INV-ADV-3", "joins siblings of several barriers"),
    "adv3_merge_without_fan_out": (DIVIDE_RUN, lambda m, _: _set(_branch(m, "A"), fanout_width=None),
                                   "INV-ADV-3", "never fanned out but has merges"),
    "adv3_arrival_counted_twice": (DIVIDE_RUN, lambda m, _: _set(_branch(m, "C"), fanout_index=0),
                                   "INV-ADV-3", "index 0 arrived twice"),
    "adv3_counter_off": (DIVIDE_RUN, lambda m, _: _set(_branch(m, "A"), fanin_arrivals=1),
                         "INV-ADV-3", "counter 1 but 2 arrived"),
    "adv3_merge_missing": (DIVIDE_RUN, lambda m, _: _set(_step(m, "D"), origin="chain"),
                           "INV-ADV-3", "has 0 merge steps"),
    "adv3_merge_input_wrong": (DIVIDE_RUN, lambda m, _: _set(_step(m, "D"), input=[[]]),
                               "INV-ADV-3", "input [[]] != sibling outputs"),
    "adv3_merge_out_of_place": (DIVIDE_RUN, lambda m, _: _set(_branch(m, "D"), fanout_index=7),
                                "INV-ADV-3", "does not stand in"),
    # INV-ADV-4
    "adv4_batch_too_big": (EXPAND_RUN, lambda m, _: m.commits.append(
        dataclasses.replace(next(c for c in m.commits if c.action == "expand"), created_steps=("x", "y"))),
        "INV-ADV-4", "created 2 children > expand_batch 1"),
    "adv4_cursor_off": (EXPAND_RUN, lambda m, _: _set(_branch(m, "A"), expand_cursor=1),
                        "INV-ADV-4", "cursor 1 but children at indices [0, 1]"),
    "adv4_completed_short": (EXPAND_RUN, lambda m, _: _set(_step(m, "A"), output=[1, 2, 3]),
                             "INV-ADV-4", "completed with 2 of 3 children"),
    "adv4_child_input_wrong": (EXPAND_RUN, lambda m, _: _set(_step(m, "A"), output=[2, 1]),
                               "INV-ADV-4", "(index 0) input [1] != [2]"),
    # INV-EXE-1
    "exe1_in_progress_without_execution": (CHAIN_RUN, lambda m, _: _set(_step(m, "D"), status="in_progress"),
                                           "INV-EXE-1", "(in_progress) has pending executions []"),
    "exe1_stranded_branch": (CHAIN_RUN, lambda m, _: _set(_branch(m, "D"), status="in_progress"),
                             "INV-EXE-1", "is stranded: latest step step4 is completed"),
    # INV-EXE-2
    "exe2_outcome_twice": (CHAIN_RUN, lambda m, _: m.outcomes.append((1, "success")),
                           "INV-EXE-2", "execution 1 has 2 recorded outcomes"),
    "exe2_completed_unrecorded": (CHAIN_RUN, lambda m, _: m.outcomes.remove((1, "success")),
                                  "INV-EXE-2", "execution 1 is completed with 0 outcomes"),
    "exe2_outcome_differs": (CHAIN_RUN, lambda m, _: _set(m.executions[1], outcome="failure"),
                             "INV-EXE-2", "execution 1 outcome failure != recorded success"),
    # INV-EXE-3
    "exe3_keys_differ": (HALTED_RUN, lambda m, _: _set(m.executions[_step(m, "A").executions[0]], key="x"),
                         "INV-EXE-3", "executions carry keys"),
    "exe3_key_not_its_own": (CHAIN_RUN, lambda m, _: _set(m.executions[1], key="step2"),
                             "INV-EXE-3", "step step1 carries key 'step2', not 'step1'"),
    "exe3_key_shared": (CHAIN_RUN, lambda m, _: (_set(_step(m, "B"), revives="step1"),
                                                 _set(m.executions[2], key="step1")),
                        "INV-EXE-3", "key 'step1' shared by steps step1 and step2 of one run"),
    # INV-EXE-4
    "exe4_first_execution_counted": (CHAIN_RUN, lambda m, _: _set(m.executions[1], retry_count=1),
                                     "INV-EXE-4", "first execution starts at 1/0"),
    "exe4_after_success": (HALTED_RUN, lambda m, _: _set(m.executions[_step(m, "A").executions[0]],
                                                         outcome="success"),
                           "INV-EXE-4", "follows success"),
    "exe4_after_no_completion": (HALTED_RUN, lambda m, _: _set(m.executions[_step(m, "A").executions[0]],
                                                               completed_at_us=None),
                                 "INV-EXE-4", "which never completed"),
    "exe4_retry_early": (HALTED_RUN, lambda m, _: _set(_execution(m, "A"), eligible_at_us=0),
                         "INV-EXE-4", "has retry/crash/eligible (1, 0, 0)"),
    "exe4_over_budget": (CHAIN_RUN, lambda m, _: _set(m, config=dataclasses.replace(m.config, max_crash=-1)),
                         "INV-EXE-4", "exceeds budgets 0/3 0/-1"),
    "exe4_failed_status": (CHAIN_RUN, lambda m, _: _set(_step(m, "D"), status="failed"),
                           "INV-EXE-4", "step step4 is failed after last execution 4 success"),
    "exe4_halt_reason": (HALTED_RUN, lambda m, _: _set(_branch(m, "A"), halt_reason="job_invalid"),
                         "INV-EXE-4", "halted job_invalid, expected job_retries_exhausted"),
    # INV-RUN-1
    "run1_left_terminal": (CHAIN_RUN, lambda m, r: m.runs[r].status_history.append("in_progress"),
                           "INV-RUN-1", "left a terminal state"),
    "run1_status_unresolved": (CHAIN_RUN, lambda m, r: _set(m.runs[r], status="halted"),
                               "INV-RUN-1", "is halted but its branches resolve to completed"),
    "run1_live_at_quiescence": (CHAIN_RUN, lambda m, r: (_set(m.runs[r], status="in_progress"),
                                                         _set(_branch(m, "D"), status="in_progress"),
                                                         _set(_branch(m, "D"), claim_token=1)),
                                "INV-RUN-1", "is in_progress at quiescence"),
    # INV-CTX-1
    "ctx1_write_disagrees": (CHAIN_RUN, lambda m, r: (m.context_set(r, "x", 1), m.context_writes.append(
        dataclasses.replace(m.context_writes[-1], existed=False))), "INV-CTX-1", "with key present"),
    "ctx1_context_disagrees": (CHAIN_RUN, lambda m, r: m.runs[r].context.update(x=1),
                               "INV-CTX-1", "context keys ['x'] disagree with accepted writes"),
    # INV-HLT-1
    "hlt1_two_hooks": (HALTED_RUN, lambda m, r: m.hooks.update(forged=dataclasses.replace(m.hook_of(r), id="forged")),
                       "INV-HLT-1", "has 2 hooks"),
    "hlt1_hook_of_a_completed_run": (CHAIN_RUN, lambda m, r: m.hooks.update(
        forged=HaltHook("forged", r, "x:Y", 0)), "INV-HLT-1", "names 'x:Y'"),
    "hlt1_outcome_unrecorded": (HALTED_RUN, lambda m, _: m.hook_outcomes.clear(),
                                "INV-HLT-1", "is succeeded with 0 recorded outcomes"),
    "hlt1_outcome_differs": (HALTED_RUN, lambda m, r: _forge_hook(m, r, status="failed"),
                             "INV-HLT-1", "is failed but recorded succeeded"),
    "hlt1_stale_record": (HALTED_RUN, lambda m, r: m.hook_log.append(("record", m.hook_of(r).id, 2)),
                          "INV-HLT-1", "an attempt recorded with token 2, not its claim None"),
    # INV-HLT-2
    "hlt2_no_hook_owed": (HALTED_RUN, lambda m, _: (m.hooks.clear(), m.hook_outcomes.clear()),
                          "INV-HLT-2", "owes no hook to"),
    "hlt2_success_then_more": (HALTED_RUN, lambda m, r: m.hook_of(r).attempts.insert(0, "success"),
                               "INV-HLT-2", "attempt 0 succeeded, then ['success']"),
    "hlt2_spent_not_failed": (HALTED_RUN, lambda m, r: _forge_hook(m, r, attempts=["invalid"]),
                              "INV-HLT-2", "attempt 0 (invalid) spent its budget"),
    "hlt2_failed_with_budget": (HALTED_RUN, lambda m, r: _forge_hook(m, r, attempts=["failure"], status="failed"),
                                "INV-HLT-2", "failed with budget left (0/0) after failure"),
    "hlt2_eligible_wrong": (HALTED_RUN, lambda m, r: _forge_hook(m, r, attempts=["failure"], status="pending",
                                                                 retry_count=1),
                            "INV-HLT-2", "hook hook1 eligible at 10000000, expected 20000000"),
    "hlt2_counts_wrong": (HALTED_RUN, lambda m, r: _forge_hook(m, r, retry_count=1),
                          "INV-HLT-2", "counts 1/0, attempts give 0/0"),
    # is_quiescent() itself asks for no open hook: a model that miscounts quiescence
    "hlt2_open_at_quiescence": (HALTED_RUN, lambda m, r: (_forge_hook(m, r, attempts=[], status="pending"),
                                                          m.hook_outcomes.clear(),
                                                          _set(m, is_quiescent=lambda: True)),
                                "INV-HLT-2", "hooks ['hook1'] are open at quiescence"),
}


def _halted_at_b(node, _input, _attempt):
    return FAILURE if node == "B" else success(1)


HALTED_AT_B = _built(HALTING, _halted_at_b, PipelineConfig(max_retry=0))


def _revived_run():
    """HALTED_AT_B (A succeeded, B failed) revived and driven: its A carried over as
    history, its B re-run (and succeeding)."""
    model, source = HALTED_AT_B()
    new = model.revive(source)
    model.drive(_ok)
    check_all(model)
    return model, (source, new)


def _copy(model, node, runs):
    return _step(model, node, runs[1])


def _old(model, node, runs):
    return _step(model, node, runs[0])


def _keyed_runs():
    """Two runs with trigger key k: the first finished, then released by the second's
    windowed trigger."""
    model = PipelinesModel(PipelineConfig())
    first = model.trigger(CHAIN_AB, [0], key="k")
    model.drive(_ok)
    model.advance_clock(5)
    second = model.trigger(CHAIN_AB, [1], key="k", key_window_us=1)
    assert second != first
    model.drive(_ok)
    check_all(model)
    return model, (first, second)


def _rolled_back():
    model = PipelinesModel(PipelineConfig())
    assert model.trigger_in(CHAIN_AB, [0], key="k", commit=False) is None
    check_all(model)
    return model, None


def _prune(model, run_id, status, finished, hook_open):
    model.prunes.append(Prune(10**12, ((run_id, status, finished, hook_open),), (run_id,), ()))


CASES.update({
    # INV-PRN-1
    "prn1_live_run_deleted": (CHAIN_RUN, lambda m, r: _prune(m, r, "in_progress", None, False),
                              "INV-PRN-1", "deleted run run1, in_progress finished at None"),
    "prn1_hook_owed_deleted": (HALTED_RUN, lambda m, r: _prune(m, r, "halted", 1, True),
                               "INV-PRN-1", "its on_halt hook still to run"),
    # INV-PRN-2
    "prn2_pruned_twice": (CHAIN_RUN, lambda m, r: (_set(m.runs[r], pruned=True), m.prunes.extend(
        [Prune(0, (), (), ((r, m.run_digest(r)),))] * 2)), "INV-PRN-2", "run run1 pruned twice"),
    "prn2_changed_after_prune": (CHAIN_RUN, lambda m, r: m.prunes.append(Prune(0, (), (), ((r, b"x"),))),
                                 "INV-PRN-2", "run run1 changed after it was pruned"),
    "prn2_flag_without_prune": (CHAIN_RUN, lambda m, r: _set(m.runs[r], pruned=True),
                                "INV-PRN-2", "runs marked pruned ['run1'] disagree with the prunes []"),
    # INV-REV-1
    "rev1_revived_twice": (_revived_run, lambda m, r: m.runs.update(
        forged=dataclasses.replace(m.runs[r[1]], id="forged")), "INV-REV-1", "run run1 was revived 2 times"),
    "rev1_revived_not_halted": (_revived_run, lambda m, r: _set(m.runs[r[0]], status="completed"),
                                "INV-REV-1", "run run1 was revived but is completed"),
    "rev1_revive_returned_another": (_revived_run, lambda m, r: m.revivals.append((r[0], "runX")),
                                     "INV-REV-1", "revive of run1 returned runX, but run2 revives it"),
    # INV-REV-2
    "rev2_failed_step_carried": (_revived_run, lambda m, r: _set(_copy(m, "B", r), copied_from=_old(m, "B", r).id),
                                 "INV-REV-2", "carried over as history into run2"),
    "rev2_copy_missing": (_revived_run, lambda m, r: _set(_copy(m, "A", r), copied_from=None),
                          "INV-REV-2", "has 0 copies in run2"),
    "rev2_copy_executed": (_revived_run, lambda m, r: _set(_copy(m, "A", r), executions=[1]),
                           "INV-REV-2", "was executed again"),
    "rev2_not_a_copy": (_revived_run, lambda m, r: _set(_copy(m, "A", r), output=99),
                        "INV-REV-2", "is not a copy of"),
    "rev2_copy_not_completed": (_revived_run, lambda m, r: _set(_copy(m, "A", r), status="advancing"),
                                "INV-REV-2", "is advancing"),
    "rev2_copy_advanced_again": (_revived_run, lambda m, r: _set(_copy(m, "B", r), revives=None),
                                 "INV-REV-2", "was advanced again"),
    # INV-REV-3
    "rev3_branch_missing": (_revived_run, lambda m, r: _set(_branch(m, "B", r[1]), copied_from=None),
                            "INV-REV-3", "is missing from run2"),
    "rev3_not_re_run": (_revived_run, lambda m, r: _set(_copy(m, "B", r), revives=None),
                        "INV-REV-3", "re-run 0 times in run2"),
    "rev3_re_run_other_input": (_revived_run, lambda m, r: _set(_copy(m, "B", r), input=[7]),
                                "INV-REV-3", "with B [7], not B [1]"),
    "rev3_budget_carried": (_revived_run, lambda m, r: _set(m.executions[_copy(m, "B", r).executions[0]],
                                                            retry_count=1),
                            "INV-REV-3", "without a fresh budget"),
    "rev3_other_key": (_revived_run, lambda m, r: _set(_copy(m, "B", r), key="other"),
                       "INV-REV-3", "has key 'other'"),
    "rev3_advancement_halt_not_resumed": (_revived_run, lambda m, r: _set(_old(m, "B", r), status="completed"),
                                          "INV-REV-3", "(advancement halt) is not resumed advancing in run2"),
    # INV-TRG-1
    "trg1_two_holders": (_keyed_runs, lambda m, r: _set(m.runs[r[0]], key_released_at_us=None),
                         "INV-TRG-1", "2 runs of"),
    "trg1_returned_unknown_run": (_keyed_runs, lambda m, _: m.triggers.append(
        dataclasses.replace(m.triggers[0], run_id="nope")), "INV-TRG-1", "returned nope, which was not triggered"),
    "trg1_started_while_held": (_keyed_runs, lambda m, _: m.triggers.__setitem__(
        1, dataclasses.replace(m.triggers[1], window_us=None)), "INV-TRG-1", "started run2 while run1 held it"),
    "trg1_returned_another_run": (_keyed_runs, lambda m, _: m.triggers.append(
        dataclasses.replace(m.triggers[0], created=False)), "INV-TRG-1", "returned run1, not its run run2"),
    "trg1_released_without_trigger": (_keyed_runs, lambda m, _: m.triggers.pop(),
                                      "INV-TRG-1", "run run1 released key 'k' without a windowed trigger taking it"),
    # INV-TRG-2
    "trg2_rollback_left_state": (_rolled_back, lambda m, _: m.rollbacks.__setitem__(0, (m.rollbacks[0][0], b"x")),
                                 "INV-TRG-2", "rolled-back trigger #1 left state behind"),
})


@pytest.mark.parametrize("name", list(CASES))
def test_each_pipeline_check_fails_on_a_forged_state(name):
    build, forge, inv_id, text = CASES[name]
    model, run_id = build()
    forge(model, run_id)
    _fails(INVARIANT_FUNCTIONS[inv_id], model, inv_id, text)
