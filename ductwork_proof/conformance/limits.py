"""The engine's claim path against the model, step by step: the limits conformance machine.

``LimitsAgainstModel`` drives the engine (a real database, a ManualClock) and the
model's ``LimitsModel`` side by side: enqueue keyed, unkeyed and delayed jobs,
move the clock (by zero, one µs, sub-millisecond and larger steps), claim by
one of several workers, claim a batch, complete (also with a hand-off of the key's next
job, and several at once in a group commit), fail (retries), crash and reap a worker,
restart with changed limits, a step on a rated key that fails with its retry
claimed once eligible (``fail_and_claim_the_retry``), and forget a partition (idle: its rows
removed; busy, a static key or the family: nothing changes). Beside the static keys ``a`` and
``b`` there is a key family ``p`` (semantics §5.1): ``per_partition`` limits drawn like
a static key's, an optional ceiling over the family, and two or three partitions
``p[<value>]``, at least one of a hostile value (quotes, brackets, a backslash, an
accent, a SQL fragment), rendered by the model's ``partition_key``; every rule acts on
them as on any key (``enqueue_partition`` and ``fill_the_family`` put work in them).
Every example starts with batch claims across one key's or partition's concurrency limit
(``fill_a_key``, also a rule), so the decision at the limit itself is met in each.
After every rule the engine and the model agree on each key's and each partition's
in-flight count, bucket levels and ``blocked_until`` stamp and on the family's in-flight
count, and every claim chose the same job.

Shipped so that ``ductwork verify`` runs it against an adopter's database
(:func:`ductwork_proof.conformance.run_conformance`); the test suite runs it on each of its
databases with its hypothesis profile's budget
(``tests/properties/test_conformance_limits.py``). Each example empties the ductwork tables
first. The rules keep their names and draws: hypothesis orders rules by name, and the
derandomized examples the engine-mutant hunts rely on follow from them.

Checks: INV-LIM-1, INV-LIM-2, INV-LIM-3, INV-LIM-4, INV-LIM-5, INV-LIM-6, INV-LIM-7, INV-LIM-8,
INV-LIM-9 (forgetting idle partitions), INV-CLK-1 (every decision uses the injected database time;
a key's sequence numbers are used once, across a forget too), INV-EXE-2, INV-EXE-4.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from ductwork.app import App
from ductwork.config import Config
from ductwork.db.clock import ManualClock, from_us, to_us
from ductwork.errors import CommitFailed
from ductwork.fleet.processes import register
from ductwork.fleet.reaper import reap
from ductwork.limits import claims
from ductwork.limits.executions import Claimed, forget_partition
from ductwork.pipelines.outcomes import HandOff, Success, record_failure, record_success, record_successes
from ductwork.pipelines.payloads import Output
from ductwork_model import LimitsModel
from ductwork_model.errors import PreconditionError
from ductwork_model.invariants import check_all
from ductwork_model.limits import partition_key
from ductwork_proof.conformance import abstraction
from ductwork_proof.conformance.factories import CONFIG, make_executions, make_run, open_execution_of, reset_tables

__all__ = ["FAMILY", "KEYS", "UNCONFIGURED", "WORKERS", "LimitsAgainstModel", "engine_config"]

KEYS = ("a", "b")
UNCONFIGURED = "u"  # stamped on jobs, absent from config: claims unlimited
FAMILY = "p"  # a key family: its partitions p[<value>] are drawn per example
#: partition values a rendered key must keep as data: quotes, brackets, a backslash, an
#: accent, LIKE's wildcards, a SQL fragment (each example has at least one)
HOSTILE = ("'); DROP TABLE x;--", 'q"]\\[é', "]", "[", "\\", "é", "100%_off")
PLAIN = ("acct-42", 42, "")
WORKERS = ("w0", "w1", "w2")
MAX_RETRY = CONFIG["job_worker"]["max_retry"]
MAX_CRASH = CONFIG["job_worker"]["max_crash"]
RETRY_DELAY_US = int(CONFIG["job_worker"]["retry_delay"] * 1_000_000)
CRASH_BACKOFF_US = int(CONFIG["job_worker"]["crash_backoff"] * 1_000_000)
T0 = datetime(2026, 1, 1)
#: an eligible time older than any execution the other rules enqueue (the clock starts at T0
#: and only moves forward): ``fill_a_key``'s executions come first in every poll
OVERDUE = T0 - timedelta(seconds=1)

rate_entry = st.fixed_dictionaries(
    {"limit": st.integers(1, 5), "per": st.sampled_from([1, 2, 60])}, optional={"burst": st.integers(1, 4)})
key_limits = st.one_of(
    st.fixed_dictionaries({"concurrency": st.integers(1, 3)}),
    st.fixed_dictionaries({"rate": st.lists(rate_entry, min_size=1, max_size=2, unique_by=lambda e: e["per"])}),
    st.fixed_dictionaries({"concurrency": st.integers(1, 3),
                           "rate": st.lists(rate_entry, min_size=1, max_size=2, unique_by=lambda e: e["per"])}),
)
rated = st.fixed_dictionaries(
    {"rate": st.lists(rate_entry, min_size=1, max_size=2, unique_by=lambda e: e["per"])},
    optional={"concurrency": st.integers(1, 3)})
family_limits = st.fixed_dictionaries({"per_partition": key_limits}, optional={"concurrency": st.integers(1, 3)})
# Key "a" always has rate entries (where buckets live); "b" is anything; "p" is a family.
limit_configs = st.fixed_dictionaries({"a": rated, "b": key_limits, FAMILY: family_limits})


def _distinct(drawn: tuple[str, list[str | int]]) -> tuple[str | int, ...]:
    """A hostile value and one or two more, distinct (a plain one if the draw repeated it)."""
    values = tuple(dict.fromkeys((drawn[0], *drawn[1])))
    return values if len(values) > 1 else (drawn[0], PLAIN[0])


#: two or three partition values, one of them hostile at least
partition_values = st.tuples(st.sampled_from(HOSTILE), st.lists(st.sampled_from(HOSTILE + PLAIN), min_size=1,
                                                                  max_size=2, unique=True)).map(_distinct)
clock_steps = st.sampled_from([0, 1, 2, 7, 999, 1_000, 99_999, 250_000, 999_999, 1_000_000, 3_000_000, 61_000_000])


def engine_config(limits: dict) -> Config:
    section = {name: dict(values) for name, values in CONFIG.items()}
    section["job_worker"] = {**section["job_worker"], "limits": limits}
    return Config.from_section(section, source="<conformance>")


class LimitsAgainstModel(RuleBasedStateMachine):
    """Engine and model side by side; rules are operations, invariants compare them."""

    def __init__(self, url: str, engine: sa.Engine):
        super().__init__()
        self.url, self.engine = url, engine

    @initialize(limits=limit_configs, values=partition_values, first=st.sampled_from(WORKERS),
                filled=st.integers(0, 4))
    def setup(self, limits: dict, values: tuple[str | int, ...], first: str = WORKERS[0], filled: int = 0) -> None:
        """A fresh engine and model with ``limits``, partitions of ``values``, then
        :meth:`fill_a_key` of key ``filled`` by worker ``first``: every example starts with
        a batch across a limit (hypothesis runs each example with some rules switched off,
        that one too at times)."""
        self.partitions = tuple(partition_key(FAMILY, value) for value in values)
        self.clock = ManualClock(T0)
        self.app = App(self.url, engine_config(limits), self.clock, engine=self.engine)
        reset_tables(self.engine)
        self.model = LimitsModel(limits)
        self.run_id, self.branch_id = make_run(self.app)
        self.process = {w: register(self.app, role="test", label=w) for w in WORKERS}
        self.generation = dict.fromkeys(WORKERS, 0)
        self.held: dict[str, tuple[str, Claimed]] = {}  # execution id -> (worker, its claim)
        self.keys: dict[str, str | None] = {}  # execution id -> key
        self.fill_a_key(first, filled)

    @property
    def now_us(self) -> int:
        return to_us(self.clock.now())

    def limited_keys(self) -> tuple[str, ...]:
        """The static keys and this example's partitions: the keys that have limits."""
        return (*KEYS, *self.partitions)

    def compared_keys(self) -> tuple[str, ...]:
        """Every key compared after each rule: the limited ones, the unconfigured one and
        the family's own name (a header row, never a lane: no buckets, no stamp)."""
        return (*KEYS, UNCONFIGURED, FAMILY, *self.partitions)

    # -- rules ------------------------------------------------------------------------------

    @rule(key=st.sampled_from([None, "a", "a", "b", UNCONFIGURED]),
          delay_us=st.sampled_from([0, 0, 0, 1, 500_000, 2_000_000]), count=st.integers(1, 3))
    def enqueue(self, key, delay_us, count):
        eligible = self.clock.now() + timedelta(microseconds=delay_us)
        for execution_id in make_executions(self.app, self.run_id, self.branch_id, key, eligible, count):
            self.model.enqueue(execution_id, key, self.now_us + delay_us)
            self.keys[execution_id] = key

    @precondition(lambda self: hasattr(self, "model"))
    @rule(partition=st.integers(0, 2), delay_us=st.sampled_from([0, 0, 1, 500_000]), count=st.integers(1, 3))
    def enqueue_partition(self, partition, delay_us, count):
        """``count`` executions in one of the family's partitions (``enqueue`` keeps its
        draws: the derandomized examples the engine-mutant hunts rely on)."""
        self.enqueue(key=self.partitions[partition % len(self.partitions)], delay_us=delay_us, count=count)

    @precondition(lambda self: hasattr(self, "model"))
    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 3))
    def fill_the_family(self, worker, limit):
        """One new execution in each partition, then one poll (a batch of up to ``limit``)
        per partition and one more: the family reaches its ceiling whenever it has one
        below the partitions' work, and a poll must skip a partition with work and room
        of its own while the family is full, a batch end there [INV-LIM-8]. The other rules
        alone seldom fill a family across partitions (older work is claimed first)."""
        for key in self.partitions:
            self.enqueue(key=key, delay_us=0, count=1)
        for _ in range(len(self.partitions) + 1):
            self.claim_batch(worker, limit)

    @precondition(lambda self: hasattr(self, "model"))
    @rule(worker=st.sampled_from(WORKERS), index=st.integers(0, 4))
    def fill_a_key(self, worker, index):
        """Batch claims across the limit of a concurrency-limited key or partition (the
        ``index``-th of those): its room (after one completion if it is full) and one more
        executions, older than any other pending work, then batches of that many (jumping
        to the key's stamp when its rate refused, at most four) and one poll more. The
        batch must stop at the limit itself [INV-LIM-1] (or the family's [INV-LIM-8]): an
        off-by-one there admits a sixth of five. The other rules reach that decision in
        some examples only (older work in other lanes ends a batch first): a decision told
        one fewer in flight than there is was found by 9 of 20 seeds within 5 examples
        without this rule."""
        limited = [(key, entry.concurrency) for key in self.limited_keys()
                   if (entry := self.app.config.entry_for(key)) is not None and entry.concurrency is not None]
        if not limited:
            return
        key, concurrency = limited[index % len(limited)]
        full = sorted(eid for eid in self.held if self.keys[eid] == key)
        if full and self.model.in_flight(key) >= concurrency:
            self._complete(full[0])
        room = max(0, concurrency - self.model.in_flight(key))  # (a restart may have lowered the limit below it)
        for execution_id in make_executions(self.app, self.run_id, self.branch_id, key, OVERDUE, room + 1):
            self.model.enqueue(execution_id, key, to_us(OVERDUE))
            self.keys[execution_id] = key
        for _ in range(4):
            self.claim_batch(worker, room + 1)
            stamp = self.model.blocked_until(key)
            if self.model.in_flight(key) >= concurrency or stamp is None or stamp <= self.now_us:
                break
            self.clock.set(from_us(stamp))
        self.claim(worker)

    @rule(key=st.sampled_from(["a", "b", UNCONFIGURED]), unkeyed_first=st.booleans(),
          worker=st.sampled_from(WORKERS), limit=st.integers(2, 4))
    def enqueue_interleaved_and_claim_batch(self, key, unkeyed_first, worker, limit):
        """Unkeyed, keyed and unkeyed executions (or keyed, unkeyed, keyed) at one moment,
        then a batch claim: a lane's oldest falls between two executions of another lane,
        and the batch must stop before it [INV-LIM-6]. ``enqueue`` and ``claim_batch`` alone
        seldom build this (older work is claimed first): 40 examples of them missed the
        ``batch_past_lane`` mutant that 400 × 100 found."""
        first, second = (None, key) if unkeyed_first else (key, None)
        for lane in (first, second, first):
            self.enqueue(key=lane, delay_us=0, count=1)
        self.claim_batch(worker, limit)

    @rule(microseconds=clock_steps)
    def advance_clock(self, microseconds):
        self.clock.advance(microseconds=microseconds)

    @precondition(lambda self: hasattr(self, "model") and any(s is not None and s > self.now_us
                                   for s in (self.model.blocked_until(k) for k in self.limited_keys())))
    @rule(offset=st.sampled_from([-1, 0, 0, 1]))
    def advance_to_next_stamp(self, offset):
        """Jump to a rate-blocked key's or partition's stamp (one µs before, at, or after
        it) [INV-LIM-5]."""
        soonest = min(s for s in (self.model.blocked_until(k) for k in self.limited_keys())
                      if s is not None and s > self.now_us)
        target = soonest + offset
        if target > self.now_us:
            self.clock.set(from_us(target))

    @rule(worker=st.sampled_from(WORKERS))
    def claim(self, worker):
        name = f"{worker}.{self.generation[worker]}"
        claimed = claims.claim(self.app, self.process[worker])
        expected = self.model.claim(name, self.now_us)
        got = None if claimed is None else claimed.execution_id
        assert got == expected, f"INV-LIM-6: engine claimed {got}, model {expected} at {self.now_us}"
        if claimed is not None:
            self.held[claimed.execution_id] = (worker, claimed)

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(2, 4))
    def claim_batch(self, worker, limit):
        """A batch claim takes what ``limit`` polls in a row would, while the first poll's
        lane stays first (unkeyed, or a key that admits: under one lock hold), and never
        an execution past an older lane [INV-LIM-6]. ``keyed_limit`` is ``limit``: no new
        draw, so the examples the engine-mutant hunts derandomize keep their shape."""
        name = f"{worker}.{self.generation[worker]}"
        claimed = claims.claim_batch(self.app, self.process[worker], limit, limit)
        expected = self.model.claim_batch(name, self.now_us, limit, limit)
        got = [c.execution_id for c in claimed]
        assert got == expected, f"INV-LIM-6: engine batch {got}, model {expected} at {self.now_us}"
        for c in claimed:
            self.held[c.execution_id] = (worker, c)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), limit=st.integers(1, 3))
    def complete_batch_and_hand_off(self, data, limit):
        """A worker's group commit: several successes of one owner in one transaction, then
        the hand-off of its lane's next executions, up to ``limit`` of them for a key too
        (a keyed group commit when they share a key: one lock hold, one release sequence
        number each) [INV-EXE-2, INV-LIM-1, INV-LIM-6]. No new draw: ``keyed_limit`` is
        ``limit``."""
        worker = data.draw(st.sampled_from(sorted({w for w, _ in self.held.values()})))
        mine = sorted(eid for eid, (w, _) in self.held.items() if w == worker)
        chosen = data.draw(st.lists(st.sampled_from(mine), min_size=1, max_size=4, unique=True))
        group = [self.held.pop(eid)[1] for eid in chosen]
        handed = record_successes(self.app, [Success(c, Output("null")) for c in group], HandOff(limit, limit))
        expected = self.model.complete_all_and_hand_off(chosen, self.now_us, limit, limit)
        got = [c.execution_id for c in handed]
        assert got == expected, f"INV-LIM-6: group hand-off gave {got}, model {expected} at {self.now_us}"
        for c in handed:
            self.held[c.execution_id] = (worker, c)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def complete(self, data):
        self._complete(data.draw(st.sampled_from(sorted(self.held))))

    def _complete(self, execution_id: str) -> None:
        """A held execution's success, recorded by the engine and the model."""
        _worker, claimed = self.held.pop(execution_id)
        record_success(self.app, claimed, Output("null"))
        self.model.complete(execution_id, self.now_us)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def complete_and_hand_off(self, data):
        """Success recorded by a worker that takes hand-offs: the same commit may claim the
        key's next execution for it, exactly when a poll would have [INV-LIM-6]. The model's
        and the engine's one success transaction, of a group of one (the rule keeps its name
        and draws: the derandomized examples the engine-mutant hunts rely on)."""
        execution_id = data.draw(st.sampled_from(sorted(self.held)))
        worker, claimed = self.held.pop(execution_id)
        handed = record_success(self.app, claimed, Output("null"), HandOff())
        expected = self.model.complete_all_and_hand_off([execution_id], self.now_us)
        got = [c.execution_id for c in handed]
        assert got == expected, f"INV-LIM-6: hand-off gave {got}, model {expected} at {self.now_us}"
        for c in handed:
            self.held[c.execution_id] = (worker, c)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def fail(self, data):
        """The step raised: the execution completes as a failure and a retry is queued."""
        self._fail(data.draw(st.sampled_from(sorted(self.held))))

    def _fail(self, execution_id: str) -> str | None:
        """Record ``execution_id``'s failure on both sides; the retry's execution id, if any."""
        _worker, claimed = self.held.pop(execution_id)
        retried = record_failure(self.app, claimed, RuntimeError("boom"))
        self.model.complete(execution_id, self.now_us, "failure")
        assert retried == (claimed.retry_count < MAX_RETRY), "INV-EXE-4: retry budget"
        if not retried:
            return None
        follow = open_execution_of(self.app, claimed.step_id)
        assert follow is not None, f"INV-EXE-4: a retry was enqueued, but step {claimed.step_id} has no open execution"
        assert to_us(follow.eligible_at) == self.now_us + RETRY_DELAY_US
        self.model.enqueue(follow.id, self.keys[execution_id], self.now_us + RETRY_DELAY_US)
        self.keys[follow.id] = self.keys[execution_id]
        return follow.id

    def _rated_held(self) -> list[str]:
        """Held executions whose key (or partition: its family's ``per_partition``) has rate
        entries (buckets) under the current limits."""
        config = self.app.config
        return sorted(eid for eid in self.held
                      if (key := self.keys[eid]) in self.limited_keys() and (entry := config.entry_for(key))
                      and entry.rates)

    def _claim_until(self, worker: str, key: str, wanted, late_us: int) -> None:
        """``worker`` polls (each poll compared with the model's) until ``wanted()`` holds,
        jumping ``late_us`` past ``key``'s stamp after a poll its rate refused; at most
        four polls."""
        for _ in range(4):
            self.claim(worker)
            stamp = self.model.blocked_until(key)
            if wanted() or stamp is None or stamp <= self.now_us:
                return
            self.clock.set(from_us(stamp + late_us))

    @precondition(lambda self: hasattr(self, "model"))
    @rule(worker=st.sampled_from(WORKERS), late_us=st.sampled_from([0, 1, 250_000]), data=st.data())
    def fail_and_claim_the_retry(self, worker, late_us, data):
        """A step on a rated key raises and ``worker`` claims again ``late_us`` after its
        retry is eligible (and after the key's stamp if the rate refused it): a retry's
        claim spends a token like any other [INV-LIM-2]. The step is one ``worker`` holds
        on a rated key, else a new execution of key ``a`` that it first claims, at the
        key's stamp if need be. The other rules alone seldom bring a retry to a claim on a
        rated key (buckets start empty, ``fail`` queues the retry 10 ms on, older work
        comes first), and a claim at the stamp of a one-token bucket leaves it empty
        whether it spends or not: 40 examples of them missed the ``no_spend_on_retry``
        mutant."""
        mine = [eid for eid in self._rated_held() if self.held[eid][0] == worker]
        if mine:
            execution_id = data.draw(st.sampled_from(mine))
        else:
            before = set(self.keys)
            self.enqueue(key="a", delay_us=0, count=1)
            (execution_id,) = set(self.keys) - before
            self._claim_until(worker, "a", lambda: execution_id in self.held, late_us)
            if execution_id not in self.held:
                return
        key = self.keys[execution_id]
        retry = self._fail(execution_id)
        if retry is not None:
            self.clock.set(from_us(self.now_us + RETRY_DELAY_US + late_us))
            self._claim_until(worker, key, lambda: retry in self.held, late_us)

    @rule(worker=st.sampled_from(WORKERS))
    def crash_and_reap(self, worker):
        """The worker dies; its supervisor force-reaps it and starts a replacement."""
        name = f"{worker}.{self.generation[worker]}"
        mine = {eid: c for eid, (w, c) in self.held.items() if w == worker}
        self.model.crash_worker(name, self.now_us)
        assert reap(self.app, self.process[worker], force=True)
        requeue = {}
        for execution_id, claimed in mine.items():
            del self.held[execution_id]
            follow = open_execution_of(self.app, claimed.step_id)
            count = claimed.crash_count + 1
            if claimed.crash_count >= MAX_CRASH:
                assert follow is None, "INV-EXE-4: crash budget spent"
                continue
            expected_at = self.now_us + (0 if count <= MAX_CRASH // 3 else CRASH_BACKOFF_US * count)
            assert to_us(follow.eligible_at) == expected_at
            requeue[execution_id] = (follow.id, expected_at)
            self.keys[follow.id] = self.keys[execution_id]
        self.model.reap(name, self.now_us, requeue=requeue)
        for execution_id, claimed in mine.items():  # INV-EXE-2: a reaped owner's late commit is rejected
            try:
                record_success(self.app, claimed, Output("null"))
            except CommitFailed:
                continue
            raise AssertionError(f"INV-EXE-2: {name}'s late success of {execution_id} was recorded after its reap")
        self.generation[worker] += 1
        self.process[worker] = register(self.app, role="test", label=f"{worker}.{self.generation[worker]}")

    @precondition(lambda self: hasattr(self, "model"))
    @rule(index=st.integers(0, 4))
    def forget_partition(self, index):
        """Forget one of the partitions, or try the static key ``a`` or the family's own row:
        an idle partition's rows are removed (and, on its next decision, its buckets come
        back empty); a busy partition, a static key or a family changes nothing [INV-LIM-9]."""
        keys = (*self.partitions, "a", FAMILY)
        key = keys[index % len(keys)]
        before = self._engine_rows()
        try:
            self.model.forget_partition(key, self.now_us)
        except PreconditionError:
            assert not forget_partition(self.app, key), f"INV-LIM-9: the engine forgot {key!r}, the model refused"
            after = self._engine_rows()
            assert (after.keys, after.buckets) == (before.keys, before.buckets), f"INV-LIM-9: {key!r} refused, changed"
            return
        assert forget_partition(self.app, key), f"INV-LIM-9: the engine kept idle {key!r}, the model forgot it"
        after = self._engine_rows()
        assert key not in after.keys, f"INV-LIM-9: {key!r} forgotten, its header row left"
        assert not [where for where in after.buckets if where[0] == key], f"INV-LIM-9: {key!r}'s buckets left"

    @rule(limits=limit_configs)
    def restart_with(self, limits):
        """The fleet restarts with new limit values: a new app re-bases every key at boot."""
        self.app = App(self.url, engine_config(limits), self.clock, engine=self.engine)
        claims.restart_with(self.app)
        self.model.restart_with(limits, self.now_us)

    # -- the comparison, after every rule --------------------------------------------------------

    def _engine_rows(self) -> abstraction.Rows:
        """Every row of the limits layer, read once per comparison."""
        with self.engine.connect() as conn:
            return abstraction.snapshot(conn)

    def _engine_key(self, key: str, rows: abstraction.Rows | None = None) -> tuple[int, list[int | None], int | None]:
        """The key as the model states it, through the one abstraction from rows to state
        (:mod:`ductwork_proof.conformance.abstraction`, which the refinement test of the lane
        routine uses too); a partition's levels follow its family's ``per_partition``."""
        rows = self._engine_rows() if rows is None else rows
        return abstraction.key_view(rows, key, self.app.config.entry_for(key))

    @invariant()
    def inv_lim_engine_agrees_with_model(self):
        """In-flight counts, bucket levels and stamps are the model's, key by key and
        partition by partition; the family's in-flight count over its partitions is the
        model's, and its header row (the lock a partition's claim takes first) exists
        once a partition has one [INV-LIM-8]."""
        if not hasattr(self, "model"):
            return
        rows = self._engine_rows()
        for key in self.compared_keys():
            in_flight, levels, blocked = self._engine_key(key, rows)
            assert in_flight == self.model.in_flight(key), f"INV-LIM-1/3: {key} in flight"
            assert levels == self.model.levels(key), f"INV-LIM-4: {key} levels {levels} != {self.model.levels(key)}"
            assert blocked == self.model.blocked_until(key), (
                f"INV-LIM-5: {key} blocked_until {blocked} != {self.model.blocked_until(key)}")
        for key in self.compared_keys():  # [INV-CLK-1] a key's numbers, across a forget too, are used once
            used = [s for e in rows.executions.values() if e.limit_key == key
                    for s in (e.claim_seq, e.release_seq) if s is not None]
            assert len(used) == len(set(used)), f"INV-CLK-1: {key} used a sequence number twice: {sorted(used)}"
        family = abstraction.family_in_flight(rows, FAMILY)
        assert family == self.model.family_in_flight(FAMILY), (
            f"INV-LIM-8: family {FAMILY} in flight {family} != {self.model.family_in_flight(FAMILY)}")
        if any(key in rows.keys for key in self.partitions):
            assert FAMILY in rows.keys, f"INV-LIM-8: partitions of {FAMILY} have header rows, the family none"

    @invariant()
    def inv_lim_model_invariants_hold(self):
        if hasattr(self, "model"):
            check_all(self.model)
