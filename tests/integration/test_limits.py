"""Limits end to end on each database: real parallel workers, rows and witnesses.

Checks: INV-LIM-1 (concurrency never exceeded, measured from claim/release
sequences and from witness rows the step bodies write; and it is reached),
INV-LIM-2 (rate windows from database claim times), INV-LIM-3 (no slot left
held), INV-LIM-5 (blocked keys are stamped with their next token time),
INV-LIM-6 (FIFO across lanes), and the seed's two-entry example.
"""

from __future__ import annotations

import itertools
import threading
import time
from datetime import datetime, timedelta
from fractions import Fraction

import pytest
import sqlalchemy as sa

from ductwork import Pipeline
from ductwork.app import set_default_app
from ductwork.db import schema
from ductwork.db.clock import to_us
from ductwork.fleet.supervisor import Loop
from ductwork.fleet.worker import Worker
from ductwork.pipelines.advance import Advancer
from tests.conftest import make_app, reset_tables
from tests.workloads import Boom, Echo, Items, OnKey, Takes, Unkeyed
from tests.workloads.hooks import HaltingPipeline

witness_meta = sa.MetaData()
witness = sa.Table(
    "test_witness", witness_meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("step_id", sa.String(36), nullable=False),
    sa.Column("key", sa.String(64), nullable=False),
    sa.Column("event", sa.String(8), nullable=False),
    sa.Column("at", sa.DateTime().with_variant(sa.dialects.mysql.DATETIME(fsp=6), "mysql", "mariadb"),
              nullable=False),
)

HELD = 3
_app_for_steps: dict[str, object] = {}


def _witness(step, event):
    app = _app_for_steps["app"]
    with app.begin() as tx:  # its own short transaction, like a user's side effect
        tx.execute(witness.insert().values(step_id=step.idempotency_key, key="shared", event=event, at=tx.now))


def _running(app):
    with app.begin() as tx:
        starts = tx.execute(sa.select(sa.func.count()).where(witness.c.event == "start")).scalar_one()
        ends = tx.execute(sa.select(sa.func.count()).where(witness.c.event == "end")).scalar_one()
    return starts - ends


class UseShared(Takes):
    """Holds its slot until HELD bodies run at once (or a deadline), proving the limit is reached."""

    def execute(self):
        _witness(self, "start")
        app = _app_for_steps["app"]
        deadline = time.monotonic() + 10
        while _running(app) < HELD and time.monotonic() < deadline and not _app_for_steps.get("reached"):
            time.sleep(0.01)
        if _running(app) >= HELD:
            _app_for_steps["reached"] = True
        time.sleep(0.02)
        _witness(self, "end")
        return self.value


class UseSharedToo(UseShared):
    pass


class SharedA(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Items).expand(to=UseShared, limit_by="shared")


class SharedB(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Items).expand(to=UseSharedToo, limit_by="shared")


class Paced(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Items).expand(to=Echo, limit_by="paced")


class SeedTwoEntries(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Items).expand(to=Echo, limit_by="vendor_api")


class KeyedQuick(OnKey):
    key = "shared"


def _fleet(app, workers, until, deadline_s=60.0):
    """Worker and advancer threads (each its own connections) until ``until()``."""
    stop = threading.Event()
    loops = [Loop(f"w{i}", lambda w=Worker(app): w.run_once() is not None, 0.01, stop)  # noqa: B008 - one each
             for i in range(workers)]
    loops.append(Loop("a", lambda a=Advancer(app): a.run_once() != "idle", 0.01, stop))  # noqa: B008
    for loop in loops:
        loop.start()
    deadline = time.monotonic() + deadline_s
    try:
        while not until():
            assert time.monotonic() < deadline, "the fleet did not finish in time"
            time.sleep(0.02)
    finally:
        stop.set()
        for loop in loops:
            loop.join(10)


def _claims(app, key):
    e = schema.executions
    with app.begin() as tx:
        return tx.execute(sa.select(e.c.claim_seq, e.c.release_seq, e.c.claimed_at)
                          .where(e.c.limit_key == key, e.c.claimed_at.is_not(None))
                          .order_by(e.c.claim_seq)).all()


