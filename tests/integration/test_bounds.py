"""Every bound a claim applies, pinned on each path that applies it, at its edge.

A keyed execution is claimed on four paths: a poll (``claims.claim``), a keyed batch of
up to k (``claims.claim_batch``'s ``keyed_limit``), the hand-off in the transaction that
records one success (``outcomes.record_successes`` of one),
and the hand-off after a keyed group commit (``executions._record_batch``). Unkeyed work
is claimed by a batch and handed off after one success or a group commit. Failures,
timeouts and crashes release their slot but hand nothing off. Most bounds are applied by
one shared guard (``lanes.in_lane`` and ``buckets.decide`` in ``claims.decide_and_claim``),
so each test here is parametrised over the paths: a path that stopped applying the bound
(a hand-off that skipped the decision, a batch that did not carry its spends) fails its
own case. docs/verification.md, "Bounds per path", has the table, bound by path.

Each test prepares the rows directly (executions in flight, bucket levels, the key's
stamp and config digest) on a ManualClock, runs one path once, and asserts the exact
number and order of what it claimed and what it wrote.

Checks: INV-LIM-1 (the ceiling), INV-LIM-2 (tokens), INV-LIM-4 (the burst cap, the stored
values a key follows), INV-LIM-5 (the stamp), INV-LIM-6 (eligibility, order within and
across lanes, at most k), INV-CLK-1 (sequence numbers and claim times).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from ductwork.db import schema
from ductwork.db.clock import ManualClock, to_us
from ductwork.fleet.processes import register
from ductwork.limit_entries import entry_digest
from ductwork.limits import claims
from ductwork.pipelines.outcomes import HandOff, Success, record_successes
from ductwork.pipelines.payloads import Output
from tests.conftest import installed, make_app
from tests.factories import make_executions, make_run

NOW = datetime(2026, 1, 1, 12, 0, 0)
EARLIER = NOW - timedelta(seconds=1)
US = timedelta(microseconds=1)
TOKEN = 1_000_000  # units of one token of a 1 s period

KEYED = ["claim", "batch", "hand_off", "group"]
UNKEYED = ["unkeyed_batch", "unkeyed_hand_off", "unkeyed_group"]
#: executions this worker holds before the path runs: what its hand-off completes
CARRIERS = {"claim": 0, "batch": 0, "hand_off": 1, "group": 3,
            "unkeyed_batch": 0, "unkeyed_hand_off": 1, "unkeyed_group": 3}


@pytest.fixture
def bounds_app(db_url):
    yield from installed(make_app(db_url, clock=ManualClock(NOW), job_worker={"limits": {
        "ceiling": {"concurrency": 4},
        "rated": {"rate": {"limit": 1, "per": "1s", "burst": 10}},
        "free": {"concurrency": 100},
    }}))


class World:
    """One run's rows on ``bounds_app``: this worker ("me"), another one, and helpers."""

    def __init__(self, app):
        self.app = app
        self.run_id, self.branch_id = make_run(app)
        self.me = register(app, role="test", label="me")
        self.other = register(app, role="test", label="other")

    def pending(self, key, count=1, eligible_at=EARLIER):
        ids = make_executions(self.app, self.run_id, self.branch_id, key, eligible_at, count)
        if key is not None:  # the key follows this config already (as after any claim)
            with self.app.begin() as tx:
                tx.execute(schema.limit_keys.update().where(schema.limit_keys.c.key == key)
                           .values(config_digest=entry_digest(self.app.config.limits.get(key))))
        return ids

    def hold(self, key, count, process=None):
        """``count`` executions of lane ``key`` claimed by ``process`` (default: me) as a
        claim would leave them (next sequence numbers), without spending tokens."""
        if count == 0:
            return []
        ids = self.pending(key, count)
        e, k = schema.executions, schema.limit_keys
        with self.app.begin() as tx:
            seq = 0
            if key is not None:
                seq = tx.execute(sa.select(k.c.seq).where(k.c.key == key)).scalar_one()
                tx.execute(k.update().where(k.c.key == key).values(seq=seq + count))
            for i, execution_id in enumerate(ids, start=1):
                tx.execute(e.update().where(e.c.id == execution_id).values(
                    claimed_at=tx.now, process_id=process or self.me,
                    claim_seq=None if key is None else seq + i, updated_at=tx.now))
            return claims._load(tx, ids)

    def bucket(self, key, level_units, refilled_at=NOW):
        b = schema.limit_buckets
        with self.app.begin() as tx:
            tx.execute(b.delete().where(b.c.key == key))
            tx.execute(b.insert().values(key=key, period_s=1, level_units=level_units,
                                         refilled_at_us=to_us(refilled_at), updated_at=tx.now))

    def take(self, path, carried, k):
        """Run ``path`` once, up to ``k`` claims; the ids it claimed, in order. A poll is
        repeated up to ``k`` times, stopping at the first that claims nothing."""
        if path == "claim":
            got = []
            while len(got) < k and (claimed := claims.claim(self.app, self.me)) is not None:
                got.append(claimed.execution_id)
            return got
        if path in ("batch", "unkeyed_batch"):
            return [c.execution_id for c in claims.claim_batch(self.app, self.me, k, keyed_limit=k)]
        assert len(carried) == CARRIERS[path]
        handed = record_successes(self.app, [Success(c, Output("null")) for c in carried], HandOff(k, k))
        return [c.execution_id for c in handed]

    def rows(self, ids):
        e = schema.executions
        with self.app.begin() as tx:
            found = {row.id: row for row in tx.execute(
                sa.select(e.c.id, e.c.claimed_at, e.c.completed_at, e.c.process_id, e.c.claim_seq,
                          e.c.release_seq).where(e.c.id.in_(ids)))}
        return [found[i] for i in ids]

    def key_row(self, key):
        k = schema.limit_keys
        with self.app.begin() as tx:
            return tx.execute(sa.select(k.c.seq, k.c.blocked_until, k.c.config_digest)
                              .where(k.c.key == key)).one()

    def buckets(self, key):
        b = schema.limit_buckets
        with self.app.begin() as tx:
            return tx.execute(sa.select(b.c.level_units, b.c.refilled_at_us).where(b.c.key == key)).all()

    def in_flight(self, key):
        e = schema.executions
        with self.app.begin() as tx:
            return tx.execute(sa.select(sa.func.count()).where(e.c.inflight_key == key)).scalar_one()


