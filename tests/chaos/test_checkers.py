"""The chaos history checkers can fail: each is run on hand-made histories that hold
its invariant (no message) and that violate it (the exact message).

Invariants covered (ductwork_proof/checkers.py): INV-LIM-1 (concurrency, by per-key
sequence and by witness overlap), INV-LIM-2 (rate: worst window and empty-start
bucket replay, plus hypothesis properties; both on a family's partitions with its
per_partition entry), INV-LIM-3 (no leaked slot), INV-LIM-8 (a key family's ceiling, at
claims and by witness overlap), INV-ADV-1
(successors exactly once), INV-ADV-3 (fan-in once, complete, ordered), INV-EXE-1
(liveness after the quiet phase), INV-EXE-3 (idempotency keys), INV-RUN-1 (run
state agrees with branches; terminal states final), INV-PRN-1 (a prune deleted only
final runs finished before its cutoff), INV-PRN-2 (no row of a pruned run, whole runs,
the last prune finished the job). Also the JSONL round trip of ductwork_proof/history.py.
state agrees with branches; terminal states final), INV-REV-1, INV-REV-2 and INV-REV-3
(a halted run revived once, its succeeded steps carried over, its failed step re-run
with its input and key). Also the JSONL round trip of ductwork_proof/history.py.

Pure and fast: no database, no processes.
"""

from __future__ import annotations

import copy
import dataclasses
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ductwork.limit_entries import RateEntry, parse_limit_config, parse_limits
from ductwork_proof.checkers import (
    CHECKERS,
    check_all,
    check_inv_adv_1,
    check_inv_adv_3,
    check_inv_clk_1,
    check_inv_exe_1,
    check_inv_exe_2,
    check_inv_exe_3,
    check_inv_exe_4,
    check_inv_hlt_1,
    check_inv_hlt_2,
    check_inv_lim_1,
    check_inv_lim_2,
    check_inv_lim_3,
    check_inv_lim_4,
    check_inv_lim_8,
    check_inv_prn_1,
    check_inv_prn_2,
    check_inv_rev_1,
    check_inv_rev_2,
    check_inv_rev_3,
    check_inv_run_1,
)
from ductwork_proof.history import BranchRow, Execution, History, HookRow, RunRow, StepRow, Witness, to_us

S = 1_000_000  # µs per second


# --------------------------------------------------------------------------- factories


def limits(**entries: dict) -> dict:
    """``limits(api={"concurrency": 3})``: parsed exactly as ``job_worker.limits``."""
    return parse_limits(entries)


def execution(eid: str, *, key: str | None = "api", at: int | None = None, done: int | None = None,
              seq: int | None = None, released: int | None = None, eligible: int | None = 0,
              step: str | None = None, outcome: str = "success") -> Execution:
    return Execution(eid, step or f"s-{eid}", "r1", key, at, done,
                     outcome if done is not None else None, seq, released, eligible)


def keyed(*spans: tuple[int | None, int | None], concurrency: int = 3) -> History:
    """Executions e1, e2, … of key 'api' claimed at claim_seq and released at release_seq
    (None: still open); times are ten times the sequence numbers."""
    history = History(limits=limits(api={"concurrency": concurrency}))
    for n, (claim, release) in enumerate(spans, 1):
        history.executions.append(execution(
            f"e{n}", at=None if claim is None else claim * 10, done=None if release is None else release * 10,
            seq=claim, released=release))
    return history


def claims_at(times: list[int], rate: dict, *, eligible: int | None = 0) -> History:
    """Executions e1, e2, … of key 'api' claimed at ``times`` (µs), claim_seq in that order."""
    history = History(limits=limits(api={"rate": rate}))
    for n, at in enumerate(times, 1):
        history.executions.append(execution(f"e{n}", at=at, seq=n, eligible=eligible))
    return history


def witnessed(*spans: tuple[int, int | None], concurrency: int = 1) -> History:
    """Witnesses of steps s1, s2, … under key 'api' running over [start, end]."""
    history = History(limits=limits(api={"concurrency": concurrency}))
    for n, (start, end) in enumerate(spans, 1):
        history.witnesses.append(Witness(f"s{n}", f"s{n}", 100 + n, "api", start, end))
    return history


def snapshot(edges: dict[str, tuple], start: str = "A#0") -> dict:
    """A format-1 definition; ``edges`` maps a node to ``(type, to[, barrier])``."""
    names = {start, *edges}
    for edge in edges.values():
        names.update(edge[1].values() if isinstance(edge[1], dict) else edge[1])
    nodes = {name: {"klass": f"shop.steps:{name.split('#')[0]}", "delay_us": None, "timeout_us": None,
                    "limit_by": None}
             for name in sorted(names, key=lambda n: int(n.split("#")[1]))}
    json_edges = {}
    for node, (kind, to, *barrier) in edges.items():
        json_edges[node] = {"type": kind, "to": to, **({"barrier": barrier[0]} if barrier else {})}
    return {"format": 1, "pipeline": "shop.pipelines:P", "start": start, "nodes": nodes, "edges": json_edges}


class Build:
    """A hand-made pipeline history: one successful execution per step, time moving on."""

    def __init__(self) -> None:
        self.h = History()
        self.clock = 0

    def tick(self) -> int:
        self.clock += 10
        return self.clock

    def run(self, rid: str, edges: dict[str, tuple], status: str = "completed", **kw: Any) -> None:
        self.h.runs.append(RunRow(rid, status, snapshot(edges), **kw))

    def branch(self, bid: str, status: str = "completed", run: str = "r1", *, arrived: bool = False,
               **kw: Any) -> None:
        self.h.branches.append(BranchRow(bid, run, status, fanin_arrived_at_us=self.tick() if arrived else None,
                                         **kw))

    def step(self, sid: str, branch: str, node: str, input: Any, output: Any = None, *, via: str = "chain",  # noqa: A002
             status: str = "completed", items: list | None = None, run: str = "r1") -> None:
        at = self.tick()
        payload = {"expand_items": len(items)} if items is not None else {"payload": output}
        if status in ("failed", "in_progress"):
            payload = None
        self.h.steps.append(StepRow(sid, run, branch, node, status, via, None, input, payload,
                                    items, at, at if status == "completed" else None))
        self.h.executions.append(Execution(f"x-{sid}", sid, run, None, at, at + 1,
                                           "failure" if status == "failed" else "success", None, None, at))


FULL = {
    "A#0": ("divide", ["B#1", "C#2"]),
    "B#1": ("combine", ["D#3"], ["A#0"]),
    "C#2": ("combine", ["D#3"], ["A#0"]),
    "D#3": ("expand", ["E#4"]),
    "E#4": ("collapse", ["F#5"], ["D#3"]),
    "F#5": ("divert", {"big": "G#6", "otherwise": "H#7"}),
    "G#6": ("converge", ["I#8"]),
    "H#7": ("converge", ["I#8"]),
}


def full() -> History:
    """One run through every fan-out and fan-in: divide → combine → expand → collapse →
    divert → converge → leaf, every branch completed."""
    b = Build()
    b.run("r1", FULL)
    b.branch("root", fanout_width=2, fanin_arrivals=2)
    b.step("sA", "root", "A#0", [1], "x", via="start")
    b.branch("b0", parent_id="root", barrier_id="root", barrier_index=0, arrived=True)
    b.step("sB", "b0", "B#1", ["x"], "b", via="divide")
    b.branch("b1", parent_id="root", barrier_id="root", barrier_index=1, arrived=True)
    b.step("sC", "b1", "C#2", ["x"], "c", via="divide")
    b.branch("m0", merged_barrier_id="root", fanout_width=2, fanin_arrivals=2)
    b.step("sD", "m0", "D#3", [["b", "c"]], via="combine", items=[10, 20])
    b.branch("e0", parent_id="m0", barrier_id="m0", barrier_index=0, arrived=True)
    b.step("sE0", "e0", "E#4", [10], 11, via="expand")
    b.branch("e1", parent_id="m0", barrier_id="m0", barrier_index=1, arrived=True)
    b.step("sE1", "e1", "E#4", [20], 21, via="expand")
    b.branch("m1", merged_barrier_id="m0")
    b.step("sF", "m1", "F#5", [[11, 21]], "big", via="collapse")
    b.step("sG", "m1", "G#6", ["big"], 7, via="divert")
    b.step("sI", "m1", "I#8", [7], None, via="converge")
    return b.h