def _max_in_flight_by_sequence(claims):
    events = sorted([(c.claim_seq, +1) for c in claims] + [(c.release_seq, -1) for c in claims])
    assert all(seq is not None for seq, _ in events), "every keyed claim and release has a sequence number"
    assert len({seq for seq, _ in events}) == len(events), "sequence numbers are unique per key"
    held = peak = 0
    for _, delta in events:
        held += delta
        peak = max(peak, held)
    return peak


def _max_overlap_of_witnesses(app):
    with app.begin() as tx:
        rows = tx.execute(sa.select(witness.c.step_id, witness.c.event, witness.c.at)).all()
    events = sorted((at, 1 if event == "start" else -1) for _, event, at in rows)
    # ends sort before starts at equal times: a body that ended cannot overlap one that starts then
    events.sort(key=lambda e: (e[0], e[1]))
    held = peak = 0
    for _, delta in events:
        held += delta
        peak = max(peak, held)
    return peak


@pytest.fixture
def limits_app(db_url):
    app = make_app(db_url, job_worker={"limits": {
        "shared": {"concurrency": HELD},
        "paced": {"rate": {"limit": 5, "per": "1s"}},
        "vendor_api": {"rate": [{"limit": 1, "per": "1s"}, {"limit": 2000, "per": "1h", "burst": 50}]},
    }})
    reset_tables(app.engine)
    witness_meta.drop_all(app.engine)
    witness_meta.create_all(app.engine)
    set_default_app(app)
    _app_for_steps.clear()
    _app_for_steps["app"] = app
    yield app
    witness_meta.drop_all(app.engine)
    set_default_app(None)
    app.dispose()


def test_shared_concurrency_is_never_exceeded_and_is_reached(limits_app):
    app = limits_app
    runs = [SharedA.trigger(6), SharedB.trigger(6)]  # two steps in two pipelines share one pool
    _fleet(app, workers=8, until=lambda: all(r.refresh().status == "completed" for r in runs))
    claims = _claims(app, "shared")
    assert len(claims) == 12
    assert _max_in_flight_by_sequence(claims) == HELD  # [INV-LIM-1] from rows: never 4, does reach 3
    assert _max_overlap_of_witnesses(app) == HELD  # [INV-LIM-1] from the bodies' own witness rows
    assert _app_for_steps.get("reached") is True
    with app.begin() as tx:
        assert tx.execute(sa.select(sa.func.count()).where(
            schema.executions.c.inflight_key == "shared")).scalar_one() == 0  # [INV-LIM-3]


def _window_violations(times_us, limit, per_s, burst):
    """Claims in [t_i, t_j] ≤ burst + limit·(t_j − t_i)/per, for every i ≤ j (exact)."""
    rate = Fraction(limit, per_s * 1_000_000)
    worst = None
    for i in range(len(times_us)):
        for j in range(i, len(times_us)):
            allowed = burst + rate * (times_us[j] - times_us[i])
            if j - i + 1 > allowed:
                worst = (i, j, j - i + 1, allowed)
    return worst


def test_rate_limit_windows_hold_in_database_time(limits_app):
    app = limits_app
    run = Paced.trigger(14)
    _fleet(app, workers=4, until=lambda: run.refresh().status == "completed")
    times = [to_us(c.claimed_at) for c in _claims(app, "paced")]
    assert len(times) == 14
    assert _window_violations(times, 5, 1, 5) is None  # [INV-LIM-2] burst 5 + 5/s · T
    # Buckets start empty: the first claim waited for its first token (0.2 s at 5/s).
    with app.begin() as tx:
        triggered = tx.execute(sa.select(schema.runs.c.triggered_at)).scalar_one()
    assert times[0] - to_us(triggered) >= 200_000