# -- the concurrency ceiling [INV-LIM-1] --------------------------------------------------------

#: (held by this worker and completed by the path, held by another worker, claimed)
CEILING = {"claim": (0, 2, 2), "batch": (0, 1, 3), "hand_off": (1, 3, 1), "group": (3, 1, 3)}


@pytest.mark.parametrize("path", KEYED)
def test_the_concurrency_ceiling_bounds_each_path(bounds_app, path):
    """``concurrency: 4``, five queued, up to five asked for: each path claims exactly the
    free slots left after what it releases, e.g. a group commit of 3 beside 1 held
    elsewhere hands on 3, one success beside 3 held elsewhere hands on 1; the key is then
    at its ceiling, and a claim is refused for concurrency [INV-LIM-1]."""
    world = World(bounds_app)
    mine, others, expected = CEILING[path]
    carried = world.hold("ceiling", mine)
    world.hold("ceiling", others, world.other)
    queued = world.pending("ceiling", 5)
    assert world.take(path, carried, 5) == queued[:expected]
    assert world.in_flight("ceiling") == 4
    refusal = claims.claim_keyed(bounds_app, "ceiling", world.me, 5)
    assert isinstance(refusal, claims.Refusal)
    assert refusal.reason == "concurrency"


# -- rate buckets [INV-LIM-2, INV-LIM-4, INV-LIM-5] -----------------------------------------------


@pytest.mark.parametrize("path", KEYED)
def test_a_bucket_one_unit_short_of_two_tokens_admits_one_on_each_path(bounds_app, path):
    """``1 per 1s``: a bucket holding two tokens less one unit admits exactly one claim
    whatever the path asks for (no token early), spends it, and stamps the key with the
    µs at which the missing unit arrives [INV-LIM-2, INV-LIM-5]."""
    world = World(bounds_app)
    carried = world.hold("rated", CARRIERS[path])
    queued = world.pending("rated", 5)
    world.bucket("rated", 2 * TOKEN - 1)
    assert world.take(path, carried, 5) == queued[:1]
    assert world.buckets("rated") == [(TOKEN - 1, to_us(NOW))]
    assert world.key_row("rated").blocked_until == NOW + US


