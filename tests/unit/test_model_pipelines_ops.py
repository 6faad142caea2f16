"""PipelinesModel's operations by worked example: each drives one operation through a
small case and compares the whole resulting records (executions, steps, branches, runs,
commits, the fence log, hooks) with the values worked out by hand from semantics §1–§4.

The fast tier of ``model/pipelines.py``: the state machines and the explorer
(``tests/properties/test_model_*.py``) check invariants over many interleavings but take
tens of seconds; these take milliseconds, so a generated mutant (``python -m
tests.mutation model.pipelines``) is judged by them. Last, the explorer's smallest worlds
are explored whole, their counts of states and transitions pinned: any change to what an
operation does or allows changes the reachable graph.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from model.errors import CommitFailed, DefinitionError, OverwriteError, PreconditionError, StaleClaim
from model.explore import _PARKED, CHAIN, CHAIN_AB, DIVIDE, EXPAND, HALTING, _pipelines, explore
from model.mutants import RollbackKeepsTrigger
from model.pipelines import (
    CRASH,
    FAILURE,
    INVALID,
    NO_INPUT,
    TIMED_OUT,
    Branch,
    Commit,
    ContextWrite,
    Definition,
    Execution,
    HaltHook,
    Outcome,
    PipelineConfig,
    PipelinesModel,
    Prune,
    RunSummary,
    Step,
    Trigger,
    canonical_json,
    is_json_value,
    job_halt_reason,
    render_key,
    resolve_run_status,
    run_and_model,
    run_to_quiescence,
    success,
)

CFG = PipelineConfig(max_retry=1, max_crash=3, retry_delay_us=10, crash_delay_us=100, expand_batch=2,
                     advancer_max_retry=1, advancer_max_crash=2)


@contextmanager
def raises(error: type[Exception], message: str) -> Iterator[None]:
    """``pytest.raises`` with the whole message compared (``match`` searches a part)."""
    with pytest.raises(error) as info:
        yield
    assert str(info.value) == message


def snap(start: str, nodes: str, edges: dict, on_halt: str | None = None, pipeline: str | None = None,
         delays: dict | None = None, limit_by: dict | None = None) -> dict:
    out: dict = {"format": 1, "start": start, "edges": edges,
                 "nodes": {n: {"klass": f"m:{n}", "delay_us": (delays or {}).get(n, 0)} for n in nodes}}
    for n, key in (limit_by or {}).items():
        out["nodes"][n]["limit_by"] = key
    if on_halt:
        out["on_halt"] = on_halt
    if pipeline:
        out["pipeline"] = pipeline
    return out


def ex(id_: int, step: str, retry: int = 0, crash: int = 0, at: int = 0, outcome: str | None = None,
       done: int | None = None, error: str | None = None, key: str | None = None) -> Execution:
    """An execution: completed when ``outcome`` is given (at ``done``, default ``at``)."""
    state = "pending" if outcome is None else "completed"
    finished = None if outcome is None else (at if done is None else done)
    return Execution(id_, step, retry, crash, at, state, outcome, error, finished, key or step)


def st(id_: str, node: str, inp: list, origin: str, preds: tuple = (), status: str = "in_progress",
       output=None, execs: list | None = None, run: str = "run1", branch: str = "branch1", **more) -> Step:
    return Step(id_, run, branch, node, inp, origin, preds, status, output, execs or [], key=more.pop("key", id_),
                **more)


ONE = snap("A", "A", {})
AB = snap("A", "AB", {"A": {"type": "chain", "to": ["B"]}})


# ----------------------------------------------------------------- values


def test_value_helpers():
    assert canonical_json({"b": [1, 2], "a": None}) == '{"a":null,"b":[1,2]}'
    assert [is_json_value(v) for v in (None, True, "s", 3, 1.5, [1, [2]], {"a": {"b": 1}})] == [True] * 7
    assert [is_json_value(v) for v in (float("nan"), float("inf"), (1,), {1: 2}, [(1,)], {"a": (1,)}, {1},
                                       object())] == [False] * 8
    assert [render_key(v) for v in ("x", True, False, None, 7, 1.0, [1], {"a": 1})] == [
        "x", "true", "false", "", "7", "1.0", None, None]
    assert [job_halt_reason(o) for o in ("process_crashed", "invalid", "failure", "timed_out", None)] == [
        "job_crashes_exhausted", "job_invalid", "job_retries_exhausted", "job_retries_exhausted",
        "job_retries_exhausted"]
    assert job_halt_reason("invalid", True) == "step_return_invalid"
    assert job_halt_reason("failure", True) == "job_retries_exhausted"
    assert success([1]) == Outcome("success", [1])
    assert Outcome("failure") == FAILURE
    assert Outcome("timed_out") == TIMED_OUT
    assert Outcome("invalid") == INVALID
    assert Outcome("process_crashed") == CRASH
    with raises(PreconditionError, "unknown outcome kind 'bogus'"):
        Outcome("bogus")
    assert repr(NO_INPUT) == "NO_INPUT"


def test_run_resolution():
    assert resolve_run_status([]) == "completed"
    assert resolve_run_status(["completed", "in_progress", "halted"]) == "in_progress"
    assert resolve_run_status(["halted", "advancing", "dampened"]) == "in_progress"
    assert resolve_run_status(["completed", "halted", "dampened"]) == "dampened"
    assert resolve_run_status(["completed", "halted"]) == "halted"
    assert resolve_run_status(["completed", "completed"]) == "completed"


def test_definition_parse_and_accessors():
    d = Definition.parse(snap("A", "AB", {"A": {"type": "chain", "to": ["B"]}}, on_halt="m:H", pipeline="p",
                              delays={"B": 5}, limit_by={"B": "k"}))
    assert (d.start, d.pipeline, d.on_halt, d.delay_us("A"), d.delay_us("B"), d.limit_by("A"), d.limit_by("B")) == (
        "A", "p", "m:H", 0, 5, None, "k")
    assert d.edge("A") == {"type": "chain", "to": ["B"]}
    assert d.edge("B") is None
    assert Definition.parse(snap("A", "A", {"A": {"type": "chain", "to": []}})).edge("A") is None
    plain = Definition.parse({"format": 1, "start": "A", "nodes": {"A": {"klass": "m:A", "delay_us": None}}})
    assert (plain.pipeline, plain.on_halt, plain.delay_us("A"), plain.edge("A")) == ("", None, 0, None)
    bad = [
        ([], "snapshot must be a mapping with format 1"),
        ({**ONE, "format": 2}, "snapshot must be a mapping with format 1"),
        ({**ONE, "start": "Z"}, "start 'Z' is not a node"),
        ({**ONE, "nodes": [], "start": "A"}, "start 'A' is not a node"),
        ({**ONE, "nodes": {"A": {"klass": "m:A"}}}, "node 'A' lacks klass/delay_us"),
        ({**ONE, "nodes": {"A": "x"}}, "node 'A' lacks klass/delay_us"),
        ({**ONE, "edges": {"Z": {"type": "chain", "to": ["A"]}}}, "edge from 'Z': unknown node or type 'chain'"),
        ({**ONE, "edges": {"A": {"type": "jump", "to": ["A"]}}}, "edge from 'A': unknown node or type 'jump'"),
        ({**ONE, "edges": {"A": {"type": "divert", "to": {"x": "A"}}}}, "divert from 'A' lacks 'otherwise'"),
        ({**ONE, "edges": {"A": {"type": "divert", "to": {"otherwise": "Z"}}}},
         "edge from 'A' targets an unknown node"),
        ({**ONE, "edges": {"A": {"type": "chain", "to": ["Z"]}}}, "edge from 'A' targets an unknown node"),
        ({**ONE, "edges": {"A": {"type": "combine", "to": ["A"]}}}, "combine from 'A' lacks barrier"),
        ({**ONE, "edges": {"A": {"type": "collapse", "to": ["A"], "barrier": "A"}}}, "collapse from 'A' lacks barrier"),
        ({**ONE, "on_halt": ""}, "on_halt must be a class name, got ''"),
        ({**ONE, "on_halt": 3}, "on_halt must be a class name, got 3"),
    ]
    for snapshot, message in bad:
        with pytest.raises(DefinitionError) as info:
            Definition.parse(snapshot)
        assert str(info.value) == message
    Definition.parse({**ONE, "edges": {"A": {"type": "divert", "to": {"otherwise": "A"}}}})
    Definition.parse({**ONE, "edges": {"A": {"type": "combine", "to": ["A"], "barrier": []}}})
    # the definition is a copy: the caller's snapshot may change after
    source = snap("A", "A", {})
    parsed = Definition.parse(source)
    source["nodes"]["A"]["delay_us"] = 9
    assert parsed.delay_us("A") == 0


# ----------------------------------------------------------------- trigger


def test_trigger_starts_one_branch_with_the_start_step():
    m = PipelinesModel(CFG)
    m.set_clock(3)
    run_id = m.trigger(snap("A", "AB", {"A": {"type": "chain", "to": ["B"]}}, delays={"A": 4}), (1, [2]))
    assert run_id == "run1"
    run = m.runs["run1"]
    assert (run.args, run.status, run.status_history, run.branches, run.context, run.finished_at_us,
            run.trigger_key, run.revived_from, run.pruned) == ([1, [2]], "in_progress", ["in_progress"], ["branch1"],
                                                               {}, None, None, None, False)
    assert m.branches == {"branch1": Branch("branch1", "run1", None, None, steps=["step1"])}
    assert m.steps == {"step1": st("step1", "A", [1, [2]], "trigger", execs=[1])}
    assert m.executions == {1: ex(1, "step1", at=7)}
    assert m.triggers == [Trigger("", None, "run1", True, None, 3)]
    assert (m.runnable_executions(), m.pending_executions()) == ([], [1])
    m.set_clock(7)
    assert m.runnable_executions() == [1]
    assert m.execution_input(1) == ("A", [1, [2]], 0)
    assert m.commits == []
    assert m.fence_log == []


def test_a_trigger_key_returns_its_run_until_pruned_or_released_by_its_window():
    m = PipelinesModel(CFG)
    p, q = snap("A", "A", {}, pipeline="p"), snap("A", "A", {}, pipeline="q")
    assert m.trigger(p, [1], key="k") == "run1"
    assert m.trigger(p, [2], key="k", key_window_us=5) == "run1"  # live: held, args not compared
    assert m.trigger(q, [3], key="k") == "run2"  # another pipeline's key
    assert m.trigger(p, [4]) == "run3"  # no key
    assert m.runs["run1"].args == [1]
    assert m.runs["run1"].trigger_key == "k"
    m.run_execution(1, success(0))
    m.set_clock(10)
    m.advance("branch1")
    assert (m.runs["run1"].status, m.runs["run1"].finished_at_us) == ("completed", 10)
    m.set_clock(14)
    assert m.trigger(p, [5], key="k", key_window_us=5) == "run1"  # 10 + 5 > 14
    assert m.trigger(p, [5], key="k") == "run1"  # no window: held for good
    m.set_clock(15)
    assert m.trigger(p, [6], key="k", key_window_us=5) == "run4"  # 10 + 5 <= 15: released
    assert m.runs["run1"].key_released_at_us == 15
    assert m.runs["run4"].key_released_at_us is None
    assert m.runs["run4"].trigger_key == "k"
    assert m.trigger(p, [7], key="k") == "run4"
    assert m.triggers == [
        Trigger("p", "k", "run1", True, None, 0), Trigger("p", "k", "run1", False, 5, 0),
        Trigger("q", "k", "run2", True, None, 0), Trigger("p", None, "run3", True, None, 0),
        Trigger("p", "k", "run1", False, 5, 14), Trigger("p", "k", "run1", False, None, 14),
        Trigger("p", "k", "run4", True, 5, 15), Trigger("p", "k", "run4", False, None, 15)]
    m.runs["run4"].pruned = True  # the engine deleted it: the key goes with the row
    assert m.trigger(p, [8], key="k") == "run5"


def test_a_live_or_unfinished_key_holder_is_not_released():
    m = PipelinesModel(CFG)
    m.trigger(ONE, [], key="k")
    m.set_clock(100)
    assert m.trigger(ONE, [], key="k", key_window_us=1) == "run1"  # in progress: no finish time
    m.runs["run1"].status = "completed"  # finished, but no finish time recorded: never expires
    assert m.trigger(ONE, [], key="k", key_window_us=1) == "run1"
    m.runs["run1"].finished_at_us = 99
    assert m.trigger(ONE, [], key="k", key_window_us=1) == "run2"
    m.runs["run2"].status, m.runs["run2"].finished_at_us = "dampened", 0
    assert m.trigger(ONE, [], key="k", key_window_us=1) == "run2"  # dampened is not final


def test_trigger_refusals_change_nothing():
    m = PipelinesModel(CFG)
    before = m.snapshot()
    for kwargs, message in (({"key": ""}, "a trigger key must be a non-empty string, got ''"),
                            ({"key": 3}, "a trigger key must be a non-empty string, got 3"),
                            ({"key_window_us": 5}, "a key window is positive microseconds with a key, got 5"),
                            ({"key": "k", "key_window_us": 0}, "got 0"), ({"key": "k", "key_window_us": -1}, "got -1"),
                            ({"key": "k", "key_window_us": True}, "got True"),
                            ({"key": "k", "key_window_us": 1.5}, "got 1.5")):
        if message.startswith("got"):
            message = f"a key window is positive microseconds with a key, {message}"
        with raises(PreconditionError, message):
            m.trigger(ONE, [], **kwargs)
    assert m.snapshot() == before
    assert m.triggers == []
    assert m.runs == {}
    assert m.trigger(ONE, [], key="k", key_window_us=1) == "run1"


def test_trigger_in_commits_as_trigger_or_leaves_nothing():
    m = PipelinesModel(CFG)
    assert m.trigger_in(ONE, [1], key="k", commit=False) is None
    assert m.runs == {}
    assert m.triggers == []
    assert len(m.rollbacks) == 1
    assert m.rollbacks[0][0] == m.rollbacks[0][1] == m.snapshot()
    assert m.trigger_in(ONE, [1], key="k", key_window_us=3) == "run1"
    assert m.triggers == [Trigger("", "k", "run1", True, 3, 0)]
    assert m.trigger_in(ONE, [2], key="k") == "run1"
    assert len(m.rollbacks) == 1


# ----------------------------------------------------------------- executions


def test_failures_retry_after_the_delay_until_the_budget_then_fail_the_step():
    m = PipelinesModel(CFG)
    m.trigger(ONE, [7])
    m.set_clock(5)
    m.run_execution(1, FAILURE)
    assert m.executions == {1: ex(1, "step1", outcome="failure", done=5), 2: ex(2, "step1", retry=1, at=15)}
    assert m.steps["step1"].status == "in_progress"
    with raises(PreconditionError, "execution 2 is not eligible until 15"):
        m.run_execution(2, FAILURE)
    m.set_clock(15)
    m.run_execution(2, TIMED_OUT)
    assert m.executions[2] == ex(2, "step1", retry=1, at=15, outcome="timed_out")
    assert len(m.executions) == 2
    assert m.steps["step1"].status == "failed"
    assert m.outcomes == [(1, "failure"), (2, "timed_out")]
    assert m.latest_outcome("step1") == "timed_out"
    with raises(CommitFailed, "execution 2 is not open"):
        m.run_execution(2, success(1))
    with raises(CommitFailed, "execution 9 is not open"):
        m.run_execution(9, success(1))
    assert m.claimable_branches() == ["branch1"]


def test_crashes_retry_at_once_for_a_third_of_the_budget_then_back_off():
    m = PipelinesModel(CFG)  # max_crash 3: the first crash re-runs at once, then (n + 1) × 100
    m.trigger(ONE, [1])
    m.run_execution(1, CRASH)
    m.run_execution(2, CRASH)
    m.set_clock(200)
    m.run_execution(3, CRASH)
    m.set_clock(500)
    m.run_execution(4, CRASH)
    assert m.executions == {1: ex(1, "step1", outcome="process_crashed"),
                            2: ex(2, "step1", crash=1, outcome="process_crashed"),
                            3: ex(3, "step1", crash=2, at=200, outcome="process_crashed"),
                            4: ex(4, "step1", crash=3, at=500, outcome="process_crashed")}
    assert m.steps["step1"].status == "failed"
    big = PipelinesModel(PipelineConfig(max_crash=7, crash_delay_us=100))  # 7 // 3 = 2 at once
    big.trigger(ONE, [1])
    for e in (1, 2, 3):
        big.run_execution(e, CRASH)
    assert [(x.crash_count, x.eligible_at_us) for x in big.executions.values()] == [(0, 0), (1, 0), (2, 0), (3, 300)]


def test_crash_and_failure_budgets_are_counted_apart():
    m = PipelinesModel(CFG)
    m.trigger(ONE, [1])
    m.run_execution(1, CRASH)
    m.run_execution(2, FAILURE)
    m.set_clock(10)
    m.run_execution(3, CRASH)
    assert [(x.retry_count, x.crash_count, x.eligible_at_us) for x in m.executions.values()] == [
        (0, 0, 0), (0, 1, 0), (1, 1, 10), (1, 2, 210)]
    assert m.steps["step1"].status == "in_progress"


def test_zero_budgets_fail_at_once():
    m = PipelinesModel(PipelineConfig(max_retry=0, max_crash=0))
    m.trigger(ONE, [1])
    m.trigger(ONE, [2])
    m.run_execution(1, FAILURE)
    m.run_execution(2, CRASH)
    assert len(m.executions) == 2
    assert m.steps["step1"].status == m.steps["step2"].status == "failed"


def test_invalid_and_unstorable_successes_fail_the_step_at_once():
    m = PipelinesModel(CFG)
    for _ in range(3):
        m.trigger(snap("A", "AB", {"A": {"type": "expand", "to": ["B"]}}), [1])
    m.trigger(AB, [1])
    m.run_execution(1, INVALID)
    m.run_execution(2, success((1, 2)))
    m.run_execution(3, success({"a": 1}))
    m.run_execution(4, success(float("nan")))
    assert [(x.outcome, x.error) for x in m.executions.values()] == [
        ("invalid", None), ("invalid", "StepReturnError: A returned tuple"),
        ("invalid", "StepReturnError: A must return a list, not dict"),
        ("invalid", "StepReturnError: A returned float")]
    assert len(m.executions) == 4
    assert [s.status for s in m.steps.values()] == ["failed"] * 4
    assert [m.executions[e].return_rejected for e in (1, 2, 3, 4)] == [False, True, True, True]
    m.executions[1].error = "ValueError: StepReturnError"
    assert not m.executions[1].return_rejected
    m.executions[2].outcome = "failure"
    assert not m.executions[2].return_rejected


def test_a_success_stores_a_copy_of_its_value_and_leaves_the_step_advancing():
    m = PipelinesModel(CFG)
    m.trigger(snap("A", "AB", {"A": {"type": "expand", "to": ["B"]}}), [1])
    value = [1, {"x": 2}]
    m.run_execution(1, success(value))
    value[1]["x"] = 3
    assert m.steps["step1"] == st("step1", "A", [1], "trigger", status="advancing", output=[1, {"x": 2}], execs=[1])
    assert m.executions[1] == ex(1, "step1", outcome="success")
    assert m.latest_outcome("step1") == "success"
    assert m.claimable_branches() == ["branch1"] == m.advanceable_branches()


# ----------------------------------------------------------------- advancement

DIVERT = snap("A", "ABCD", {"A": {"type": "chain", "to": ["B"]},
                            "B": {"type": "divert", "to": {"1": "C", "otherwise": "D"}},
                            "C": {"type": "converge", "to": ["D"]}}, delays={"C": 2})


def test_chain_divert_converge_and_a_leaf_one_fenced_transaction_each():
    m = PipelinesModel(CFG)
    m.trigger(DIVERT, [0])
    m.run_execution(1, success("a"))
    assert m.claim_branch("branch1") == 1
    assert m.branches["branch1"].status == "advancing"
    with raises(PreconditionError, "branch branch1 is not claimable"):
        m.claim_branch("branch1")
    assert m.advance("branch1", 1) == Commit("branch1", 1, "chain", ("step2",))
    m.run_execution(2, success(1))  # rendered "1": the divert takes C
    assert m.advance("branch1") == Commit("branch1", 2, "divert", ("step3",))
    m.set_clock(2)
    m.run_execution(3, success(None))
    assert m.advance("branch1") == Commit("branch1", 3, "converge", ("step4",))
    m.run_execution(4, success("end"))
    m.set_clock(9)
    assert m.advance("branch1") == Commit("branch1", 4, "leaf", ())
    assert m.steps == {
        "step1": st("step1", "A", [0], "trigger", status="completed", output="a", execs=[1]),
        "step2": st("step2", "B", ["a"], "chain", ("step1",), "completed", 1, [2]),
        "step3": st("step3", "C", [1], "divert", ("step2",), "completed", None, [3]),
        "step4": st("step4", "D", [None], "converge", ("step3",), "completed", "end", [4])}
    assert m.executions[3] == ex(3, "step3", at=2, outcome="success")
    assert m.branches["branch1"] == Branch("branch1", "run1", None, None, "completed",
                                           steps=["step1", "step2", "step3", "step4"])
    run = m.runs["run1"]
    assert (run.status, run.status_history, run.finished_at_us) == ("completed", ["in_progress", "completed"], 9)
    assert m.fence_log == [("claim", "branch1", 1), ("commit", "branch1", 1), ("release", "branch1", 1),
                           ("claim", "branch1", 2), ("commit", "branch1", 2), ("release", "branch1", 2),
                           ("claim", "branch1", 3), ("commit", "branch1", 3), ("release", "branch1", 3),
                           ("claim", "branch1", 4), ("commit", "branch1", 4), ("release", "branch1", 4)]
    assert m.is_quiescent()
    assert m.claimable_branches() == [] == m.advanceable_branches()
    m2 = PipelinesModel(CFG)
    m2.trigger(DIVERT, [0])
    m2.run_execution(1, success("a"))
    m2.advance("branch1")
    m2.run_execution(2, success([1]))  # renders to nothing: otherwise
    assert m2.advance("branch1") == Commit("branch1", 2, "divert", ("step3",))
    assert m2.steps["step3"].node == "D"


def test_stale_tokens_and_unknown_branches_are_refused():
    m = PipelinesModel(CFG)
    m.trigger(AB, [0])
    with raises(PreconditionError, "no branch nope"):
        m.advance("nope")
    with raises(PreconditionError, "branch branch1 is not claimable"):
        m.advance("branch1")  # its step is still running
    m.run_execution(1, success(1))
    before = m.snapshot()
    with raises(StaleClaim, "branch branch1: token 5 is not the claim token None"):
        m.advance("branch1", 5)
    assert m.snapshot() == before
    token = m.claim_branch("branch1")
    with raises(StaleClaim, f"branch branch1: token {token + 1} is not the claim token {token}"):
        m.advance("branch1", token + 1)
    assert m.advance("branch1", token).action == "chain"
    with pytest.raises(StaleClaim):
        m.advance("branch1", token)


DIVIDE4 = snap("A", "ABCD", {"A": {"type": "divide", "to": ["B", "C"]},
                             "B": {"type": "combine", "to": ["D"], "barrier": ["A"]},
                             "C": {"type": "combine", "to": ["D"], "barrier": ["A"]}})


def test_divide_then_combine_fires_on_the_last_arrival_with_outputs_by_index():
    m = PipelinesModel(CFG)
    m.trigger(DIVIDE4, [0])
    m.run_execution(1, success("a"))
    assert m.advance("branch1") == Commit("branch1", 1, "divide", ("step2", "step3"))
    assert m.branches["branch1"] == Branch("branch1", "run1", None, None, "completed", steps=["step1"],
                                           fanout_step="step1", fanout_width=2)
    assert m.branches["branch2"] == Branch("branch2", "run1", "branch1", 0, steps=["step2"])
    assert m.branches["branch3"] == Branch("branch3", "run1", "branch1", 1, steps=["step3"])
    m.run_execution(3, success("c"))
    m.run_execution(2, success("b"))
    assert m.advance("branch3") == Commit("branch3", 2, "combine", ())
    assert (m.branches["branch1"].fanin_arrivals, m.branches["branch1"].arrived) == (1, {1: "branch3"})
    assert m.advance("branch2") == Commit("branch2", 3, "combine", ("step4",))
    assert m.branches["branch1"].arrived == {1: "branch3", 0: "branch2"}
    assert m.branches["branch4"] == Branch("branch4", "run1", None, None, steps=["step4"], merge_of="branch1")
    assert m.steps["step4"] == st("step4", "D", [["b", "c"]], "combine", ("step2", "step3"), execs=[4],
                                  branch="branch4")
    assert m.runs["run1"].status == "in_progress"
    m.run_execution(4, success(1))
    m.advance("branch4")
    assert m.summary("run1") == RunSummary(
        "completed", Counter({("A", "completed"): 1, ("B", "completed"): 1, ("C", "completed"): 1,
                              ("D", "completed"): 1}),
        Counter({("A", "completed", None): 1, ("B", "completed", None): 1, ("C", "completed", None): 1,
                 ("D", "completed", None): 1}), Counter(), {"D": [[["b", "c"]]]})


def test_a_fan_in_outside_its_barrier_halts_transition_invalid():
    m = PipelinesModel(CFG)
    m.trigger(snap("A", "AB", {"A": {"type": "combine", "to": ["B"], "barrier": ["A"]}}), [0])
    m.run_execution(1, success(1))
    assert m.advance("branch1") == Commit("branch1", 1, "halt:transition_invalid", ())
    m.trigger(snap("A", "ABCD", {"A": {"type": "divide", "to": ["B"]},
                                 "B": {"type": "combine", "to": ["D"], "barrier": ["C"]}}), [0])
    m.run_execution(2, success(1))
    m.advance("branch2")
    m.run_execution(3, success(2))
    assert m.advance("branch3") == Commit("branch3", 3, "halt:transition_invalid", ())
    assert m.branches["branch2"].fanin_arrivals == 0
    assert (m.steps["step3"].status, m.steps["step3"].halted_by_advancer) == ("completed", True)
    assert (m.runs["run2"].status, m.branches["branch3"].halt_reason) == ("halted", "transition_invalid")


EXPAND3 = snap("A", "ABCD", {"A": {"type": "expand", "to": ["B"]},
                             "B": {"type": "collapse", "to": ["C"], "barrier": ["A"]},
                             "C": {"type": "dampen", "to": ["D"]}})


def test_expand_in_batches_keeps_its_claim_then_collapse_and_dampen_and_resume():
    m = PipelinesModel(CFG)  # expand_batch 2
    m.trigger(EXPAND3, [0])
    m.run_execution(1, success([10, 11, 12]))
    assert m.advance("branch1") == Commit("branch1", 1, "expand", ("step2", "step3"))
    b1 = m.branches["branch1"]
    assert (b1.status, b1.claim_token, b1.expand_cursor, b1.fanout_step, b1.fanout_width) == (
        "advancing", 1, 2, "step1", 3)
    assert m.steps["step1"].status == "advancing"
    assert m.claimable_branches() == []
    assert m.advanceable_branches() == ["branch1"]
    assert m.fence_log == [("claim", "branch1", 1), ("commit", "branch1", 1)]
    assert m.advance("branch1") == Commit("branch1", 1, "expand", ("step4",))
    assert (b1.status, b1.claim_token, b1.expand_cursor) == ("completed", None, 3)
    assert [m.steps[s].input for s in ("step2", "step3", "step4")] == [[10], [11], [12]]
    assert [(m.branches[b].barrier, m.branches[b].fanout_index) for b in ("branch2", "branch3", "branch4")] == [
        ("branch1", 0), ("branch1", 1), ("branch1", 2)]
    for e, v in ((2, "x"), (3, "y"), (4, "z")):
        m.run_execution(e, success(v))
    for b in ("branch4", "branch2", "branch3"):
        m.advance(b)
    assert m.steps["step5"] == st("step5", "C", [["x", "y", "z"]], "collapse", ("step2", "step3", "step4"),
                                  execs=[5], branch="branch5")
    m.run_execution(5, success("c"))
    assert m.advance("branch5") == Commit("branch5", 5, "dampen", ())
    assert (m.branches["branch5"].status, m.runs["run1"].status, m.runs["run1"].finished_at_us) == (
        "dampened", "dampened", None)
    assert m.is_quiescent()
    assert m.resume("run1") == 1
    assert m.steps["step6"] == st("step6", "D", ["c"], "resume", ("step5",), execs=[6], branch="branch5")
    assert (m.branches["branch5"].status, m.runs["run1"].status) == ("in_progress", "in_progress")
    assert m.runs["run1"].status_history == ["in_progress", "dampened", "in_progress"]
    with raises(PreconditionError, "run run1 is in_progress with no dampened branch; nothing to resume"):
        m.resume("run1")  # as the engine's Run.resume raises RunStateError


def test_resume_with_an_input_and_an_empty_expand():
    m = PipelinesModel(CFG)
    m.trigger(snap("C", "CD", {"C": {"type": "dampen", "to": ["D"]}}), [0])
    m.run_execution(1, success("own"))
    m.advance("branch1")
    value = {"v": 1}
    assert m.resume("run1", value) == 1
    value["v"] = 2
    assert m.steps["step2"].input == [{"v": 1}]
    m.trigger(EXPAND3, [0])
    m.run_execution(3, success([]))
    assert m.advance("branch2") == Commit("branch2", 2, "expand", ())
    assert (m.branches["branch2"].status, m.steps["step3"].status, m.runs["run2"].status) == (
        "completed", "completed", "completed")
    assert m.branches["branch2"].expand_cursor is None


# ----------------------------------------------------------------- halts


@pytest.mark.parametrize(("outcomes", "reason"), [
    ([FAILURE, FAILURE], "job_retries_exhausted"),
    ([FAILURE, TIMED_OUT], "job_retries_exhausted"),
    ([CRASH, CRASH, CRASH, CRASH], "job_crashes_exhausted"),
    ([INVALID], "job_invalid"),
    ([success(object())], "step_return_invalid"),
])
def test_a_failed_step_halts_its_branch_and_the_run_owes_its_hook(outcomes, reason):
    m = PipelinesModel(CFG)
    m.trigger(snap("A", "AB", {"A": {"type": "chain", "to": ["B"]}}, on_halt="m:H"), [0])
    for outcome in outcomes:
        m.set_clock(m.executions[m.pending_executions()[0]].eligible_at_us)
        m.run_execution(m.pending_executions()[0], outcome)
    now = m.now_us
    assert m.advance("branch1") == Commit("branch1", 1, f"halt:{reason}", ())
    assert m.steps["step1"].status == "failed"
    assert not m.steps["step1"].halted_by_advancer
    assert (m.branches["branch1"].status, m.branches["branch1"].halt_reason, m.branches["branch1"].claim_token) == (
        "halted", reason, None)
    run = m.runs["run1"]
    assert (run.status, run.status_history, run.finished_at_us) == ("halted", ["in_progress", "halted"], now)
    assert m.hooks == {"hook1": HaltHook("hook1", "run1", "m:H", now)}
    assert m.summary("run1").halt_reasons == Counter({("A", reason): 1})
    assert m.open_hooks() == ["hook1"] == m.runnable_hooks()


def test_a_halted_run_without_on_halt_owes_no_hook():
    m = PipelinesModel(CFG)
    m.trigger(ONE, [0])
    m.run_execution(1, INVALID)
    m.advance("branch1")
    assert m.runs["run1"].status == "halted"
    assert m.hooks == {}
    assert m.hook_of("run1") is None
    assert m.hook_summary("run1") is None


def test_advancer_errors_release_until_the_budget_then_halt():
    m = PipelinesModel(CFG)  # advancer_max_retry 1: the second error halts
    m.trigger(AB, [0])
    m.run_execution(1, success(1))
    m.advancer_error("branch1")
    assert (m.branches["branch1"].status, m.branches["branch1"].claim_token, m.branches["branch1"].advancer_errors) == (
        "in_progress", None, 1)
    assert m.fence_log == [("claim", "branch1", 1), ("release", "branch1", 1)]
    assert m.steps["step1"].status == "advancing"
    m.advancer_error("branch1")
    assert (m.branches["branch1"].status, m.branches["branch1"].halt_reason) == ("halted", "advancer_retries_exhausted")
    assert (m.steps["step1"].status, m.steps["step1"].halted_by_advancer) == ("completed", True)
    assert m.commits == [Commit("branch1", 2, "halt:advancer_retries_exhausted", ())]
    assert m.fence_log[2:] == [("claim", "branch1", 2), ("commit", "branch1", 2), ("release", "branch1", 2)]


def test_a_transition_error_halts_at_once_and_only_routing_raises_it():
    m = PipelinesModel(CFG)
    m.trigger(AB, [0])
    m.run_execution(1, FAILURE)
    m.set_clock(10)
    m.run_execution(2, FAILURE)
    with raises(PreconditionError, "branch branch1: only routing raises TransitionError"):
        m.advancer_error("branch1", transition_error=True)
    m.advancer_error("branch1")  # an error on a failed step: counted, the step stays failed
    m.advancer_error("branch1")
    assert (m.branches["branch1"].halt_reason, m.steps["step1"].status, m.steps["step1"].halted_by_advancer) == (
        "advancer_retries_exhausted", "failed", False)
    m.trigger(AB, [0])
    m.run_execution(3, success(1))
    m.advancer_error("branch2", transition_error=True)
    assert (m.branches["branch2"].halt_reason, m.steps["step2"].status) == ("transition_invalid", "completed")
    with raises(PreconditionError, "branch nope is not claimable"):
        m.advancer_error("nope")


def test_advancer_crashes_count_per_step_and_then_halt():
    m = PipelinesModel(CFG)  # advancer_max_crash 2
    m.trigger(snap("A", "ABC", {"A": {"type": "chain", "to": ["B"]}, "B": {"type": "chain", "to": ["C"]}}), [0])
    m.run_execution(1, success(1))
    m.advancer_crash("branch1")
    m.advancer_error("branch1")
    assert (m.branches["branch1"].advancer_crashes, m.branches["branch1"].advancer_errors) == (1, 1)
    m.advance("branch1")  # a new step: fresh budgets
    assert (m.branches["branch1"].advancer_crashes, m.branches["branch1"].advancer_errors) == (0, 0)
    m.run_execution(2, success(2))
    m.advancer_crash("branch1")
    assert m.batchable("branch1")
    m.advancer_crash("branch1")
    assert m.branches["branch1"].advancer_crashes == 2
    assert m.batchable("branch1")
    assert m.advance("branch1") == Commit("branch1", 6, "halt:advancer_crashes_exhausted", ())
    assert (m.steps["step2"].status, m.steps["step2"].halted_by_advancer) == ("completed", True)
    assert [k for k, _, _ in m.fence_log] == ["claim", "release", "claim", "release", "claim", "commit", "release",
                                             "claim", "release", "claim", "release", "claim", "commit", "release"]


def test_an_advancer_crash_mid_expand_resumes_at_the_cursor():
    m = PipelinesModel(CFG)
    m.trigger(EXPAND3, [0])
    m.run_execution(1, success([1, 2, 3]))
    m.advance("branch1")
    m.advancer_crash("branch1")  # the holder is reaped: the batch stays, the claim goes
    b1 = m.branches["branch1"]
    assert (b1.status, b1.claim_token, b1.expand_cursor, b1.advancer_crashes) == ("in_progress", None, 2, 1)
    assert m.fence_log == [("claim", "branch1", 1), ("commit", "branch1", 1), ("release", "branch1", 1)]
    assert m.advance("branch1") == Commit("branch1", 2, "expand", ("step4",))
    assert len(m.branches) == 4


# ----------------------------------------------------------------- worker batches


def test_a_success_alone_advances_inline_edges_only_when_the_branch_is_free():
    """``advance_on_successes`` of one success (a group of one)."""
    m = PipelinesModel(CFG)
    m.trigger(AB, [0])
    assert m.advance_on_successes([(1, success("a"))]) == [Commit("branch1", 1, "chain", ("step2",))]
    assert m.advance_on_successes([(2, FAILURE)]) == [None]
    m.set_clock(10)
    assert m.advance_on_successes([(3, success("b"))]) == [Commit("branch1", 2, "leaf", ())]
    assert (m.runs["run1"].status, m.branches["branch1"].status) == ("completed", "completed")
    m.trigger(DIVIDE4, [0])
    assert m.advance_on_successes([(4, success(1))]) == [None]  # a fan-out: left to an advancer
    assert m.steps["step3"].status == "advancing"
    assert not m.advances_inline("step3")
    assert m.advances_inline("step1")
    assert m.advances_inline("step2")
    m.trigger(AB, [0])
    with raises(CommitFailed, "executions [1]: not all open"):
        m.advance_on_successes([(1, success(1))])
    before = m.snapshot()
    m.set_clock(10)
    with pytest.raises(CommitFailed):
        m.advance_on_successes([(4, success(1))])
    assert m.snapshot() == before


def test_a_success_leaves_a_held_branch_to_its_advancer():
    m = PipelinesModel(CFG)
    m.trigger(AB, [0])
    m.run_execution(1, success(1))
    m.advance("branch1")
    m.branches["branch1"].status, m.branches["branch1"].claim_token = "advancing", 99  # a stale holder
    assert m.advance_on_successes([(2, success(2))]) == [None]
    assert m.steps["step2"].status == "advancing"
    assert m.commits[-1].token == 1


def test_advance_on_successes_is_each_in_order_or_refused_whole():
    m = PipelinesModel(CFG)
    m.trigger(AB, [0])
    m.trigger(AB, [1])
    m.trigger(snap("A", "A", {}, delays={"A": 5}), [2])
    before = m.snapshot()
    for items, error, message in (
            ([(1, success(1)), (1, success(1))], CommitFailed, "executions [1, 1]: not all open"),
            ([(1, success(1)), (9, success(1))], CommitFailed, "executions [1, 9]: not all open"),
            ([(2, success(1)), (3, success(1))], PreconditionError, "executions [2, 3]: not all eligible")):
        with raises(error, message):
            m.advance_on_successes(items)
        assert m.snapshot() == before
    assert m.advance_on_successes([(2, success("b")), (1, FAILURE)]) == [Commit("branch2", 1, "chain", ("step4",)),
                                                                        None]
    with raises(CommitFailed, "executions [1]: not all open"):
        m.advance_on_successes([(1, success(1))])


def test_claim_branches_and_advance_batch():
    m = PipelinesModel(CFG)
    for i in range(3):
        m.trigger(AB, [i])
    m.trigger(DIVIDE4, [0])
    for e in (1, 2, 3, 4):
        m.run_execution(e, success(e))
    assert [m.batchable(b) for b in ("branch1", "branch2", "branch3", "branch4")] == [True, True, True, False]
    m.claim_branch("branch2")
    assert m.claim_branches(["branch3", "branch1", "branch2", "branch3"]) == {"branch3": 2, "branch1": 3}
    before = m.snapshot()
    with raises(PreconditionError, "branch branch4 is not advanced in a batch"):
        m.advance_batch({"branch1": 3, "branch4": 9})
    with raises(PreconditionError, "branch nope is not advanced in a batch"):
        m.advance_batch({"nope": 1})
    assert m.snapshot() == before
    assert m.advance_batch({"branch3": 2, "branch2": 5, "branch1": 3}) == {
        "branch1": Commit("branch1", 3, "chain", ("step5",)), "branch2": None,
        "branch3": Commit("branch3", 2, "chain", ("step6",))}
    assert not m.batchable("branch1")  # its new step is running


# ----------------------------------------------------------------- on_halt hooks


def halted(cfg: PipelineConfig = CFG, on_halt: str | None = "m:H", runs: int = 1) -> PipelinesModel:
    m = PipelinesModel(cfg)
    for i in range(runs):
        m.trigger(snap("A", "AB", {"A": {"type": "chain", "to": ["B"]}}, on_halt=on_halt), [i])
        m.run_execution(i + 1, INVALID)
        m.advance(f"branch{i + 1}")
    return m


def test_a_hook_retries_failures_after_the_delay_then_fails():
    m = halted()
    m.set_clock(4)
    assert m.claim_hook("hook1") == 2
    with raises(PreconditionError, "hook hook1 is not pending"):
        m.claim_hook("hook1")
    with raises(StaleClaim, "hook hook1: token 1 is not its claim"):
        m.run_hook("hook1", 1, success(None))
    with raises(StaleClaim, "hook nope: token 2 is not its claim"):
        m.run_hook("nope", 2, success(None))
    assert m.open_hooks() == ["hook1"]  # running
    assert m.run_hook("hook1", 2, FAILURE) == "pending"
    assert m.hooks["hook1"] == HaltHook("hook1", "run1", "m:H", 14, "pending", 1, 0, None, ["failure"], [4])
    with raises(PreconditionError, "hook hook1 is not eligible until 14"):
        m.claim_hook("hook1")
    assert m.runnable_hooks() == []
    assert m.open_hooks() == ["hook1"]
    with pytest.raises(StaleClaim):
        m.run_hook("hook1", 2, success(None))  # no longer running
    m.set_clock(14)
    assert m.claim_hook("hook1") == 3
    assert m.run_hook("hook1", 3, TIMED_OUT) == "failed"
    assert m.hooks["hook1"] == HaltHook("hook1", "run1", "m:H", 14, "failed", 1, 0, None, ["failure", "timed_out"],
                                        [4, 14])
    assert m.hook_outcomes == [("hook1", "failed")]
    assert m.hook_log == [("claim", "hook1", 2), ("record", "hook1", 2), ("claim", "hook1", 3), ("record", "hook1", 3)]
    assert m.hook_summary("run1") == {"klass": "m:H", "status": "failed", "retry_count": 1, "crash_count": 0,
                                      "attempts": ["failure", "timed_out"]}
    assert m.open_hooks() == []
    assert m.hook_of("run1") is m.hooks["hook1"]


def test_a_hook_succeeds_or_is_invalid_at_once_and_crashes_back_off():
    m = halted(runs=3)
    t1, t2, t3 = (m.claim_hook(h) for h in ("hook1", "hook2", "hook3"))
    assert m.run_hook("hook1", t1, success(1)) == "succeeded"
    assert m.run_hook("hook2", t2, INVALID) == "failed"
    assert m.run_hook("hook3", t3, CRASH) == "pending"  # max_crash 3: the first at once
    assert (m.hooks["hook3"].crash_count, m.hooks["hook3"].eligible_at_us) == (1, 0)
    m.claim_hook("hook3")
    assert m.reap_hook("hook3") == "pending"  # the worker died: a crash
    assert (m.hooks["hook3"].crash_count, m.hooks["hook3"].eligible_at_us, m.hooks["hook3"].claim_token) == (
        2, 200, None)
    with raises(PreconditionError, "hook hook3 is not running"):
        m.reap_hook("hook3")
    with raises(PreconditionError, "hook nope is not running"):
        m.reap_hook("nope")
    with raises(PreconditionError, "hook nope is not pending"):
        m.claim_hook("nope")
    m.set_clock(200)
    m.claim_hook("hook3")
    assert m.reap_hook("hook3") == "pending"
    assert m.hooks["hook3"].eligible_at_us == 500
    m.set_clock(500)
    m.claim_hook("hook3")
    assert m.reap_hook("hook3") == "failed"
    assert m.hooks["hook3"].attempts == ["process_crashed"] * 4
    assert m.hooks["hook3"].attempt_times == [0, 0, 200, 500]
    assert m.hook_outcomes == [("hook1", "succeeded"), ("hook2", "failed"), ("hook3", "failed")]
    assert [h.eligible_at_us for h in m.hooks.values()] == [0, 0, 500]


def test_runnable_hooks_in_eligibility_order():
    m = halted(runs=3)
    for hook_id in ("hook1", "hook2"):
        m.run_hook(hook_id, m.claim_hook(hook_id), FAILURE)
    assert m.runnable_hooks() == ["hook3"]
    assert m.open_hooks() == ["hook1", "hook2", "hook3"]
    m.set_clock(10)
    assert m.runnable_hooks() == ["hook3", "hook1", "hook2"]


# ----------------------------------------------------------------- retention


def test_prune_deletes_final_runs_finished_before_the_cutoff_oldest_first():
    m = PipelinesModel(CFG)
    m.trigger(ONE, [0])  # run1: completes at 5
    m.trigger(ONE, [1])  # run2: live
    m.trigger(snap("A", "A", {}, on_halt="m:H"), [2])  # run3: halts at 3 and owes a hook
    m.trigger(ONE, [3])  # run4: halts at 3
    m.set_clock(3)
    m.run_execution(3, INVALID)
    m.run_execution(4, INVALID)
    m.advance("branch3")
    m.advance("branch4")
    m.set_clock(5)
    m.run_execution(1, success(1))
    m.advance("branch1")
    assert m.prunable_runs(6) == ["run4", "run1"]
    assert m.prunable_runs(5) == ["run4"]
    assert m.prunable_runs(3) == []
    digest4 = m.run_digest("run4")
    assert m.prune(6, limit=1) == ["run4"]
    assert m.prunes == [Prune(6, (("run4", "halted", 3, False),), ("run4",), (("run4", digest4),))]
    assert m.runs["run4"].pruned
    assert m.live_runs() == ["run1", "run2", "run3"]
    with raises(PreconditionError, "run run4 was pruned"):
        m.context_set("run4", "k", 1)
    assert m.prune(6, candidates=["run2", "run4", "nope", "run3", "run1"]) == ["run1"]
    assert m.prunes[-1].considered == (("run2", "in_progress", None, False), ("run3", "halted", 3, True),
                                       ("run1", "completed", 5, False))
    m.run_hook("hook1", m.claim_hook("hook1"), success(None))
    assert m.prune_all(6, batch=1) == ["run3"]
    assert [p.pruned for p in m.prunes[-2:]] == [("run3",), ()]


def test_prune_all_takes_batches_until_none_is_left():
    m = PipelinesModel(CFG)
    for i in range(3):
        m.trigger(ONE, [i])
        m.run_execution(i + 1, success(i))
        m.advance(f"branch{i + 1}")
    assert m.prune_all(1, batch=2) == ["run1", "run2", "run3"]
    assert [p.pruned for p in m.prunes] == [("run1", "run2"), ("run3",), ()]
    assert m.prune(1) == []
    assert m.prunes[-1] == Prune(1, (), (), ())


def test_run_digest_covers_the_run_records():
    m = PipelinesModel(CFG)
    m.trigger(AB, [0])
    m.trigger(AB, [1])
    before = m.run_digest("run1")
    m.run_execution(2, success(1))
    assert m.run_digest("run1") == before
    m.run_execution(1, success(1))
    assert m.run_digest("run1") != before
    for change in (lambda: m.context_set("run1", "k", 1), lambda: m.advance("branch1")):
        before = m.run_digest("run1")
        change()
        assert m.run_digest("run1") != before


# ----------------------------------------------------------------- revive and context


def test_revive_carries_history_and_re_enqueues_the_failed_step():
    m = PipelinesModel(CFG)
    m.trigger(snap("A", "ABC", {"A": {"type": "divide", "to": ["B", "C"]}}, delays={"C": 7}), [0])
    m.run_execution(1, success("a"))
    m.advance("branch1")
    m.run_execution(2, success("b"))
    m.advance("branch2")
    m.set_clock(7)
    m.run_execution(3, INVALID)
    m.advance("branch3")
    m.context_set("run1", "k", {"v": 1})
    assert m.runs["run1"].status == "halted"
    m.set_clock(20)
    assert m.revive("run1") == "run2"
    new = m.runs["run2"]
    assert (new.args, new.status, new.revived_from, new.branches, new.context, new.trigger_key) == (
        [0], "in_progress", "run1", ["branch4", "branch5", "branch6"], {}, None)
    assert m.branches["branch4"] == Branch("branch4", "run2", None, None, "completed", steps=["step4"],
                                           fanout_step="step4", fanout_width=2, copied_from="branch1")
    assert m.branches["branch5"] == Branch("branch5", "run2", "branch4", 0, "completed", steps=["step5"],
                                           copied_from="branch2")
    assert m.branches["branch6"] == Branch("branch6", "run2", "branch4", 1, "in_progress", steps=["step6"],
                                           copied_from="branch3")
    assert m.steps["step4"] == st("step4", "A", [0], "trigger", (), "completed", "a", run="run2", branch="branch4",
                                  key="step1", copied_from="step1")
    assert m.steps["step5"] == st("step5", "B", ["a"], "divide", ("step4",), "completed", "b", run="run2",
                                  branch="branch5", key="step2", copied_from="step2")
    assert m.steps["step6"] == st("step6", "C", ["a"], "divide", ("step4",), "in_progress", None, [4], run="run2",
                                  branch="branch6", key="step3", revives="step3")
    assert m.executions[4] == ex(4, "step6", at=27, key="step3")
    assert m.executions[4].idempotency_key == "step3"
    assert m.executions[1].idempotency_key == "step1"
    assert m.revivals == [("run1", "run2")]
    assert m.revive("run1") == "run2"
    assert m.revivals == [("run1", "run2")] * 2
    assert len(m.runs) == 2
    with raises(PreconditionError, "run run2 is in_progress, not halted: only a halted run is revived"):
        m.revive("run2")
    with raises(PreconditionError, "no run nope"):
        m.revive("nope")


def test_revive_reruns_an_advancer_halt_and_may_copy_the_context():
    m = PipelinesModel(CFG)
    m.trigger(AB, [0])
    m.run_execution(1, success("a"))
    m.advancer_error("branch1", transition_error=True)
    m.context_set("run1", "k", [1])
    m.context_set("run1", "j", 2)
    assert m.revive("run1", duplicate_context=True) == "run2"
    assert m.steps["step2"] == st("step2", "A", [0], "trigger", (), "advancing", "a", run="run2", branch="branch2",
                                  key="step1", copied_from="step1")
    assert m.branches["branch2"].status == "in_progress"
    assert m.claimable_branches() == ["branch2"]
    assert m.runs["run2"].context == {"k": [1], "j": 2}
    assert m.context_writes[-2:] == [ContextWrite("run2", "k", False, False, True),
                                     ContextWrite("run2", "j", False, False, True)]
    m.runs["run1"].context["k"].append(9)
    assert m.runs["run2"].context["k"] == [1]
    assert m.advance("branch2") == Commit("branch2", 2, "chain", ("step3",))
    m.runs["run1"].pruned = True
    with raises(PreconditionError, "no run run1"):
        m.revive("run1")


def test_a_revived_run_revived_again_keeps_the_first_steps_keys():
    m = PipelinesModel(CFG)
    m.trigger(AB, [0])
    m.run_execution(1, success(1))
    m.advance("branch1")
    m.run_execution(2, INVALID)
    m.advance("branch1")
    assert m.revive("run1") == "run2"
    m.run_execution(3, INVALID)
    m.advance("branch2")
    assert m.runs["run2"].status == "halted"
    assert m.revive("run2") == "run3"
    assert [(s.id, s.key, s.copied_from, s.revives) for s in m.steps.values() if s.run_id == "run3"] == [
        ("step5", "step1", "step3", None), ("step6", "step2", None, "step4")]
    assert m.executions[4] == ex(4, "step6", key="step2")
    assert (m.runs["run3"].status, m.runs["run3"].status_history) == ("in_progress", ["in_progress"])


def test_context_is_set_once_unless_overwritten():
    m = PipelinesModel(CFG)
    m.trigger(ONE, [0])
    value = {"a": 1}
    assert m.context_set("run1", "k", value) is value
    value["a"] = 2
    assert m.context_get("run1", "k") == {"a": 1}
    assert m.context_get("run1", "other") is None
    with raises(OverwriteError, "run run1: context key 'k' can only be set once"):
        m.context_set("run1", "k", 3)
    assert m.context_get("run1", "k") == {"a": 1}
    assert m.context_set("run1", "k", 4, overwrite=True) == 4
    assert m.context_set("run1", "n", 5, overwrite=True) == 5
    assert m.context_writes == [ContextWrite("run1", "k", False, False, True),
                                ContextWrite("run1", "k", False, True, False),
                                ContextWrite("run1", "k", True, True, True),
                                ContextWrite("run1", "n", True, False, True)]
    assert m.runs["run1"].context == {"k": 4, "n": 5}


# ----------------------------------------------------------------- driving and summaries


def expand_oracle(node: str, inp: list, attempt: int) -> Outcome:
    """A returns three items; B fails once on item 2; C counts its input; D echoes."""
    if node == "A":
        return success([1, 2, 3])
    if node == "B" and inp == [2] and attempt == 0:
        return FAILURE
    if node == "C":
        return success(len(inp[0]))
    return success(inp)


def test_clock_moves_only_forward():
    m = PipelinesModel(CFG)
    m.advance_clock(5)
    m.set_clock(8)
    m.advance_clock(0)
    assert m.now_us == 8
    with raises(PreconditionError, "the model clock only moves forward"):
        m.set_clock(7)
    with pytest.raises(PreconditionError):
        m.advance_clock(-1)
    assert m.now_us == 8


def test_run_and_model_drives_to_quiescence_and_resumes():
    summary, m, run_id = run_and_model(EXPAND3, [0], expand_oracle, CFG, resumes=[NO_INPUT, "unused"])
    assert run_id == "run1"
    assert m.now_us == 10
    assert summary == RunSummary(
        "completed", Counter({("A", "completed"): 1, ("B", "completed"): 3, ("C", "completed"): 1,
                              ("D", "completed"): 1}),
        Counter({("A", "completed", None): 1, ("B", "completed", None): 3, ("D", "completed", None): 1}),
        Counter(), {"C": [[[[1], [2], [3]]]]})
    assert summary.as_json() == {
        "status": "completed",
        "steps": [["A", "completed", 1], ["B", "completed", 3], ["C", "completed", 1], ["D", "completed", 1]],
        "branches": [["A", "completed", None, 1], ["B", "completed", None, 3], ["D", "completed", None, 1]],
        "halt_reasons": [], "fan_in_inputs": {"C": [[[[1], [2], [3]]]]}}
    assert m.runs[run_id].status_history == ["in_progress", "dampened", "in_progress", "completed"]
    assert m.steps["step6"].input == [3]  # resumed with the dampen step's own output
    assert run_to_quiescence(EXPAND3, [0], expand_oracle, CFG, resumes=["given"]).status == "completed"
    _, given, _ = run_and_model(EXPAND3, [0], expand_oracle, CFG, resumes=["given"])
    assert given.steps["step6"].input == ["given"]
    assert run_to_quiescence(EXPAND3, [0], expand_oracle, CFG).status == "dampened"
    assert run_to_quiescence(EXPAND3, [0], expand_oracle, CFG, batch=2).status == "dampened"
    assert run_and_model(EXPAND3, [0], expand_oracle)[1].config == PipelineConfig()


@pytest.mark.parametrize(("batch", "actions"), [(None, 12), (1, 11), (2, 10)])
def test_drive_counts_its_actions(batch, actions):
    m = PipelinesModel(CFG)
    m.trigger(EXPAND3, [0])
    assert m.drive(expand_oracle, batch=batch) == actions
    assert (m.now_us, m.runs["run1"].status, len(m.commits)) == (10, "dampened", 6)
    assert m.is_quiescent()


def test_drive_stops_early_or_past_its_budget():
    m = PipelinesModel(CFG)
    m.trigger(EXPAND3, [0])
    assert m.drive(expand_oracle, stop_after=0) == 0
    assert m.outcomes == []
    assert m.drive(expand_oracle, stop_after=1) == 1
    assert m.outcomes == [(1, "success")]
    assert m.commits == []
    assert m.drive(expand_oracle, stop_after=2) == 2
    assert len(m.commits) == 1
    assert len(m.outcomes) == 2
    with raises(PreconditionError, "no quiescence after 3 actions"):
        m.drive(expand_oracle, max_actions=3)
    m2 = PipelinesModel(CFG)
    m2.trigger(EXPAND3, [0])
    with raises(PreconditionError, "no quiescence after 2 actions"):
        m2.drive(expand_oracle, max_actions=2, batch=1)
    m3 = PipelinesModel(CFG)
    m3.trigger(EXPAND3, [0])
    assert m3.drive(expand_oracle, max_actions=12) == 12


def test_drive_runs_the_hooks_with_their_oracle():
    cfg = PipelineConfig(max_retry=1, max_crash=1, retry_delay_us=10, crash_delay_us=100)
    hook_outcomes = {0: CRASH, 1: FAILURE, 2: success(None)}
    seen = []

    def hook_oracle(run_id: str, attempt: int) -> Outcome:
        seen.append((run_id, attempt))
        return hook_outcomes[attempt]

    halting = snap("A", "A", {}, on_halt="m:H")
    summary, m, _ = run_and_model(halting, [0], lambda *_: INVALID, cfg, hook_oracle=hook_oracle)
    assert summary.status == "halted"
    assert seen == [("run1", 0), ("run1", 1), ("run1", 2)]
    # max_crash 1: no crash re-runs at once (1 // 3 = 0), the first after 1 × 100
    assert m.hooks["hook1"] == HaltHook("hook1", "run1", "m:H", 110, "succeeded", 1, 1, None,
                                        ["process_crashed", "failure", "success"], [0, 100, 110])
    assert m.hook_log == [("claim", "hook1", 2), ("claim", "hook1", 3), ("record", "hook1", 3),
                          ("claim", "hook1", 4), ("record", "hook1", 4)]  # token 1: the halting advance
    assert m.now_us == 110
    plain = PipelinesModel(cfg)
    plain.trigger(halting, [0])
    assert plain.drive(lambda *_: INVALID) == 3
    assert plain.hooks["hook1"].status == "succeeded"
    batched = PipelinesModel(cfg)
    batched.trigger(halting, [0])
    assert batched.drive(lambda *_: INVALID, batch=2, hook_oracle=hook_oracle) == 5
    assert batched.hooks["hook1"].status == "succeeded"
    left = PipelinesModel(cfg)
    left.trigger(halting, [0])
    assert left.drive(lambda *_: INVALID, hooks=False) == 2
    assert left.hooks["hook1"].status == "pending"
    assert left.open_hooks() == ["hook1"]
    assert not left.is_quiescent()
    later = PipelinesModel(cfg)
    later.trigger(halting, [0])
    later.drive(lambda *_: INVALID, hooks=False)
    later.hooks["hook1"].eligible_at_us = 50  # a hook waiting is not waited for without hooks
    assert later.drive(lambda *_: INVALID, hooks=False) == 0
    assert later.now_us == 0
    assert later.drive(lambda *_: INVALID) == 1
    assert later.now_us == 50


def by_node(node: str, *_: object) -> Outcome:
    return success(node)


def test_drive_advances_each_branch_once_per_round_and_waits_for_the_earliest():
    m = PipelinesModel(CFG)
    m.trigger(DIVIDE4, [0])
    m.trigger(snap("A", "A", {}, delays={"A": 40}), [1])
    calls = []

    def oracle(node: str, _inp: list, attempt: int) -> Outcome:
        calls.append((node, attempt, m.now_us))
        return FAILURE if (node, attempt) == ("B", 0) else success(node)

    assert m.drive(oracle) == 11
    assert calls == [("A", 0, 0), ("B", 0, 0), ("C", 0, 0), ("B", 1, 10), ("D", 0, 10), ("A", 0, 40)]
    assert m.summary("run1").fan_in_inputs == {"D": [[["B", "C"]]]}


def test_summary_counts_steps_branches_and_halts_without_ids():
    m = PipelinesModel(CFG)
    m.trigger(snap("A", "ABCD", {"A": {"type": "divide", "to": ["B", "C", "B"]},
                                 "B": {"type": "combine", "to": ["D"], "barrier": ["A"]}}), [0])
    m.drive(lambda node, *_: INVALID if node == "C" else success(node))
    assert m.summary("run1") == RunSummary(
        "halted", Counter({("A", "completed"): 1, ("B", "completed"): 2, ("C", "failed"): 1}),
        Counter({("A", "completed", None): 1, ("B", "completed", None): 2, ("C", "halted", "job_invalid"): 1}),
        Counter({("C", "job_invalid"): 1}), {})
    assert m.runs["run1"].status_history == ["in_progress", "halted"]


def test_snapshot_changes_with_the_state_and_the_queries_order():
    m = PipelinesModel(CFG)
    m.trigger(snap("A", "A", {}, delays={"A": 5}), [0])
    m.trigger(ONE, [1])
    m.trigger(ONE, [2])
    assert m.pending_executions() == [2, 3, 1]
    assert m.runnable_executions() == [2, 3]
    before = m.snapshot()
    m.run_execution(3, success(1))
    assert m.snapshot() != before
    assert m.advanceable_branches() == ["branch3"]
    m.set_clock(5)
    assert m.runnable_executions() == [2, 1]
    ids = ["branch10", "branch9", "branch1", "x"]
    assert sorted(ids, key=PipelinesModel._id_order) == ["x", "branch1", "branch9", "branch10"]
    m.claim_branch("branch3")
    m.branches["branch3"].status = "advancing"
    assert m.claimable_branches() == []
    assert m.advanceable_branches() == ["branch3"]
    assert not m.is_quiescent()


# ----------------------------------------------------------------- the smallest explorer worlds

TINY = {
    "chain": ({"definition": CHAIN, "faults": 1}, 97, 256),
    "divide": ({"definition": DIVIDE, "faults": 0}, 16, 51),
    "expand": ({"definition": EXPAND, "faults": 0}, 25, 78),
    "expand-parked": (dict(definition=EXPAND, faults=0, fault_kinds=(), **_PARKED), 83, 315),
    "hooks": ({"definition": HALTING, "faults": 2, "fault_kinds": ("failure", "invalid"), "advancer_faults": False,
               "hooks": True}, 102, 292),
    "revive": ({"definition": HALTING, "faults": 1, "fault_kinds": ("invalid",), "advancer_faults": False,
                "context_writes": 1, "prunes": 1, "revives": 1}, 92, 600),
    "two-runs": ({"definition": HALTING, "runs": 2, "faults": 0, "hooks": True}, 54, 222),
    "triggers": ({"definition": CHAIN_AB, "faults": 0, "advancer_faults": False, "batches": False,
                  "keyed_triggers": 1, "key_window_us": 1_000_000}, 145, 446),
}


@pytest.mark.parametrize("name", list(TINY))
def test_the_smallest_worlds_hold_every_invariant_in_a_known_graph(name):
    """Every invariant in every reachable state, and the number of states and transitions
    the operations reach: a changed operation changes the graph."""
    bounds, states, transitions = TINY[name]
    report = explore(_pipelines(name, "tiny", **bounds))
    assert report.violation is None, str(report.violation)
    assert report.complete
    assert (report.states, report.transitions) == (states, transitions)


# ----------------------------------------------------------------- what the mutation run found


def test_run_and_model_drives_with_the_arguments_it_was_given(monkeypatch):
    """``run_to_quiescence``/``run_and_model`` pass the config, the args, ``batch`` and
    ``hook_oracle`` to the model, before each resume too: the summary alone does not show it
    (a batched drive is defined to end as the single one does)."""
    calls = []
    drive = PipelinesModel.drive

    def spy(self: PipelinesModel, oracle, **kwargs):
        calls.append((self.config, kwargs))
        return drive(self, oracle, **kwargs)

    monkeypatch.setattr(PipelinesModel, "drive", spy)

    def hook_oracle(*_: object) -> Outcome:
        return success(None)

    _, m, run_id = run_and_model(EXPAND3, ["x", 1], expand_oracle, CFG, resumes=["r"], batch=2,
                                 hook_oracle=hook_oracle)
    assert m.steps["step1"].input == ["x", 1]
    assert m.runs[run_id].args == ["x", 1]
    expected = {"batch": 2, "hook_oracle": hook_oracle}
    assert calls == [(CFG, expected), (CFG, expected)]
    calls.clear()
    assert run_to_quiescence(EXPAND3, [0], expand_oracle, CFG, resumes=[NO_INPUT], batch=3).status == "completed"
    expected = {"batch": 3, "hook_oracle": None}
    assert calls == [(CFG, expected), (CFG, expected)]
    calls.clear()
    run_to_quiescence(EXPAND3, [0], expand_oracle)
    run_and_model(EXPAND3, [0], expand_oracle)
    expected = {"batch": None, "hook_oracle": None}
    assert calls == [(PipelineConfig(), expected)] * 2


def test_a_summary_as_json_orders_rows_by_canonical_json():
    """Rows sort by their JSON text, not as Python lists: ``"é"`` is ``"\\u00e9"`` there,
    before ``"z"``."""
    m = PipelinesModel(CFG)
    m.trigger(snap("z", "zé", {"z": {"type": "chain", "to": ["é"]}}), [0])
    m.drive(lambda node, *_: success(node))
    assert m.summary("run1").as_json()["steps"] == [["é", "completed", 1], ["z", "completed", 1]]
    assert m.summary("run1").as_json()["branches"] == [["é", "completed", None, 1]]


def test_latest_outcome_of_a_step_not_run_yet_is_none():
    m = PipelinesModel(CFG)
    m.trigger(ONE, [0])
    assert m.latest_outcome("step1") is None
    m.run_execution(1, FAILURE)
    assert m.latest_outcome("step1") == "failure"


@pytest.mark.parametrize("batch", [None, 1, 2])
def test_drive_stops_past_its_budget_even_when_a_round_only_advanced(batch):
    """A round that only advanced branches (halts here) still counts against ``max_actions``."""
    m = PipelinesModel(CFG)
    m.trigger(ONE, [0])
    m.trigger(ONE, [1])
    m.run_execution(1, INVALID)
    m.run_execution(2, INVALID)
    with raises(PreconditionError, "no quiescence after 0 actions"):
        m.drive(by_node, max_actions=0, batch=batch)
    assert m.runs["run1"].status == "halted"
    m2 = PipelinesModel(CFG)
    m2.trigger(ONE, [0])
    m2.trigger(ONE, [1])
    m2.run_execution(1, INVALID)
    m2.run_execution(2, INVALID)
    assert m2.drive(by_node, max_actions=2, batch=batch) == (2 if batch != 2 else 1)


def test_a_batched_drive_advances_the_batchable_branches_in_chunks():
    m = PipelinesModel(CFG)
    for i in range(3):
        m.trigger(ONE, [i])
        m.run_execution(i + 1, INVALID)
    assert m.drive(by_node, batch=2) == 2  # two advance_batch transactions: [1, 2], [3]
    assert [(c.branch_id, c.token) for c in m.commits] == [("branch1", 1), ("branch2", 2), ("branch3", 3)]
    assert [k for k, _, _ in m.fence_log] == ["claim", "claim", "commit", "release", "commit", "release",
                                             "claim", "commit", "release"]


def test_revive_carries_every_fan_out_and_fan_in_link_to_the_new_ids():
    """A revived expand keeps its width, cursor, arrivals (mapped) and its merge branch's
    ``merge_of`` (mapped): the revive test above had no fan-in, so each could be lost."""
    m = PipelinesModel(CFG)
    m.trigger(EXPAND3, [0])
    m.drive(lambda node, *_: INVALID if node == "C" else success([1, 2, 3] if node == "A" else node))
    assert m.revive("run1") == "run2"
    assert [m.branches[b] for b in m.runs["run2"].branches] == [
        Branch("branch6", "run2", None, None, "completed", steps=["step6"], fanout_step="step6", fanout_width=3,
               fanin_arrivals=3, arrived={0: "branch7", 1: "branch8", 2: "branch9"}, expand_cursor=3,
               copied_from="branch1"),
        Branch("branch7", "run2", "branch6", 0, "completed", steps=["step7"], copied_from="branch2"),
        Branch("branch8", "run2", "branch6", 1, "completed", steps=["step8"], copied_from="branch3"),
        Branch("branch9", "run2", "branch6", 2, "completed", steps=["step9"], copied_from="branch4"),
        Branch("branch10", "run2", None, None, "in_progress", steps=["step10"], merge_of="branch6",
               copied_from="branch5")]
    assert m.steps["step10"].predecessors == ("step7", "step8", "step9")


def test_advance_batch_commits_in_id_order_with_the_claims_tokens():
    m = PipelinesModel(CFG)
    for i in range(10):
        m.trigger(ONE, [i])
        m.run_execution(i + 1, INVALID)
    assert m.advanceable_branches() == [f"branch{i}" for i in range(1, 11)]
    claims = m.claim_branches(["branch10", "branch9"])
    assert claims == {"branch10": 1, "branch9": 2}
    assert list(m.advance_batch(claims)) == ["branch9", "branch10"]
    assert [(c.branch_id, c.token) for c in m.commits] == [("branch9", 2), ("branch10", 1)]


def test_advancer_errors_count_up_to_a_larger_budget():
    m = PipelinesModel(PipelineConfig(advancer_max_retry=2))
    m.trigger(AB, [0])
    m.run_execution(1, success(1))
    m.advancer_error("branch1")
    m.advancer_error("branch1")
    assert (m.branches["branch1"].status, m.branches["branch1"].advancer_errors) == ("in_progress", 2)
    m.advancer_error("branch1")
    assert m.branches["branch1"].halt_reason == "advancer_retries_exhausted"


def test_a_hooks_timeout_is_retried_like_a_failure():
    m = halted()
    m.run_hook("hook1", m.claim_hook("hook1"), TIMED_OUT)
    assert m.hooks["hook1"] == HaltHook("hook1", "run1", "m:H", 10, "pending", 1, 0, None, ["timed_out"], [0])


def test_drive_counts_every_hook_it_ran():
    m = halted(runs=2)
    assert m.drive(by_node) == 2
    assert [h.status for h in m.hooks.values()] == ["succeeded", "succeeded"]


def test_values_taken_from_the_caller_are_deep_copies():
    """A resume input and a context value are stored as they were when given, however deep
    the caller later changes them."""
    m = PipelinesModel(CFG)
    m.trigger(snap("C", "CD", {"C": {"type": "dampen", "to": ["D"]}}), [0])
    m.run_execution(1, success("own"))
    m.advance("branch1")
    given = {"v": [1]}
    m.resume("run1", given)
    m.context_set("run1", "k", given)
    given["v"].append(2)
    assert m.steps["step2"].input == [{"v": [1]}]
    assert m.context_get("run1", "k") == {"v": [1]}


def test_resume_counts_every_dampened_branch():
    m = PipelinesModel(CFG)
    m.trigger(snap("A", "ABCD", {"A": {"type": "divide", "to": ["B", "C"]}, "B": {"type": "dampen", "to": ["D"]},
                                 "C": {"type": "dampen", "to": ["D"]}}), [0])
    m.drive(by_node)
    assert m.runs["run1"].status == "dampened"
    assert m.resume("run1") == 2
    assert [(s.node, s.input, s.origin) for s in m.steps.values() if s.node == "D"] == [
        ("D", ["B"], "resume"), ("D", ["C"], "resume")]


def test_run_digest_covers_the_executions():
    """The digest is how a prune's record shows nothing of a pruned run changed after
    [INV-PRN-2]; a change to an execution alone must show."""
    m = PipelinesModel(CFG)
    m.trigger(ONE, [0])
    m.run_execution(1, success(1))
    before = m.run_digest("run1")
    m.executions[1].completed_at_us = 5
    assert m.run_digest("run1") != before


def test_a_run_whose_hook_is_running_is_not_pruned():
    m = halted()
    m.claim_hook("hook1")
    assert m.prunable_runs(1) == []
    assert m.prune(1, candidates=["run1"]) == []
    assert m.prunes[-1].considered == (("run1", "halted", 0, True),)


def test_expanded_steps_record_their_origin():
    m = PipelinesModel(CFG)
    m.trigger(EXPAND3, [0])
    m.run_execution(1, success([1]))
    m.advance("branch1")
    assert m.steps["step2"] == st("step2", "B", [1], "expand", ("step1",), execs=[2], branch="branch2")


NESTED = snap("A", "ABCDEFG", {"A": {"type": "divide", "to": ["B", "C"]},
                               "B": {"type": "divide", "to": ["D", "E"]},
                               "D": {"type": "combine", "to": ["F"], "barrier": ["B"]},
                               "E": {"type": "combine", "to": ["F"], "barrier": ["B"]},
                               "F": {"type": "combine", "to": ["G"], "barrier": ["A"]},
                               "C": {"type": "combine", "to": ["G"], "barrier": ["A"]}})


def test_a_nested_fan_in_merges_into_the_outer_fan_out_at_its_index():
    """The inner merge's branch takes the inner barrier's own barrier and fan-out index, so
    it arrives at the outer fan-in in B's place (index 0)."""
    m = PipelinesModel(CFG)
    m.trigger(NESTED, [0])
    m.drive(by_node)
    assert m.branches["branch6"] == Branch("branch6", "run1", "branch1", 0, "completed", steps=["step6"],
                                           merge_of="branch2")
    assert m.branches["branch7"] == Branch("branch7", "run1", None, None, "completed", steps=["step7"],
                                           merge_of="branch1")
    assert m.branches["branch1"].arrived == {1: "branch3", 0: "branch6"}
    assert m.summary("run1").fan_in_inputs == {"F": [[["D", "E"]]], "G": [[["F", "C"]]]}
    assert m.runs["run1"].status == "completed"


