"""Edges of the clocks and the id generator that the integration tier does not reach.

ManualClock refuses to move back (and stays put for a step of zero) and OffsetClock.skip_to
never moves back (INV-CLK-1: the one injectable clock only moves forward); what OffsetClock
tells a server-side routine of its time; new_id stays strictly increasing when
more than 4,096 ids are made within one millisecond (the counter carries into the
timestamp); machine_identifier falls back to the host name where /etc/machine-id is
unreadable.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest

from ductwork.db import clock, hosts, ids


def test_manual_clock_refuses_to_move_back_and_names_itself():
    start = datetime(2026, 1, 1, 12, 0, 0)
    manual = clock.ManualClock(start)
    with pytest.raises(ValueError, match="time only moves forward"):
        manual.advance(timedelta(seconds=-1))
    assert manual.now() == start
    assert repr(manual) == "ManualClock(2026-01-01T12:00:00)"


def test_manual_clock_advanced_by_nothing_stays_where_it_is():
    """A step of zero (a rule's delay that came out 0, ``advance()`` with no argument) is
    not a move back: the clock stays, no error."""
    start = datetime(2026, 1, 1, 12, 0, 0)
    manual = clock.ManualClock(start)
    assert manual.advance() == start
    assert manual.advance(timedelta(), microseconds=0) == start
    assert manual.advance(microseconds=1) == start + timedelta(microseconds=1)


def test_offset_clock_tells_a_server_routine_its_time_or_its_offset():
    """``in_sql`` (what a server-side routine reads after its locks): over a fixed clock
    (a test's) the fixed time moved by the offset; over the database's clock, no time and
    the offset to add to the database's own."""
    start = datetime(2026, 1, 1, 12, 0, 0)
    fixed = clock.OffsetClock(clock.ManualClock(start))
    flowing = clock.OffsetClock(clock.DatabaseClock())
    assert (fixed.in_sql(), flowing.in_sql()) == ((start, timedelta()), (None, timedelta()))
    fixed.skip_to(start + timedelta(seconds=5), start)
    flowing.skip_to(start + timedelta(seconds=7), start)
    assert fixed.in_sql() == (start + timedelta(seconds=5), timedelta())
    assert flowing.in_sql() == (None, timedelta(seconds=7))


def test_offset_clock_skip_to_never_moves_back():
    start = datetime(2026, 1, 1, 12, 0, 0)
    offset = clock.OffsetClock(clock.ManualClock(start))
    offset.skip_to(start - timedelta(seconds=5), start)
    assert offset.offset == timedelta()
    offset.skip_to(start + timedelta(seconds=5), start)
    assert offset.offset == timedelta(seconds=5)
    assert repr(offset) == "OffsetClock(ManualClock(2026-01-01T12:00:00), offset=0:00:05)"


def test_new_id_carries_a_full_counter_into_the_timestamp(monkeypatch):
    future_ms = 2 ** 47  # far ahead of the real clock, so every call takes the counter path
    monkeypatch.setattr(ids, "_last_ms", future_ms)
    monkeypatch.setattr(ids, "_counter", 0xFFF)
    first, second = ids.new_id(), ids.new_id()
    assert first < second
    assert [uuid.UUID(i).int >> 80 for i in (first, second)] == [future_ms + 1, future_ms + 1]


def test_machine_identifier_without_machine_id_is_the_host_name(monkeypatch):
    def unreadable(_self):  # type: ignore[no-untyped-def]
        raise PermissionError("/etc/machine-id")

    monkeypatch.setattr(hosts.Path, "read_text", unreadable)
    assert hosts.machine_identifier() == hosts.socket.gethostname()[:255]


def test_ids_made_in_one_millisecond_count_on_and_the_4097th_moves_to_the_next(monkeypatch):
    """``ids.new_id`` within one millisecond: the 12-bit counter after the time counts 0,
    1, 2, … so each id is greater than the one before (the random bits after it never
    decide), up to 4,095; the next id takes the next millisecond, its counter 0."""
    start = 1_800_000_000_000  # (2027-01-15, a fixed clock; _last_ms set below it)
    monkeypatch.setattr(ids.time, "time_ns", lambda: start * 1_000_000)
    monkeypatch.setattr(ids, "_last_ms", 0)
    made = [uuid.UUID(ids.new_id()).int for _ in range(4097)]
    fields = [(value >> 80, (value >> 64) & 0xFFF) for value in made]
    assert (fields[:3], fields[4095], fields[4096]) == (
        [(start, 0), (start, 1), (start, 2)], (start, 4095), (start + 1, 0))
    assert (made == sorted(made), len(set(made))) == (True, 4097)