def find(items: list, **match: Any) -> Any:
    (found,) = [item for item in items if all(getattr(item, k) == v for k, v in match.items())]
    return found


def without(history: History, *ids: str) -> History:
    """A copy with these branches and steps (and the steps' executions) removed."""
    h = copy.deepcopy(history)
    h.branches = [b for b in h.branches if b.branch_id not in ids]
    h.steps = [s for s in h.steps if s.step_id not in ids]
    h.executions = [e for e in h.executions if e.step_id not in ids]
    return h


def edit(history: History, attr: str, ident: str, **changes: Any) -> History:
    """A copy with the record of ``attr`` whose first field is ``ident`` changed."""
    h = copy.deepcopy(history)
    for record in getattr(h, attr):
        if getattr(record, next(iter(record.__dataclass_fields__))) == ident:
            for name, value in changes.items():
                setattr(record, name, value)
    return h


# --------------------------------------------------------------------------- INV-LIM-1


def test_lim_1_holds_at_the_limit():
    assert check_inv_lim_1(keyed((1, 4), (2, 6), (3, 8), (5, 9))) == []


def test_lim_1_four_in_flight_under_limit_three():
    assert check_inv_lim_1(keyed((1, 5), (2, 6), (3, 7), (4, 8))) == [
        "INV-LIM-1: key 'api' had 4 in flight (limit 3) after claim_seq 4 (execution e4)"]


def test_lim_1_orders_by_sequence_not_by_time():
    history = keyed((1, 2), (3, 4), concurrency=1)
    history.executions[1].claimed_at_us = 5  # before e1's completion time (20): still fine
    assert check_inv_lim_1(history) == []
    history.executions[1].claim_seq = 1
    history.executions[0].release_seq = 3  # now e2's claim (1) precedes e1's release (3)
    assert check_inv_lim_1(history) == [
        "INV-LIM-1: key 'api' used seq 1 twice: claim of e1, claim of e2",
        "INV-LIM-1: key 'api' had 2 in flight (limit 1) after claim_seq 1 (execution e2)"]


def test_lim_1_claim_without_claim_seq():
    history = keyed((1, 2))
    history.executions.append(execution("e2", at=30, seq=None))
    assert check_inv_lim_1(history) == ["INV-LIM-1: execution e2 of key 'api' was claimed without a claim_seq"]


def test_lim_1_completion_without_release_seq():
    history = keyed((1, 2))
    history.executions.append(execution("e2", at=30, done=40, seq=3, released=None, outcome="timed_out"))
    assert check_inv_lim_1(history) == [
        "INV-LIM-1: execution e2 of key 'api' completed (timed_out) without a release_seq"]


def test_lim_1_release_not_after_claim():
    assert check_inv_lim_1(keyed((5, 3))) == [
        "INV-LIM-1: execution e1 of key 'api' has release_seq 3, not after its claim_seq 5"]


def test_lim_1_sequence_number_used_twice():
    assert check_inv_lim_1(keyed((1, 3), (3, 4))) == [
        "INV-LIM-1: key 'api' used seq 3 twice: release of e1, claim of e2"]


def test_lim_1_unlimited_and_unconfigured_keys_have_no_bound():
    history = keyed((1, None), (2, None), (3, None), (4, None))
    history.limits = limits(api={"rate": {"limit": 100, "per": 1}})
    assert check_inv_lim_1(history) == []
    history.limits = {}
    assert check_inv_lim_1(history) == []


def test_lim_1_witnesses_back_to_back_do_not_overlap():
    assert check_inv_lim_1(witnessed((0, 100), (100, 200), (200, 300))) == []


def test_lim_1_witnesses_overlap():
    assert check_inv_lim_1(witnessed((0, 200), (150, 250), (50, 160), concurrency=2)) == [
        "INV-LIM-1: key 'api' had 3 step bodies running at once at 150 µs (limit 2): steps s1, s2, s3"]


def test_lim_1_killed_body_runs_until_its_execution_completed():
    history = witnessed((0, None), (100, 200))
    history.executions.append(execution("x1", step="s1", at=0, done=100, seq=1, released=2))
    assert check_inv_lim_1(history) == []
    history.executions[0].completed_at_us = 150  # reaped later than the next body started
    assert check_inv_lim_1(history) == [
        "INV-LIM-1: key 'api' had 2 step bodies running at once at 100 µs (limit 1): steps s1, s2"]


def test_lim_1_killed_body_without_execution_runs_to_the_end():
    assert check_inv_lim_1(witnessed((0, None), (10_000, 10_100))) == [
        "INV-LIM-1: key 'api' had 2 step bodies running at once at 10000 µs (limit 1): steps s1, s2"]


# --------------------------------------------------------------------------- INV-LIM-8 (key families)


def tenant_family(*, ceiling: int | None = 3, per_partition: dict | None = None) -> History:
    """An empty history whose config has the family ``tenant`` (per partition 2 at once, unless
    ``per_partition`` says otherwise; the family ``ceiling`` at once, None: none)."""
    entry: dict[str, Any] = {"per_partition": per_partition or {"concurrency": 2}}
    if ceiling is not None:
        entry["concurrency"] = ceiling
    static, families = parse_limit_config({"tenant": entry, "api": {"concurrency": 3}})
    return History(limits=static, families=families)


def partition_bodies(*spans: tuple[str, int, int | None], ceiling: int | None = 3) -> History:
    """Steps s1, s2, … of partition ``tenant["<p>"]`` whose bodies ran over [start, end]."""
    history = tenant_family(ceiling=ceiling)
    for n, (partition, start, end) in enumerate(spans, 1):
        key = f'tenant["{partition}"]'
        history.steps.append(StepRow(f"s{n}", "r1", "b1", "Call#0", "succeeded", "collapse", key))
        history.witnesses.append(Witness(f"s{n}", f"s{n}", 100 + n, key, start, end))
    return history


def partition_claims(*spans: tuple[str, int, int | None], ceiling: int = 3) -> History:
    """Executions e1, e2, … of partition ``tenant["<p>"]`` claimed at ``at`` and released at
    ``done`` (None: still open), each partition's sequence numbers in claim order."""
    history = tenant_family(ceiling=ceiling)
    seq: dict[str, int] = {}
    for n, (partition, at, done) in enumerate(spans, 1):
        seq[partition] = seq.get(partition, 0) + 1
        history.executions.append(execution(f"e{n}", key=f'tenant["{partition}"]', at=at, done=done,
                                            seq=seq[partition] * 100 + n, released=None))
    return history


def test_lim_8_family_bodies_within_the_ceiling_pass():
    # three partitions' bodies at once (the ceiling), a fourth starting as one ends, and a
    # partition with two at once (its own limit)
    history = partition_bodies(("a", 0, 100), ("b", 10, 200), ("c", 20, 300), ("d", 100, 250),
                               ("a", 200, 400), ("a", 250, 450))
    assert check_inv_lim_8(history) == []
    assert check_inv_lim_1(history) == []


def test_lim_8_ceiling_plus_one_family_bodies_fail():
    # four partitions, one body each (each within its own limit of 2): four at once, ceiling 3
    history = partition_bodies(("a", 0, 100), ("b", 10, 200), ("c", 20, 300), ("d", 50, 250))
    assert check_inv_lim_1(history) == []
    assert check_inv_lim_8(history) == [
        "INV-LIM-8: family 'tenant' had 4 step bodies running at once at 50 µs (ceiling 3): "
        's1 (tenant["a"]), s2 (tenant["b"]), s3 (tenant["c"]), s4 (tenant["d"])']
    assert check_all(history)["INV-LIM-8"] == check_inv_lim_8(history)


def test_lim_8_a_static_key_and_another_family_do_not_count():
    history = partition_bodies(("a", 0, 100), ("b", 10, 200), ("c", 20, 300))
    history.witnesses.append(Witness("x", "x", 9, "api", 30, 90))  # a static key's body
    history.witnesses.append(Witness("y", "y", 9, 'other["a"]', 30, 90))  # no such family: a static key
    assert check_inv_lim_8(history) == []


def test_lim_8_a_family_without_a_ceiling_has_no_bound():
    history = partition_bodies(("a", 0, 100), ("b", 10, 200), ("c", 20, 300), ("d", 50, 250), ceiling=None)
    assert check_inv_lim_8(history) == []


