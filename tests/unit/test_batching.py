"""How big a worker's batch may be, and how its settings are checked (no database).

Checks: the batch bound documented on ``fleet.worker.Worker`` (a batch is sized to run in
about ``batch_window`` at the recent pace, between one and ``batch_size``), and that
a bad ``job_worker.batch_size`` / ``batch_window`` fails the load naming its path.
The claims a batch makes are checked against the model in
``tests/properties/test_conformance_limits.py`` [INV-LIM-6].
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ductwork.config import MAX_BATCH_SIZE, Config
from ductwork.errors import ConfigError
from ductwork.fleet.shared import TokenAlarm
from ductwork.fleet.worker import Worker, batch_for

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