def test_a_rate_keys_long_run_throughput_is_its_rate(limits_app):
    """``limit: 5, per: 1s`` over 150 claims by two workers that poll whenever the key's
    stamp says a token is due: the throughput in database time is within 5 % of 5/s
    (exactly 5/s here: buckets start empty, so no banked burst inflates it), and no window
    exceeds burst + 5·T [INV-LIM-2, INV-LIM-5]. An injected clock makes this a property of
    the limiter, not of this machine's speed (bench/ measures that)."""
    from ductwork.db.clock import ManualClock

    app = make_app(limits_app.url, config=limits_app.config, clock=ManualClock(datetime(2026, 1, 1)))
    set_default_app(app)
    run = Paced.trigger(150)
    workers, advancer = [Worker(app), Worker(app)], Advancer(app)
    while advancer.run_once() != "idle" or workers[0].run_once() is not None:
        pass
    claimed: list[int] = []
    while len(claimed) < 150:
        if workers[len(claimed) % 2].run_once() is not None:
            claimed.append(to_us(app.clock.now()))
            continue
        with app.begin() as tx:  # refused: the next poll is when the stamp says
            blocked = tx.execute(sa.select(schema.limit_keys.c.blocked_until)
                                 .where(schema.limit_keys.c.key == "paced")).scalar_one()
        assert blocked is not None
        assert blocked > app.clock.now()
        app.clock.set(blocked)
    throughput = Fraction(len(claimed) - 1, claimed[-1] - claimed[0]) * 1_000_000
    assert abs(throughput - 5) <= Fraction(5, 100) * 5, float(throughput)
    assert _window_violations(claimed, 5, 1, 5) is None
    while advancer.run_once() != "idle" or workers[0].run_once() is not None:
        pass
    assert run.refresh().status == "completed"
    app.dispose()
    set_default_app(limits_app)


def test_the_seeds_two_entry_example_obeys_both_buckets(limits_app):
    """``1 per 1s`` and ``2000 per 1h, burst 50``: a start needs a token from each."""
    from datetime import datetime

    from ductwork.db.clock import ManualClock

    app = make_app(limits_app.url, config=limits_app.config, clock=ManualClock(datetime(2026, 1, 1)))
    set_default_app(app)
    run = SeedTwoEntries.trigger(130)
    worker, advancer = Worker(app), Advancer(app)
    while advancer.run_once() != "idle" or worker.run_once() is not None:
        pass
    start = to_us(app.clock.now())
    # Idle for an hour: the hourly bucket fills to its burst of 50, the per-second one to 1.
    app.clock.advance(timedelta(hours=1))
    claimed = []
    while len(claimed) < 130:
        if worker.run_once() is not None:
            claimed.append(to_us(app.clock.now()) - start)
            continue
        with app.begin() as tx:  # refused: jump exactly to the stamped next-token time
            blocked = tx.execute(sa.select(schema.limit_keys.c.blocked_until)
                                 .where(schema.limit_keys.c.key == "vendor_api")).scalar_one()
        assert blocked is not None
        assert blocked > app.clock.now()
        app.clock.set(blocked)
    gaps = [b - a for a, b in itertools.pairwise(claimed)]
    assert min(gaps) >= 1_000_000  # the per-second bucket: never two starts within 1 s
    assert _window_violations(claimed, 1, 1, 1) is None
    assert _window_violations(claimed, 2000, 3600, 50) is None
    # While the hourly bucket has banked tokens the pace is exactly 1/s ...
    assert gaps[:40] == [1_000_000] * 40
    # ... and once it has spent its burst (50 banked, net -0.44/s: ~112 starts), the hourly
    # entry (1.8 s per token) sets the pace.
    assert max(gaps[-5:]) >= 1_800_000
    # each child's leaf ended its branch in its success's transaction: the last one, the run
    assert run.refresh().status == "completed"
    app.dispose()
    set_default_app(limits_app)


def test_unkeyed_and_keyed_lanes_are_served_oldest_first(limits_app):
    """With nothing saturated, claims follow global FIFO across lanes [INV-LIM-6]."""
    from datetime import datetime

    from ductwork.db.clock import ManualClock

    app = make_app(limits_app.url, config=limits_app.config, clock=ManualClock(datetime(2026, 1, 1)))
    set_default_app(app)
    expected = []
    for i in range(3):
        KeyedQuick.trigger(f"k{i}")
        expected.append(["k", f"k{i}"])
        app.clock.advance(microseconds=10)
        Unkeyed.trigger(f"u{i}")
        expected.append(["u", f"u{i}"])
        app.clock.advance(microseconds=10)
    worker, order = Worker(app), []
    while (done := worker.run_once()) is not None:
        order.append(done.node)
    assert order == ["Echo#0"] * 6
    e, s = schema.executions, schema.steps
    with app.begin() as tx:
        inputs = tx.execute(sa.select(s.c.input_args).join(e, e.c.step_id == s.c.id)
                            .order_by(e.c.claimed_at, e.c.id)).scalars().all()
    assert [__import__("json").loads(a)[0] for a in inputs] == [x[1] for x in expected]
    app.dispose()
    set_default_app(limits_app)