def test_a_rolled_back_trigger_hands_its_arguments_to_the_seam():
    """``_rolled_back`` is where ``model/mutants.py``'s ``rollback_keeps_trigger`` writes the
    trigger anyway: it gets the definition, args and key the caller gave."""
    m = RollbackKeepsTrigger(CFG)
    assert m.trigger_in(snap("A", "A", {}, pipeline="p"), [5], key="k", commit=False) is None
    assert (m.runs["run1"].args, m.runs["run1"].trigger_key, m.runs["run1"].definition.pipeline) == ([5], "k", "p")


def test_a_spent_advancer_crash_budget_is_batchable_whatever_the_edge():
    m = PipelinesModel(CFG)  # advancer_max_crash 2
    m.trigger(DIVIDE4, [0])
    m.run_execution(1, success(1))
    assert not m.batchable("branch1")
    m.advancer_crash("branch1")
    assert not m.batchable("branch1")
    m.advancer_crash("branch1")
    assert m.batchable("branch1")
    assert m.advance_batch(m.claim_branches(["branch1"])) == {
        "branch1": Commit("branch1", 3, "halt:advancer_crashes_exhausted", ())}
    m.trigger(DIVIDE4, [0])
    m.run_execution(2, FAILURE)
    m.set_clock(10)
    m.run_execution(3, FAILURE)
    assert m.batchable("branch2")  # a failed step, crashes to spare


