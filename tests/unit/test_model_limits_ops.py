"""``LimitsModel``'s operations on worked examples: every event, job, bucket and stamp exact.

The limits machine (``tests/properties/test_model_limits.py``) checks the invariants
after random steps; it never says what a step *should* leave, only that nothing it
left breaks an invariant, and it takes half a minute. These examples say it, in
milliseconds: each drives one operation through the cases of its docstring and compares
whole values (the events appended, ``jobs``, ``buckets``, ``stamps``), so a changed
operator, constant or field shows. They are the tier mutmut runs against
``model/limits.py`` (``tests/mutation.py``).

Numbers: ``RateEntry(L, P, B)`` holds ``B·P·10⁶`` units and gains ``L`` a µs; a token is
``P·10⁶`` units. Key ``k`` below is concurrency 1 and 1 per 1 s (burst 1): one token
each 1,000,000 µs. Key ``r`` is 2 per 1 s, burst 2: one token each 500,000 µs, at most 2.

Checks: INV-LIM-1 (saturated lanes skipped, refusals), INV-LIM-3 (slots freed on
completion and reap), INV-LIM-4 (levels, restarts), INV-LIM-5 (stamps), INV-LIM-6 (lane
order, batches and hand-offs), INV-EXE-2 (a reaped job's commit), and for key families
(semantics §5.1, model only: issue 34) INV-LIM-8 (the family's ceiling) and INV-LIM-9
(forgetting an idle partition).
"""

from __future__ import annotations

import pytest

from model.errors import CommitFailed, ConfigError, PreconditionError
from model.limits import (
    UNCONFIGURED_WARNING,
    Bucket,
    Claimed,
    Completed,
    Decided,
    Decision,
    Enqueued,
    KeyLimits,
    LaneVerdict,
    LimitJob,
    LimitsModel,
    Polled,
    RateEntry,
    Restarted,
    cap_units,
    drop_dominated,
    next_token_us,
    parse_key_limits,
    parse_limits,
    parse_period,
    parse_rate_entries,
    refill,
    render_period,
    spend,
    token_units,
)

S = 1_000_000
K = {"concurrency": 1, "rate": {"limit": 1, "per": 1}}
R = {"rate": {"limit": 2, "per": 1, "burst": 2}}
K_LIMITS = KeyLimits(1, (RateEntry(1, 1, 1),), (RateEntry(1, 1, 1),))
R_LIMITS = KeyLimits(None, (RateEntry(2, 1, 2),), (RateEntry(2, 1, 2),))


def _lane(key, job_id, eligible_at_us, created, verdict):
    return LaneVerdict(key, job_id, eligible_at_us, created, verdict)


def _new_events(model: LimitsModel, since: int) -> list:
    return model.events[since:]


# --------------------------------------------------------------------------- construction, enqueue


def test_a_new_model_parses_its_config_and_logs_a_restart_of_every_key():
    model = LimitsModel({"k": K, "r": R})
    assert model.config == {"k": K_LIMITS, "r": R_LIMITS}
    assert model.events == [Restarted(0, 0, {"k": K_LIMITS, "r": R_LIMITS}, frozenset({"k", "r"}))]
    assert (model.jobs, model.buckets, model.stamps, model.dead_workers, model.log) == ({}, {}, {}, set(), [])
    assert LimitsModel().config == {}
    assert LimitsModel().events == [Restarted(0, 0, {}, frozenset())]


def test_enqueue_numbers_jobs_in_call_order_and_refuses_a_second_job_of_the_same_id():
    model = LimitsModel({"k": K})
    model.enqueue("a", "k", 7)
    model.enqueue("b", None, 3)
    assert model.jobs == {"a": LimitJob("a", "k", 7, 1), "b": LimitJob("b", None, 3, 2)}
    assert model.events[1:] == [Enqueued(1, "a", "k", 7, 1), Enqueued(2, "b", None, 3, 2)]
    with pytest.raises(PreconditionError, match=r"^job 'a' already exists$"):
        model.enqueue("a", None, 0)
    assert len(model.events) == 3
    assert model.jobs["a"] == LimitJob("a", "k", 7, 1)
    assert model.jobs["b"].order == (3, 2)


# --------------------------------------------------------------------------- claim


