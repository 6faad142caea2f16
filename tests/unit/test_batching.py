"""A worker's batching policy (``fleet/batching.py``) and its settings, without a database.

Checks: the batch bound documented on ``fleet.worker.Worker`` (a batch is sized to run in
about ``batch_window`` at the recent pace, between one and ``batch_size``), the pace and
CPU-share bookkeeping, a thread's share of a key run in a row (never above the key's
concurrency over its shares, one for a rated key), which successes wait for a group
commit and when that group is recorded, the first claim's top-up; the token alarm; and
that a bad ``job_worker.batch_size`` / ``batch_window`` fails the load naming its path.
The claims a batch makes are checked against the model in
``tests/properties/test_conformance_limits.py`` [INV-LIM-6], [INV-LIM-1].
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ductwork.config import MAX_BATCH_SIZE, Config
from ductwork.errors import ConfigError
from ductwork.fleet.batching import Pace, batch_for, flush_due, groups, in_a_row, tops_up
from ductwork.fleet.shared import TokenAlarm
from ductwork.fleet.worker import Worker
from ductwork.limit_entries import LimitEntry, RateEntry

paces = st.floats(min_value=0, max_value=3600, allow_nan=False)
windows = st.floats(min_value=1e-6, max_value=60, allow_nan=False)
sizes = st.integers(1, MAX_BATCH_SIZE)


def test_a_worker_built_by_hand_refuses_a_batch_size_below_one():
    """``Worker(app, batch_size=…)`` (tests, scripts) checks what the config's loader checks."""
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        Worker(None, batch_size=0)


def test_batch_for_worked_numbers():
    assert batch_for(0.0001, 0.05, 16) == 16  # no-op steps: the whole batch
    assert batch_for(0.02, 0.05, 16) == 2  # 20 ms steps: two fit in 50 ms
    assert batch_for(3.0, 0.05, 16) == 1  # slow steps: one at a time, as without batches
    assert batch_for(0.0, 0.05, 16) == 16  # an untimed (instant) step


@given(paces, windows, sizes)
def test_a_batch_is_between_one_and_its_size_and_fits_its_window(pace, window, size):
    batch = batch_for(pace, window, size)
    assert 1 <= batch <= size
    assert batch == 1 or batch * pace <= window


@given(paces, paces, windows, sizes)
def test_slower_steps_never_make_bigger_batches(a, b, window, size):
    fast, slow = sorted((a, b))
    assert batch_for(slow, window, size) <= batch_for(fast, window, size)


durations = st.floats(min_value=0, max_value=60, allow_nan=False)
bodies = st.tuples(durations, st.floats(min_value=0, max_value=1)).map(lambda t: (t[0], t[0] * t[1]))
shares = st.floats(min_value=0, max_value=1)


@given(windows, sizes, st.lists(bodies, min_size=1, max_size=20))
def test_a_pace_sizes_every_batch_within_its_bounds_and_averages_what_it_saw(window, size, timed):
    """Each noted body gives a batch of 1 to ``size``; the pace stays between the slowest
    and the fastest body noted, the CPU share between 0 and 1."""
    pace = Pace(window, size)
    for seconds, cpu_s in timed:
        batch = pace.note(seconds, cpu_s)
        assert 1 <= batch <= size
        assert batch == batch_for(pace.pace_s, window, size)
    assert min(s for s, _ in timed) <= pace.pace_s <= max(s for s, _ in timed)
    assert 0 <= pace.cpu_share <= 1


def test_a_pace_worked_numbers():
    pace = Pace(0.05, 64)
    assert (pace.pace_s, pace.cpu_share) == (None, None)  # nothing timed yet
    assert pace.note(0.0, 0.0) == 64  # a no-op: all of it this thread's CPU
    assert (pace.pace_s, pace.cpu_share) == (0.0, 1.0)
    assert pace.note(0.002, 0.0) == 50  # a body that only waited: the averages halve
    assert (pace.pace_s, pace.cpu_share) == (0.001, 0.5)
    assert pace.note(0.01, 0.02) == 9  # more CPU than wall time (other threads' too): a share of 1
    assert (pace.pace_s, pace.cpu_share) == (0.0055, 0.75)


WIDE, THREE = LimitEntry("wide", 10, ()), LimitEntry("three", 3, ())
RATED = LimitEntry("r", None, (RateEntry(100, 1, 1),))


def test_in_a_row_worked_numbers():
    """Five threads, fast bodies that mostly wait: a thread's share of ``concurrency: 10``
    is two; of 3, one; a rated key or an unconfigured one: one, the batch. Bodies that
    mostly run Python: the process's share (10 over the supervisor's processes)."""
    waiting = {"cpu_share": 0.0, "threads": 5, "processes": 2}
    assert [in_a_row(64, entry, **waiting) for entry in (WIDE, THREE, RATED, None)] == [2, 1, 1, 64]
    running = {"cpu_share": 0.5, "threads": 5, "processes": 2}
    assert [in_a_row(64, entry, **running) for entry in (WIDE, THREE, RATED, None)] == [5, 1, 1, 64]
    assert in_a_row(64, WIDE, cpu_share=None, threads=5, processes=2) == 2  # untimed: the thread's share
    assert in_a_row(3, WIDE, cpu_share=1.0, threads=5, processes=1) == 3  # never more than the batch