def test_a_timeout_is_retried_like_a_failure():
    m = PipelinesModel(CFG)
    m.trigger(ONE, [0])
    m.run_execution(1, TIMED_OUT)
    assert m.executions[2] == ex(2, "step1", retry=1, at=10)
    assert m.steps["step1"].status == "in_progress"


def test_trigger_takes_a_parsed_definition_and_copies_the_callers_args():
    m = PipelinesModel(CFG)
    parsed = Definition.parse(AB)
    args = [{"a": [1]}]
    assert m.trigger(parsed, args) == "run1"
    assert m.runs["run1"].definition is parsed
    args[0]["a"].append(2)
    assert m.steps["step1"].input == [{"a": [1]}]
    assert m.runs["run1"].args == [{"a": [1]}]  # the run's args too (a revive copies them)


def test_drive_stops_past_its_budget_when_a_round_only_ran_a_hook_or_an_empty_expand():
    for batch in (None, 1):
        with raises(PreconditionError, "no quiescence after 0 actions"):
            halted().drive(by_node, max_actions=0, batch=batch)  # one hook run, nothing else
        assert halted().drive(by_node, max_actions=1, batch=batch) == 1
    m = PipelinesModel(CFG)
    m.trigger(EXPAND3, [0])
    m.run_execution(1, success([]))  # its advance (not batchable) creates nothing
    with raises(PreconditionError, "no quiescence after 0 actions"):
        m.drive(by_node, max_actions=0, batch=1)


