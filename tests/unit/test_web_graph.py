"""The dashboard's pure parts: the graph layout of a definition and the claims-rate
sampler (``ductwork.web.graph``, ``ductwork.web.rates``). No database."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta

from ductwork import Pipeline
from ductwork.pipelines.history import BranchRecord, RunHistory, RunRecord, StepRecord, Wait
from ductwork.pipelines.snapshot import Definition
from ductwork.web.graph import lay_out, node_states
from ductwork.web.rates import ClaimRates
from tests.workloads import Echo


class A(Echo):
    """Echo under a one-letter name, so that the layout's boxes are easy to name."""


class B(Echo):
    """Echo under another name."""


class C(Echo):
    """Echo under a third name."""


class Shapes(Pipeline):
    """start, divide into two, combine, divert by key, converge, dampen: each edge kind."""

    @classmethod
    def define(cls, p):
        (p.start(A).divide(to=[B, C]).combine(into=A).divert(to={"x": B, "otherwise": C})
         .converge(into=A).dampen(before=B, limit_by="k"))


def test_every_edge_points_right_and_a_column_is_the_longest_path():
    layout = lay_out(Shapes.definition, {})
    boxes = {box.name: box for box in layout.boxes}
    columns = {name: (box.x - 16) // (190 + 80) for name, box in boxes.items()}
    assert columns == {"A#0": 0, "B#1": 1, "C#2": 1, "A#3": 2, "B#4": 3, "C#5": 3, "A#6": 4, "B#7": 5}
    assert (boxes["B#1"].y, boxes["C#2"].y) == (16, 16 + 54 + 26)  # stacked in creation order
    assert len(layout.edges) == 9  # two divide, two combine, two divert, two converge, one dampen
    for edge in layout.edges:
        x1, x2 = (float(part.split(",")[0].lstrip("MC")) for part in (edge.path.split()[0], edge.path.split()[-1]))
        assert x2 > x1, edge
    assert sorted(e.label for e in layout.edges if e.kind == "divert") == ["divert 'x'", "divert otherwise"]
    assert boxes["B#7"].limit_by == "k"
    assert {box.state for box in layout.boxes} == {"none"}
    assert layout.width == 16 * 2 + 6 * (190 + 80) - 80


def test_a_stored_snapshot_whose_nodes_come_back_sorted_lays_out_the_same():
    snapshot = Shapes.definition.to_json()
    resorted = json.loads(json.dumps(snapshot, sort_keys=True))
    assert list(resorted["nodes"]) != list(snapshot["nodes"])  # "A#0", "A#3", "A#6", "B#1", ...
    stored, defined = lay_out(Definition.from_json(resorted), {}), lay_out(Shapes.definition, {})
    assert stored.boxes == defined.boxes
    assert sorted(stored.edges, key=repr) == sorted(defined.edges, key=repr)  # a divert's keys may come back sorted


def _step(node: str, status: str, branch: str = "b1", wait: Wait | None = None, n: int = 0) -> StepRecord:
    at = datetime(2026, 1, 1)
    return StepRecord(id=f"{node}-{n}", branch_id=branch, node=node, klass="m:A", status=status,
                      to_transition="chain", limit_key=None, created_at=at, completed_at=None, executions=(),
                      wait=wait, idempotency_key=f"{node}-{n}")


def test_a_node_shows_its_most_urgent_step_and_a_dampened_branch_its_last_step():
    at = datetime(2026, 1, 1)
    steps = (_step("A#0", "completed", "b0"),
             _step("B#1", "completed", "b1", n=1), _step("B#1", "in_progress", "b2", Wait(kind="queued"), n=2),
             _step("B#1", "in_progress", "b3", Wait(kind="running", since=at), n=3),
             _step("C#2", "failed", "b4", n=4), _step("C#2", "in_progress", "b5", Wait(kind="running", since=at), n=5),
             _step("A#3", "completed", "b6", n=6))
    branches = tuple(BranchRecord(id=f"b{i}", status="dampened" if i == 6 else "in_progress", halt_reason=None,
                                  parent_id=None, barrier_index=None, started_at=at, completed_at=None,
                                  advancement_errors=(), wait=None) for i in range(7))
    run = RunRecord(id="r", pipeline="m:P", status="in_progress", triggered_at=at, completed_at=None,
                    halted_at=None, revived_from=None, halt_reasons=())
    states = node_states(RunHistory(now=at, run=run, branches=branches, steps=steps, context_keys=()))
    assert states == {"A#0": Counter(done=1), "B#1": Counter(done=1, waiting=1, running=1),
                      "C#2": Counter(failed=1, running=1), "A#3": Counter(dampened=1)}
    boxes = {box.name: box for box in lay_out(Shapes.definition, states).boxes}
    assert {name: boxes[name].state for name in ("A#0", "B#1", "C#2", "A#3", "B#4")} == {
        "A#0": "done", "B#1": "running", "C#2": "failed", "A#3": "dampened", "B#4": "none"}
    assert boxes["B#1"].counts == "1 running, 1 waiting, 1 done"


def test_claim_rates_are_the_counters_differences_over_database_time():
    rates, t0 = ClaimRates(window_s=60, min_gap_s=1.0), datetime(2026, 1, 1)
    assert rates.series("k") == []
    rates.record(t0, {"k": 100, "idle": 5})
    assert rates.series("k") == []  # one sample: no interval yet
    rates.record(t0 + timedelta(seconds=0.5), {"k": 900})  # closer than min_gap_s: skipped
    rates.record(t0 + timedelta(seconds=2), {"k": 110, "idle": 5})
    rates.record(t0 + timedelta(seconds=3), {"k": 110})  # a snapshot of some keys only
    rates.record(t0 + timedelta(seconds=4), {"k": 150, "idle": 5, "new": 7})
    assert rates.series("k") == [(4.0, 2.0, 5.0), (2.0, 1.0, 0.0), (1.0, 0.0, 40.0)]
    assert rates.series("idle") == [(4.0, 0.0, 0.0)]  # one point kept, and the last sample
    assert rates.series("new") == []
    points, peak = rates.sparkline("k", width=60, height=20)
    assert peak == 40.0
    # over the 4 s sampled (the window is 60 s); 5/s: an eighth of 16 px
    assert points == "0.0,16.0 30.0,16.0 30.0,18.0 45.0,18.0 45.0,2.0 60.0,2.0"
    rates.record(t0 + timedelta(seconds=70), {"k": 150})
    assert rates.series("k") == [(66.0, 0.0, 0.0)]  # the intervals before the window are gone


def test_a_partitioned_node_shows_its_family_and_field():
    class Tenants(Pipeline):
        @classmethod
        def define(cls, p):
            p.start(A, limit_by=("vendor_api", "value.account_id")).chain(to=B, limit_by="k").chain(to=C)

    assert [box.limit_by for box in lay_out(Tenants.definition, {}).boxes] == [
        "vendor_api[value.account_id]", "k", None]