@given(sizes, st.integers(1, 1000), st.booleans(), st.one_of(st.none(), shares), st.integers(1, 64),
       st.integers(1, 64))
def test_in_a_row_never_exceeds_its_share_of_the_key(batch, concurrency, rated, cpu_share, threads, processes):
    """At least one, at most the batch; for a key with a concurrency, at most that over its
    shares (the thread's or the process's) unless that is below one; a rated key: one."""
    rates = (RateEntry(1, 1, 1),) if rated else ()
    ran = in_a_row(batch, LimitEntry("k", concurrency, rates), cpu_share=cpu_share, threads=threads,
                   processes=processes)
    share = processes if cpu_share is not None and cpu_share >= 0.5 else threads
    assert 1 <= ran <= max(1, min(batch, concurrency // share))
    assert ran == 1 or not rated
    assert in_a_row(batch, LimitEntry("k", None, rates), cpu_share=cpu_share, threads=threads,
                    processes=processes) == (1 if rated else batch)


def test_which_successes_wait_for_the_threads_group_commit():
    """With batches: unkeyed ones, a lone worker's keyed ones, and keyed ones run in a row;
    a process thread's other keyed successes go to the process's keyed group commit."""
    assert groups(8, keyed=False, alone=False, in_a_row=False)
    assert groups(8, keyed=True, alone=True, in_a_row=False)
    assert groups(8, keyed=True, alone=False, in_a_row=True)
    assert not groups(8, keyed=True, alone=False, in_a_row=False)
    for keyed in (False, True):
        for alone in (False, True):
            assert not groups(1, keyed=keyed, alone=alone, in_a_row=True)  # no batches: each alone


@given(durations, windows)
def test_a_group_is_flushed_at_its_batchs_end_or_once_its_window_has_passed(waited, window):
    assert flush_due(False, waited, window)  # nothing left to run: at once
    assert flush_due(True, waited, window) == (waited >= window)


def test_only_a_lone_unkeyed_first_claim_is_topped_up():
    unkeyed, keyed = SimpleNamespace(limit_key=None), SimpleNamespace(limit_key="k")
    assert tops_up([unkeyed], 1, 8)
    assert not tops_up([keyed], 1, 8)  # a keyed claim took its share already
    assert not tops_up([unkeyed, unkeyed], 2, 8)  # not a first claim: its pace is known
    assert not tops_up([unkeyed], 8, 8)  # a full batch
    assert not tops_up([], 1, 8)


def _job_worker(**values):
    return Config.from_section({"job_worker": values}, source="<test>").job_worker


def test_batch_settings_default_and_parse():
    defaults = _job_worker()
    assert (defaults.batch_size, defaults.batch_window, defaults.release_first_after) == (64, 0.05, 0.005)
    chosen = _job_worker(batch_size=1, batch_window=0.2, release_first_after=0)
    assert (chosen.batch_size, chosen.batch_window, chosen.release_first_after) == (1, 0.2, 0)


@pytest.mark.parametrize(("key", "value"), [
    ("batch_size", 0), ("batch_size", MAX_BATCH_SIZE + 1), ("batch_size", "16"), ("batch_size", True),
    ("batch_size", 2.5), ("batch_window", -1), ("batch_window", "soon"),
    ("release_first_after", -0.001), ("release_first_after", "soon"), ("release_first_after", True),
])
def test_bad_batch_settings_name_their_path(key, value):
    with pytest.raises(ConfigError) as info:
        _job_worker(**{key: value})
    assert info.value.path == f"job_worker.{key}"
    assert info.value.value == value


def test_a_negative_release_first_after_says_zero_is_allowed():
    with pytest.raises(ConfigError) as info:
        _job_worker(release_first_after=-1)
    assert (info.value.path, info.value.value, info.value.reason) == (
        "job_worker.release_first_after", -1, "must be 0 or a positive time")


def test_a_token_alarm_wakes_one_thread_once_its_earliest_time_has_come():
    """``TokenAlarm`` (a rated key's next token, set by the claim that spent the last):
    the earliest time set wins, ``run_once`` wakes exactly one thread when it has come and
    clears it, and a new earlier time notifies the alarm's own loop (``changed``)."""
    now = [10.0]
    woken: list[int] = []
    alarm = TokenAlarm(woken.append, clock=lambda: now[0])
    assert (alarm.seconds_left(), alarm.run_once()) == (None, False)
    seen = alarm.changed.generation
    alarm.at(0.5)
    assert alarm.changed.generation != seen  # the loop re-reads its wait
    seen = alarm.changed.generation
    alarm.at(2.0)  # later than the one set: ignored
    assert (alarm.seconds_left(), alarm.changed.generation) == (0.5, seen)
    alarm.at(0.25)
    assert alarm.seconds_left() == 0.25
    now[0] = 10.2
    assert (alarm.run_once(), woken) == (False, [])
    now[0] = 10.25
    assert alarm.seconds_left() == 0.0
    assert (alarm.run_once(), woken) == (True, [1])
    assert (alarm.run_once(), alarm.seconds_left(), woken) == (False, None, [1])
    alarm.at(-1.0)  # a token already due: at once
    assert (alarm.seconds_left(), alarm.run_once(), woken) == (0.0, True, [1, 1])
