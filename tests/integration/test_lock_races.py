"""Claims racing on one key, with one claimer parked inside the key's lock.

A claimer claims in a transaction it keeps open, holding the key's lock, while the
others are observed, through the database's own lock-wait views, blocked on that lock;
then it commits. No sleeps: every wait is on a condition with a deadline.

Then second writers that wait on a holder's row locks and find, once it commits, nothing
left to do: a prune whose batch another prune deleted looks again, an orphan sweep whose
hook another sweep crashed crashes nothing (PostgreSQL and MySQL: SQLite's second writer
waits at BEGIN and reads after the commit).

Checks: INV-LIM-1 (claims on a key serialise on its lock: of N racing claimers
under ``concurrency: 1`` exactly one is admitted), INV-CLK-1 (a claim's time, and a
keyed group commit's release time, is read after the lock, so a key's claim and
release times follow its sequence), INV-PRN-1 (a prune re-checks its batch under the
row locks), INV-HLT-1 and INV-HLT-2 (a hook crashed once by two racing sweeps), INV-LIM-8
(claims in a family's partitions serialise on the family's lock).
"""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from ductwork import Pipeline, faults
from ductwork.db import schema
from ductwork.db.clock import to_us
from ductwork.fleet.processes import register
from ductwork.limits.claims import claim
from ductwork.pipelines.outcomes import HandOff, Success, record_successes
from ductwork.pipelines.payloads import Output
from ductwork_proof.fleet import wait_for
from tests.capabilities import needs
from tests.conftest import make_app, reset_tables
from tests.factories import of_another_process
from tests.workloads import Echo, OnKey

RACERS = 4


class SoloPipeline(OnKey):
    key = "solo"


class PairPipeline(OnKey):
    key = "pair"


class TenantPipeline(Pipeline):
    """A step in partition ``fam[<value>]`` of a family of ceiling 1 (each partition 1 too)."""

    @classmethod
    def define(cls, p):
        p.start(Echo, limit_by=("fam", "value"))


def lock_waiters(app) -> int:
    """Claims of this database waiting for a lock right now (the key's: its holder sits idle
    in its transaction, so a claim still executing the routine waits)."""
    return blocked_on(app, "%FROM ductwork_limit_keys%FOR UPDATE%")  # (MySQL shows the routine's statement)


def ask_server(app, postgresql: str, mysql: str, **params) -> list:
    """The rows a query of the server's session tables returns: ``postgresql`` on
    PostgreSQL, ``mysql`` on the MySQL family (with ``params`` bound)."""
    with app.engine.connect() as conn:
        return conn.execute(sa.text(postgresql if app.backend == "postgresql" else mysql), params).all()


def server_view(app) -> list:
    """What the database says its sessions are doing (for a failure message)."""
    return ask_server(
        app,
        "SELECT pid, state, wait_event_type, wait_event, left(query, 80) FROM pg_stat_activity "
        "WHERE datname = current_database()",
        "SELECT p.id, p.state, t.trx_state, left(p.info, 80) FROM information_schema.processlist p "
        "LEFT JOIN information_schema.innodb_trx t ON t.trx_mysql_thread_id = p.id "
        "WHERE p.db = DATABASE()")


@pytest.fixture
def race_app(db_url, tmp_path, monkeypatch):
    from ductwork.app import set_default_app

    app = make_app(db_url, job_worker={"limits": {"solo": {"concurrency": 1}, "pair": {"concurrency": 2},
                                                  "fam": {"per_partition": {"concurrency": 1}, "concurrency": 1}}})
    reset_tables(app.engine)
    set_default_app(app)
    monkeypatch.setenv("DUCTWORK_FAULT_RELEASE", str(tmp_path / "release"))
    yield app, tmp_path / "release"
    faults.disarm()
    set_default_app(None)
    app.dispose()


def race_claims(app, key: str, claimers: int, *, observe_waiters: bool) -> list:
    """The first claimer claims ``key`` in a transaction left open, holding the key's lock
    (the routine returned, nothing committed); the others, each of its own process
    (:func:`of_another_process`), claim in threads, and once they all wait for that lock
    (or have all passed it: a missing lock), it commits. Returns each claimer's claim (or
    None)."""
    from ductwork.limits.claims import release_and_claim

    pids = [register(app, role="test", label=f"racer-{i}") for i in range(claimers)]
    results: list = [None] * claimers
    errors: list[BaseException] = []

    def claim_one(i: int) -> None:
        other = of_another_process(app)
        try:
            results[i] = claim(other, pids[i])
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            other.dispose()

    threads = [threading.Thread(target=claim_one, args=(i,)) for i in range(1, claimers)]
    with app.begin() as tx:
        held = release_and_claim(app, tx, key, pids[0], [], 1, poll=True).claimed
        results[0] = held[0] if held else None
        for thread in threads:
            thread.start()
        try:
            if observe_waiters:
                def waiting() -> bool:
                    return lock_waiters(app) >= claimers - 1 or not any(t.is_alive() for t in threads)
                try:
                    wait_for(waiting, "the other claimers wait on the key lock (or passed it: no lock)", 20)
                except AssertionError as timeout:
                    raise AssertionError(f"{timeout}; claimer errors {errors!r}; server: {server_view(app)}") from None
        except BaseException:
            tx.conn.rollback()  # never leave the claimers waiting on a holder that failed
            raise
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    return results