class Hourly(OnKey):
    key = "hourly"


def test_a_keyed_lane_its_rate_refuses_does_not_hold_back_a_younger_unkeyed_execution(db_url):
    """The oldest lane is a key whose first decision refuses (a bucket starts empty); the
    same poll goes on to the next lane and claims the unkeyed execution behind it
    [INV-LIM-6]; the key's own execution waits for its token."""
    from datetime import datetime

    from ductwork.db.clock import ManualClock
    from tests.conftest import installed

    for app in installed(make_app(db_url, clock=ManualClock(datetime(2026, 1, 1)),
                                  job_worker={"limits": {"hourly": {"rate": {"limit": 1, "per": "1h"}}}})):
        keyed = Hourly.trigger("k")
        app.clock.advance(microseconds=10)
        unkeyed = Unkeyed.trigger("u")
        worker = Worker(app)
        assert worker.run_once() is not None
        assert (keyed.refresh().status, unkeyed.refresh().status) == ("in_progress", "completed")
        assert worker.run_once() is None  # the key is stamped until its token
        (stamp,) = _blocked_until(app, "hourly")
        assert stamp == datetime(2026, 1, 1, 1, 0, 0, 10)  # an hour after the poll (at 10 µs) created it empty


class Spare(OnKey):
    key = "spare"


def _telling(app, told: list, after: str, lane: str, process_id: str):
    """A poll's ``refused`` hook that keeps each refusal in ``told`` and, after ``after``'s,
    lets another worker (``process_id``) claim lane ``lane``'s next execution."""
    from ductwork.limits.claims import claim_keyed

    def refused(refusal) -> None:
        told.append(refusal)
        if refusal.key == after:
            assert len(claim_keyed(app, lane, process_id)) == 1

    return refused


def _claims_of(app, process_id):
    e = schema.executions
    with app.begin(readonly=True) as tx:
        return tx.execute(sa.select(e.c.id, schema.steps.c.run_id).join(schema.steps, schema.steps.c.id == e.c.step_id)
                          .where(e.c.process_id == process_id)).all()


def test_a_poll_tells_of_each_key_its_limits_refused_and_not_of_one_gone(db_url):
    """Three lanes oldest first: a rated key whose bucket starts empty, a key with a free
    slot, and the unkeyed lane. A poll (``claim_batch``) is refused by the first for its
    rate and tells its ``refused`` hook (the fleet counts refusals); meanwhile (in that
    hook: after the poll's scan, before its next claim) another worker takes the second
    key's only execution, so the poll finds that lane gone, which is no refusal and is
    not told; it then claims the unkeyed execution. The hook heard of the rate refusal
    alone."""
    from ductwork.db.clock import ManualClock
    from ductwork.fleet.processes import register
    from ductwork.limits.claims import Refusal, claim_batch
    from tests.conftest import installed

    for app in installed(make_app(db_url, clock=ManualClock(datetime(2026, 1, 1)), job_worker={"limits": {
            "hourly": {"rate": {"limit": 1, "per": "1h"}}, "spare": {"concurrency": 5}}})):
        Hourly.trigger("h")
        app.clock.advance(microseconds=10)
        spare = Spare.trigger("s")
        app.clock.advance(microseconds=10)
        unkeyed = Unkeyed.trigger("u")
        poller, other = (register(app, role="test", label=label) for label in ("poller", "other"))
        told: list[Refusal] = []
        (claimed,) = claim_batch(app, poller, 1, refused=_telling(app, told, "hourly", "spare", other))
        assert claimed.run_id == unkeyed.id
        assert told == [Refusal("hourly", "rate")]
        assert [c.run_id for c in _claims_of(app, other)] == [spare.id]


class Stray(OnKey):
    key = "stray"


