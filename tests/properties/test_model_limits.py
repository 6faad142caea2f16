"""``LimitsModelMachine``: the limits model alone, driven by random polls, completions,
crashes, reaps, clock moves and restarts; every invariant after every step.
``PartitionedLimitsModelMachine``: the same with a key family (semantics §5.1, model only:
issue 34), its partitions rendered from hostile values, and idle partitions forgotten.

Checks: INV-LIM-1, INV-LIM-2, INV-LIM-3, INV-LIM-4, INV-LIM-5, INV-LIM-6, INV-EXE-2
(a reaped worker's late completion is rejected), INV-LIM-8 and INV-LIM-9 (model only).
"""

from __future__ import annotations

import copy
import json
import os

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

# the model as ductwork_model, as in the other model machines: test_model_mutants runs each machine
# against ductwork_model's mutants
from ductwork_model.errors import CommitFailed, ConfigError, PreconditionError
from ductwork_model.invariants import INVARIANT_FUNCTIONS
from ductwork_model.limits import MAX_KEY_CHARS, LimitsModel, limits_for, partition_key, split_partition_key
from tests.properties.strategies import (
    FAMILY,
    LIMIT_KEYS,
    limits_configs,
    partition_values,
    partitioned_limits_configs,
)

#: steps per example: the ci profile's 100 examples of 40 steps take a few seconds
STEPS = 100 if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else 40
CLOCK_STEPS = st.one_of(st.sampled_from([0, 1, 999, 1_000, 250_000, 500_000, 1_000_000, 5_000_000, 60_000_000]),
                        st.integers(0, 2_000_000))


def _state(model: LimitsModel) -> tuple:
    """What a claim changes: each job's state and owner, the buckets and the stamps."""
    return ({j.job_id: (j.state, j.worker, j.claimed_at_us) for j in model.jobs.values()},
            dict(model.buckets), dict(model.stamps))