def test_racing_claims_on_a_key_serialise_on_its_lock(race_app):
    app, _ = race_app
    for i in range(RACERS):
        SoloPipeline.trigger(i)
    observe = app.backend != "sqlite"  # SQLite: the claimers queue for the database write lock
    results = race_claims(app, "solo", RACERS, observe_waiters=observe)
    assert sum(r is not None for r in results) == 1  # [INV-LIM-1] concurrency 1
    with app.begin() as tx:
        assert tx.execute(sa.select(sa.func.count()).where(
            schema.executions.c.inflight_key == "solo")).scalar_one() == 1


def test_racing_claims_in_the_partitions_of_a_family_serialise_on_its_lock(race_app):
    """One claimer holds a claim of partition ``fam[0]`` uncommitted (its newest lane, so no
    other claimer tries it first and waits on its row instead); the others poll, each finding
    an older partition free (its own concurrency 1 admits) but the family's lock held: they
    wait for it, then count the family at its ceiling of 1. Without the family's lock each
    would count the family empty (the claim is not committed) and claim a partition
    [INV-LIM-8]."""
    app, _ = race_app
    for i in [*range(1, RACERS), 0]:
        TenantPipeline.trigger(i)
    observe = app.backend != "sqlite"  # SQLite: the claimers queue for the database write lock
    results = race_claims(app, 'fam[0]', RACERS, observe_waiters=observe)
    assert sum(r is not None for r in results) == 1  # [INV-LIM-8] the family's ceiling, 1
    with app.begin() as tx:
        assert tx.execute(sa.select(sa.func.count()).where(
            schema.executions.c.inflight_key.like("fam[%"))).scalar_one() == 1


@needs("key_lock_after_begin")
def test_a_claims_time_is_read_after_the_key_lock(race_app):
    """Claimer B is parked just before the key lock; A claims meanwhile, later in time;
    then B claims. B's claim takes the next sequence number, so its time must not be
    earlier than A's: it must read the clock after the lock, not before [INV-CLK-1]."""
    app, release = race_app
    faults.disarm()
    faults.arm(faults.BEFORE_KEY_LOCK, "wait", nth=1)  # only the first to arrive waits
    for i in range(2):
        PairPipeline.trigger(i)
    pid_a, pid_b = (register(app, role="test", label=f"racer-{n}") for n in "ab")
    outcome: dict = {}
    other = of_another_process(app)  # (B's: a thread of A's process would pass the key A is trying)
    late = threading.Thread(target=lambda: outcome.setdefault("b", claim(other, pid_b)))
    late.start()
    try:
        wait_for(lambda: faults.fired(faults.BEFORE_KEY_LOCK) == 1, "claimer B parked before the key lock", 20)
        outcome["a"] = claim(app, pid_a)
    finally:
        release.touch()
        late.join(30)
        other.dispose()
    assert outcome["a"] is not None
    assert outcome["b"] is not None
    e = schema.executions
    with app.begin() as tx:
        rows = tx.execute(sa.select(e.c.claim_seq, e.c.claimed_at).where(e.c.limit_key == "pair")
                          .order_by(e.c.claim_seq)).all()
    times = [to_us(at) for _, at in rows]
    assert times == sorted(times), f"[INV-CLK-1] claim times out of sequence order: {rows}"


@needs("key_lock_after_begin")
def test_a_keyed_group_commits_release_time_is_read_after_the_key_lock(race_app):
    """A keyed group commit B is parked after writing what follows its step, before it
    takes the key's lock (it has read the clock); A claims the key meanwhile, later in
    time; then B releases. B's release takes the sequence number after A's claim, so its
    time must not be earlier than A's: the commit reads the clock again once it holds
    the lock [INV-CLK-1]."""
    app, release = race_app
    faults.disarm()
    faults.arm(faults.BEFORE_RELEASE_KEY_LOCK, "wait", nth=1)
    for i in range(2):
        PairPipeline.trigger(i)
    pid_a, pid_b = (register(app, role="test", label=f"racer-{n}") for n in "ab")
    held = claim(app, pid_b)
    assert held is not None
    outcome: dict = {}

    def commit_b() -> None:  # a keyed success's transaction, which would hand nothing on
        outcome["b"] = record_successes(app, [Success(held, Output("null"))], HandOff(keyed_limit=0))

    late = threading.Thread(target=commit_b)
    late.start()
    try:
        wait_for(lambda: faults.fired(faults.BEFORE_RELEASE_KEY_LOCK) == 1,
                 "B's group commit parked before the key lock", 20)
        outcome["a"] = claim(app, pid_a)
    finally:
        release.touch()
        late.join(30)
    assert outcome["a"] is not None
    assert outcome["b"] == []
    e = schema.executions
    with app.begin() as tx:
        rows = tx.execute(sa.select(e.c.claim_seq, e.c.claimed_at, e.c.release_seq, e.c.completed_at)
                          .where(e.c.limit_key == "pair")).all()
    events = sorted([(r.claim_seq, to_us(r.claimed_at)) for r in rows]
                    + [(r.release_seq, to_us(r.completed_at)) for r in rows if r.release_seq is not None])
    assert len(events) == 3, rows
    times = [at for _, at in events]
    assert times == sorted(times), f"[INV-CLK-1] claim and release times out of sequence order: {events}"