def test_only_a_claim_of_a_key_with_no_entry_is_logged_unlimited(db_url, caplog):
    """A key this process's config names (``spare``) and one it does not (``stray``), one
    execution each: claiming the configured key's logs nothing; claiming the stray key's
    claims it unlimited and logs that once (``claims.UNCONFIGURED_WARNING``); a second poll
    of the stray key, whose lane is gone, claims nothing and logs nothing more."""
    import logging

    from ductwork.fleet.processes import register
    from ductwork.limits.claims import UNCONFIGURED_WARNING, Refusal, claim_keyed
    from tests.conftest import installed

    for app in installed(make_app(db_url, job_worker={"limits": {"spare": {"concurrency": 5}}})):
        spare, stray = Spare.trigger("s"), Stray.trigger("t")
        pid = register(app, role="test", label="claimer")
        caplog.set_level(logging.WARNING, logger="ductwork.claims")
        caplog.clear()
        (configured,) = claim_keyed(app, "spare", pid)
        assert configured.run_id == spare.id
        assert [r.getMessage() for r in caplog.records if r.name == "ductwork.claims"] == []
        (unlimited,) = claim_keyed(app, "stray", pid)
        assert unlimited.run_id == stray.id
        assert claim_keyed(app, "stray", pid) == Refusal("stray", "gone")
        assert [r.getMessage() for r in caplog.records if r.name == "ductwork.claims"] == [
            UNCONFIGURED_WARNING % "stray"]


def test_a_claim_that_spends_its_keys_last_token_sets_the_alarm_for_the_next(db_url):
    """A claim that leaves its key's bucket empty carries when the next token is due (the
    stamp it wrote, ``Claimed.next_token_in_s``), and its worker sets the process's
    ``TokenAlarm`` to it, so an idle thread polls then; a refused poll sets nothing (it
    waits for the stamp itself), and an unrated claim carries nothing."""
    from ductwork.db.clock import ManualClock
    from ductwork.fleet.shared import TokenAlarm
    from tests.conftest import installed

    for app in installed(make_app(db_url, clock=ManualClock(datetime(2026, 1, 1)),
                                  job_worker={"limits": {"hourly": {"rate": {"limit": 1, "per": "1h"}}}})):
        Hourly.trigger("a")
        Hourly.trigger("b")
        woken: list[int] = []
        alarm = TokenAlarm(woken.append, clock=lambda: 100.0)
        worker = Worker(app, tokens=alarm)
        assert worker.run_once() is None  # the bucket starts empty: refused, stamped an hour on
        assert alarm.seconds_left() is None
        app.clock.advance(seconds=3600)
        assert worker.run_once() is not None  # the token: claimed and run; the bucket is empty again
        assert alarm.seconds_left() == 3600.0  # the next token, an hour after this claim
        assert (alarm.run_once(), woken) == (False, [])  # not due yet
        Unkeyed.trigger("u")
        unkeyed = Worker(app, tokens=TokenAlarm(woken.append, clock=lambda: 100.0))
        assert unkeyed.run_once() is not None
        assert unkeyed._tokens.seconds_left() is None


def test_a_batch_over_several_keys_sets_the_alarm_for_the_token_any_of_them_spent(db_url):
    """A batch that takes ``hourly``'s last token and then, past it (its run filled its
    ``concurrency: 1``), ``spare``'s execution sets the alarm for ``hourly``'s next token,
    though the batch's last claim carries none."""
    from ductwork.db.clock import ManualClock
    from ductwork.fleet.shared import TokenAlarm
    from tests.conftest import installed

    limits = {"hourly": {"concurrency": 1, "rate": {"limit": 1, "per": "1h"}}, "spare": {"concurrency": 1}}
    for app in installed(make_app(db_url, clock=ManualClock(datetime(2026, 1, 1)), job_worker={"limits": limits})):
        hourly = Hourly.trigger("a")
        alarm = TokenAlarm(lambda _: None, clock=lambda: 100.0)
        worker = Worker(app, tokens=alarm, batch_size=8)
        assert worker.run_once() is None  # the bucket starts empty: refused, stamped an hour on
        app.clock.advance(seconds=3600)
        spare = Spare.trigger("b")
        worker.batch = 8
        assert worker.run_once() is not None  # one claim of both, then both run
        assert (hourly.refresh().status, spare.refresh().status) == ("completed", "completed")
        assert alarm.seconds_left() == 3600.0


class KeyedRefusal(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Boom, limit_by="retried")