def test_drive_defaults(monkeypatch):
    """Without ``max_actions`` a drive stops past 100,000 actions."""
    seen = []
    round_ended = PipelinesModel._round_ended

    def spy_round(self: PipelinesModel, progressed: bool, actions: int, max_actions: int, *rest: bool) -> bool:
        seen.append(max_actions)
        return round_ended(self, progressed, actions, max_actions, *rest)

    monkeypatch.setattr(PipelinesModel, "_round_ended", spy_round)
    m = PipelinesModel(CFG)
    m.trigger(ONE, [0])
    m.drive(by_node)
    m.drive(by_node, batch=1)
    assert set(seen) == {100_000}


def test_fan_in_inputs_of_one_node_sort_by_canonical_json():
    """Two collapses into F, one per expanding branch: their inputs sort as JSON text
    (``"é"`` is ``"\\u00e9"``, before ``"z"``)."""
    m = PipelinesModel(CFG)
    m.trigger(snap("A", "ABCDF", {"A": {"type": "divide", "to": ["B", "C"]},
                                  "B": {"type": "expand", "to": ["D"]}, "C": {"type": "expand", "to": ["D"]},
                                  "D": {"type": "collapse", "to": ["F"], "barrier": ["B", "C"]}}), [0])
    m.drive(lambda node, inp, _: success({"B": ["z"], "C": ["é"]}[node] if node in "BC" else inp[0]))
    assert m.summary("run1").fan_in_inputs == {"F": [[["é"]], [["z"]]]}


