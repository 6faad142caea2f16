"""The lane routine's specification (``ductwork.limits.plan``), without a database.

``plan`` is what the SQL of each backend is checked against (tests/properties/
test_refinement.py) and what SQLite runs. Here each of its decisions is pinned by a worked
example compared whole, and its batch rule by a property: a claim of ``take`` is the claims
that ``take`` polls made one after another would make, each on what the previous one left
[INV-LIM-1, INV-LIM-2, INV-LIM-6].
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from ductwork.limit_entries import LimitEntry, RateEntry, entry_digest
from ductwork.limits.buckets import Bucket, decide
from ductwork.limits.lanes import Position
from ductwork.limits.plan import NOTHING, KeyRow, LaneState, Plan, Request, plan

T0 = datetime(2026, 1, 1)
NOW = 5_000_000
C2 = LimitEntry("k", concurrency=2, rates=())
R1 = LimitEntry("k", concurrency=None, rates=(RateEntry(limit=1, per_s=1, burst=1),))
R3 = LimitEntry("k", concurrency=3, rates=(RateEntry(limit=1, per_s=1, burst=3),))


def _at(n: int, id_: str | None = None) -> Position:
    return Position(T0 + timedelta(seconds=n), id_ or f"e{n}")


def _state(entry: LimitEntry | None, *, in_flight: int = 0, candidates: int = 3, bound: int | None = None,
           buckets: dict[int, Bucket] | None = None, digest: str | None = "same") -> LaneState:
    key = KeyRow(7, entry_digest(entry) if digest == "same" else digest, buckets or {})
    return LaneState(NOW, key, in_flight, tuple(_at(n) for n in range(candidates)),
                     None if bound is None else _at(bound, "a"))  # at a tie, before the lane's


def _full(entry: LimitEntry, tokens: int) -> dict[int, Bucket]:
    """Buckets holding ``tokens`` tokens each, refilled up to now."""
    return {r.per_s: Bucket(r.per_s, tokens * r.units_per_token, NOW) for r in entry.rates}


def test_nothing_to_take_decides_nothing():
    assert plan(_state(C2), Request("k", C2, take=0, poll=True)) == NOTHING


def test_nothing_eligible_is_a_polls_gone_and_a_hand_offs_nothing():
    assert plan(_state(C2, candidates=0), Request("k", C2, take=1, poll=True)) == Plan(refused="gone")
    assert plan(_state(C2, candidates=0), Request("k", C2, take=1, poll=False)) == NOTHING


def test_a_key_without_its_row_is_a_polls_gone_and_a_hand_offs_nothing():
    """Defensive in the engine (an execution's key row is written with it): a keyed lane read
    without a row claims nothing."""
    rowless = LaneState(NOW, None, 0, (_at(0),), None)
    assert plan(rowless, Request("k", C2, take=1, poll=True)) == Plan(refused="gone")
    assert plan(rowless, Request("k", C2, take=1, poll=False)) == NOTHING


def test_a_hand_off_whose_lane_is_not_first_writes_nothing_and_a_poll_claims_regardless():
    """[INV-LIM-6] another lane's oldest is a second older than this lane's: the hand-off
    leaves the lane to a poll, which tries the other lane first."""
    state = LaneState(NOW, KeyRow(7, entry_digest(C2), {}), 0, (_at(0),), Position(T0 - timedelta(seconds=1), "x"))
    assert plan(state, Request("k", C2, take=1, poll=False)) == NOTHING
    assert plan(state, Request("k", C2, take=1, poll=True)).claims == ("e0",)
    # a bound at the lane's own oldest position is not before it: the hand-off claims
    level = LaneState(NOW, state.key, 0, (_at(0),), _at(0))
    assert plan(level, Request("k", C2, take=1, poll=False)).claims == ("e0",)


def test_the_unkeyed_lane_claims_up_to_take_and_stops_at_another_lanes_oldest():
    unkeyed = LaneState(NOW, None, 0, tuple(_at(n) for n in range(4)), None)
    assert plan(unkeyed, Request(None, None, take=3, poll=True)) == Plan(claims=("e0", "e1", "e2"))
    bounded = LaneState(NOW, None, 0, tuple(_at(n) for n in range(4)), _at(2, "a"))
    assert plan(bounded, Request(None, None, take=4, poll=False)) == Plan(claims=("e0", "e1"))


def test_a_concurrency_refusal_writes_nothing_and_a_hand_off_says_nothing():
    state = _state(C2, in_flight=2)
    assert plan(state, Request("k", C2, take=1, poll=True)) == Plan(refused="concurrency")
    assert plan(state, Request("k", C2, take=1, poll=False)) == NOTHING


def test_a_rate_refusal_writes_its_refill_and_stamp_on_a_poll_only():
    state = _state(R1, buckets={1: Bucket(1, 400_000, NOW - 100_000)})  # 0.4 + 0.1 token
    decision = decide(R1, state.key.buckets, 0, NOW)
    assert (decision.admitted, decision.stamp) == (False, True)
    assert plan(state, Request("k", R1, take=1, poll=True)) == Plan(
        buckets=decision.buckets, stamp=True, blocked_until_us=NOW + 500_000, refused="rate")
    assert plan(state, Request("k", R1, take=1, poll=False)) == NOTHING


def test_a_batch_stops_at_the_concurrency_and_writes_the_last_admitted_decision():
    claimed = plan(_state(R3, in_flight=1, buckets=_full(R3, 3)), Request("k", R3, take=3, poll=True))
    first = decide(R3, _full(R3, 3), 1, NOW)
    one_left = decide(R3, {1: first.buckets[0]}, 2, NOW)
    assert claimed == Plan(claims=("e0", "e1"), buckets=one_left.buckets, stamp=one_left.stamp,
                           blocked_until_us=one_left.blocked_until_us)
    assert claimed.buckets == (Bucket(1, 1_000_000, NOW),)


def test_a_batch_stops_at_the_rate_leaving_no_trace_of_the_refusal():
    claimed = plan(_state(R3, buckets=_full(R3, 2)), Request("k", R3, take=3, poll=True))
    assert claimed.claims == ("e0", "e1")
    assert claimed.buckets == (Bucket(1, 0, NOW),)
    assert (claimed.stamp, claimed.blocked_until_us, claimed.refused) == (True, NOW + 1_000_000, None)


def test_a_batch_stops_before_another_lanes_oldest():
    assert plan(_state(C2, bound=1), Request("k", C2, take=2, poll=True)).claims == ("e0",)
    assert plan(_state(C2, bound=2), Request("k", C2, take=2, poll=True)).claims == ("e0", "e1")


def test_a_key_of_other_values_is_left_to_a_poll_which_rebases_it():
    """[INV-LIM-4] the stored digest is another config's: a hand-off writes nothing; a poll
    keeps the buckets of the periods the entry still has, drops the others and writes the
    digest, and a concurrency refusal after a re-base still clears the stamp."""
    stale = {1: Bucket(1, 3_000_000, NOW), 60: Bucket(60, 1, NOW)}
    state = _state(R3, buckets=stale, digest="old")
    assert plan(state, Request("k", R3, take=1, poll=False)) == NOTHING
    rebased = plan(state, Request("k", R3, take=1, poll=True))
    assert (rebased.claims, rebased.dropped, rebased.digest) == (("e0",), (60,), entry_digest(R3))
    assert rebased.buckets == (Bucket(1, 2_000_000, NOW),)
    empty = _state(R1, buckets={1: Bucket(1, 0, NOW), 60: Bucket(60, 1, NOW)}, digest="old")
    refused = plan(empty, Request("k", R1, take=1, poll=True))  # a rate refusal re-bases too
    assert (refused.refused, refused.dropped, refused.digest, refused.stamp) == ("rate", (60,), entry_digest(R1), True)
    full = _state(R3, in_flight=3, buckets=stale, digest="old")
    assert plan(full, Request("k", R3, take=1, poll=True)) == Plan(
        refused="concurrency", stamp=True, dropped=(60,), digest=entry_digest(R3))


def test_an_unconfigured_key_claims_unlimited_and_says_so():
    unconfigured = _state(None, in_flight=50)
    assert plan(unconfigured, Request("k", None, take=2, poll=True)) == Plan(
        claims=("e0", "e1"), buckets=(), stamp=True, unconfigured=True)


entries = st.builds(
    lambda concurrency, rates: LimitEntry("k", concurrency, tuple(rates)) if concurrency or rates else None,
    st.none() | st.integers(1, 4),
    st.lists(st.builds(RateEntry, limit=st.integers(1, 3), per_s=st.sampled_from([1, 2]), burst=st.integers(1, 3)),
             max_size=1))


@given(entries, st.integers(0, 4), st.integers(0, 3), st.integers(0, 4), st.none() | st.integers(0, 4),
       st.integers(1, 5), st.integers(0, 2_000_000))
def test_a_batch_is_the_claims_of_as_many_polls_one_after_another(entry, in_flight, tokens, candidates, bound,
                                                                  take, since_us):
    """[INV-LIM-1, INV-LIM-2, INV-LIM-6] ``take`` in one plan claims what ``take`` plans of one
    would, each on the in-flight count and buckets the previous left and the candidates after
    its claim, stopping at the first that claims nothing; the buckets written are the last's."""
    buckets = {r.per_s: Bucket(r.per_s, min(tokens, r.burst) * r.units_per_token, NOW - since_us)
               for r in (entry.rates if entry else ())}
    state = _state(entry, in_flight=in_flight, candidates=candidates, bound=bound, buckets=buckets)
    whole = plan(state, Request("k", entry, take=take, poll=True))
    claims: list[str] = []
    last = None
    for _ in range(take):
        one = plan(state, Request("k", entry, take=1, poll=True))
        if not one.claims:
            break
        if claims and state.bound is not None and state.candidates[0] >= state.bound:
            break  # after the first, another lane's oldest comes first: the next poll tries it
        claims.append(one.claims[0])
        last = one
        written = {b.period_s: b for b in one.buckets or ()}
        state = LaneState(NOW, KeyRow(state.key.seq, state.key.digest, written or state.key.buckets),
                          state.in_flight + 1, state.candidates[1:], state.bound)
    assert whole.claims == tuple(claims)
    if last is not None:
        assert (whole.buckets, whole.stamp, whole.blocked_until_us) == (last.buckets, last.stamp,
                                                                        last.blocked_until_us)


def test_every_refusal_reason_fits_the_column_the_workers_count_it_in():
    """Each reason a poll can be refused for is counted by a worker in
    ``ductwork_key_refusals.reason``; one longer than the column (``family_concurrency`` in a
    ``VARCHAR(16)``, before revision 0015) made every heartbeat after it fail on the servers."""
    from typing import get_args

    from ductwork.db import schema
    from ductwork.limits.plan import Refused

    width = schema.key_refusals.c.reason.type.length
    assert {reason: len(reason) for reason in get_args(Refused) if len(reason) > width} == {}
    assert "family_concurrency" in get_args(Refused)


#: a partition's entry (its family's ``per_partition``): concurrency 5, no rate
P5 = LimitEntry('f["a"]', concurrency=5, rates=())


def _in_family(family_in_flight: int, **kwargs) -> LaneState:
    return dataclasses.replace(_state(P5, **kwargs), family_in_flight=family_in_flight)


def test_a_familys_ceiling_refuses_a_poll_first_and_says_nothing_to_a_hand_off():
    """[INV-LIM-8] a partition with room of its own, its family at its ceiling of 3: a poll
    is refused ``family_concurrency`` and writes nothing, a hand-off claims nothing; one
    below the ceiling, each claims one."""
    full, room = _in_family(3), _in_family(2)
    assert plan(full, Request('f["a"]', P5, take=1, poll=True, family_ceiling=3)) == Plan(refused="family_concurrency")
    assert plan(full, Request('f["a"]', P5, take=1, poll=False, family_ceiling=3)) == NOTHING
    for poll in (True, False):
        claimed = plan(room, Request('f["a"]', P5, take=1, poll=poll, family_ceiling=3))
        assert (claimed.claims, claimed.refused) == (("e0",), None)


def test_a_batch_ends_where_its_family_reaches_the_ceiling():
    """One of the family's 3 in flight elsewhere and a partition of concurrency 5: a batch
    of 3 claims 2, the ceiling; without a ceiling, all 3."""
    assert plan(_in_family(1), Request('f["a"]', P5, take=3, poll=True, family_ceiling=3)).claims == ("e0", "e1")
    assert plan(_in_family(0), Request('f["a"]', P5, take=3, poll=True)).claims == ("e0", "e1", "e2")