def test_an_idle_poll_knows_when_a_delayed_execution_becomes_eligible(db_url):
    """After an idle poll a worker knows how long until time alone lets a poll claim
    (``Worker.next_due_s``, which caps its thread's wait before the next poll): a retry's
    eligible time after ``retry_delay``, in the unkeyed lane or in a key's, and a
    rate-blocked key's next token, whichever comes first; with nothing pending, None (the
    polling interval). A retry thus runs at its time, not up to a polling interval late."""
    from ductwork.db.clock import ManualClock
    from tests.conftest import installed

    for app in installed(make_app(db_url, clock=ManualClock(datetime(2026, 1, 1)),
                                  job_worker={"retry_delay": 30, "max_retry": 1,
                                              "limits": {"retried": {"concurrency": 1},
                                                         "hourly": {"rate": {"limit": 1, "per": "1h"}}}})):
        worker = Worker(app)
        assert worker.run_once() is None
        assert worker.next_due_s is None  # nothing pending at all
        HaltingPipeline.trigger(1)
        assert worker.run_once() is not None  # it fails: its retry is eligible in 30 s
        assert worker.run_once() is None
        assert worker.next_due_s == 30.0
        app.clock.advance(seconds=10)
        KeyedRefusal.trigger(2)
        assert worker.run_once() is not None  # it fails too: a retry in the key's lane, in 30 s
        assert worker.run_once() is None
        assert worker.next_due_s == 20.0  # the unkeyed retry comes first
        app.clock.advance(seconds=20)
        assert worker.run_once() is not None  # the unkeyed retry, at its time (its last: the step fails)
        assert worker.run_once() is None
        assert worker.next_due_s == 10.0  # the key's retry
        Hourly.trigger("a")
        assert worker.run_once() is None  # the hourly key's bucket starts empty: refused, stamped an hour on
        assert worker.next_due_s == 10.0  # the key's retry is still the first to come
        app.clock.advance(seconds=10)
        assert worker.run_once() is not None  # the key's retry (its last: the step fails)
        assert worker.run_once() is None
        assert worker.next_due_s == 3600.0 - 10.0  # now only the hourly key's token, due an hour after that poll


def _blocked_until(app, key):
    with app.begin(readonly=True) as tx:
        return tx.execute(sa.select(schema.limit_keys.c.blocked_until).where(schema.limit_keys.c.key == key)).one()


# -- hand-off: a freed slot passes to the key's next execution in the same commit ----------------


def _succeed_and_hand_off(app, claimed):
    from ductwork.pipelines.outcomes import HandOff, record_success
    from ductwork.pipelines.payloads import Output

    return record_success(app, claimed, Output("null"), HandOff())


def _claim_row(app, execution_id):
    e = schema.executions
    with app.begin() as tx:
        return tx.execute(sa.select(e.c.claimed_at, e.c.completed_at, e.c.claim_seq, e.c.release_seq,
                                    e.c.process_id).where(e.c.id == execution_id)).one()


def test_a_freed_slot_is_handed_on_in_the_commit_that_frees_it(limits_app):
    """The next execution of the key is claimed at the very database time (and next key
    sequence number) at which the previous one completed: the slot is never empty while
    the key has eligible work [INV-LIM-1, INV-LIM-3]."""
    from ductwork.fleet.processes import register
    from ductwork.limits import claims
    from tests.factories import make_executions, make_run

    app = limits_app
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    ids = make_executions(app, run_id, branch_id, "shared", datetime(2000, 1, 1), 3)
    claimed = claims.claim(app, process)
    assert claimed.execution_id == ids[0]
    for previous, following in itertools.pairwise(ids):
        handed, = _succeed_and_hand_off(app, claimed)
        assert handed.execution_id == following
        done, taken = _claim_row(app, previous), _claim_row(app, following)
        assert taken.claimed_at == done.completed_at
        assert taken.process_id == process
        assert taken.claim_seq == done.release_seq + 1
        claimed = handed
    assert _succeed_and_hand_off(app, claimed) == []  # nothing left of the key


def test_a_hand_off_yields_to_an_older_lane(limits_app):
    """A completion hands on only what a poll would claim first [INV-LIM-6]: with an
    unkeyed job older than the key's next one, it claims nothing and a poll takes the
    unkeyed job, then the key's."""
    from ductwork.fleet.processes import register
    from ductwork.limits import claims
    from tests.factories import make_executions, make_run

    app = limits_app
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    at = datetime(2000, 1, 1)
    first, = make_executions(app, run_id, branch_id, "shared", at)
    older, = make_executions(app, run_id, branch_id, None, at)
    later, = make_executions(app, run_id, branch_id, "shared", at)
    claimed = claims.claim(app, process)
    assert claimed.execution_id == first
    assert _succeed_and_hand_off(app, claimed) == []
    assert _claim_row(app, later).claimed_at is None
    assert [claims.claim(app, process).execution_id for _ in range(2)] == [older, later]