def test_lim_8_a_killed_body_counts_until_its_execution_completed():
    history = partition_bodies(("a", 0, None), ("b", 10, 200), ("c", 20, 300), ("d", 150, 250))
    history.executions.append(execution("x1", key='tenant["a"]', step="s1", at=0, done=120, seq=1, released=2))
    assert check_inv_lim_8(history) == []
    history.executions[0].completed_at_us = 160  # reaped after d's body started
    assert check_inv_lim_8(history) == [
        "INV-LIM-8: family 'tenant' had 4 step bodies running at once at 150 µs (ceiling 3): "
        's1 (tenant["a"]), s2 (tenant["b"]), s3 (tenant["c"]), s4 (tenant["d"])']


def test_lim_8_at_a_claim_executions_claimed_before_and_released_after_count():
    # e1..e3 in flight when e4 is claimed at 40 (3: at the ceiling, e4 itself is not counted)
    history = partition_claims(("a", 10, 100), ("b", 20, 100), ("c", 30, 100), ("d", 40, 100), ("a", 50, 100))
    assert check_inv_lim_8(history) == [
        "INV-LIM-8: family 'tenant' had 4 executions in flight (ceiling 3) when execution e5 (tenant[\"a\"]) "
        'was claimed at 50 µs: e1 (tenant["a"]), e2 (tenant["b"]), e3 (tenant["c"]), e4 (tenant["d"])']
    history.executions[1].completed_at_us = 50  # released at that very time: not provably in flight
    assert check_inv_lim_8(history) == []


def test_lim_8_claims_at_one_time_do_not_count_each_other():
    # a batch (one transaction, one time) and its releases: nothing provably overlaps
    history = partition_claims(("a", 10, 60), ("b", 10, 60), ("c", 10, 60), ("d", 10, 60), ("a", 60, 90))
    assert check_inv_lim_8(history) == []


def test_lim_8_a_witness_names_its_steps_partition():
    history = partition_bodies(("a", 0, 100))
    history.witnesses[0].key = 'tenant["A"]'
    assert check_inv_lim_8(history) == [
        'INV-LIM-8: a body of step s1 named partition \'tenant["A"]\', but the step\'s key is \'tenant["a"]\'']


def test_lim_1_and_lim_2_apply_per_partition_entry_to_each_partition():
    history = partition_claims(("a", 10, None), ("a", 20, None), ("a", 30, None), ("b", 40, None), ceiling=9)
    for n, e in enumerate(history.executions, 1):
        e.claim_seq = n
    assert check_inv_lim_1(history) == [
        "INV-LIM-1: key 'tenant[\"a\"]' had 3 in flight (limit 2) after claim_seq 3 (execution e3)"]
    history.families = tenant_family(per_partition={"rate": {"limit": 1, "per": "1s", "burst": 2}}).families
    assert check_inv_lim_1(history) == []
    assert check_inv_lim_2(history) == [
        "INV-LIM-2: key 'tenant[\"a\"]' (limit 1 per 1s, burst 2): 3 claims in the 20 µs window [10, 30] "
        "(executions e1 … e3), B + L·T/P allows 2",
        "INV-LIM-2: key 'tenant[\"a\"]' (limit 1 per 1s, burst 2): claim_seq 1 (execution e1) at 10 µs found "
        "1/100000 of a token in a bucket started empty at 0 µs (the key's earliest eligible_at); a claim needs 1",
        "INV-LIM-2: key 'tenant[\"b\"]' (limit 1 per 1s, burst 2): claim_seq 4 (execution e4) at 40 µs found "
        "1/25000 of a token in a bucket started empty at 0 µs (the key's earliest eligible_at); a claim needs 1"]


# --------------------------------------------------------------------------- INV-LIM-2

FIVE_PER_SECOND_BURST_1 = {"limit": 5, "per": "1s", "burst": 1}


def test_lim_2_holds_at_exactly_the_rate():
    times = [S + k * 200_000 for k in range(10)]  # a token every 0.2 s, from a full bucket of 1
    assert check_inv_lim_2(claims_at(times, FIVE_PER_SECOND_BURST_1)) == []


def test_lim_2_six_claims_within_a_second_under_five_per_second_burst_one():
    times = [S + k * 100_000 for k in range(6)]
    assert check_inv_lim_2(claims_at(times, FIVE_PER_SECOND_BURST_1)) == [
        "INV-LIM-2: key 'api' (limit 5 per 1s, burst 1): 6 claims in the 500000 µs window "
        "[1000000, 1500000] (executions e1 … e6), B + L·T/P allows 3",
        "INV-LIM-2: key 'api' (limit 5 per 1s, burst 1): claim_seq 2 (execution e2) at 1100000 µs "
        "found 1/2 of a token in a bucket started empty at 0 µs (the key's earliest eligible_at); "
        "a claim needs 1",
    ]


def test_lim_2_one_microsecond_early_fails():
    times = [S, S + 199_999]
    assert check_inv_lim_2(claims_at(times, FIVE_PER_SECOND_BURST_1)) == [
        "INV-LIM-2: key 'api' (limit 5 per 1s, burst 1): 2 claims in the 199999 µs window "
        "[1000000, 1199999] (executions e1 … e2), B + L·T/P allows 1",
        "INV-LIM-2: key 'api' (limit 5 per 1s, burst 1): claim_seq 2 (execution e2) at 1199999 µs "
        "found 199999/200000 of a token in a bucket started empty at 0 µs (the key's earliest "
        "eligible_at); a claim needs 1",
    ]


def test_lim_2_a_new_key_gets_no_free_burst():
    history = claims_at([0, 1, 2], {"limit": 1, "per": "1s", "burst": 5})
    assert check_inv_lim_2(history) == [  # the window bound (burst 5) holds; the replay does not
        "INV-LIM-2: key 'api' (limit 1 per 1s, burst 5): claim_seq 1 (execution e1) at 0 µs found 0 of a "
        "token in a bucket started empty at 0 µs (the key's earliest eligible_at); a claim needs 1"]


def test_lim_2_replay_starts_at_the_earliest_eligible_time():
    history = claims_at([0, 1, 2], {"limit": 1, "per": "1s", "burst": 5}, eligible=None)
    assert check_inv_lim_2(history) == []  # unknown: only the window bound applies
    history.executions.append(execution("pending", eligible=-5 * S))
    assert check_inv_lim_2(history) == []  # a bucket could have filled from -5 s


def test_lim_2_checks_every_kept_rate_entry():
    rates = [{"limit": 1, "per": "1s", "burst": 1}, {"limit": 10, "per": "100s", "burst": 5}]
    history = claims_at([k * S for k in range(1, 8)], rates[0])
    history.limits = limits(api={"rate": rates})
    assert [len(entry.rates) for entry in history.limits.values()] == [2]  # neither dominates
    assert check_inv_lim_2(history) == [
        "INV-LIM-2: key 'api' (limit 10 per 100s, burst 5): 7 claims in the 6000000 µs window "
        "[1000000, 7000000] (executions e1 … e7), B + L·T/P allows 5",
        "INV-LIM-2: key 'api' (limit 10 per 100s, burst 5): claim_seq 1 (execution e1) at 1000000 µs "
        "found 1/10 of a token in a bucket started empty at 0 µs (the key's earliest eligible_at); "
        "a claim needs 1",
    ]


def test_lim_2_replays_in_lock_order():
    # Same times, but claim_seq says e2 came first: both at 1 s, and the bucket had one token.
    history = claims_at([S, S], FIVE_PER_SECOND_BURST_1)
    history.executions[0].claim_seq, history.executions[1].claim_seq = 2, 1
    assert check_inv_lim_2(history)[1] == (
        "INV-LIM-2: key 'api' (limit 5 per 1s, burst 1): claim_seq 2 (execution e1) at 1000000 µs found 0 of "
        "a token in a bucket started empty at 0 µs (the key's earliest eligible_at); a claim needs 1")


