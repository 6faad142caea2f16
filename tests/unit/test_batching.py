"""A worker's batching policy (``fleet/batching.py``) and its settings, without a database.

Checks: the batch bound documented on ``fleet.worker.Worker`` (a batch is sized to run in
about ``batch_window`` at the recent pace, between one and ``batch_size``), the pace
bookkeeping, a thread's share of a key (never above the key's concurrency over the
process's threads, one for a rated key), when a group of successes is recorded; the token
alarm; and that a bad ``job_worker.batch_size`` / ``batch_window`` fails the load naming
its path.
The claims a batch makes are checked against the model in
``tests/properties/test_conformance_limits.py`` [INV-LIM-6], [INV-LIM-1].
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ductwork.config import MAX_BATCH_SIZE, Config
from ductwork.errors import ConfigError
from ductwork.fleet.batching import CPU_BOUND, Pace, batch_for, flush_due, keyed_batch
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
    # a window that holds exactly the batch at this pace holds all of it, though the window
    # over the pace, in floats, is a hair short of 27
    pace = 0.8598627063716503
    assert (pace * 27 / pace, batch_for(pace, pace * 27, 27)) == (26.999999999999996, 27)


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


@given(windows, sizes, st.lists(durations, min_size=1, max_size=20))
def test_a_pace_sizes_every_batch_within_its_bounds_and_averages_what_it_saw(window, size, timed):
    """Each noted body gives a batch of 1 to ``size``; the pace stays between the slowest
    and the fastest body noted."""
    pace = Pace(window, size)
    for seconds in timed:
        batch = pace.note(seconds, 0.0)
        assert 1 <= batch <= size
        assert batch == batch_for(pace.pace_s, window, size)
    assert min(timed) <= pace.pace_s <= max(timed)


def test_a_pace_worked_numbers():
    pace = Pace(0.05, 64)
    assert pace.pace_s is None  # nothing timed yet
    assert pace.note(0.0, 0.0) == 64  # a no-op
    assert pace.note(0.002, 0.0) == 50  # the average halves
    assert pace.pace_s == 0.001
    assert pace.note(0.01, 0.0) == 9
    assert pace.pace_s == 0.0055


def test_a_pace_averages_the_cpu_share_of_its_bodies():
    """The share of a body's time on its thread's CPU, averaged as the pace is; an instant
    body counts as all CPU, a body on the CPU longer than it ran (a clock's grain) as 1."""
    pace = Pace(0.05, 64)
    assert pace.cpu_share == 0.0  # nothing timed yet: as if waiting (the smaller share)
    pace.note(0.01, 0.01)
    assert pace.cpu_share == 1.0  # the first body sets it
    pace.note(0.01, 0.0)
    assert pace.cpu_share == 0.5
    pace.note(0.0, 0.0)
    assert pace.cpu_share == 0.75
    pace.note(0.001, 0.002)
    assert pace.cpu_share == 0.875


WIDE, THREE = LimitEntry("wide", 10, ()), LimitEntry("three", 3, ())
RATED = LimitEntry("r", None, (RateEntry(100, 1, 1),))


def test_keyed_batch_worked_numbers():
    """Five threads: a thread's share of ``concurrency: 10`` is two; of 3, one; a rated key:
    one; an unconfigured one, or one without a ceiling: the batch."""
    assert [keyed_batch(64, entry, 5) for entry in (WIDE, THREE, RATED, None)] == [2, 1, 1, 64]
    assert keyed_batch(64, WIDE, 1) == 10  # one thread: the key's whole concurrency
    assert keyed_batch(64, RATED, 1) == 64  # one thread: no other takes the tokens
    assert keyed_batch(64, RATED, 2) == 1  # two threads: the other may take the next token
    assert keyed_batch(3, WIDE, 1) == 3  # never more than the batch
    assert keyed_batch(64, LimitEntry("r", None, ()), 5) == 64


def test_a_cpu_bound_thread_takes_its_processs_share_of_a_key():
    """Bodies that keep the thread on the CPU (at least ``CPU_BOUND`` of their time) are run
    one at a time by the process's threads anyway: a thread may claim the process's share
    of the key, its concurrency over the fleet's processes; below that share, the thread's."""
    assert keyed_batch(64, WIDE, 5, cpu_share=CPU_BOUND) == 10
    assert keyed_batch(64, WIDE, 5, cpu_share=CPU_BOUND - 0.01) == 2
    assert keyed_batch(64, WIDE, 5, cpu_share=1.0, processes=3) == 3
    assert keyed_batch(64, WIDE, 5, cpu_share=1.0, processes=20) == 1  # at least one
    assert keyed_batch(64, RATED, 5, cpu_share=1.0) == 1  # a rate's tokens go to whichever thread is free
    assert keyed_batch(4, WIDE, 5, cpu_share=1.0) == 4  # never more than the batch


@given(sizes, st.integers(1, 1000), st.booleans(), st.integers(1, 64), st.floats(0, 1), st.integers(1, 64))
def test_a_keyed_batch_never_exceeds_the_threads_share_of_the_key(batch, concurrency, rated, threads, cpu_share,
                                                                 processes):
    """At least one, at most the batch; for a key with a concurrency, at most that over the
    process's threads (over the fleet's processes for CPU-bound bodies) unless that is below
    one; a rated key of a process of threads: one."""
    rates = (RateEntry(1, 1, 1),) if rated else ()
    took = keyed_batch(batch, LimitEntry("k", concurrency, rates), threads, cpu_share=cpu_share, processes=processes)
    sharers = processes if cpu_share >= CPU_BOUND else threads
    assert 1 <= took <= max(1, min(batch, concurrency // sharers))
    assert took == 1 or not rated or threads == 1
    assert keyed_batch(batch, LimitEntry("k", None, rates), threads) == (1 if rated and threads > 1 else batch)


@given(durations, windows)
def test_a_group_is_flushed_at_its_batchs_end_or_once_its_window_has_passed(waited, window):
    assert flush_due(False, waited, window)  # nothing left to run: at once
    assert flush_due(True, waited, window) == (waited >= window)


def _job_worker(**values):
    return Config.from_section({"job_worker": values}, source="<test>").job_worker


def test_batch_settings_default_and_parse():
    defaults = _job_worker()
    assert (defaults.batch_size, defaults.batch_window) == (64, 0.05)
    chosen = _job_worker(batch_size=1, batch_window=0.2)
    assert (chosen.batch_size, chosen.batch_window) == (1, 0.2)


@pytest.mark.parametrize(("key", "value"), [
    ("batch_size", 0), ("batch_size", MAX_BATCH_SIZE + 1), ("batch_size", "16"), ("batch_size", True),
    ("batch_size", 2.5), ("batch_window", -1), ("batch_window", "soon"),
])
def test_bad_batch_settings_name_their_path(key, value):
    with pytest.raises(ConfigError) as info:
        _job_worker(**{key: value})
    assert info.value.path == f"job_worker.{key}"
    assert info.value.value == value


def test_a_retired_setting_is_accepted_with_a_warning_that_says_it_is_ignored(caplog):
    """``job_worker.release_first_after`` (read before issue 32): a config written for that
    version still boots, and the log says the value is ignored and why."""
    with caplog.at_level("WARNING", logger="ductwork.config"):
        worker = _job_worker(release_first_after=0)
    assert not hasattr(worker, "release_first_after")
    assert [r.getMessage() for r in caplog.records] == [
        "job_worker.release_first_after is no longer read and is ignored: every success is now recorded in one "
        "transaction, its step advanced before the key's lock (issue 32); remove it"]
    with pytest.raises(ConfigError) as info:  # and a typo's error lists only the keys read now
        _job_worker(release_first_afterr=0)
    assert info.value.reason.endswith("batch_size, batch_window, max_retry, max_crash, limits")


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
    alarm.at(0.5)  # the very time set (another claim spent the same key's last token): already set
    assert (alarm.seconds_left(), alarm.changed.generation) == (0.5, seen)  # its loop is not woken for it
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