def test_advance_halts_a_spent_crash_budget_or_a_failed_step_whatever_the_edge():
    m = PipelinesModel(CFG)  # advancer_max_crash 2
    m.trigger(DIVIDE4, [0])
    m.run_execution(1, success(1))
    m.advancer_crash("branch1")
    m.advancer_crash("branch1")  # exactly the budget: the next advance halts, on a divide edge too
    assert m.advance("branch1") == Commit("branch1", 3, "halt:advancer_crashes_exhausted", ())
    assert (m.steps["step1"].status, m.steps["step1"].halted_by_advancer) == ("completed", True)
    assert (list(m.branches), m.branches["branch1"].fanout_step) == (["branch1"], None)
    for shape, branch in ((DIVIDE4, "branch2"), (EXPAND3, "branch3")):
        m.trigger(shape, [0])
        first = m.pending_executions()[0]
        m.run_execution(first, FAILURE)
        m.set_clock(m.now_us + 10)
        m.run_execution(m.pending_executions()[0], FAILURE)
        step = m.branches[branch].latest_step
        assert m.steps[step].status == "failed"
        token = m.claim_branch(branch)
        assert m.advance(branch, token) == Commit(branch, token, "halt:job_retries_exhausted", ())
        assert (m.steps[step].status, m.steps[step].halted_by_advancer) == ("failed", False)
        assert (m.branches[branch].status, m.branches[branch].fanout_step) == ("halted", None)
    assert sorted(m.branches) == ["branch1", "branch2", "branch3"]