@pytest.mark.parametrize("path", KEYED)
def test_a_full_bucket_admits_its_burst_and_no_more_on_each_path(bounds_app, path):
    """``1 per 1s, burst 10``, a bucket last refilled an hour ago: the refill stops at the
    burst, so each path asking for twelve claims exactly ten, and the key is stamped a
    token's time later [INV-LIM-2, INV-LIM-4, INV-LIM-5]."""
    world = World(bounds_app)
    carried = world.hold("rated", CARRIERS[path])
    queued = world.pending("rated", 12)
    world.bucket("rated", 9 * TOKEN, refilled_at=NOW - timedelta(hours=1))
    assert world.take(path, carried, 12) == queued[:10]
    assert world.buckets("rated") == [(0, to_us(NOW))]
    assert world.key_row("rated").blocked_until == NOW + timedelta(seconds=1)


@pytest.mark.parametrize("path", KEYED)
def test_a_rate_refusal_stamps_on_a_claim_and_leaves_no_trace_on_a_hand_off(bounds_app, path):
    """A bucket one unit short of a token after its refill: nothing is claimed on any
    path; a poll or batch writes the refill and stamps the key with the next token's µs
    [INV-LIM-5], a hand-off writes nothing of the key (its worker polls as usual)."""
    world = World(bounds_app)
    carried = world.hold("rated", CARRIERS[path])
    world.pending("rated", 2)
    world.bucket("rated", TOKEN - 2, refilled_at=NOW - US)
    assert world.take(path, carried, 2) == []
    stamped = path in ("claim", "batch")
    assert world.buckets("rated") == ([(TOKEN - 1, to_us(NOW))] if stamped else [(TOKEN - 2, to_us(NOW - US))])
    assert world.key_row("rated").blocked_until == (NOW + US if stamped else None)


# -- eligibility, order, at most k [INV-LIM-6] ----------------------------------------------------


def _lane(path):
    return None if path in UNKEYED else "free"


@pytest.mark.parametrize("path", KEYED + UNKEYED)
def test_an_execution_eligible_one_microsecond_later_is_not_claimed_on_any_path(bounds_app, path):
    """One execution eligible now and one eligible a µs from now: each path, asked for
    five, claims only the first [INV-LIM-6]."""
    world = World(bounds_app)
    carried = world.hold(_lane(path), CARRIERS[path])
    now, = world.pending(_lane(path), eligible_at=NOW)
    later, = world.pending(_lane(path), eligible_at=NOW + US)
    assert world.take(path, carried, 5) == [now]
    assert world.rows([later])[0].claimed_at is None


@pytest.mark.parametrize("path", KEYED + UNKEYED)
def test_each_path_claims_a_lane_oldest_eligible_first(bounds_app, path):
    """Executions created in the order x, y, z, w, eligible at now, now − 2 µs, now − 1 µs,
    now − 1 µs: each path takes y, z, w, x (eligible time, then creation order) [INV-LIM-6]."""
    world = World(bounds_app)
    carried = world.hold(_lane(path), CARRIERS[path])
    x, = world.pending(_lane(path), eligible_at=NOW)
    y, = world.pending(_lane(path), eligible_at=NOW - 2 * US)
    z, w = world.pending(_lane(path), 2, eligible_at=NOW - US)
    assert world.take(path, carried, 4) == [y, z, w, x]


@pytest.mark.parametrize("path", KEYED + UNKEYED)
def test_each_path_stops_before_an_older_lanes_oldest(bounds_app, path):
    """The path's lane has a (now − 3 µs) and b (now − 1 µs), another lane c (now − 2 µs):
    asked for five, a batch or hand-off takes a only; polls in a row take a, c, b
    [INV-LIM-6]."""
    world = World(bounds_app)
    carried = world.hold(_lane(path), CARRIERS[path])
    a, = world.pending(_lane(path), eligible_at=NOW - 3 * US)
    c, = world.pending("free" if path in UNKEYED else None, eligible_at=NOW - 2 * US)
    b, = world.pending(_lane(path), eligible_at=NOW - US)
    assert world.take(path, carried, 5) == ([a, c, b] if path == "claim" else [a])