def test_a_poll_walks_past_a_saturated_lanes_backlog_to_the_next_lane(limits_app):
    """The lane scan walks the pending executions in poll order a page at a time
    (``lanes.WALK_PAGE``), leaving out the lanes it met: with a saturated key's backlog of
    more than a page ahead of them, polls still find the unkeyed execution behind it, then
    another key's behind that [INV-LIM-6]."""
    from ductwork.fleet.processes import register
    from ductwork.limits import claims, lanes
    from tests.factories import make_executions, make_run

    app = limits_app
    run_id, branch_id = make_run(app)
    process = register(app, role="test", label="w")
    at = datetime(2000, 1, 1)
    make_executions(app, run_id, branch_id, "shared", at, count=HELD + lanes.WALK_PAGE + 1)
    assert all(claims.claim(app, process) for _ in range(HELD))  # "shared" saturated, its backlog older than all
    behind, = make_executions(app, run_id, branch_id, None, at + timedelta(seconds=1))
    last, = make_executions(app, run_id, branch_id, "unconfigured", at + timedelta(seconds=2))
    assert [claims.claim(app, process).execution_id for _ in range(2)] == [behind, last]
    assert claims.claim(app, process) is None


def test_a_poll_walks_on_past_a_walks_lanes_when_all_of_them_refuse(db_url):
    """A poll tries the lanes one walk found (``lanes.LANES_PER_SCAN``) and, when every one
    refuses, walks on past them: nine rate keys never decided yet (each looks open to a scan:
    no stamp) hold the oldest executions, and each refuses its first claim (its bucket starts
    empty); the unkeyed execution behind them is claimed by the same poll [INV-LIM-6]."""
    from ductwork.fleet.processes import register
    from ductwork.limits import claims, lanes
    from tests.factories import make_executions, make_run

    keys = [f"rated{i}" for i in range(lanes.LANES_PER_SCAN + 1)]
    app = make_app(db_url, job_worker={"limits": {k: {"rate": {"limit": 1, "per": "1h"}} for k in keys}})
    reset_tables(app.engine)
    try:
        run_id, branch_id = make_run(app)
        process = register(app, role="test", label="w")
        at = datetime(2000, 1, 1)
        for i, key in enumerate(keys):
            make_executions(app, run_id, branch_id, key, at + timedelta(seconds=i))
        behind, = make_executions(app, run_id, branch_id, None, at + timedelta(minutes=1))
        refused: list = []
        got = claims.claim_batch(app, process, 1, refused=refused.append)
        assert [c.execution_id for c in got] == [behind]
        assert sorted(r.key for r in refused) == sorted(keys)  # each tried once, each refused for rate
    finally:
        app.dispose()


class HandedOn(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Items).expand(to=Echo, limit_by="shared")


@pytest.mark.parametrize("hand_off", [True, False])
def test_a_worker_performs_what_its_completions_hand_it(limits_app, hand_off):
    """With hand-offs a worker's run_once goes on to every execution handed to it; without
    (or once its process is stopping) it performs exactly one per call."""
    run = HandedOn.trigger(4)
    worker = Worker(limits_app, hand_off=lambda: hand_off)
    assert worker.run_once().node.startswith("Items")
    while Advancer(limits_app).run_once() != "idle":
        pass
    performed = worker.run_once()
    assert performed is not None
    assert performed.outcome == "success"
    e, s = schema.executions, schema.steps
    with limits_app.begin() as tx:
        done = tx.execute(sa.select(sa.func.count())
                          .select_from(e.join(s, s.c.id == e.c.step_id))
                          .where(s.c.run_id == run.id, e.c.limit_key == "shared",
                                 e.c.outcome == "success")).scalar_one()
    assert done == (4 if hand_off else 1)
    assert worker.current is None


def test_a_claim_on_a_key_no_work_ever_named_is_refused_gone(app):
    """A key without a row (no step was ever limited by it) has nothing to claim: refused
    ``gone``, as a key whose lane emptied is, and no row is written for it."""
    from ductwork.fleet.processes import register
    from ductwork.limits.claims import Refusal, claim_keyed

    pid = register(app, role="test", label="claimer")
    assert claim_keyed(app, "never-named", pid) == Refusal("never-named", "gone")
    with app.begin(readonly=True) as tx:
        assert tx.execute(sa.select(sa.func.count()).select_from(schema.limit_keys)).scalar_one() == 0