@st.composite
def bucket_schedules(draw: Any) -> tuple[RateEntry, int, list[int], list[int]]:
    """Claim times an exact bucket (empty at ``start``) admits, and the saturating times:
    moments after whose claims the bucket held less than one token."""
    rate = RateEntry(draw(st.integers(1, 20)), draw(st.sampled_from([1, 2, 10, 60])), draw(st.integers(1, 5)))
    unit, cap = rate.per_s * S, rate.burst * rate.per_s * S
    start = draw(st.integers(-10 * S, 10 * S))
    level, now, times, saturating = 0, start, [], []

    def attempt(at: int, count: int) -> None:
        nonlocal level, now
        level, now = min(cap, level + (at - now) * rate.limit), at
        count = min(count, level // unit)
        times.extend([at] * count)
        level -= count * unit
        if count and level < unit:
            saturating.append(at)

    for _ in range(draw(st.integers(0, 25))):
        attempt(now + draw(st.integers(0, 2 * unit // rate.limit + 1) | st.sampled_from([0, 1])),
                draw(st.integers(0, rate.burst)))
    short = max(0, -(-(unit - level) // rate.limit))  # wait until a whole token is there, then drain
    attempt(now + short, rate.burst)
    return rate, start, times, saturating


def _history_for(rate: RateEntry, start: int, times: list[int]) -> History:
    history = History(limits={"api": parse_limits({"api": {"rate": {
        "limit": rate.limit, "per": rate.per_s, "burst": rate.burst}}})["api"]})
    for n, at in enumerate(sorted(times), 1):
        history.executions.append(execution(f"e{n}", at=at, seq=n, eligible=start))
    return history


@given(bucket_schedules(), st.data())
def test_lim_2_bucket_schedules_pass_and_one_extra_claim_fails(schedule: Any, data: Any):
    rate, start, times, saturating = schedule
    assert check_inv_lim_2(_history_for(rate, start, times)) == []
    extra = data.draw(st.sampled_from(saturating), label="saturating time")
    found = check_inv_lim_2(_history_for(rate, start, [*times, extra]))
    assert found
    assert all(m.startswith("INV-LIM-2: key 'api'") for m in found)
    assert f"at {extra} µs found " in found[-1]  # the replay fails exactly at the extra claim


@given(st.lists(st.integers(0, 3 * S), min_size=1, max_size=12), st.integers(1, 7),
       st.sampled_from([1, 2]), st.integers(1, 3))
def test_lim_2_window_agrees_with_every_pair_of_claims(times: list[int], limit: int, per: int, burst: int):
    history = claims_at(times, {"limit": limit, "per": per, "burst": burst}, eligible=None)
    ordered = sorted(times)
    worst = None  # (excess, i, j): the largest excess, earliest j, then earliest i
    for j in range(len(ordered)):
        for i in range(j + 1):
            excess = (j - i + 1) - burst - Fraction(limit * (ordered[j] - ordered[i]), per * S)
            if excess > 0 and (worst is None or excess > worst[0]):
                worst = (excess, i, j)
    found = check_inv_lim_2(history)
    if worst is None:
        assert found == []
    else:
        _, i, j = worst
        [message] = found
        span = ordered[j] - ordered[i]
        assert f": {j - i + 1} claims in the {span} µs window [{ordered[i]}, {ordered[j]}]" in message


# --------------------------------------------------------------------------- INV-LIM-3


def test_lim_3_holds_when_every_claim_completed():
    assert check_inv_lim_3(keyed((1, 2), (3, 4))) == []


def test_lim_3_leaked_slot():
    history = keyed((1, 2), (3, None), (4, 5), (6, None))
    history.executions.append(execution("u1", key=None, at=70))
    history.executions.append(execution("p1", at=None))  # pending: holds no slot
    assert check_inv_lim_3(history) == [
        "INV-LIM-3: unkeyed lane has 1 in flight after quiescence (claimed, never completed: u1)",
        "INV-LIM-3: key 'api' has 2 in flight after quiescence (claimed, never completed: e2, e4)",
    ]


# --------------------------------------------------------------------------- INV-ADV-1

CHAIN = {"A#0": ("chain", ["B#1"]), "B#1": ("chain", ["C#2"])}
DAMPEN = {"A#0": ("dampen", ["B#1"]), "B#1": ("chain", ["C#2"])}


def test_adv_1_holds_on_every_transition():
    assert check_inv_adv_1(full()) == []


def test_adv_1_lost_successor():
    assert check_inv_adv_1(without(full(), "sI")) == [
        "INV-ADV-1: lost successor: step sG (G#6 --converge-->) should have created step I#8 on branch m1 "
        "once; found none"]


def test_adv_1_duplicated_successor():
    history = full()
    history.steps.append(dataclasses.replace(find(history.steps, step_id="sI"), step_id="sI2", started_at_us=1000))
    assert check_inv_adv_1(history) == [
        "INV-ADV-1: duplicated successor: step sG (G#6 --converge-->) should have created step I#8 on "
        "branch m1 once; found 2 (sI, sI2)"]


def test_adv_1_unexpected_step():
    history = full()
    history.steps.append(StepRow("sX", "r1", "m1", "H#7", "in_progress", "divert", started_at_us=5))
    assert check_inv_adv_1(history) == [
        "INV-ADV-1: unexpected step H#7 on branch m1 (sX): no completed transition explains it"]


def test_adv_1_divert_follows_the_rendered_output():
    assert check_inv_adv_1(edit(full(), "steps", "sF", output_payload={"payload": "small"})) == [
        "INV-ADV-1: lost successor: step sF (F#5 --divert-->) should have created step H#7 on branch m1 "
        "once; found none",
        "INV-ADV-1: unexpected step G#6 on branch m1 (sG): no completed transition explains it",
    ]


def test_adv_1_lost_expand_child_makes_the_merge_unexpected():
    assert check_inv_adv_1(without(full(), "e1", "sE1")) == [
        "INV-ADV-1: lost successor: step sD (D#3 --expand-->) should have created child branch 1 of "
        "branch m0 once; found none",
        "INV-ADV-1: unexpected merge branch of barrier m0 (m1): no completed transition explains it",
    ]


def test_adv_1_duplicated_child_branch():
    history = full()
    history.branches.append(BranchRow("b1x", "r1", "completed", parent_id="root", barrier_id="root",
                                      barrier_index=1))
    history.steps.append(StepRow("sC2", "r1", "b1x", "C#2", "in_progress", "divide", input=["x"], started_at_us=35))
    assert check_inv_adv_1(history) == [
        "INV-ADV-1: duplicated successor: step sA (A#0 --divide-->) should have created child branch 1 of "
        "branch root once; found 2 (b1, b1x)"]


def test_adv_1_successor_input_and_transition():
    history = edit(full(), "steps", "sB", input=["y"])
    history = edit(history, "steps", "sE1", input=[99])
    history = edit(history, "steps", "sI", to_transition="chain")
    assert check_inv_adv_1(history) == [
        'INV-ADV-1: step sB (B#1 on branch b0) has input ["y"], expected ["x"] from step sA (A#0 --divide-->)',
        "INV-ADV-1: step sE1 (E#4 on branch e1) has input [99], expected [20] from step sD (D#3 --expand-->)",
        "INV-ADV-1: step sI (I#8 on branch m1) has to_transition 'chain', expected 'converge' from step sG "
        "(G#6 --converge-->)",
    ]


def test_adv_1_fanout_width():
    assert check_inv_adv_1(edit(full(), "branches", "root", fanout_width=3)) == [
        "INV-ADV-1: step sA (A#0 --divide-->) fanned out 2 children but branch root records fanout_width 3",
        # with width 3 the two arrivals no longer complete the barrier, so its merge is unexplained too
        "INV-ADV-1: unexpected merge branch of barrier root (m0): no completed transition explains it",
    ]


def test_adv_1_lost_arrival():
    assert check_inv_adv_1(edit(full(), "branches", "e0", fanin_arrived_at_us=None)) == [
        "INV-ADV-1: lost successor: step sE0 (E#4 --collapse-->) completed but branch e0 never arrived at "
        "its barrier m0",
        "INV-ADV-1: unexpected merge branch of barrier m0 (m1): no completed transition explains it",
    ]


def test_adv_1_lost_start_step():
    assert check_inv_adv_1(without(full(), "sA")) == [  # the children's own steps are not listed again
        "INV-ADV-1: unexpected child branch 0 of branch root (b0): no completed transition explains it",
        "INV-ADV-1: unexpected child branch 1 of branch root (b1): no completed transition explains it",
        "INV-ADV-1: lost successor: the trigger of run r1 should have created step A#0 on branch root once; "
        "found none",
    ]


def halted_chain(*, reason: str = "job_retries_exhausted", failed: bool = True) -> Build:
    b = Build()
    b.run("r2", CHAIN, status="halted")
    b.branch("root", "halted", run="r2", halt_reason=reason)
    b.step("sA", "root", "A#0", [1], 2, via="start", run="r2")
    b.step("sB", "root", "B#1", [2], 3, run="r2", status="failed" if failed else "completed")
    return b


def test_adv_1_halted_step_has_no_successor():
    assert check_inv_adv_1(halted_chain().h) == []
    assert check_inv_adv_1(halted_chain(reason="advancer_retries_exhausted", failed=False).h) == []
    b = halted_chain()
    b.step("sC", "root", "C#2", [None], status="in_progress", run="r2")
    assert check_inv_adv_1(b.h) == [
        "INV-ADV-1: branch root halted (job_retries_exhausted) at step sC, which is in_progress, not failed",
        "INV-ADV-1: unexpected step C#2 on branch root (sC): no completed transition explains it",
    ]


def test_adv_1_halt_reason_names_the_halting_step():
    # the advancer's budgets can run out while halting a failed step: the step stays failed
    assert check_inv_adv_1(halted_chain(reason="advancer_crashes_exhausted").h) == []
    assert check_inv_adv_1(halted_chain(reason="transition_invalid").h) == [
        "INV-ADV-1: branch root halted (transition_invalid) at step sB, which is failed, not completed"]
    assert check_inv_adv_1(halted_chain(reason="job_crashes_exhausted", failed=False).h) == [
        "INV-ADV-1: branch root halted (job_crashes_exhausted) at step sB, which is completed, not failed"]


def test_adv_1_expand_halted_between_batches_keeps_its_committed_children():
    b = Build()
    b.run("r1", {"A#0": ("expand", ["B#1"])}, status="halted")
    b.branch("root", "halted", halt_reason="advancer_crashes_exhausted", fanout_width=3, fanout_cursor=2)
    b.step("sA", "root", "A#0", [3], via="start", items=["p", "q", "r"])
    for index, item in enumerate("pq"):
        b.branch(f"c{index}", parent_id="root", barrier_id="root", barrier_index=index)
        b.step(f"sB{index}", f"c{index}", "B#1", [item], item, via="expand")
    assert check_inv_adv_1(b.h) == []
    b.branch("c2", parent_id="root", barrier_id="root", barrier_index=2)  # past the cursor
    assert check_inv_adv_1(b.h) == [
        "INV-ADV-1: unexpected child branch 2 of branch root (c2): no completed transition explains it"]


def test_adv_1_dampen_creates_the_next_step_only_when_resumed():
    b = Build()
    b.run("r1", DAMPEN, status="dampened")
    b.branch("root", "dampened")
    b.step("sA", "root", "A#0", [1], 2, via="start")
    assert check_inv_adv_1(b.h) == []
    resumed = edit(b.h, "branches", "root", status="completed")
    assert check_inv_adv_1(resumed) == [
        "INV-ADV-1: lost successor: step sA (A#0 --dampen-->) should have created step B#1 on branch root "
        "once; found none"]
    b.h = resumed
    b.step("sB", "root", "B#1", ["resume input"], 3, via="dampen")
    b.step("sC", "root", "C#2", [3], 4)
    assert check_inv_adv_1(b.h) == []


def test_adv_1_expand_of_nothing_is_a_leaf():
    b = Build()
    b.run("r1", {"A#0": ("expand", ["B#1"]), "B#1": ("collapse", ["C#2"], ["A#0"])})
    b.branch("root")
    b.step("sA", "root", "A#0", [0], via="start", items=[])
    assert check_inv_adv_1(b.h) == []
    assert check_inv_adv_3(b.h) == []


def test_adv_1_unreadable_snapshot():
    history = edit(full(), "runs", "r1", definition={"format": 2})
    assert check_inv_adv_1(history)[0] == (
        "INV-ADV-1: run r1 has an unreadable definition snapshot: <snapshot>.snapshot: format=2: "
        "only format 1 is understood")


# --------------------------------------------------------------------------- INV-ADV-3


def test_adv_3_holds_on_nested_fan_ins():
    assert check_inv_adv_3(full()) == []


def test_adv_3_merge_fired_twice():
    history = full()
    history.branches.append(BranchRow("m0b", "r1", "completed", merged_barrier_id="root"))
    history.steps.append(StepRow("sD2", "r1", "m0b", "D#3", "completed", "combine", input=[["b", "c"]],
                                 started_at_us=45))
    assert check_inv_adv_3(history) == ["INV-ADV-3: barrier root merged 2 times (branches m0, m0b)"]


def test_adv_3_merge_fired_early():
    history = edit(full(), "branches", "b1", fanin_arrived_at_us=None)
    history = edit(history, "branches", "root", fanin_arrivals=1)
    assert check_inv_adv_3(history) == [
        "INV-ADV-3: barrier root merged before each of its 2 indices arrived once: arrived [0] (merge m0)"]


def test_adv_3_merge_inputs_out_of_order():
    assert check_inv_adv_3(edit(full(), "steps", "sD", input=[["c", "b"]])) == [
        'INV-ADV-3: barrier root merge step sD has input [["c", "b"]], expected the arrived outputs by '
        'barrier_index [["b", "c"]] (the same outputs, out of order)']
    assert check_inv_adv_3(edit(full(), "steps", "sD", input=[["b"]])) == [
        'INV-ADV-3: barrier root merge step sD has input [["b"]], expected the arrived outputs by '
        'barrier_index [["b", "c"]]']


def test_adv_3_arrival_counter():
    assert check_inv_adv_3(edit(full(), "branches", "root", fanin_arrivals=3)) == [
        "INV-ADV-3: barrier root counts 3 arrivals but 2 siblings arrived"]


def test_adv_3_never_fired():
    history = without(full(), "m1", "sF", "sG", "sI")
    assert check_inv_adv_3(history) == ["INV-ADV-3: barrier m0: all 2 siblings arrived but it never merged"]
    assert check_inv_adv_1(history) == [  # the same loss, seen as a successor
        "INV-ADV-1: lost successor: barrier m0 (all 2 arrived) should have created merge branch of barrier m0 "
        "once; found none"]


def test_adv_3_index_arrived_twice():
    history = full()
    history.branches.append(BranchRow("b2", "r1", "completed", barrier_id="root", barrier_index=1,
                                      fanin_arrived_at_us=99))
    history.steps.append(StepRow("sC3", "r1", "b2", "C#2", "completed", "combine", input=["x"],
                                 output_payload={"payload": "c"}, started_at_us=31))
    assert check_inv_adv_3(history) == [
        "INV-ADV-3: barrier root: index 1 arrived twice (branches b1, b2)",
        "INV-ADV-3: barrier root counts 2 arrivals but 3 siblings arrived",
        "INV-ADV-3: barrier root merged before each of its 2 indices arrived once: arrived [0, 1, 1] (merge m0)",
    ]


def test_adv_3_arrival_without_a_fan_in_step():
    assert check_inv_adv_3(edit(full(), "steps", "sB", status="advancing")) == [
        "INV-ADV-3: branch b0 arrived at barrier root without completing a fan-in step (latest step: "
        "sB (B#1, advancing))"]


def test_adv_3_merge_stands_in_the_barriers_place():
    assert check_inv_adv_3(edit(full(), "branches", "m1", barrier_id="root", barrier_index=0)) == [
        "INV-ADV-3: merge m1 of barrier m0 stands at barrier root index 0, expected barrier None index None"]


def test_adv_3_arrival_at_a_branch_that_never_fanned_out():
    assert check_inv_adv_3(edit(full(), "branches", "m1", barrier_id="sX", fanin_arrived_at_us=5)) == [
        "INV-ADV-3: branch m1 arrived at sX, which never fanned out",
        "INV-ADV-3: merge m1 of barrier m0 stands at barrier sX index None, expected barrier None index None",
    ]


# --------------------------------------------------------------------------- INV-EXE-1


def test_exe_1_holds_when_everything_settled():
    assert check_inv_exe_1(full()) == []
    assert check_inv_exe_1(halted_chain().h) == []


def test_exe_1_run_stuck_in_progress():
    assert check_inv_exe_1(edit(full(), "runs", "r1", status="in_progress")) == [
        "INV-EXE-1: run r1 is still in_progress after the quiet phase"]


def test_exe_1_lost_and_stuck_work():
    history = edit(full(), "branches", "m1", status="advancing", claim_token="t1")
    history = edit(history, "branches", "e0", claim_token="t2")
    history = edit(history, "executions", "x-sE1", completed_at_us=None)
    history = edit(history, "executions", "x-sI", claimed_at_us=None, completed_at_us=None)
    history.executions = [e for e in history.executions if e.step_id != "sG"]
    assert check_inv_exe_1(history) == [
        "INV-EXE-1: execution x-sE1 (step sE1, run r1) is still in flight (claimed at 100 µs) after the quiet phase",
        "INV-EXE-1: execution x-sI (step sI, run r1) is still pending after the quiet phase",
        "INV-EXE-1: step sG (G#6, run r1) has no execution",
        "INV-EXE-1: branch e0 (run r1) is still completed with a claim token after the quiet phase",
        "INV-EXE-1: branch m1 (run r1) is still advancing after the quiet phase",
    ]


# --------------------------------------------------------------------------- INV-EXE-3


def witnesses(*pairs: tuple[str, str]) -> History:
    history = full()
    history.witnesses = [Witness(step, key, 7, None, n, n + 1) for n, (step, key) in enumerate(pairs)]
    return history


def test_exe_3_holds_across_re_runs():
    assert check_inv_exe_3(witnesses(("sA", "sA"), ("sA", "sA"), ("sB", "sB"))) == []


def test_exe_3_two_steps_share_a_key():
    assert check_inv_exe_3(witnesses(("sA", "sA"), ("sB", "sA"))) == [
        "INV-EXE-3: step sB ran with idempotency key 'sA', not its step id",
        "INV-EXE-3: idempotency key 'sA' shared by steps sA, sB",
    ]


def test_exe_3_a_step_with_two_keys():
    assert check_inv_exe_3(witnesses(("sA", "sA"), ("sA", "k2"))) == [
        "INV-EXE-3: step sA ran with 2 idempotency keys: 'sA', 'k2'",
        "INV-EXE-3: step sA ran with idempotency key 'k2', not its step id",
    ]


def test_exe_3_witness_of_an_unknown_step():
    assert check_inv_exe_3(witnesses(("ghost", "ghost"))) == [
        "INV-EXE-3: witnesses name step ghost, which does not exist"]


# --------------------------------------------------------------------------- INV-RUN-1


def test_run_1_holds_for_every_settled_state():
    assert check_inv_run_1(full()) == []
    assert check_inv_run_1(halted_chain().h) == []
    dampened = edit(edit(full(), "runs", "r1", status="dampened"), "branches", "m1", status="dampened")
    assert check_inv_run_1(dampened) == []
    running = edit(edit(full(), "runs", "r1", status="in_progress"), "branches", "m1", status="in_progress")
    assert check_inv_run_1(running) == []


def test_run_1_completed_run_with_a_halted_branch():
    assert check_inv_run_1(edit(full(), "branches", "b1", status="halted")) == [
        "INV-RUN-1: run r1 is completed but has branches not completed: b1 (halted)"]


def test_run_1_halted_run_with_active_or_dampened_branches():
    history = halted_chain().h
    history.branches.append(BranchRow("b9", "r2", "advancing"))
    history.branches.append(BranchRow("b8", "r2", "dampened"))
    assert check_inv_run_1(history) == [
        "INV-RUN-1: run r2 is halted but has active branches: b9 (advancing)",
        "INV-RUN-1: run r2 is halted but has dampened branches: b8 (dampened)",
    ]
    assert check_inv_run_1(edit(halted_chain().h, "branches", "root", status="completed")) == [
        "INV-RUN-1: run r2 is halted but no branch is halted"]


def test_run_1_dampened_run_without_a_dampened_branch():
    assert check_inv_run_1(edit(full(), "runs", "r1", status="dampened")) == [
        "INV-RUN-1: run r1 is dampened but no branch is dampened"]


def test_run_1_in_progress_run_with_nothing_active():
    assert check_inv_run_1(edit(full(), "runs", "r1", status="in_progress")) == [
        "INV-RUN-1: run r1 is in_progress but no branch is active"]


def test_run_1_terminal_states_are_final():
    history = edit(halted_chain().h, "runs", "r2", completed_at_us=50, halted_at_us=60)
    assert check_inv_run_1(history) == ["INV-RUN-1: run r2 was completed at 50 µs but is now halted"]


def test_run_1_run_without_branches():
    history = full()
    history.runs.append(RunRow("r3", "completed", snapshot(CHAIN)))
    assert check_inv_run_1(history) == ["INV-RUN-1: run r3 (completed) has no branch"]


# --------------------------------------------------------------------------- all, and the history file


def test_check_all_names_every_checker_and_passes_a_valid_history():
    assert check_all(full()) == {inv: [] for inv in CHECKERS}
    assert list(CHECKERS) == ["INV-CLK-1", "INV-LIM-1", "INV-LIM-2", "INV-LIM-3", "INV-LIM-4", "INV-LIM-8",
                              "INV-ADV-1",
                              "INV-ADV-3", "INV-EXE-1", "INV-EXE-2", "INV-EXE-3", "INV-EXE-4", "INV-RUN-1",
                              "INV-HLT-1", "INV-HLT-2", "INV-PRN-1", "INV-PRN-2", "INV-REV-1", "INV-REV-2",
                              "INV-REV-3"]
    broken = check_all(without(full(), "sI"))
    assert broken["INV-ADV-1"]
    assert all(m.startswith(inv + ": ") for inv, ms in broken.items() for m in ms)


def test_history_round_trips_through_jsonl(tmp_path):
    history = full()
    history.executions += keyed((1, 2)).executions
    history.witnesses.append(Witness("sA", "sA", 42, "api", 5, None))
    history.limits = limits(api={"concurrency": 2, "rate": [{"limit": 5, "per": "1s"}, {"limit": 60, "per": "1h",
                                                                                        "burst": 30}]})
    history.families = tenant_family().families
    history.kills.append({"pid": 42, "role": "worker", "at_us": 7, "how": "SIGKILL"})
    history.hooks += halted_with_hook().hooks
    history.seed, history.meta = 1234, {"database": "sqlite 3.45", "commit": "abc"}
    history.to_jsonl(tmp_path / "round.jsonl")
    again = History.from_jsonl(tmp_path / "round.jsonl")
    assert again == history
    assert check_all(again) == check_all(history)


def test_to_us_is_exact():
    assert to_us(datetime(1970, 1, 1, 0, 0, 1, 5)) == 1_000_005
    assert to_us(datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2)))) == to_us(datetime(2025, 12, 31, 22))
    assert to_us("2026-01-01 00:00:00.000001") == to_us(datetime(2026, 1, 1)) + 1
    assert to_us(None) is None


# --------------------------------------------------------------------------- INV-CLK-1


def test_clk_1_holds_when_times_follow_the_key_sequence():
    assert check_inv_clk_1(keyed((1, 3), (2, 4), (5, None))) == []


def test_clk_1_catches_a_claim_timed_before_the_lock_it_waited_for():
    history = keyed((1, 3), (2, 4))
    history.executions[1] = dataclasses.replace(history.executions[1], claimed_at_us=5)  # seq 2 at 5 < seq 1 at 10
    assert check_inv_clk_1(history) == [
        "INV-CLK-1: key 'api': claim seq 2 of e2 at 5 us is earlier than claim seq 1 of e1 at 10 us"]


def test_clk_1_orders_releases_with_claims():
    history = keyed((1, 2), (3, None))
    history.executions[0] = dataclasses.replace(history.executions[0], completed_at_us=40)  # release seq 2 at 40
    assert check_inv_clk_1(history) == [
        "INV-CLK-1: key 'api': claim seq 3 of e2 at 30 us is earlier than release seq 2 of e1 at 40 us"]


# --------------------------------------------------------------------------- INV-LIM-4, INV-EXE-2, INV-EXE-4


def test_lim_4_levels_within_the_configured_burst():
    from ductwork_proof.history import BucketRow

    history = History(limits=limits(api={"rate": {"limit": 5, "per": "1s", "burst": 2}}))
    history.buckets = [BucketRow("api", 1, 2 * S, 0), BucketRow("api", 60, 10**12, 0)]  # 60 s: not kept
    assert check_inv_lim_4(history) == []
    history.buckets.append(BucketRow("api", 1, 2 * S + 1, 0))
    history.buckets.append(BucketRow("api", 1, -1, 0))
    assert check_inv_lim_4(history) == [
        "INV-LIM-4: key 'api' bucket per 1s holds 2000001 units, outside [0, 2000000]",
        "INV-LIM-4: key 'api' bucket per 1s holds -1 units, outside [0, 2000000]"]


def test_exe_2_a_steps_success_is_recorded_once():
    history = History(limits={})
    history.executions = [execution("e1", key=None, at=1, done=2), execution("e2", key=None, at=3)]
    assert check_inv_exe_2(history) == []
    twice = dataclasses.replace(history.executions[1], step_id="s-e1", completed_at_us=4, outcome="success")
    history.executions[1] = twice
    never_claimed = execution("e3", key=None, done=5)
    history.executions.append(never_claimed)
    assert check_inv_exe_2(history) == [
        "INV-EXE-2: execution e3 has an outcome but was never claimed",
        "INV-EXE-2: step s-e1 succeeded 2 times: e1, e2"]


def test_exe_2_one_open_execution_per_step():
    history = History(limits={})
    history.executions = [execution("e1", key=None), dataclasses.replace(execution("e2", key=None), step_id="s-e1")]
    assert check_inv_exe_2(history) == ["INV-EXE-2: step s-e1 has 2 open executions: e1, e2"]


def test_exe_4_budgets():
    history = History(limits={}, meta={"max_retry": 1, "max_crash": 2})
    history.executions = [dataclasses.replace(execution("e1", key=None), retry_count=1, crash_count=2)]
    assert check_inv_exe_4(history) == []
    history.executions.append(dataclasses.replace(execution("e2", key=None), retry_count=2, crash_count=0))
    assert check_inv_exe_4(history) == [
        "INV-EXE-4: execution e2 of step s-e2 has retry_count 2 (max 1) and crash_count 0 (max 2)"]


# --------------------------------------------------------------------------- INV-HLT (issue 16)

HANDLER = "shop.hooks:Page"


def halted_with_hook(**hook: Any) -> History:
    """A halted run whose snapshot names an on_halt handler, and its hook, succeeded."""
    h = History(meta={"max_retry": 3, "max_crash": 5})
    h.runs.append(RunRow("r1", "halted", {**snapshot({}), "on_halt": HANDLER}))
    h.branches.append(BranchRow("b1", "r1", "halted", "job_retries_exhausted"))
    fields = {"hook_id": "k1", "run_id": "r1", "klass": HANDLER, "status": "succeeded", "retry_count": 1,
              "crash_count": 0, "last_outcome": "success", "claim_token": None, "completed_at_us": 50, **hook}
    h.hooks.append(HookRow(**fields))
    return h


def test_hlt_holds_for_a_delivered_and_a_spent_hook():
    assert check_inv_hlt_1(halted_with_hook()) == check_inv_hlt_2(halted_with_hook()) == []
    spent = halted_with_hook(status="failed", retry_count=3, last_outcome="failure")
    assert check_inv_hlt_1(spent) == check_inv_hlt_2(spent) == []


def test_hlt_1_two_hooks_for_one_run():
    h = halted_with_hook()
    h.hooks.append(dataclasses.replace(h.hooks[0], hook_id="k2"))
    assert any("run r1 has 2 hooks" in v for v in check_inv_hlt_1(h))


def test_hlt_1_a_hook_for_a_run_that_did_not_halt_or_names_another_handler():
    h = halted_with_hook()
    h.runs[0] = dataclasses.replace(h.runs[0], status="completed")
    assert any("INV-HLT-1: hook k1" in v for v in check_inv_hlt_1(h))
    assert any("INV-HLT-1: hook k1" in v for v in check_inv_hlt_1(halted_with_hook(klass="shop.hooks:Other")))


def test_hlt_1_outcome_recorded_and_claim_released_together():
    assert any("completed_at" in v for v in check_inv_hlt_1(halted_with_hook(completed_at_us=None)))
    assert any("completed_at" in v for v in check_inv_hlt_1(halted_with_hook(status="pending")))
    assert any("still holds claim" in v for v in check_inv_hlt_1(halted_with_hook(claim_token="t9")))
    assert any("last outcome failure" in v for v in check_inv_hlt_1(halted_with_hook(last_outcome="failure")))


def test_hlt_2_a_halted_run_without_its_hook():
    h = halted_with_hook()
    h.hooks.clear()
    assert check_inv_hlt_2(h) == [f"INV-HLT-2: halted run r1 owes no hook to {HANDLER!r}"]


def test_hlt_2_a_hook_left_open_or_past_its_budgets():
    assert any("after the quiet phase" in v
               for v in check_inv_hlt_2(halted_with_hook(status="running", completed_at_us=None)))
    assert any("retried 4 times" in v for v in check_inv_hlt_2(halted_with_hook(retry_count=4)))
    assert any("re-run 6 times" in v for v in check_inv_hlt_2(halted_with_hook(crash_count=6)))
    early = halted_with_hook(status="failed", retry_count=1, last_outcome="failure")
    assert any("budget left" in v for v in check_inv_hlt_2(early))
# --------------------------------------------------------------------------- INV-PRN


def _prune(before: dict, after: list, *, cutoff: str | None = "1970-01-01 00:00:10", before_us: int = 20 * S,
           last: bool = False) -> dict:
    return {"action": "prune", "at_s": 1.0, "before_us": before_us, "before": before, "after": after,
            "cutoff": cutoff, **({"last": True} if last else {})}


def _whole(run_id: str, status: str = "completed") -> History:
    return History(runs=[RunRow(run_id, status, None)],
                   branches=[BranchRow(f"b-{run_id}", run_id, status)],
                   steps=[StepRow(f"s-{run_id}", run_id, f"b-{run_id}", "A#0", status, "start")])


def test_prn_1_holds_when_only_old_final_runs_go():
    history = _whole("kept", "dampened")
    history.kills = [_prune({"old": ["completed", 5 * S], "halt": ["halted", 6 * S], "kept": ["dampened", None]},
                            ["kept"])]
    assert check_inv_prn_1(history) == []


def test_prn_1_a_live_run_deleted():
    history = History(kills=[_prune({"live": ["in_progress", None]}, [])])
    assert check_inv_prn_1(history) == ["INV-PRN-1: prune at 1.0 s deleted run live, which was in_progress"]


def test_prn_1_a_dampened_run_that_is_gone():
    """Seen dampened by one read (kept then), gone at the end: a later prune took it."""
    history = History(kills=[_prune({"waits": ["dampened", None]}, ["waits"])])
    assert check_inv_prn_1(history) == ["INV-PRN-1: run waits was dampened (live) and is gone"]


def test_prn_1_a_run_finished_after_the_cutoff_deleted():
    history = History(kills=[_prune({"late": ["completed", 11 * S]}, [])])
    assert check_inv_prn_1(history) == [
        "INV-PRN-1: prune at 1.0 s deleted run late, finished at 11000000 µs, not before its cutoff 10000000 µs"]


def test_prn_1_a_prune_slow_to_start_cannot_judge_a_run_that_finished_meanwhile():
    history = History(kills=[_prune({"r": ["in_progress", None]}, [], before_us=5 * S)])
    assert check_inv_prn_1(history) == []


def test_prn_2_holds_on_whole_runs():
    history = _whole("r1")
    history.kills = [_prune({"gone": ["completed", S], "r1": ["completed", 30 * S]}, ["r1"], last=True)]
    assert check_inv_prn_2(history) == []


def test_prn_2_rows_of_a_run_without_its_run_row():
    history = _whole("r1")
    history.runs = []
    assert check_inv_prn_2(history) == [
        "INV-PRN-2: branch b-r1 belongs to run r1, which has no run row",
        "INV-PRN-2: step s-r1 belongs to run r1, which has no run row"]


def test_prn_2_a_run_cut_in_half():
    history = _whole("r1")
    history.steps = []
    assert check_inv_prn_2(history) == ["INV-PRN-2: run r1 has no step"]


def test_prn_2_the_last_prune_left_an_old_final_run():
    history = _whole("r1")
    history.kills = [_prune({"r1": ["completed", S]}, ["r1"], last=True)]
    assert check_inv_prn_2(history) == [
        "INV-PRN-2: run r1 (completed, finished before the last prune's cutoff) is left"]
# --------------------------------------------------------------------------- INV-REV (revive)


def revived() -> History:
    """A halted chain A → B (B failed) revived as r2: A carried over (no execution, no
    witness), B re-run under B's key, then completed."""
    b = Build()
    chain = {"A#0": ("chain", ["B#1"])}
    b.run("r1", chain, status="halted")
    b.branch("x1", status="halted", halt_reason="job_retries_exhausted")
    b.step("sA", "x1", "A#0", [1], 2, via="start")
    b.step("sB", "x1", "B#1", [2], via="chain", status="failed")
    b.run("r2", chain, revived_from="r1")
    b.branch("x2", run="r2")
    b.step("tA", "x2", "A#0", [1], 2, via="start", run="r2")
    b.step("tB", "x2", "B#1", [2], 3, via="chain", run="r2")
    b.h.executions = [e for e in b.h.executions if e.step_id != "tA"]  # history: not executed
    find(b.h.steps, step_id="tB").idempotency_key = "sB"
    b.h.witnesses = [Witness("sA", "sA", 1, None, 1, 2), Witness("sB", "sB", 1, None, 3, 4),
                     Witness("tB", "sB", 1, None, 5, 6)]
    b.h.meta["revives"] = [{"run": "r1", "got": ["r2", "r2"], "errors": []}]
    return b.h


def test_rev_checkers_hold_on_a_revived_run():
    h = revived()
    assert {inv: check(h) for inv, check in CHECKERS.items() if inv.startswith(("INV-REV", "INV-EXE-1",
                                                                                  "INV-EXE-3"))} == {
        "INV-REV-1": [], "INV-REV-2": [], "INV-REV-3": [], "INV-EXE-1": [], "INV-EXE-3": []}


def test_rev_1_a_run_revived_twice_and_a_caller_given_another_run():
    h = revived()
    h.runs.append(RunRow("r3", "completed", h.runs[1].definition, revived_from="r1"))
    h.meta["revives"] = [{"run": "r1", "got": ["r2", "r3"], "errors": []}]
    assert check_inv_rev_1(h) == [
        "INV-REV-1: run r1 was revived 2 times: r2, r3",
        "INV-REV-1: a revive of r1 returned r3, but the run that revives it is ['r2', 'r3']",
    ]


def test_rev_1_a_run_that_was_not_halted_revived():
    assert check_inv_rev_1(edit(revived(), "runs", "r1", status="completed")) == [
        "INV-REV-1: run r2 revives r1, which is completed, not halted"]


def test_rev_2_a_succeeded_step_executed_again():
    h = revived()
    h.executions.append(Execution("x-tA", "tA", "r2", None, 90, 91, "success", None, None, 90))
    h.witnesses.append(Witness("tA", "tA", 1, None, 90, 91))
    assert check_inv_rev_2(h) == [
        "INV-REV-2: run r2 carried over [] from r1, whose succeeded steps are [(('A#0', '[1]'), 1)]"]


def test_rev_2_a_carried_over_step_that_ran_or_is_not_completed():
    h = edit(revived(), "steps", "tA", status="advancing")
    h.witnesses.append(Witness("tA", "tA", 1, None, 90, 91))
    assert check_inv_rev_2(h) == [
        "INV-REV-2: carried-over step tA (A#0) of r2 is advancing",
        "INV-REV-2: carried-over step tA (A#0) of r2 ran again",
    ]


def test_rev_3_a_failed_step_re_run_with_a_new_key_or_a_used_budget():
    assert check_inv_rev_3(edit(revived(), "steps", "tB", idempotency_key=None)) == [
        "INV-REV-3: failed step sB (B#1 [2]) of r1 is re-run 0 times in r2"]
    assert check_inv_rev_3(edit(revived(), "steps", "tB", input=[None])) == [
        "INV-REV-3: failed step sB (B#1 [2]) of r1 is re-run 0 times in r2"]
    assert check_inv_rev_3(edit(revived(), "executions", "x-tB", retry_count=1)) == [
        "INV-REV-3: step tB re-runs sB without a fresh budget"]
    h = revived()
    h.witnesses.append(Witness("tB", "tB", 1, None, 7, 8))
    assert check_inv_rev_3(h) == ["INV-REV-3: step tB ran with keys ['sB', 'tB'], not 'sB'"]


def test_exe_1_and_exe_3_accept_a_revive_but_nothing_else():
    h = revived()
    assert check_inv_exe_1(edit(h, "runs", "r2", revived_from=None)) == [
        "INV-EXE-1: step tA (A#0, run r2) has no execution"]
    assert check_inv_exe_3(edit(h, "steps", "tB", idempotency_key=None)) == [
        "INV-EXE-3: step tB ran with idempotency key 'sB', not its step id",
        "INV-EXE-3: idempotency key 'sB' shared by steps sB, tB",
    ]


def test_chaos_seeds_default_rounds_lists_and_ranges():
    from ductwork_proof.harness import BASE_SEED, chaos_seeds

    assert chaos_seeds({}) == [BASE_SEED, BASE_SEED + 1]
    assert chaos_seeds({"DUCTWORK_CHAOS_ROUNDS": "1"}) == [BASE_SEED]
    assert chaos_seeds({"DUCTWORK_CHAOS_SEED": "7, 10-12", "DUCTWORK_CHAOS_ROUNDS": "5"}) == [7, 10, 11, 12]
    with pytest.raises(ValueError, match="runs backwards"):
        chaos_seeds({"DUCTWORK_CHAOS_SEED": "12-10"})
    with pytest.raises(ValueError, match="DUCTWORK_CHAOS_ROUNDS=0"):
        chaos_seeds({"DUCTWORK_CHAOS_ROUNDS": "0"})


def test_lim_1_a_body_on_a_frozen_host_stops_counting_when_the_freeze_began():
    """A SIGSTOPped body is not running; after the thaw it is a fenced zombie (INV-EXE-5's
    stated exception). Counted to its end, it would make limit 1 look exceeded by its re-run."""
    history = witnessed((0, 5_000_000), (3_500_000, 3_600_000))  # s1 in pid 101, s2 in pid 102
    assert any("2 step bodies running" in v for v in check_inv_lim_1(history))
    history.kills.append({"action": "freeze_host", "pids": [100, 101], "frozen_at_us": 1_000_000})
    assert check_inv_lim_1(history) == []
    history.kills[-1]["pids"] = [100]  # another host's freeze does not excuse this body
    assert any("2 step bodies running" in v for v in check_inv_lim_1(history))


def test_lim_1_a_body_admitted_before_a_freeze_and_recorded_after_the_thaw_is_a_zombie():
    """The freeze can fall between a worker's lease question and its witness's round trip
    (INV-EXE-5's stated window): the row is written after the thaw, by a fenced zombie. It
    is exempt only for the frozen host and only while a claim of its step was open at the
    freeze (seen in CI: mysql seed 20261131, 4 bodies of a key limited to 3)."""
    history = witnessed((6_000_000, 8_000_000), (3_500_000, 7_000_000))  # s1 in pid 101, s2 in pid 102
    history.executions.append(execution("e1", step="s1", at=900_000, seq=1))  # claimed before the freeze
    assert any("2 step bodies running" in v for v in check_inv_lim_1(history))
    history.kills.append({"action": "freeze_host", "pids": [100, 101], "frozen_at_us": 1_000_000})
    assert check_inv_lim_1(history) == []
    history.kills[-1]["pids"] = [100]  # another host's freeze does not excuse this body
    assert any("2 step bodies running" in v for v in check_inv_lim_1(history))
    history.kills[-1]["pids"] = [100, 101]
    history.executions[-1] = execution("e1", step="s1", at=1_200_000, seq=1)  # claimed after the freeze
    assert any("2 step bodies running" in v for v in check_inv_lim_1(history))
    history.executions[-1] = execution("e1", step="s1", at=900_000, done=950_000, seq=1, released=2)  # closed before it
    assert any("2 step bodies running" in v for v in check_inv_lim_1(history))