# --------------------------------------------------------------------------- second writers that find nothing


def blocked_on(app, mysql_statement: str) -> int:
    """Sessions of this database waiting for a row lock now: PostgreSQL's lock waits; on
    MySQL the sessions executing a statement like ``mysql_statement`` (the holder sits idle
    in its transaction, so one still executing it waits)."""
    ((count,),) = ask_server(
        app,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
        "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() AND info LIKE :s",
        s=mysql_statement)
    return count


def behind_a_holder(app, hold, second, mysql_statement: str):
    """Run ``hold(tx)`` in a transaction left open, start ``second()`` in a thread, wait
    until it waits on the holder's row locks, commit the holder; returns what ``second`` returned."""
    outcome: dict = {}

    def run_second() -> None:
        try:
            outcome["second"] = second()
        except BaseException as error:  # noqa: BLE001 - reported below
            outcome["error"] = error

    with app.begin() as tx:
        hold(tx)
        thread = threading.Thread(target=run_second)
        thread.start()
        try:
            wait_for(lambda: blocked_on(app, mysql_statement) >= 1 or not thread.is_alive(),
                     "the second writer waits on the holder's row lock", 20)
            assert thread.is_alive(), outcome  # it waited (it did not pass a missing lock)
        except BaseException:
            tx.conn.invalidate()  # never leave the second writer blocked behind a failed test
            raise
    thread.join(30)
    assert "error" not in outcome, outcome
    return outcome["second"]


@needs("row_lock_waits_observable")
def test_a_prune_whose_batch_another_prune_deleted_looks_again(app):
    """Prune B reads a finished run as a candidate while prune A holds it, deleted but not
    committed; B's batch locks it after A commits and finds nothing: B looks again (no
    batch counted), finds no candidate, and ends having deleted nothing [INV-PRN-1]."""
    from datetime import timedelta

    from ductwork.pipelines.prune import candidates, prune, prune_batch
    from ductwork.testing import drain

    run = SoloPipeline.trigger(1)
    drain(app, timeout=30)
    assert run.refresh().status == "completed"

    def hold(tx) -> None:
        cutoff = tx.now
        assert prune_batch(tx, candidates(tx, cutoff, 10), cutoff)[schema.runs.name] == 1

    result = behind_a_holder(app, hold, lambda: prune(app, timedelta(0)), "%FROM ductwork_runs%FOR UPDATE%")
    assert (result.runs, result.batches) == (0, 0)
    with app.begin(readonly=True) as tx:
        assert tx.execute(sa.select(sa.func.count()).select_from(schema.runs)).scalar_one() == 0


@needs("row_lock_waits_observable")
def test_a_sweep_that_finds_an_orphaned_hook_crashed_meanwhile_crashes_nothing(manual_app):
    """Two orphan sweeps read the same orphaned hook claim; the first crashes it and holds
    the row, the second's fenced record waits, then matches nothing: one crash, not two
    [INV-HLT-1, INV-HLT-2]."""
    from datetime import timedelta

    from ductwork.fleet.reaper import sweep_orphans
    from ductwork.fleet.worker import Worker
    from ductwork.pipelines.advance import Advancer
    from ductwork.pipelines.hooks import claim_hook, crash_hooks_of
    from tests.workloads.hooks import HaltingPipeline

    app = manual_app
    run = HaltingPipeline.trigger(1)
    worker, advancer = Worker(app), Advancer(app)
    worker._hook = lambda: None  # this worker runs executions only: the hook is left owed

    def step() -> bool:
        advancer.run_once()
        worker.run_once()
        app.clock.advance(timedelta(seconds=1))  # past the retry delays
        return run.refresh().status == "halted"

    wait_for(step, "the run halted, owing its hook", 20)
    ghost = register(app, role="ghost", label="ghost")
    assert claim_hook(app, ghost) is not None
    with app.begin() as tx:  # the claimer's row vanished (a reap that raced the claim)
        tx.execute(schema.processes.delete().where(schema.processes.c.id == ghost))
    app.clock.advance(timedelta(seconds=3 * app.config.supervisor.reaper_timeout + 1))

    def hold(tx) -> None:
        (hook,) = tx.execute(sa.select(schema.halt_hooks.c.id)).scalars()
        assert len(crash_hooks_of(app, tx, [hook])) == 1

    assert behind_a_holder(app, hold, lambda: sweep_orphans(app), "UPDATE ductwork_halt_hooks%") == 0
    h = schema.halt_hooks
    with app.begin(readonly=True) as tx:
        assert tx.execute(sa.select(h.c.status, h.c.crash_count)).one() == ("pending", 1)