def test_a_poll_records_every_lane_refused_skipped_claimed_and_untried():
    """One model through refusals, an unkeyed claim, blocked lanes, an unconfigured key,
    a claim at the stamp, a saturated key and a claim after a completion."""
    model = LimitsModel({"k": K, "r": R})
    model.enqueue("k1", "k", 0)
    model.enqueue("r1", "r", 0)
    model.enqueue("u1", None, 0)
    model.enqueue("x1", "x", 10)  # a key config does not name; not eligible before 10 µs

    # both keyed lanes come first (older) and are refused: no token yet; the unkeyed lane admits
    assert model.claim("w1", 0) == "u1"
    assert _new_events(model, 5) == [
        Decided(key="k", at_us=0, admitted=False, refused_for="rate", blocked_until_us=S, levels=(0,),
                in_flight=0, seq=5),
        Decided(key="r", at_us=0, admitted=False, refused_for="rate", blocked_until_us=S // 2, levels=(0,),
                in_flight=0, seq=6),
        Polled(7, 5, "w1", 0, (_lane("k", "k1", 0, 1, "refused_rate"), _lane("r", "r1", 0, 2, "refused_rate"),
                               _lane(None, "u1", 0, 3, "claimed")), "u1"),
        Claimed(8, "u1", None, "w1", 0),
    ]
    assert model.buckets == {("k", 1): Bucket(0, 0, S), ("r", 1): Bucket(0, 0, 2 * S)}
    assert model.stamps == {"k": S, "r": S // 2}

    # both stamps are in the future: skipped without a decision; x admits, unconfigured
    assert model.claim("w2", S // 2 - 1) == "x1"
    assert _new_events(model, 9) == [
        Decided(key="x", at_us=S // 2 - 1, admitted=True, refused_for=None, blocked_until_us=None, levels=(),
                in_flight=1, unconfigured=True, seq=9),
        Polled(10, 9, "w2", S // 2 - 1, (_lane("k", "k1", 0, 1, "blocked"), _lane("r", "r1", 0, 2, "blocked"),
                                         _lane("x", "x1", 10, 4, "claimed")), "x1"),
        Claimed(11, "x1", "x", "w2", S // 2 - 1),
    ]
    assert model.log == [UNCONFIGURED_WARNING]

    # at r's stamp exactly: r has one token (500,000 µs × 2 units), spends it, stamps again
    assert model.claim("w1", S // 2) == "r1"
    assert _new_events(model, 12) == [
        Decided(key="r", at_us=S // 2, admitted=True, refused_for=None, blocked_until_us=S, levels=(0,),
                in_flight=1, seq=12),
        Polled(13, 12, "w1", S // 2, (_lane("k", "k1", 0, 1, "blocked"), _lane("r", "r1", 0, 2, "claimed")), "r1"),
        Claimed(14, "r1", "r", "w1", S // 2),
    ]
    assert model.buckets[("r", 1)] == Bucket(0, S // 2, 2 * S)

    # at k's stamp: one token, spent; the next token is a second later
    assert model.claim("w2", S) == "k1"
    assert _new_events(model, 15) == [
        Decided(key="k", at_us=S, admitted=True, refused_for=None, blocked_until_us=2 * S, levels=(0,),
                in_flight=1, seq=15),
        Polled(16, 15, "w2", S, (_lane("k", "k1", 0, 1, "claimed"),), "k1"),
        Claimed(17, "k1", "k", "w2", S),
    ]
    assert model.stamps == {"k": 2 * S, "r": S}

    # k is at its concurrency: skipped as saturated, even past its stamp; nothing decided
    model.enqueue("k2", "k", 0)
    assert model.claim("w1", 2 * S) is None
    assert _new_events(model, 18) == [
        Enqueued(18, "k2", "k", 0, 5),
        Polled(19, 19, "w1", 2 * S, (_lane("k", "k2", 0, 5, "saturated"),), None),
    ]

    model.complete("k1", 2 * S)
    assert model.claim("w1", 2 * S) == "k2"
    assert _new_events(model, 20) == [
        Completed(20, "k1", "k", "w2", 2 * S, "success"),
        Decided(key="k", at_us=2 * S, admitted=True, refused_for=None, blocked_until_us=3 * S, levels=(0,),
                in_flight=1, seq=21),
        Polled(22, 21, "w1", 2 * S, (_lane("k", "k2", 0, 5, "claimed"),), "k2"),
        Claimed(23, "k2", "k", "w1", 2 * S),
    ]
    assert model.jobs == {
        "k1": LimitJob("k1", "k", 0, 1, "completed", "w2", S, "success"),
        "r1": LimitJob("r1", "r", 0, 2, "in_flight", "w1", S // 2),
        "u1": LimitJob("u1", None, 0, 3, "in_flight", "w1", 0),
        "x1": LimitJob("x1", "x", 10, 4, "in_flight", "w2", S // 2 - 1),
        "k2": LimitJob("k2", "k", 0, 5, "in_flight", "w1", 2 * S),
    }
    assert model.claims == [e for e in model.events if isinstance(e, Claimed)]
    assert [c.job_id for c in model.claims] == ["u1", "x1", "r1", "k1", "k2"]
    assert [p.seq for p in model.polls] == [7, 10, 13, 16, 19, 22]


def test_lanes_are_tried_by_their_oldest_eligible_job_and_ties_by_creation():
    """A later-created job eligible earlier heads its lane; a job not yet eligible is no
    lane's head; lanes after the claimed one are untried [INV-LIM-6]."""
    model = LimitsModel({"a": {"concurrency": 5}, "b": {"concurrency": 5}})
    model.enqueue("a1", "a", 20)
    model.enqueue("b1", "b", 10)
    model.enqueue("u1", None, 10)
    model.enqueue("a2", "a", 10)  # created after b1 and u1, eligible as early
    model.enqueue("b0", "b", 30)  # not eligible at 25
    assert model.claim("w", 25) == "b1"
    assert model.polls[-1] == Polled(7, 6, "w", 25, (_lane("b", "b1", 10, 2, "claimed"),
                                                     _lane(None, "u1", 10, 3, "untried"),
                                                     _lane("a", "a2", 10, 4, "untried")), "b1")
    assert model.claim("w", 25) == "u1"
    assert model.claim("w", 25) == "a2"
    assert model.claim("w", 25) == "a1"
    assert model.claim("w", 29) is None
    assert model.polls[-1] == Polled(model.polls[-1].seq, model.polls[-1].seq, "w", 29, (), None)
    assert model.claim("w", 30) == "b0"
    assert model.pending() == []


def test_an_eligible_time_is_inclusive():
    model = LimitsModel()
    model.enqueue("u", None, 5)
    assert model.claim("w", 4) is None
    assert model.claim("w", 5) == "u"


def test_a_dead_worker_cannot_poll():
    model = LimitsModel()
    model.enqueue("u", None, 0)
    model.crash_worker("w", 0)
    with pytest.raises(PreconditionError, match=r"^worker 'w' is dead and cannot poll$"):
        model.claim("w", 0)
    with pytest.raises(PreconditionError):
        model.claim_batch("w", 0, 2)
    assert model.pending() == ["u"]
    assert model.claim("v", 0) == "u"


def test_a_rate_only_key_has_no_ceiling_and_every_bucket_must_hold_a_token():
    """Two periods: 2 per 1 s (burst 2) and 3 per 60 s (burst 3). The minute bucket runs out
    first; the stamp is the later of the short buckets' next tokens [INV-LIM-5]."""
    model = LimitsModel({"m": {"rate": [{"limit": 2, "per": 1, "burst": 2}, {"limit": 3, "per": "1m", "burst": 3}]}})
    assert model.config["m"].rates == (RateEntry(2, 1, 2), RateEntry(3, 60, 3))
    for job in range(5):
        model.enqueue(job, "m", 0)
    # after 60 s both are full: the 1 s bucket 2 tokens (2·10⁶ units), the minute bucket 3 (3·60·10⁶)
    now = 60 * S
    assert model.claim("w", now) is None  # both created empty at 60 s
    assert model.levels("m") == [0, 0]
    assert model.blocked_until("m") == now + 20 * S  # a minute token: 60·10⁶ units at 3 a µs
    now += 20 * S
    assert model.claim("w", now) == 0
    # 1 s bucket: 20 s × 2 capped at 2·10⁶, less 10⁶; minute bucket: 60·10⁶ less 60·10⁶
    assert model.levels("m") == [S, 0]
    assert model.blocked_until("m") == now + 20 * S
    assert model.in_flight("m") == 1
    now += 20 * S
    assert model.claim("w", now) == 1
    assert model.claim("w", now + 20 * S - 1) is None  # blocked: skipped, no decision
    assert model.polls[-1].lanes == (_lane("m", 2, 0, 3, "blocked"),)
    model.restart_with(model.limits, now + 20 * S - 1)  # clears the stamp: the next poll decides again
    assert model.claim("w", now + 20 * S - 1) is None
    assert model.events[-2] == Decided(key="m", at_us=now + 20 * S - 1, admitted=False, refused_for="rate",
                                       blocked_until_us=now + 20 * S, levels=(2 * S, 60 * S - 3),
                                       in_flight=2, seq=len(model.events) - 2)
    assert model.in_flight("m") == 2
    assert model.in_flight(None) == 0


def test_a_stamp_is_the_latest_next_token_of_the_short_buckets():
    """Admitted with the minute bucket short only: the stamp is its next token. Refused
    with both short: the later of the two."""
    model = LimitsModel({"m": {"rate": [{"limit": 1, "per": 1, "burst": 2}, {"limit": 3, "per": "1m", "burst": 3}]}})
    model.buckets = {("m", 1): Bucket(2 * S, 0, 2 * S), ("m", 60): Bucket(60 * S, 0, 180 * S)}
    decision = model.decide("m", 0)
    assert (decision.admitted, decision.levels, decision.blocked_until_us) == (True, (S, 0), 20 * S)
    # refused: the 1 s bucket's token is 1 µs away, the minute bucket's ceil(4 / 3) = 2 µs
    model.buckets[("m", 1)] = Bucket(S - 1, 0, 2 * S)
    model.buckets[("m", 60)] = Bucket(60 * S - 4, 0, 180 * S)
    decision = model.decide("m", 0)
    assert (decision.admitted, decision.refused_for, decision.blocked_until_us) == (False, "rate", 2)
    # and the other way round: 2 µs for the 1 s bucket, ceil(3 / 3) = 1 µs for the minute one
    model.buckets[("m", 1)] = Bucket(S - 2, 0, 2 * S)
    model.buckets[("m", 60)] = Bucket(60 * S - 3, 0, 180 * S)
    decision = model.decide("m", 0)
    assert (decision.admitted, decision.blocked_until_us) == (False, 2)


# --------------------------------------------------------------------------- decide


def test_decide_admits_with_a_slot_holding_job_and_refuses_at_the_ceiling():
    model = LimitsModel({"c": {"concurrency": 1}})
    admitted = model.decide("c", 5)
    assert admitted == Decision("c", 5, True, None, None, (), 1, False, admitted.job_id)
    assert model.in_flight_jobs() == [admitted.job_id]
    assert model.jobs[admitted.job_id].state == "in_flight"
    assert model.jobs[admitted.job_id].key == "c"
    assert model.jobs[admitted.job_id].claimed_at_us == 5
    assert model.decide("c", 6) == Decision("c", 6, False, "concurrency", None, (), 1)
    assert model.events[-1] == Decided(key="c", at_us=6, admitted=False, refused_for="concurrency",
                                       blocked_until_us=None, levels=(), in_flight=1, seq=len(model.events) - 1)
    model.complete(admitted.job_id, 7)
    second = model.decide("c", 7)
    assert second.admitted
    assert second.job_id != admitted.job_id
    assert model.in_flight_jobs() == [second.job_id]


def test_decide_on_a_key_config_does_not_name_admits_unconfigured_and_warns_each_time():
    model = LimitsModel()
    first = model.decide("x", 1)
    assert first == Decision("x", 1, True, None, None, (), 1, True, first.job_id)
    second = model.decide("x", 2)
    assert (second.in_flight, second.unconfigured) == (2, True)
    assert model.log == [UNCONFIGURED_WARNING, UNCONFIGURED_WARNING]
    assert model.levels("x") == []
    assert model.blocked_until("x") is None


def test_a_concurrency_refusal_refills_and_stamps_nothing():
    model = LimitsModel({"k": K})
    assert model.decide("k", 0).admitted is False  # creates the empty bucket, stamps 1 s
    holder = model.decide("k", 3 * S)
    assert holder.admitted
    assert model.buckets[("k", 1)] == Bucket(0, 3 * S, S)
    assert model.stamps == {"k": 4 * S}
    assert model.decide("k", 9 * S) == Decision("k", 9 * S, False, "concurrency", 4 * S, (0,), 1)
    assert model.buckets[("k", 1)] == Bucket(0, 3 * S, S)
    assert model.stamps == {"k": 4 * S}


def test_an_admission_that_leaves_a_token_clears_the_stamp():
    model = LimitsModel({"r": R})
    assert model.decide("r", 0) == Decision("r", 0, False, "rate", S // 2, (0,), 0)
    decision = model.decide("r", 2 * S)  # refilled to the burst, 2 tokens, one spent
    assert (decision.admitted, decision.blocked_until_us, decision.levels) == (True, None, (S,))
    assert model.stamps == {}
    assert model.buckets[("r", 1)] == Bucket(S, 2 * S, 2 * S)
    decision = model.decide("r", 2 * S)
    assert (decision.admitted, decision.blocked_until_us, decision.levels, decision.in_flight) == (True, 2 * S + S // 2,
                                                                                                  (0,), 2)


# --------------------------------------------------------------------------- claim_batch


def test_an_unkeyed_batch_stops_at_its_limit_or_where_another_lane_comes_first():
    model = LimitsModel({"k": {"concurrency": 5}})
    model.enqueue("u1", None, 0)
    model.enqueue("u2", None, 0)
    model.enqueue("k1", "k", 1)
    model.enqueue("u3", None, 2)
    model.enqueue("u4", None, 2)
    assert model.claim_batch("w", 5, 5) == ["u1", "u2"]  # k1 (eligible at 1) is older than u3
    assert model.claim_batch("w", 5, 1, 5) == ["k1"]  # the next lane is the unkeyed one
    assert model.claim_batch("w", 5, 1) == ["u3"]
    assert model.claim_batch("w", 5, 5) == ["u4"]  # nothing more
    assert model.claim_batch("w", 5, 5) == []
    assert [p.job_id for p in model.polls] == ["u1", "u2", "k1", "u3", "u4", None]
    assert model.in_flight_jobs("w") == ["u1", "u2", "k1", "u3", "u4"]


def test_a_keyed_batch_stops_before_a_refusal_and_writes_no_refusal():
    """r after 1 s holds its burst, 2 tokens: a batch of up to 3 claims 2, and the third
    poll, which would be refused, is not made (the second spend stamped r already)."""
    model = LimitsModel({"r": R})
    for job in ("r1", "r2", "r3"):
        model.enqueue(job, "r", 0)
    model.buckets[("r", 1)] = Bucket(0, 0, 2 * S)
    start = len(model.events)
    assert model.claim_batch("w", S, 1, 3) == ["r1", "r2"]
    decided = [e for e in model.events[start:] if isinstance(e, Decided)]
    assert [(d.admitted, d.levels, d.blocked_until_us) for d in decided] == [(True, (S,), None),
                                                                           (True, (0,), S + S // 2)]
    assert len(model.events) == start + 6
    assert model.stamps == {"r": S + S // 2}


def test_a_keyed_batch_stops_at_the_keys_ceiling_and_at_its_keyed_limit():
    model = LimitsModel({"c": {"concurrency": 2}, "d": {"concurrency": 9}})
    for job in ("c1", "c2", "c3"):
        model.enqueue(job, "c", 0)
    assert model.claim_batch("w", 0, 9, 9) == ["c1", "c2"]
    assert model.polls[-2].lanes == (_lane("c", "c2", 0, 2, "claimed"),)
    # c's run filled its concurrency: the batch polls on, and that poll finds c saturated
    assert (model.polls[-1].lanes, model.polls[-1].job_id) == ((_lane("c", "c3", 0, 3, "saturated"),), None)
    for job in ("d1", "d2", "d3"):
        model.enqueue(job, "d", 0)
    assert model.claim_batch("w", 0, 9, 2) == ["d1", "d2"]
    assert model.claim_batch("w", 0, 9) == ["d3"]


def test_an_unconfigured_keys_batch_is_bounded_by_keyed_limit():
    model = LimitsModel()
    for job in ("x1", "x2", "x3"):
        model.enqueue(job, "x", 0)
    assert model.claim_batch("w", 0, 1, 2) == ["x1", "x2"]
    assert model.log == [UNCONFIGURED_WARNING] * 2


def test_a_batch_goes_on_past_the_keys_its_runs_saturate():
    """Runs of one lane each: a ``concurrency: 1`` key's run of one fills it, so the batch
    polls on (q, then r's run of two, which fills r too, then the unkeyed lane's); it
    stops after a run that leaves its lane able to admit (the unkeyed lane, a key's share
    below its concurrency), and at ``max(limit, keyed_limit)`` claims in all."""
    config = {"p": {"concurrency": 1}, "q": {"concurrency": 1}, "r": {"concurrency": 2}}
    jobs = [("p1", "p"), ("q1", "q"), ("p2", "p"), ("r1", "r"), ("r2", "r"), ("r3", "r"), ("u1", None), ("u2", None)]

    def fed():
        model = LimitsModel(config)
        for job, key in jobs:
            model.enqueue(job, key, 0)
        return model

    assert fed().claim_batch("w", 0, 9, 9) == ["p1", "q1", "r1", "r2", "u1", "u2"]
    assert fed().claim_batch("w", 0, 9, 1) == ["p1", "q1", "r1"]  # r's share of 1 leaves it admitting
    assert fed().claim_batch("w", 0, 3, 1) == ["p1", "q1", "r1"]  # three in all
    assert fed().claim_batch("w", 0, 1, 3) == ["p1", "q1", "r1"]
    model = fed()
    assert model.claim_batch("w", 0, 1) == ["p1"]  # one in all
    assert model.claim_batch("w", 0, 9, 2) == ["q1", "r1", "r2", "u1", "u2"]
    assert model.pending() == ["p2", "r3"]
    model = LimitsModel(config)
    for job, key in [("p1", "p"), ("q1", "q"), ("u1", None), ("u2", None), ("u3", None)]:
        model.enqueue(job, key, 0)
    assert model.claim_batch("w", 0, 3, 1) == ["p1", "q1", "u1"]  # the unkeyed run has what is left of three


def test_a_group_of_several_lanes_hands_nothing_on():
    """Successes of two lanes recorded at once complete both and claim nothing, though a
    poll would claim in either lane: no poll, no decision."""
    model = LimitsModel({"c": {"concurrency": 9}})
    for job in ("c1", "u1", "c2", "u2"):
        model.enqueue(job, "c" if job[0] == "c" else None, 0)
    assert model.claim("w", 0) == "c1"
    assert model.claim("w", 0) == "u1"
    start = len(model.events)
    assert model.complete_all_and_hand_off(["c1", "u1"], 1, 2, 2) == []
    assert model.events[start:] == [Completed(start, "c1", "c", "w", 1, "success"),
                                    Completed(start + 1, "u1", None, "w", 1, "success")]
    assert model.pending() == ["c2", "u2"]


# --------------------------------------------------------------------------- hand-offs


def test_a_keyed_hand_off_is_the_poll_that_would_claim_the_next_job():
    model = LimitsModel({"c": {"concurrency": 1}})
    model.enqueue("c1", "c", 0)
    model.enqueue("c2", "c", 0)
    model.enqueue("c3", "c", 0)
    assert model.claim("w", 0) == "c1"
    start = len(model.events)
    assert model.complete_all_and_hand_off(["c1"], 4) == ["c2"]
    assert model.events[start:] == [
        Completed(start, "c1", "c", "w", 4, "success"),
        Decided(key="c", at_us=4, admitted=True, refused_for=None, blocked_until_us=None, levels=(),
                in_flight=1, seq=start + 1),
        Polled(start + 2, start + 1, "w", 4, (_lane("c", "c2", 0, 2, "claimed"),), "c2"),
        Claimed(start + 3, "c2", "c", "w", 4),
    ]
    assert model.complete_all_and_hand_off(["c2"], 5, 3) == ["c3"]  # limit bounds only the unkeyed lane
    assert model.complete_all_and_hand_off(["c3"], 6) == []
    assert model.jobs["c3"].state == "completed"


def test_no_hand_off_when_another_lane_comes_first_or_the_key_refuses():
    """The completion alone is recorded: no refill, no stamp, no poll."""
    model = LimitsModel({"k": K})
    model.enqueue("k1", "k", 0)
    model.enqueue("u1", None, 0)
    model.enqueue("k2", "k", 1)
    model.buckets[("k", 1)] = Bucket(S, 0, S)
    assert model.claim("w", 0) == "k1"
    assert model.buckets[("k", 1)] == Bucket(0, 0, S)
    assert model.stamps == {"k": S}
    start = len(model.events)
    assert model.complete_all_and_hand_off(["k1"], 2) == []  # u1 (eligible at 0) comes before k2
    assert model.events[start:] == [Completed(start, "k1", "k", "w", 2, "success")]
    assert model.claim("v", 2) == "u1"
    model.enqueue("k3", "k", 0)
    assert model.claim("w", S) == "k3"  # a token again at 1 s; stamped 2 s
    model.restart_with(model.limits, S)  # clears the stamp, keeps the empty bucket
    before = (dict(model.buckets), dict(model.stamps))
    start = len(model.events)
    assert model.complete_all_and_hand_off(["k3"], S + 1) == []  # k2 is first, k has no token: no poll
    assert model.events[start:] == [Completed(start, "k3", "k", "w", S + 1, "success")]
    assert (model.buckets, model.stamps) == before


def test_an_unkeyed_hand_off_takes_up_to_limit_jobs():
    model = LimitsModel()
    for job in ("u1", "u2", "u3", "u4"):
        model.enqueue(job, None, 0)
    assert model.claim("w", 0) == "u1"
    assert model.complete_all_and_hand_off(["u1"], 1, 2) == ["u2", "u3"]
    assert model.in_flight_jobs("w") == ["u2", "u3"]
    assert model.complete_all_and_hand_off(["u3"], 1, 2) == ["u4"]
    assert model.complete_all_and_hand_off(["u2"], 1, 2) == []


def test_a_group_commit_completes_every_job_then_hands_off_the_last_ones_lane():
    model = LimitsModel({"c": {"concurrency": 3}})
    for job in ("c1", "c2", "c3", "c4", "c5", "c6"):
        model.enqueue(job, "c", 0)
    assert model.claim_batch("w", 0, 1, 3) == ["c1", "c2", "c3"]
    start = len(model.events)
    assert model.complete_all_and_hand_off(["c2", "c1"], 5, 1, 2) == ["c4", "c5"]
    assert model.events[start:start + 2] == [Completed(start, "c2", "c", "w", 5, "success"),
                                             Completed(start + 1, "c1", "c", "w", 5, "success")]
    assert model.in_flight_jobs() == ["c3", "c4", "c5"]
    assert model.complete_all_and_hand_off(["c3"], 6) == ["c6"]  # keyed_limit defaults to 1
    with pytest.raises(CommitFailed):
        model.complete_all_and_hand_off(["c4", "c1"], 7)
    assert model.jobs["c4"].state == "completed"  # the successes before the failed one stand


def test_a_hand_off_and_a_group_commit_take_one_job_unless_told_more():
    """Both default to one job handed on, on a key with room and on the unkeyed lane
    (mutmut: defaults of 2 survived, every test had passed them or had one job left)."""
    model = LimitsModel({"c": {"concurrency": 9}})
    for job in ("c1", "c2", "c3", "u1", "u2", "u3"):
        model.enqueue(job, "c" if job[0] == "c" else None, 0)
    assert model.claim("w", 0) == "c1"
    assert model.complete_all_and_hand_off(["c1"], 1) == ["c2"]
    assert model.complete_all_and_hand_off(["c2"], 1) == ["c3"]
    assert model.claim_batch("w", 1, 2) == ["u1", "u2"]
    assert model.complete_all_and_hand_off(["u1", "u2"], 2) == ["u3"]
    assert model.pending() == []


def test_no_hand_off_to_a_period_whose_bucket_a_restart_added_and_nothing_created():
    """A restart gives the key a second period: its bucket does not exist yet, so it holds
    no token (it starts empty) and the hand-off makes no poll; the poll after it creates
    the bucket empty and is refused."""
    model = LimitsModel({"c": {"concurrency": 3}})
    for job in ("c1", "c2"):
        model.enqueue(job, "c", 0)
    assert model.claim("w", 0) == "c1"
    model.restart_with({"c": {"concurrency": 3, "rate": {"limit": 1, "per": 1}}}, S)
    start = len(model.events)
    assert model.complete_all_and_hand_off(["c1"], 5 * S) == []
    assert model.events[start:] == [Completed(start, "c1", "c", "w", 5 * S, "success")]
    assert (model.buckets, model.stamps) == ({}, {})
    assert model.claim("w", 5 * S) is None
    assert model.buckets == {("c", 1): Bucket(0, 5 * S, S)}
    assert model.stamps == {"c": 6 * S}


def test_a_group_commit_of_the_unkeyed_lane_hands_off_up_to_limit():
    model = LimitsModel()
    for job in ("u1", "u2", "u3", "u4", "u5"):
        model.enqueue(job, None, 0)
    assert model.claim_batch("w", 0, 2) == ["u1", "u2"]
    assert model.complete_all_and_hand_off(["u1", "u2"], 1, 2, 1) == ["u3", "u4"]


# --------------------------------------------------------------------------- complete, crash, reap


def test_complete_frees_the_slot_and_refuses_what_is_not_in_flight():
    model = LimitsModel({"c": {"concurrency": 1}})
    model.enqueue("a", "c", 0)
    with pytest.raises(CommitFailed, match=r"^job 'a' is not in flight$"):
        model.complete("a", 0)  # pending
    with pytest.raises(CommitFailed, match=r"^job 'nope' is not in flight$"):
        model.complete("nope", 0)
    assert model.claim("w", 0) == "a"
    model.complete("a", 3, "timed_out")
    assert model.events[-1] == Completed(len(model.events) - 1, "a", "c", "w", 3, "timed_out")
    assert model.jobs["a"] == LimitJob("a", "c", 0, 1, "completed", "w", 0, "timed_out")
    assert model.in_flight("c") == 0
    with pytest.raises(CommitFailed):
        model.complete("a", 4)  # twice


def test_a_crashed_workers_jobs_hold_their_slots_until_reaped():
    model = LimitsModel({"c": {"concurrency": 2}})
    for job in ("a", "b", "c", "d"):
        model.enqueue(job, "c", 0)
    assert model.claim("w1", 0) == "a"
    assert model.claim("w2", 0) == "b"
    assert model.crash_worker("w1", 1) == ["a"]
    assert model.dead_workers == {"w1"}
    assert model.claim("w2", 1) is None  # saturated: a still holds its slot
    with pytest.raises(PreconditionError, match=r"^job 'a' belongs to dead worker 'w1'$"):
        model.complete("a", 1)
    assert model.reap("w1", 2) == ["a"]  # not re-enqueued
    assert model.jobs["a"] == LimitJob("a", "c", 0, 1, "completed", "w1", 0, "process_crashed")
    assert model.claim("w2", 2) == "c"
    assert model.pending() == ["d"]
    assert model.crash_worker("w3", 2) == []


def test_a_reap_completes_in_creation_order_and_re_enqueues_only_what_it_is_told():
    model = LimitsModel({"c": {"concurrency": 5}})
    model.enqueue("u", None, 0)
    model.enqueue("v", None, 0)
    for job in ("a", "b", "c"):
        model.enqueue(job, "c", 0)
    assert model.claim("x", 0) == "u"
    assert model.claim("w", 0) == "v"
    assert model.claim("w", 0) == "a"
    assert model.claim("w", 0) == "b"
    start = len(model.events)
    assert model.reap("w", 9, {"b": ("b2", 11), "v": ("v2", 10)}) == ["v", "a", "b"]
    assert model.events[start:] == [
        Completed(start, "v", None, "w", 9, "process_crashed"),
        Completed(start + 1, "a", "c", "w", 9, "process_crashed"),
        Completed(start + 2, "b", "c", "w", 9, "process_crashed"),
        Enqueued(start + 3, "v2", None, 10, 6),
        Enqueued(start + 4, "b2", "c", 11, 7),
    ]
    assert model.pending() == ["c", "v2", "b2"]
    assert model.in_flight_jobs() == ["u"]
    # the reaped worker was alive: its late commit is rejected [INV-EXE-2]
    with pytest.raises(CommitFailed, match=r"^job 'b' is not in flight$"):
        model.complete("b", 12)
    assert model.reap("w", 12, {}) == []


# --------------------------------------------------------------------------- restart


def test_a_restart_keeps_the_kept_periods_buckets_drops_the_rest_and_clears_every_stamp():
    model = LimitsModel({"m": {"rate": [{"limit": 1, "per": 1}, {"limit": 30, "per": "1m", "burst": 5}]}, "r": R})
    model.enqueue("m1", "m", 0)
    model.enqueue("r1", "r", 0)
    assert model.claim("w", 0) is None  # creates every bucket empty and stamps both keys
    assert model.stamps == {"m": 2 * S, "r": S // 2}
    assert set(model.buckets) == {("m", 1), ("m", 60), ("r", 1)}
    model.restart_with({"m": {"rate": {"limit": 30, "per": "1m", "burst": 1}}, "z": {"concurrency": 1}}, 7)
    assert model.buckets == {("m", 60): Bucket(0, 0, 5 * 60 * S)}  # level, time and old cap as they were
    assert model.stamps == {}
    m_limits = KeyLimits(None, (RateEntry(30, 60, 1),), (RateEntry(30, 60, 1),))
    z_limits = KeyLimits(1, (), ())
    assert model.config == {"m": m_limits, "z": z_limits}
    assert model.events[-1] == Restarted(len(model.events) - 1, 7, {"m": m_limits, "z": z_limits},
                                         frozenset({"m", "r", "z"}))
    assert model.levels("m") == [0]
    # the next refill clamps to the new burst: one token of 60·10⁶ units
    model.decide("m", 10 * 60 * S)
    assert model.buckets[("m", 60)] == Bucket(0, 10 * 60 * S, 60 * S)


def test_a_restart_rebases_keys_known_only_by_a_stamp_or_a_bucket():
    model = LimitsModel()
    model.stamps["s"] = 5
    model.buckets[("b", 1)] = Bucket(0, 0, S)
    model.restart_with({})
    assert model.events[-1] == Restarted(1, 0, {}, frozenset({"s", "b"}))
    assert (model.buckets, model.stamps) == ({}, {})


# --------------------------------------------------------------------------- queries


def test_the_queries_on_one_state():
    model = LimitsModel({"m": {"rate": [{"limit": 1, "per": 1}, {"limit": 2, "per": "1m", "burst": 2}]}})
    model.enqueue("late", None, 9)
    model.enqueue("m1", "m", 0)
    model.enqueue("early", None, 0)
    model.enqueue("tie", None, 9)
    assert model.pending() == ["m1", "early", "late", "tie"]
    assert model.levels("m") == [None, None]
    assert model.levels("nope") == []
    model.buckets[("m", 60)] = Bucket(4, 0, 2 * 60 * S)
    assert model.levels("m") == [None, 4]
    assert model.blocked_until("m") is None
    assert model.claim("w2", 9) == "early"  # m has no token
    assert model.blocked_until("m") == 9 + (60 * S - 4 - 9 * 2) // 2  # the minute bucket's token, the later
    assert model.claim("w1", 9) == "late"
    assert model.claim("w2", 9) == "tie"
    assert model.in_flight_jobs() == ["late", "early", "tie"]  # creation order, not claim order
    assert model.in_flight_jobs("w2") == ["early", "tie"]
    assert model.in_flight_jobs(None) == ["late", "early", "tie"]
    assert model.in_flight(None) == 3
    assert model.in_flight("m") == 0
    assert model.pending() == ["m1"]


# --------------------------------------------------------------------------- found by mutmut before this tier
# (moved from tests/properties/test_model_limits.py: they are worked examples, not properties)

def test_the_models_queries_on_a_worked_example():
    """pending(), in_flight_jobs() and blocked_until() as the machines' preconditions read
    them: a query that went empty would only switch rules off, which no invariant notices
    (mutmut's mutants of in_flight_jobs survived the machine). Concurrency 1, 1 per 1 s."""
    model = LimitsModel({"k": {"concurrency": 1, "rate": [{"limit": 1, "per": 1}]}})
    model.enqueue("a", "k", 0)
    model.enqueue("b", "k", 0)
    model.enqueue("u", None, 5)
    assert model.pending() == ["a", "b", "u"]
    assert model.claim("w1", 0) is None  # k has no token yet, u is not eligible before 5 µs
    assert model.blocked_until("k") == 1_000_000
    assert model.claim("w1", 1_000_000) == "a"
    assert model.claim("w2", 1_000_000) == "u"  # k is saturated
    assert model.in_flight_jobs() == ["a", "u"]
    assert (model.in_flight_jobs("w1"), model.in_flight_jobs("w2"), model.in_flight_jobs("w3")) == (["a"], ["u"], [])
    assert model.pending() == ["b"]


def test_a_batch_takes_one_keyed_job_unless_told_more():
    """claim_batch's default keyed_limit is 1: a batch of a keyed lane is one claim unless
    the caller asks for a keyed group commit, and an unkeyed batch takes up to ``limit``
    (mutmut found both untested: every caller passes keyed_limit, and the machine's
    batches passed with the keyed bound applied to the unkeyed lane)."""
    model = LimitsModel({"k": {"concurrency": 5}})
    for job in ("a", "b", "c"):
        model.enqueue(job, "k", 0)
    assert model.claim_batch("w1", 0, 3) == ["a"]
    assert model.claim_batch("w1", 0, 3, 2) == ["b", "c"]
    # the unkeyed lane's batch is bounded by limit alone
    for job in ("u1", "u2", "u3"):
        model.enqueue(job, None, 0)
    assert model.claim_batch("w2", 0, 3) == ["u1", "u2", "u3"]


def test_a_hand_off_takes_one_job_unless_told_more():
    """A success's hand-off takes one job by default (``limit`` 1): the owner of an
    unkeyed job takes one next job unless the caller asks for a batch (mutmut found it
    untested: the machine always passes limit)."""
    model = LimitsModel({})
    for job in ("a", "b", "c", "d"):
        model.enqueue(job, None, 0)
    assert model.claim("w1", 0) == "a"
    assert model.complete_all_and_hand_off(["a"], 0) == ["b"]
    assert model.complete_all_and_hand_off(["b"], 0, 2) == ["c", "d"]


def test_a_crash_and_a_reap_touch_only_that_workers_jobs():
    """crash_worker() and reap() on a worked example: the dead worker's jobs, and only its,
    are returned, refused a commit, and completed ``process_crashed`` at the reap's time
    (mutmut found both unpinned: the machine crashes and reaps one worker at a time and
    reads no Completed event)."""
    model = LimitsModel({"k": {"concurrency": 2}})
    model.enqueue("a", "k", 0)
    model.enqueue("b", "k", 0)
    assert (model.claim("w1", 0), model.claim("w2", 0)) == ("a", "b")
    assert model.crash_worker("w1", 5) == ["a"]
    with pytest.raises(PreconditionError, match="belongs to dead worker 'w1'"):
        model.complete("a", 6)
    assert model.reap("w1", 7, {"a": ("a2", 9)}) == ["a"]
    assert [(e.job_id, e.worker, e.at_us, e.outcome) for e in model.events if isinstance(e, Completed)] == [
        ("a", "w1", 7, "process_crashed")]
    assert (model.in_flight_jobs(), model.pending()) == (["b"], ["a2"])
    model.complete("b", 8)  # w2 is alive

# --------------------------------------------------------------------------- bucket arithmetic


def test_refill_spend_and_next_token_at_their_boundaries():
    entry = RateEntry(3, 2, 2)  # a token is 2·10⁶ units, full is 4·10⁶, 3 units a µs
    assert (token_units(entry), cap_units(entry)) == (2 * S, 4 * S)
    assert refill(Bucket(10, 100, 7), entry, 100) == Bucket(10, 100, 4 * S)
    assert refill(Bucket(10, 100, 7), entry, 99) == Bucket(10, 100, 4 * S)  # time went back
    assert refill(Bucket(10, 100, 7), entry, 101) == Bucket(13, 101, 4 * S)
    assert refill(Bucket(4 * S - 3, 0, 4 * S), entry, 1) == Bucket(4 * S, 1, 4 * S)
    assert refill(Bucket(4 * S - 3, 0, 4 * S), entry, 2) == Bucket(4 * S, 2, 4 * S)  # clamped
    assert refill(Bucket(5 * S, 0, 5 * S), entry, 0) == Bucket(4 * S, 0, 4 * S)  # a lowered burst
    assert spend(Bucket(2 * S, 5, 9), entry) == Bucket(0, 5, 9)
    assert spend(Bucket(2 * S + 1, 5, 9), entry) == Bucket(1, 5, 9)
    with pytest.raises(AssertionError, match=r"^\[INV-LIM-4\] spend from a bucket short of a token$"):
        spend(Bucket(2 * S - 1, 5, 9), entry)
    assert next_token_us(Bucket(2 * S, 5, 9), entry) == 5
    assert next_token_us(Bucket(3 * S, 5, 9), entry) == 5
    assert next_token_us(Bucket(2 * S - 1, 5, 9), entry) == 6
    assert next_token_us(Bucket(2 * S - 3, 5, 9), entry) == 6
    assert next_token_us(Bucket(2 * S - 4, 5, 9), entry) == 7
    assert next_token_us(Bucket(0, 5, 9), entry) == 5 + 666_667


# --------------------------------------------------------------------------- config


def _config_error(call, *args) -> tuple[str, object, str]:
    with pytest.raises(ConfigError) as info:
        call(*args)
    return info.value.path, info.value.value, info.value.reason


def test_periods_parse_and_render_exactly():
    assert [parse_period(v) for v in (1, "1", "90", "1w", "1d", "1h", "1m", "1s", "1w2d3h4m5s", "0h1s")] == [
        1, 1, 90, 604_800, 86_400, 3_600, 60, 1, 788_645, 1]
    assert [render_period(n) for n in (1, 60, 61, 3_600, 86_400, 604_800, 788_645)] == [
        "1s", "1m", "1m1s", "1h", "1d", "1w", "1w2d3h4m5s"]
    expected = "must be whole seconds or a duration string like '1h30m'"
    assert _config_error(parse_period, True) == ("per", True, expected)
    assert _config_error(parse_period, 1.0, "p") == ("p", 1.0, expected)
    assert _config_error(parse_period, None) == ("per", None, expected)
    assert _config_error(parse_period, "1mo") == ("per", "1mo", "months and years are not supported")
    assert _config_error(parse_period, "2y") == ("per", "2y", "months and years are not supported")
    assert _config_error(parse_period, "3M") == ("per", "3M", "months and years are not supported")
    assert _config_error(parse_period, "mo") == ("per", "mo", "unparseable duration (use w d h m s, e.g. '1h30m')")
    assert _config_error(parse_period, "") == ("per", "", "unparseable duration (use w d h m s, e.g. '1h30m')")
    assert _config_error(parse_period, "1s1m")[2] == "unparseable duration (use w d h m s, e.g. '1h30m')"
    for zero in (0, "0", "0s", "0w0d"):
        assert _config_error(parse_period, zero) == ("per", zero, "a period must be at least one second")
    assert _config_error(parse_period, -5) == ("per", -5, "a period must be at least one second")


def test_rate_entries_defaults_and_refusals_name_the_path():
    assert parse_rate_entries({"limit": 10, "per": 2}) == [RateEntry(10, 2, 5)]
    assert parse_rate_entries({"limit": 1, "per": 2}) == [RateEntry(1, 2, 1)]
    assert parse_rate_entries([{"limit": 3, "per": 1, "burst": 1}, {"limit": 9, "per": 3}]) == [
        RateEntry(3, 1, 1), RateEntry(9, 3, 3)]
    shape = "must be one {limit, per, burst} mapping or a non-empty list"
    assert _config_error(parse_rate_entries, []) == ("rate", [], shape)
    assert _config_error(parse_rate_entries, "1/s", "x.rate") == ("x.rate", "1/s", shape)
    assert _config_error(parse_rate_entries, [5]) == ("rate[0]", 5, "must be a mapping with limit and per")
    assert _config_error(parse_rate_entries, [{"limit": 1, "per": 1}, {"limit": 1, "per": 1, "x": 2}]) == (
        "rate[1]", {"limit": 1, "per": 1, "x": 2}, "unknown fields ['x']")
    assert _config_error(parse_rate_entries, {"per": 1}) == ("rate[0]", {"per": 1}, "limit and per are required")
    assert _config_error(parse_rate_entries, {"limit": 1}) == ("rate[0]", {"limit": 1}, "limit and per are required")
    assert _config_error(parse_rate_entries, {"limit": 0, "per": 1}) == ("rate[0].limit", 0, "must be an integer >= 1")
    assert _config_error(parse_rate_entries, {"limit": True, "per": 1})[:2] == ("rate[0].limit", True)
    assert _config_error(parse_rate_entries, {"limit": "1", "per": 1})[:2] == ("rate[0].limit", "1")
    assert _config_error(parse_rate_entries, {"limit": 1, "per": 0})[:2] == ("rate[0].per", 0)
    assert _config_error(parse_rate_entries, {"limit": 1, "per": 1, "burst": 0})[:2] == ("rate[0].burst", 0)
    assert _config_error(parse_rate_entries, [{"limit": 1, "per": 60}, {"limit": 2, "per": 1},
                                              {"limit": 5, "per": "1m"}]) == (
        "rate[2]", {"limit": 5, "per": "1m"}, "same period as rate[0]")


def test_dominated_entries_are_dropped_in_config_order_ties_keep_the_shorter_period():
    a, b = RateEntry(1, 1, 5), RateEntry(60, 60, 5)  # same rate and burst: the 1 s one is kept
    assert drop_dominated([b, a]) == [a]
    fast, slow = RateEntry(10, 1, 10), RateEntry(100, 60, 20)  # neither beats the other
    assert drop_dominated([fast, slow]) == [fast, slow]
    strict = RateEntry(1, 1, 1)
    assert drop_dominated([fast, strict, slow]) == [strict]
    lower_burst = RateEntry(10, 1, 5)  # same rate, smaller burst: beats fast
    assert drop_dominated([fast, lower_burst]) == [lower_burst]
    slower = RateEntry(5, 1, 10)  # same burst, slower rate: beats fast
    assert drop_dominated([fast, slower]) == [slower]
    assert drop_dominated([]) == []
    assert RateEntry(2, 4, 1).rate * 2 == 1
    assert RateEntry(2, 4, 1).as_dict() == {"limit": 2, "per_s": 4, "burst": 1}


def test_key_limits_and_whole_configs_parse_and_refuse_naming_the_path():
    assert parse_key_limits({"concurrency": 5, "rate": {"limit": 1, "per": "1s"}}) == KeyLimits(
        5, (RateEntry(1, 1, 1),), (RateEntry(1, 1, 1),))
    assert parse_key_limits({"rate": [{"limit": 1, "per": 1}, {"limit": 1, "per": 2}]}) == KeyLimits(
        None, (RateEntry(1, 2, 1),), (RateEntry(1, 1, 1), RateEntry(1, 2, 1)))
    assert parse_key_limits({"concurrency": 2}) == KeyLimits(2, (), ())
    assert parse_key_limits(K_LIMITS) is K_LIMITS
    assert _config_error(parse_key_limits, 3) == ("limits", 3, "must be a mapping with concurrency and/or rate")
    assert _config_error(parse_key_limits, {"concurrency": 1, "rates": 2, "a": 1}, "limits.k") == (
        "limits.k", {"concurrency": 1, "rates": 2, "a": 1}, "unknown fields ['a', 'rates']")
    assert _config_error(parse_key_limits, {}) == ("limits", {}, "declares neither concurrency nor rate")
    assert _config_error(parse_key_limits, {"concurrency": 0}) == ("limits.concurrency", 0, "must be an integer >= 1")
    assert _config_error(parse_key_limits, {"rate": []})[:2] == ("limits.rate", [])
    assert parse_limits(None) == {}
    assert parse_limits({}) == {}
    assert parse_limits({"k": K, "c": {"concurrency": 3}}) == {"k": K_LIMITS, "c": KeyLimits(3, (), ())}
    assert _config_error(parse_limits, {"k": {"concurrency": -1}}) == ("limits.k.concurrency", -1,
                                                                        "must be an integer >= 1")
    for key in ("", "  ", 7):
        assert _config_error(parse_limits, {key: K}) == ("limits", key, "a limit key must be a non-blank string")


# --------------------------------------------------------------------------- key families (issue 34, model only)


def test_a_family_entry_parses_and_a_family_rate_or_a_colliding_static_key_is_refused():
    from model.limits import FamilyLimits, parse_limits

    assert parse_limits({"v": {"per_partition": {"concurrency": 2}, "concurrency": 50}}) == {
        "v": FamilyLimits(KeyLimits(2), 50)}
    assert parse_limits({"v": {"per_partition": {"concurrency": 2}}}) == {"v": FamilyLimits(KeyLimits(2), None)}
    with pytest.raises(ConfigError, match="a rate over a whole family is not supported"):
        parse_limits({"v": {"per_partition": {"concurrency": 2}, "rate": {"limit": 1, "per": 1}}})
    with pytest.raises(ConfigError, match="unknown fields"):
        parse_limits({"v": {"per_partition": {"concurrency": 2}, "burst": 1}})
    with pytest.raises(ConfigError, match=r"limits\.v\.per_partition"):
        parse_limits({"v": {"per_partition": {}}})
    with pytest.raises(ConfigError, match="without '\\['"):
        parse_limits({"v[": {"per_partition": {"concurrency": 1}}})
    with pytest.raises(ConfigError, match="may not be a partition of family 'v'"):
        parse_limits({"v": {"per_partition": {"concurrency": 1}}, 'v["a"]': {"concurrency": 1}})


@pytest.mark.parametrize(("value", "rendered"), [
    ("acct-42", 'v["acct-42"]'), (42, "v[42]"), (-1, "v[-1]"), ("", 'v[""]'), ('"]', 'v["\\"]"]'),
    ("\x00", 'v["\\u0000"]'), ("é🙂", 'v["é🙂"]'), ("x" * 250, 'v["' + "x" * 250 + '"]'),
])
def test_a_partition_key_is_its_value_as_canonical_json_and_inverts(value, rendered):
    from model.limits import partition_key, split_partition_key

    assert partition_key("v", value) == rendered
    assert split_partition_key(rendered) == ("v", value)


@pytest.mark.parametrize("value", [True, None, 1.5, [1], {"a": 1}, "\ud800", "x" * 251])
def test_a_value_that_cannot_be_rendered_or_stored_is_refused_by_name(value):
    from model.limits import partition_key

    with pytest.raises(ConfigError) as raised:
        partition_key("v", value)
    assert raised.value.path == "limit_by"
    assert raised.value.value == value


@pytest.mark.parametrize("key", [None, "v", "v[", "v[x]", 'v["a" ]', "v[1.0]", "v[true]", "v[01]", 'v["a"]x'])
def test_a_key_that_partition_key_would_not_render_is_no_partition(key):
    from model.limits import split_partition_key

    assert split_partition_key(key) is None


def test_a_partition_is_decided_after_its_family_and_the_family_ceiling_spans_partitions():
    """Partitions p1, p2 of v: each 1 at a time; v: 1 at a time. p1 claimed; p2's lane is
    skipped as saturated (the family is full); a raw decision on p2 refuses for
    ``family_concurrency`` and changes nothing; after p1 completes, p2 is claimed."""
    from model.limits import partition_key

    p1, p2 = partition_key("v", 1), partition_key("v", 2)
    m = LimitsModel({"v": {"per_partition": {"concurrency": 1}, "concurrency": 1}})
    m.enqueue(1, p1, 0)
    m.enqueue(2, p2, 0)
    assert m.claim("w", 0) == 1
    assert m.family_in_flight("v") == 1
    assert m.claim("w", 0) is None
    assert m.polls[-1].lanes == (LaneVerdict(p2, 2, 0, 2, "saturated"),)
    decision = m.decide(p2, 0)
    assert (decision.admitted, decision.refused_for, decision.in_flight) == (False, "family_concurrency", 0)
    m.complete(1, 0)
    assert m.claim("w", 0) == 2


def test_forget_partition_removes_an_idle_partitions_rows_and_refuses_a_busy_one():
    from model.limits import Forgotten, partition_key

    p1 = partition_key("v", "a")
    m = LimitsModel({"v": {"per_partition": {"rate": {"limit": 1, "per": "1s"}}}, "k": {"concurrency": 1}})
    m.enqueue(1, p1, 0)
    assert m.claim("w", 0) is None  # the bucket is created empty, the partition stamped
    assert m.buckets == {(p1, 1): Bucket(0, 0, 1_000_000)}
    assert m.stamps == {p1: 1_000_000}
    with pytest.raises(PreconditionError, match="not idle"):
        m.forget_partition(p1, 0)
    with pytest.raises(PreconditionError, match="not a partition key"):
        m.forget_partition("k", 0)
    assert m.claim("w", 1_000_000) == 1
    with pytest.raises(PreconditionError, match="not idle"):
        m.forget_partition(p1, 1_000_000)
    m.complete(1, 1_500_000)
    m.forget_partition(p1, 1_500_000)
    assert (m.buckets, m.stamps, m.events[-1]) == ({}, {}, Forgotten(len(m.events) - 1, p1, 1_500_000))
    m.enqueue(2, p1, 2_000_000)
    assert m.claim("w", 2_000_000) is None  # re-created empty at 2 s: no token carried over
    assert m.buckets == {(p1, 1): Bucket(0, 2_000_000, 1_000_000)}
    assert m.stamps == {p1: 3_000_000}


def test_a_parsed_family_entry_passes_through_and_family_of_names_only_a_declared_family():
    """``parse_limits`` keeps a ``FamilyLimits`` as it is (the object itself); ``family_of``
    names the family of a rendered partition only when the mapping declares it a family
    and does not name the key itself (a static key, even one written like a partition)."""
    from model.limits import FamilyLimits, family_of, limits_for, parse_limits

    family = FamilyLimits(KeyLimits(2), 5)
    parsed = parse_limits({"v": family})
    assert parsed == {"v": family}
    assert parsed["v"] is family
    assert family_of(parsed, 'v["a"]') == ("v", family)
    assert limits_for(parsed, 'v["a"]') == KeyLimits(2)
    assert family_of(parsed, None) is None
    assert family_of(parsed, "v") is None
    assert family_of(parsed, "v[") is None
    assert family_of({"v": family, 'v["a"]': K_LIMITS}, 'v["a"]') is None  # the key is named: static
    assert family_of({}, 'v["a"]') is None  # no such family
    assert family_of({"v": K_LIMITS}, 'v["a"]') is None  # v is a static key, not a family
    assert limits_for({"v": K_LIMITS}, 'v["a"]') is None


def test_a_family_ceiling_refusal_is_a_whole_decision_of_the_partition_at_its_time():
    """The refusal for the family's ceiling reports the partition asked about and the time
    asked, no stamp, no levels (nothing refilled) and the partition's own in-flight count."""
    from model.limits import partition_key

    p1, p2 = partition_key("v", 1), partition_key("v", 2)
    m = LimitsModel({"v": {"per_partition": {"concurrency": 2}, "concurrency": 1}})
    assert m.decide(p1, 0).admitted
    since = len(m.events)
    assert m.decide(p2, 5) == Decision(p2, 5, False, "family_concurrency", None, (), 0)
    assert _new_events(m, since) == [Decided(p2, 5, False, "family_concurrency", None, (), 0, seq=since)]


def test_would_admit_answers_as_the_key_decision_would_and_changes_nothing():
    """``_would_admit`` (a keyed batch's and a hand-off's question, and the limits machine's
    oracle) is False for a partition whose family is full though the partition is not, and
    for a key at its own ceiling, as the decision refuses them; on a bucket it is True from
    the exact µs the bucket holds a token (r: 2 per 1 s, one token each 500,000 µs)."""
    from model.limits import partition_key

    p1, p2 = partition_key("v", 1), partition_key("v", 2)
    m = LimitsModel({"v": {"per_partition": {"concurrency": 2}, "concurrency": 1}, "k": {"concurrency": 1}, "r": R})
    assert m._would_admit(p2, 0) is True
    assert m._would_admit("k", 0) is True
    assert m._would_admit("unnamed", 0) is True
    assert m.decide(p1, 0).admitted  # the family is full, p2 is not
    assert m.decide("k", 0).admitted  # k is at its ceiling, in no family
    assert m._would_admit(p2, 0) is False
    assert m.decide(p2, 0).refused_for == "family_concurrency"
    assert m._would_admit("k", 0) is False
    assert m.decide("k", 0).refused_for == "concurrency"
    assert m._would_admit("r", 0) is False  # no bucket yet: it would be created empty
    assert m.decide("r", 0).refused_for == "rate"
    state = (dict(m.buckets), dict(m.stamps), len(m.events))
    assert m._would_admit("r", S // 2 - 1) is False
    assert m._would_admit("r", S // 2) is True
    assert (dict(m.buckets), dict(m.stamps), len(m.events)) == state


def test_a_restart_rebases_every_partition_with_an_execution_and_no_other_unnamed_key():
    """A partition no entry names, with a pending execution and neither bucket nor stamp,
    is re-based by a restart; an unconfigured static key with one is not (no entry named
    it before or after), nor the unkeyed lane."""
    from model.limits import FamilyLimits, partition_key

    p = partition_key("v", "a")
    m = LimitsModel({"v": {"per_partition": {"concurrency": 1}}})
    m.enqueue(1, p, 0)
    m.enqueue(2, "unnamed", 0)
    m.enqueue(3, None, 0)
    m.restart_with({"v": {"per_partition": {"concurrency": 2}}}, 5)
    limits = {"v": FamilyLimits(KeyLimits(2), None)}
    assert m.events[-1] == Restarted(len(m.events) - 1, 5, limits, frozenset({"v", p}))


def test_forget_partition_refuses_a_key_that_is_no_partition_or_is_named_and_changes_nothing():
    """Neither a key that renders no partition nor a static key written like one (``s[1]``,
    s no family) is forgotten: a PreconditionError, and no event."""
    m = LimitsModel({"v": {"per_partition": {"concurrency": 1}}, "s[1]": {"concurrency": 1}})
    since = len(m.events)
    for key in ("unnamed", "s[1]", "v"):
        with pytest.raises(PreconditionError, match=rf"^{key!r} is not a partition key$".replace("[", r"\[")):
            m.forget_partition(key, 0)
    assert len(m.events) == since


def test_forget_partition_of_a_partition_never_stamped_or_never_decided():
    """An idle partition with no stamp (a concurrency-only partition, completed; or one never
    claimed) is forgotten: nothing to remove, the Forgotten event all the same."""
    from model.limits import Forgotten, partition_key

    p, q = partition_key("v", "a"), partition_key("v", "b")
    m = LimitsModel({"v": {"per_partition": {"concurrency": 1}}})
    m.enqueue(1, p, 0)
    assert m.claim("w", 0) == 1
    m.complete(1, 3)
    m.forget_partition(p, 4)
    m.forget_partition(q, 5)
    assert m.events[-2:] == [Forgotten(len(m.events) - 2, p, 4), Forgotten(len(m.events) - 1, q, 5)]
    assert (m.buckets, m.stamps) == ({}, {})


def test_forget_partition_hands_each_bucket_its_own_periods_entry_and_the_time():
    """The hook ``_forget_bucket`` gets each bucket with the entry of its period and the
    time of the forgetting, and a bucket it returns is kept in its place: with
    ``model.mutants.ForgetRefills`` (the INV-LIM-9 mutant, which refills instead of
    removing) each of the two buckets comes back full to its own entry's cap at that time,
    and the stamp is removed."""
    from model.limits import partition_key
    from model.mutants import ForgetRefills

    fast, slow = RateEntry(10, 1, 10), RateEntry(100, 60, 20)  # neither beats the other: both kept
    p = partition_key("v", "a")
    m = ForgetRefills({"v": {"per_partition": {"rate": [{"limit": 10, "per": 1, "burst": 10},
                                                        {"limit": 100, "per": "1m", "burst": 20}]}}})
    assert m.config["v"].per_partition.rates == (fast, slow)
    assert m.decide(p, 0).refused_for == "rate"  # both buckets created empty, p stamped
    assert set(m.buckets) == {(p, 1), (p, 60)}
    assert p in m.stamps
    m.forget_partition(p, 7)
    assert m.buckets == {(p, 1): Bucket(cap_units(fast), 7, cap_units(fast)),
                         (p, 60): Bucket(cap_units(slow), 7, cap_units(slow))}
    assert m.stamps == {}