@pytest.mark.parametrize("path", KEYED + UNKEYED)
def test_each_path_claims_at_most_k(bounds_app, path):
    """Five queued that the lane admits: a batch or hand-off of k = 2 claims the oldest two;
    a poll claims one [INV-LIM-6]."""
    world = World(bounds_app)
    carried = world.hold(_lane(path), CARRIERS[path])
    queued = world.pending(_lane(path), 5)
    if path == "claim":
        assert claims.claim(bounds_app, world.me).execution_id == queued[0]
        assert [row.claimed_at for row in world.rows(queued[1:])] == [None] * 4
        return
    assert world.take(path, carried, 2) == queued[:2]
    assert [row.claimed_at for row in world.rows(queued[2:])] == [None] * 3


# -- what a claim writes: sequence numbers and times [INV-CLK-1] ---------------------------------


@pytest.mark.parametrize("path", KEYED)
def test_each_path_numbers_its_claims_after_its_releases(bounds_app, path):
    """From the key's seq s: the path's releases take s + 1, … in order, then its three
    claims the next three numbers in claim order, the key's seq is the last, and every
    claim is at the time of the path's transaction (a hand-off's: its releases') [INV-CLK-1]."""
    world = World(bounds_app)
    carried = world.hold("free", CARRIERS[path])
    queued = world.pending("free", 5)
    s = world.key_row("free").seq
    bounds_app.clock.advance(microseconds=5)
    got = world.take(path, carried, 3)
    assert got == queued[:3]
    released = world.rows([c.execution_id for c in carried])
    assert [row.release_seq for row in released] == list(range(s + 1, s + 1 + len(carried)))
    s += len(carried)
    taken = world.rows(got)
    assert [row.claim_seq for row in taken] == [s + 1, s + 2, s + 3]
    assert world.key_row("free").seq == s + 3
    assert {row.claimed_at for row in taken} == {NOW + 5 * US}
    assert {row.completed_at for row in released} <= {NOW + 5 * US}


# -- a key whose stored values are not this process's config --------------------------------------


@pytest.mark.parametrize("path", KEYED)
def test_a_key_enforced_with_other_values_is_rebased_by_a_claim_and_left_by_a_hand_off(bounds_app, path):
    """The key's row carries another config's digest (a deploy in progress) and the 1 s
    bucket those values rated it by, though this process's entry for it has no rate: a
    poll or batch re-bases it on this process's values (the bucket of a period its entry
    does not keep dropped, the stamp cleared) and claims [INV-LIM-4]; a hand-off claims
    nothing and writes nothing of the key, leaving it to a poll."""
    world = World(bounds_app)
    carried = world.hold("ceiling", CARRIERS[path])
    queued = world.pending("ceiling", 2)
    with bounds_app.begin() as tx:
        tx.execute(schema.limit_keys.update().where(schema.limit_keys.c.key == "ceiling")
                   .values(config_digest="another-config", blocked_until=NOW + timedelta(hours=1)))
    world.bucket("ceiling", 3 * TOKEN)
    rebased = path in ("claim", "batch")  # (a stamp made under other values holds no poll back)
    assert world.take(path, carried, 2) == (queued if rebased else [])
    row = world.key_row("ceiling")
    assert row.config_digest == (entry_digest(bounds_app.config.limits["ceiling"]) if rebased else "another-config")
    assert row.blocked_until == (None if rebased else NOW + timedelta(hours=1))
    assert world.buckets("ceiling") == ([] if rebased else [(3 * TOKEN, to_us(NOW))])


@pytest.mark.parametrize("path", ["claim", "batch"])
def test_a_rebase_keeps_an_empty_buckets_level(bounds_app, path):
    """The rate key's row carries another config's digest and its 1 s bucket holds less
    than a token: the poll or batch that re-bases it on this process's values keeps the
    bucket's level (it never adds tokens) and claims nothing, leaving the bucket as it
    was [INV-LIM-2, INV-LIM-4]."""
    world = World(bounds_app)
    world.pending("rated", 3)
    world.bucket("rated", TOKEN - 1)
    with bounds_app.begin() as tx:
        tx.execute(schema.limit_keys.update().where(schema.limit_keys.c.key == "rated")
                   .values(config_digest="another-config"))
    assert world.take(path, [], 3) == []
    assert world.buckets("rated") == [(TOKEN - 1, to_us(NOW))]
    assert world.key_row("rated").config_digest == entry_digest(bounds_app.config.limits["rated"])