class LimitsModelMachine(RuleBasedStateMachine):
    """Nouns: jobs, workers, keys. ``model_class`` is swapped for mutants."""

    model_class: type[LimitsModel] = LimitsModel

    @initialize(config=limits_configs())
    def configure(self, config):
        self._start(config)

    def _start(self, config):
        self.model = self.model_class(config)
        self.now = 0
        self.jobs = 0
        self.live = ["w0", "w1"]
        self.workers = 2
        self.reaped_alive: list = []  # jobs reaped from a worker that is still alive

    def _job_id(self) -> int:
        self.jobs += 1
        return self.jobs

    # ------------------------------------------------------------------ rules

    @rule(keys=st.lists(st.sampled_from((None, "a", *LIMIT_KEYS)), min_size=1, max_size=3),
          delay=st.sampled_from([0, 0, 1, 500_000, 2_000_000]))
    def enqueue(self, keys, delay):
        """A few jobs at once, keyed ``a`` most often; creation order is list order."""
        for key in keys:
            self.model.enqueue(self._job_id(), key, self.now + delay)

    @rule()
    def poll(self):
        """The oldest live worker polls once. No arguments on purpose: hypothesis tries
        argument-free rules first, so polling is what an example does by default."""
        self.model.claim(self.live[0], self.now)

    @rule(data=st.data(), polls=st.integers(1, 3))
    def claim(self, data, polls):
        """One to three polls at the same instant, by random live workers."""
        for _ in range(polls):
            self.model.claim(data.draw(st.sampled_from(self.live)), self.now)

    @precondition(lambda self: len(self.live) > 0)
    @rule(data=st.data(), limit=st.integers(1, 4), keyed_limit=st.integers(1, 4))
    def claim_batch(self, data, limit, keyed_limit):
        """A batch claim is what polls in a row would claim, made on a copy of the model
        one at a time: the same jobs, then the same jobs, buckets and stamps (the same
        decisions and spends [INV-LIM-2, INV-LIM-5]). It claims in runs of one lane, each
        within its share, and goes on past a run only when the run filled its key's
        concurrency (then the next poll is another lane's, and may claim nothing); a run
        below its share stops only where the next poll would try another lane first or be
        refused [INV-LIM-6]."""
        worker = data.draw(st.sampled_from(self.live))
        polls = copy.deepcopy(self.model)
        claimed = self.model.claim_batch(worker, self.now, limit, keyed_limit)
        most = max(limit, keyed_limit)
        assert len(claimed) <= most
        assert [polls.claim(worker, self.now) for _ in claimed] == claimed, "a batch is polls in a row"
        runs: list[list[str]] = []
        for job in claimed:
            if runs and self.model.jobs[runs[-1][0]].key == self.model.jobs[job].key:
                runs[-1].append(job)
            else:
                runs.append([job])
        taken = 0
        for i, run in enumerate(runs):
            key = self.model.jobs[run[0]].key
            assert len(run) <= min(limit if key is None else keyed_limit, most - taken), "a run within its share"
            taken += len(run)
            limits = None if key is None else limits_for(self.model.config, key)
            filled = limits is not None and limits.concurrency is not None and len(run) >= limits.concurrency
            assert filled or i == len(runs) - 1, "a batch goes on only past a key its run filled"
        if not runs or (filled and len(claimed) < most):  # the poll after the last run claimed nothing
            assert polls.claim(worker, self.now) is None
        assert _state(polls) == _state(self.model), "a batch decides, spends and stamps as polls do"
        if runs and not filled and len(runs[-1]) < min(limit if key is None else keyed_limit, most - taken + len(run)):
            polls.claim(worker, self.now)  # why the run stopped: the next poll tries another lane first, or is refused
            tried = [lane for lane in polls.polls[-1].lanes if lane.verdict not in ("blocked", "saturated")]
            assert not tried or tried[0].key != key or tried[0].verdict.startswith("refused"), tried

    @precondition(lambda self: any(self.model.jobs[j].worker in self.live for j in self.model.in_flight_jobs()))
    @rule(data=st.data(), outcome=st.sampled_from(["success", "failure", "timed_out"]))
    def complete(self, data, outcome):
        mine = [j for j in self.model.in_flight_jobs() if self.model.jobs[j].worker in self.live]
        self.model.complete(data.draw(st.sampled_from(mine)), self.now, outcome)

    @precondition(lambda self: any(self.model.jobs[j].worker in self.live for j in self.model.in_flight_jobs()))
    @rule(data=st.data())
    def complete_and_hand_off(self, data):
        """A success (a group of one) whose commit takes its lane's next job for the same worker
        when a poll would."""
        mine = [j for j in self.model.in_flight_jobs() if self.model.jobs[j].worker in self.live]
        job = data.draw(st.sampled_from(mine))
        worker = self.model.jobs[job].worker
        handed = self.model.complete_all_and_hand_off([job], self.now, data.draw(st.sampled_from([1, 1, 3])))
        assert all(self.model.jobs[h].worker == worker for h in handed)
        assert len(handed) <= 1 or all(self.model.jobs[h].key is None for h in handed)  # a keyed hand-off: one

    @precondition(lambda self: any(self.model.jobs[j].worker in self.live and self.model.jobs[j].key is not None
                                   for j in self.model.in_flight_jobs()))
    @rule(data=st.data(), keyed_limit=st.integers(1, 3))
    def complete_keyed_group_and_hand_off(self, data, keyed_limit):
        """A keyed group commit: successes of one key by one worker recorded at once, then
        what ``keyed_limit`` polls in a row would claim of that key, and nothing else: the
        same jobs and state as completing them, then polling while the key stays first."""
        mine = [j for j in self.model.in_flight_jobs()
                if self.model.jobs[j].worker in self.live and self.model.jobs[j].key is not None]
        first = data.draw(st.sampled_from(mine))
        worker, key = self.model.jobs[first].worker, self.model.jobs[first].key
        same = sorted((j for j in mine if self.model.jobs[j].worker == worker and self.model.jobs[j].key == key),
                      key=repr)
        group = data.draw(st.lists(st.sampled_from(same), min_size=1, max_size=3, unique=True))
        reference = copy.deepcopy(self.model)
        handed = self.model.complete_all_and_hand_off(group, self.now, 1, keyed_limit)
        for job in group:
            reference.complete(job, self.now)
        expected = []
        while len(expected) < keyed_limit:
            _, candidates = reference._lanes(self.now)
            if not candidates or candidates[0].key != key or not reference._would_admit(key, self.now):
                break
            expected.append(reference.claim(worker, self.now))
        assert handed == expected, f"keyed group hand-off {handed}, polls in a row {expected}"
        assert _state(self.model) == _state(reference)

    @precondition(lambda self: self.reaped_alive)
    @rule(data=st.data())
    def late_complete(self, data):
        job = data.draw(st.sampled_from(self.reaped_alive))
        with pytest.raises(CommitFailed):
            self.model.complete(job, self.now)

    @precondition(lambda self: len(self.live) > 0)
    @rule(data=st.data())
    def crash_worker(self, data):
        worker = data.draw(st.sampled_from(self.live))
        self.model.crash_worker(worker, self.now)
        self.live.remove(worker)
        self.live.append(f"w{self.workers}")
        self.workers += 1

    @precondition(lambda self: self.model.in_flight_jobs())
    @rule(data=st.data(), requeue=st.booleans(), delay=st.sampled_from([0, 1, 1_000_000]))
    def reap(self, data, requeue, delay):
        """Reap a dead worker, or a live one that missed heartbeats (its late commit must fail)."""
        owners = sorted({self.model.jobs[j].worker for j in self.model.in_flight_jobs()})
        worker = data.draw(st.sampled_from(owners))
        plan = {j: (self._job_id(), self.now + delay) for j in self.model.in_flight_jobs(worker)} if requeue else None
        reaped = self.model.reap(worker, self.now, plan)
        if worker in self.live:
            self.reaped_alive += reaped

    @rule(dt=CLOCK_STEPS)
    def advance_clock(self, dt):
        self.now += dt

    @precondition(lambda self: any(stamp > self.now for stamp in self.model.stamps.values()))
    @rule(data=st.data(), early=st.sampled_from([0, 1]))
    def advance_clock_to_stamp(self, data, early):
        """Jump to a key's ``blocked_until`` (or 1 µs before): the edge INV-LIM-5 is about."""
        stamps = sorted(stamp for stamp in self.model.stamps.values() if stamp > self.now)
        self.now = max(self.now, data.draw(st.sampled_from(stamps)) - early)

    @rule(config=limits_configs())
    def restart_with_config(self, config):
        self._restart(config)

    def _restart(self, config):
        before = dict(self.model.buckets)
        self.model.restart_with(config, self.now)
        for where, bucket in self.model.buckets.items():
            assert before[where] == bucket, f"[INV-LIM-4] restart changed kept bucket {where}"
        assert self.model.stamps == {}

    # ------------------------------------------------------------------ invariants

    @invariant()
    def inv_lim_1_in_flight_within_concurrency(self):
        INVARIANT_FUNCTIONS["INV-LIM-1"](self.model)

    @invariant()
    def inv_lim_2_rate_window(self):
        INVARIANT_FUNCTIONS["INV-LIM-2"](self.model)

    @invariant()
    def inv_lim_3_no_leaked_slots(self):
        INVARIANT_FUNCTIONS["INV-LIM-3"](self.model)

    @invariant()
    def inv_lim_4_levels_in_range(self):
        INVARIANT_FUNCTIONS["INV-LIM-4"](self.model)

    @invariant()
    def inv_lim_5_stamp_exact(self):
        INVARIANT_FUNCTIONS["INV-LIM-5"](self.model)

    @invariant()
    def inv_lim_6_fifo(self):
        INVARIANT_FUNCTIONS["INV-LIM-6"](self.model)

    @invariant()
    def inv_lim_8_family_within_ceiling(self):
        INVARIANT_FUNCTIONS["INV-LIM-8"](self.model)

    @invariant()
    def inv_lim_9_forget_adds_no_tokens(self):
        INVARIANT_FUNCTIONS["INV-LIM-9"](self.model)