# -- a key's statements touch only its own rows ---------------------------------------------------

#: three periods none of which dominates another (a lower rate, a larger burst)
THREE_RATES = [{"limit": 1, "per": "1s", "burst": 1}, {"limit": 30, "per": "1m", "burst": 5},
               {"limit": 600, "per": "1h", "burst": 10}]


class ZKey(OnKey):
    key = "z_key"


class MKey(OnKey):
    key = "m_key"


class AKey(OnKey):
    key = "a_key"


def _key_rows(app, key):
    """``key``'s header row and its buckets (period -> row), every column."""
    k, b = schema.limit_keys, schema.limit_buckets
    with app.begin(readonly=True) as tx:
        header = tuple(tx.execute(sa.select(k).where(k.c.key == key)).one())
        kept = {row.period_s: tuple(row) for row in tx.execute(sa.select(b).where(b.c.key == key))}
    return header, kept


def test_a_keys_claims_and_re_bases_write_only_its_own_rows(db_url):
    """Three rated keys with the same bucket periods; the middle one (``m_key``, between the
    others by name and by creation order, so a statement that lost its key filter reads or
    writes another key's rows whichever order the database returns them in) spends a token,
    is re-based by a poll under a config that drops a period, and by a restart under one
    that drops another. Its reads see only its own buckets (full: its claim is admitted
    while the others' are empty), each write changes only its own rows (its three buckets
    each keep their own level), and the other keys' header and bucket rows stay exactly as
    they were, every column."""
    from ductwork.db.clock import ManualClock
    from ductwork.fleet.processes import register
    from ductwork.limits.claims import Refusal, claim_keyed, restart_with
    from tests.conftest import installed

    clock = ManualClock(datetime(2026, 1, 1))
    limits = {key: {"rate": THREE_RATES} for key in ("a_key", "m_key", "z_key")}
    for app in installed(make_app(db_url, clock=clock, job_worker={"limits": limits})):
        for pipeline in (ZKey, MKey, AKey):  # created in this order: z, m, a
            pipeline.trigger(1)
            pipeline.trigger(2)
        pid = register(app, role="test", label="claimer")
        for key in ("z_key", "m_key", "a_key"):
            assert claim_keyed(app, key, pid) == Refusal(key, "rate")  # its buckets are made, empty
            clock.advance(microseconds=10)
        clock.advance(seconds=7200)  # every bucket full
        for key in ("z_key", "a_key"):
            assert len(claim_keyed(app, key, pid)) == 1  # each spends a token: its 1 s bucket is empty
            clock.advance(microseconds=10)
        others = {key: _key_rows(app, key) for key in ("a_key", "z_key")}

        assert len(claim_keyed(app, "m_key", pid)) == 1  # its own full buckets, not the others' empty ones
        kept = _key_rows(app, "m_key")[1]
        assert sorted(kept) == [1, 60, 3600]
        levels = {period: row[2] for period, row in kept.items()}  # (key, period_s, level_units, …)
        # one token off each full bucket, a token being period_s x 10^6 units (limits/buckets.py)
        assert levels == {1: 0, 60: 4 * 60 * 10**6, 3600: 9 * 3600 * 10**6}
        assert {key: _key_rows(app, key) for key in others} == others

        dropped = {**limits, "m_key": {"rate": THREE_RATES[:2]}}  # a poll under it re-bases m_key
        rebased = make_app(db_url, clock=clock, job_worker={"limits": dropped})
        try:
            clock.advance(seconds=1)
            assert len(claim_keyed(rebased, "m_key", pid)) == 1
            assert sorted(_key_rows(app, "m_key")[1]) == [1, 60]
            assert {key: _key_rows(app, key) for key in others} == others
            restarted = make_app(db_url, clock=clock, job_worker={"limits": {**limits, "m_key": {
                "rate": THREE_RATES[:1]}}})
            try:
                restart_with(restarted)
            finally:
                restarted.dispose()
        finally:
            rebased.dispose()
        assert sorted(_key_rows(app, "m_key")[1]) == [1]
        assert {key: _key_rows(app, key)[1] for key in others} == {
            key: rows for key, (_, rows) in others.items()}  # (a restart clears every key's stamp)