LimitsModelMachine.TestCase.settings = settings(stateful_step_count=STEPS)
TestLimitsModel = LimitsModelMachine.TestCase


def _unstorable(value) -> bool:
    """Whether ``value`` has no partition key: another type than a string or an integer, a lone
    surrogate (no UTF-8 form), or a rendered key over ``MAX_KEY_CHARS`` (semantics §5.1)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return True
    if isinstance(value, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        return True
    return len(f"{FAMILY}[{json.dumps(value, ensure_ascii=False, separators=(',', ':'))}]") > MAX_KEY_CHARS


def _render(value) -> str | None:
    """The partition key of ``value`` in family ``p``, or None when it is refused: a
    ``ConfigError`` naming the value, for exactly the values that cannot be stored."""
    if _unstorable(value):
        with pytest.raises(ConfigError) as raised:
            partition_key(FAMILY, value)
        assert raised.value.value == value
        assert raised.value.path == "limit_by"
        return None
    key = partition_key(FAMILY, value)
    # one-to-one and data only: the key is family[JSON], inverts to the value, holds no NUL
    assert key.startswith(f"{FAMILY}[")
    assert key.endswith("]")
    assert "\x00" not in key
    assert len(key) <= MAX_KEY_CHARS
    assert split_partition_key(key) == (FAMILY, value), key
    return key


class PartitionedLimitsModelMachine(LimitsModelMachine):
    """The limits machine with a key family ``p``: per-partition limits and, often, a
    ceiling over the family; its partitions are rendered from hostile values drawn at the
    start (so several jobs share one); idle partitions are forgotten, one or all at once.
    Every invariant after every step, INV-LIM-8 and INV-LIM-9 included."""

    @initialize(config=partitioned_limits_configs(), values=st.lists(partition_values(), min_size=1, max_size=4))
    def configure(self, config, values):
        self._start(config)
        rendered = [key for key in map(_render, values) if key is not None]
        self.partitions = list(dict.fromkeys([*rendered, partition_key(FAMILY, 0)]))

    @rule(data=st.data(), delay=st.sampled_from([0, 0, 1, 500_000, 2_000_000]))
    def enqueue(self, data, delay):
        """A few jobs at once, on partitions of ``p`` most often, else on static keys or the
        unkeyed lane; creation order is list order."""
        lanes = st.one_of(st.sampled_from(self.partitions), st.sampled_from((None, "a", *LIMIT_KEYS)))
        for key in data.draw(st.lists(lanes, min_size=1, max_size=3)):
            self.model.enqueue(self._job_id(), key, self.now + delay)

    @rule(value=partition_values())
    def render(self, value):
        """Any value from a tenant's data renders to one key of ``p`` or is refused by name."""
        _render(value)

    @rule(config=partitioned_limits_configs())
    def restart_with_config(self, config):
        self._restart(config)

    def _busy(self, key) -> bool:
        return any(job.key == key and job.state != "completed" for job in self.model.jobs.values())

    @rule(data=st.data())
    def forget_partition(self, data):
        """Forget one partition: when idle its rows go; when busy it is refused, changing nothing."""
        key = data.draw(st.sampled_from(self.partitions))
        if self._busy(key):
            before = (dict(self.model.buckets), dict(self.model.stamps), len(self.model.events))
            with pytest.raises(PreconditionError):
                self.model.forget_partition(key, self.now)
            assert (dict(self.model.buckets), dict(self.model.stamps), len(self.model.events)) == before
            return
        self.model.forget_partition(key, self.now)
        left = [w for w in self.model.buckets if w[0] == key]
        assert not left, f"[INV-LIM-9] forgotten {key!r} keeps buckets {left}"
        assert key not in self.model.stamps, f"[INV-LIM-9] forgotten {key!r} keeps its stamp"

    def _idle_with_rows(self) -> list:
        held = {key for key, _ in self.model.buckets} | set(self.model.stamps)
        return sorted(k for k in held if split_partition_key(k) is not None and not self._busy(k))

    @precondition(lambda self: self._idle_with_rows())
    @rule()
    def forget_idle_partitions(self):
        """Forget every idle partition with rows: the rows left belong to static keys and to
        partitions with work, however many partitions were ever seen (bounded state)."""
        for key in self._idle_with_rows():
            self.model.forget_partition(key, self.now)
        left = {key for key, _ in self.model.buckets} | set(self.model.stamps)
        idle = sorted(key for key in left if split_partition_key(key) is not None and not self._busy(key))
        assert not idle, f"[INV-LIM-9] idle partitions keep rows after every idle one was forgotten: {idle}"


PartitionedLimitsModelMachine.TestCase.settings = settings(stateful_step_count=STEPS)
TestPartitionedLimitsModel = PartitionedLimitsModelMachine.TestCase

