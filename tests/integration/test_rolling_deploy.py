"""A rolling deploy as users run one: two fleets with different ``ductwork.yml`` limits on
one database at once, the old one then stopped, the work going on.

The old fleet runs with ``raised: concurrency 2``, ``lowered: concurrency 3`` and
``rated: 5 per 1s, burst 3``; the new one, started while the old one still runs, with
``raised: 3``, ``lowered: 1`` and ``rated: 2 per 1s, burst 1``. Both take turns on
``rated``, each claim re-basing it to the claiming worker's values. Every step body
writes a witness row (start and end, database time, the fleet that ran it), so the
checks read from the database what a user would see. What docs/limits.md ("Changing
limits on a live fleet") promises, and this checks:

- at every moment, the bodies running under a key number at most the larger of the two
  concurrencies, those of the new fleet at most the new one, those of the old fleet at
  most the old one, and once the old fleet has stopped, at most the new one [INV-LIM-1];
- the claims of the rated key fit ``burst + limit × T`` of the larger values in any T
  seconds of database time, and those after the old fleet stopped fit the new values
  [INV-LIM-2, INV-LIM-4: a re-base drops or clamps tokens, never adds any];
- a raised limit is used: the new fleet alone runs as many bodies at once as its new
  concurrency allows (a wait with a deadline);
- every run completes, each step with one success and no more bodies than executions
  [INV-EXE-1, INV-EXE-2]: a graceful stop of the old fleet loses and repeats nothing.

Every check is a list of violations, reported together. Not checked here: a key added
or removed by the deploy (docs/limits.md says what the workers of a config without the
key's entry do; docs/operating.md retires a key in two deploys), or hosts that die
during the deploy (tests/chaos).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import sqlalchemy as sa

from ductwork.db import schema
from ductwork.db.clock import to_us
from ductwork_proof.fleet import Fleet, process_rows, wait_for, write_config
from tests.workloads.rolling import RollingLowered, RollingRaised, RollingRated, rolling_witness_table

OLD = {"raised": {"concurrency": 2}, "lowered": {"concurrency": 3},
       "rated": {"rate": {"limit": 5, "per": "1s", "burst": 3}}}
NEW = {"raised": {"concurrency": 3}, "lowered": {"concurrency": 1},
       "rated": {"rate": {"limit": 2, "per": "1s", "burst": 1}}}
PIPELINES = {"raised": RollingRaised, "lowered": RollingLowered, "rated": RollingRated}
#: a body's pause: long enough for a key's bodies to overlap, short enough to keep the test fast
PAUSE = {"raised": 0.15, "lowered": 0.15, "rated": 0.01}
#: eligible executions kept waiting on each key while the fleets should be busy: more than
#: their limits admit at once, so that the limits bind
PENDING = {"raised": 6, "lowered": 6, "rated": 4}
WITNESS = rolling_witness_table()
_e = schema.executions


def _overlap(intervals: Iterable[tuple[datetime, datetime]], since: datetime = datetime.min) -> int:
    """The most intervals ``[start, end)`` that hold one moment at or after ``since`` in common."""
    clipped = [(max(start, since), end) for start, end in intervals if end > since]
    events = sorted([(end, -1) for _, end in clipped] + [(start, 1) for start, _ in clipped])
    most = running = 0
    for _, step in events:  # an end sorts before a start at the same time: half-open
        running += step
        most = max(most, running)
    return most


def _rate_excess(claims: list[datetime], limit: int, per_s: int, burst: int) -> str | None:
    """The first window of ``claims`` (sorted) holding more than ``burst + limit × T / per``
    claims in its T µs, as exact integers; None when every window fits."""
    us = [to_us(c) for c in claims]
    for i in range(len(us)):
        for j in range(i, len(us)):
            if (j - i + 1 - burst) * per_s * 1_000_000 > limit * (us[j] - us[i]):
                return (f"{j - i + 1} claims in {(us[j] - us[i]) / 1e6:.6f} s > {burst} + {limit} per {per_s} s"
                        f" (claims {i}..{j} of {len(us)})")
    return None


class Deploy:
    """The test's view of the database (witness rows, executions, runs), and a queue of
    work it keeps topped up."""

    def __init__(self, app):
        self.app, self.runs, self.pause = app, [], dict(PAUSE)

    def top_up(self) -> None:
        """Trigger runs until every key has its ``PENDING`` unclaimed executions."""
        with self.app.begin(readonly=True) as tx:
            pending = dict(tx.execute(sa.select(_e.c.pending_lane, sa.func.count())
                                      .where(_e.c.pending_lane.in_(list(PIPELINES)))
                                      .group_by(_e.c.pending_lane)).all())
        for key, pipeline in PIPELINES.items():
            for _ in range(PENDING[key] - pending.get(key, 0)):
                self.runs.append(pipeline.trigger(self.pause[key]))

    def busy(self, condition) -> bool:
        """``condition()``, the queue topped up first (a wait's predicate)."""
        self.top_up()
        return bool(condition())

    def now(self) -> datetime:
        with self.app.begin(readonly=True) as tx:
            return tx.now

    def witnesses(self, key: str, fleet: str | None = None) -> list[sa.Row]:
        w = WITNESS
        query = sa.select(w.c.step_id, w.c.fleet, w.c.started_at, w.c.ended_at).where(w.c.limit_key == key)
        if fleet is not None:
            query = query.where(w.c.fleet == fleet)
        with self.app.begin(readonly=True) as tx:
            return tx.execute(query.order_by(w.c.started_at, w.c.id)).all()

    def ran_since(self, fleet: str, keys: Iterable[str], since: datetime, count: int = 1) -> bool:
        """``fleet`` began ``count`` bodies of each of ``keys`` at ``since`` or later."""
        return all(sum(w.started_at >= since for w in self.witnesses(key, fleet)) >= count for key in keys)

    def most_at_once(self, key: str, since: datetime) -> int:
        """The most bodies of ``key`` that ran at one moment at or after ``since`` (a body
        still running counts as running on)."""
        return _overlap(((w.started_at, w.ended_at or datetime.max) for w in self.witnesses(key)), since)

    def settled(self) -> bool:
        """Every run triggered has completed."""
        r = schema.runs
        with self.app.begin(readonly=True) as tx:
            return tx.execute(sa.select(sa.func.count()).where(r.c.id.in_([run.id for run in self.runs]),
                                                               r.c.status != "completed")).scalar_one() == 0


def test_a_rolling_deploy_keeps_each_configs_limits_and_loses_nothing(app, db_url, tmp_path):
    WITNESS.metadata.create_all(app.engine)
    with app.begin() as tx:
        tx.execute(WITNESS.delete())
    pipelines = [f"{p.__module__}:{p.__qualname__}" for p in PIPELINES.values()]
    # a lease long enough that a loaded machine's slow boot does not cost a worker its lease
    settings = {"job_worker": {"count": 4, "polling_timeout": 0.1}, "supervisor": {"reaper_timeout": 20}}
    fleets = {
        name: Fleet(db_url, write_config(tmp_path / f"{name}.yml", pipelines=pipelines, limits=limits,
                                         overrides=settings),
                    label=f"{name}-fleet", env={"DUCTWORK_ROLLING_FLEET": name,
                                                "DUCTWORK_ROLLING_WITNESS_URL": db_url})
        for name, limits in (("old", OLD), ("new", NEW))}
    deploy = Deploy(app)
    deploy.top_up()
    try:
        fleets["old"].start()
        wait_for(lambda: deploy.busy(lambda: deploy.ran_since("old", PIPELINES, datetime.min)),
                 f"the old fleet ran bodies of every key; log: {fleets['old'].log()[-2000:]}", 60)
        fleets["new"].start()  # the deploy: the old fleet goes on running meanwhile
        wait_for(lambda: deploy.busy(lambda: process_rows(app.engine, role="job_worker", label_prefix="new-fleet")),
                 f"the new fleet's worker registered; log: {fleets['new'].log()[-2000:]}", 60)
        deployed = deploy.now()
        # While both run, a key's free slots go to the fleets whose values admit a claim:
        # only the new fleet's workers once 'raised' holds two (the old limit), only the
        # old fleet's while 'lowered' holds one or more (the new limit).
        # Both take turns on 'rated', each claim re-basing it to its own values.
        wait_for(lambda: deploy.busy(lambda: deploy.ran_since("new", ("raised",), deployed)
                                     and deploy.ran_since("old", ("lowered",), deployed)
                                     and deploy.ran_since("new", ("rated",), deployed, 4)
                                     and deploy.ran_since("old", ("rated",), deployed, 4)),
                 f"both fleets ran bodies at once; logs: {fleets['old'].log()[-1000:]}\n"
                 f"{fleets['new'].log()[-1000:]}", 60)
        assert fleets["old"].terminate(30) == 0, fleets["old"].log()[-3000:]  # its bodies in hand return first
        stopped = deploy.now()
        deploy.pause["raised"] = 1.0  # bodies long enough for the new fleet to fill its raised limit
        wait_for(lambda: deploy.busy(lambda: deploy.ran_since("new", PIPELINES, stopped, 3)
                                     and deploy.most_at_once("raised", stopped) >= NEW["raised"]["concurrency"]),
                 f"the new fleet alone ran bodies of every key, 'raised' up to its new limit; log: "
                 f"{fleets['new'].log()[-2000:]}", 60)
        wait_for(deploy.settled, f"every run completed; log: {fleets['new'].log()[-2000:]}", 60)
        assert fleets["new"].terminate(30) == 0, fleets["new"].log()[-3000:]
    finally:
        for fleet in fleets.values():
            fleet.kill_host()
    violations = _violations(app, deploy, stopped)
    assert not violations, "\n".join(violations)


def _violations(app, deploy: Deploy, stopped: datetime) -> list[str]:
    """What the database shows against the promises in the module docstring, each line one
    broken promise; empty when all hold."""
    out = []
    s = schema.steps
    with app.begin(readonly=True) as tx:
        executions = tx.execute(sa.select(s.c.id, _e.c.outcome, _e.c.claimed_at, _e.c.limit_key)
                                .join(s, s.c.id == _e.c.step_id)
                                .where(s.c.run_id.in_([run.id for run in deploy.runs]))).all()
        bodies = dict(tx.execute(sa.select(WITNESS.c.step_id, sa.func.count()).group_by(WITNESS.c.step_id)).all())
    # [INV-EXE-1, INV-EXE-2] every step succeeded once, and ran one body per execution
    tries: dict[str, list[str]] = {}
    for step_id, outcome, _, _ in executions:
        tries.setdefault(step_id, []).append(outcome)
    out += [f"step {step_id}: outcomes {outcomes}, {bodies.get(step_id, 0)} bodies" for step_id, outcomes
            in tries.items() if outcomes.count("success") != 1 or not 1 <= bodies.get(step_id, 0) <= len(outcomes)]
    if len(tries) != len(deploy.runs):
        out.append(f"{len(deploy.runs)} runs, {len(tries)} steps")

    for key in ("raised", "lowered"):
        old, new = OLD[key]["concurrency"], NEW[key]["concurrency"]
        rows = deploy.witnesses(key)
        out += [f"{key}: a body of the {w.fleet} fleet did not return" for w in rows if w.ended_at is None]

        def most(selected: Iterable[sa.Row], since: datetime = datetime.min) -> int:
            return _overlap(((w.started_at, w.ended_at or datetime.max) for w in selected), since)

        # [INV-LIM-1] each claim is decided under the key's lock with the claiming worker's values
        for what, count, ceiling in (
                ("bodies of both fleets", most(rows), max(old, new)),
                ("bodies of the old fleet", most(w for w in rows if w.fleet == "old"), old),
                ("bodies of the new fleet", most(w for w in rows if w.fleet == "new"), new),
                ("bodies once the old fleet stopped", most(rows, stopped), new)):
            if count > ceiling:
                out.append(f"{key}: {count} {what} at once, above {ceiling}")

    # [INV-LIM-2, INV-LIM-4] the rated key's claims, in database time
    claims = sorted(c for _, _, c, key in executions if key == "rated")
    old_rate, new_rate = OLD["rated"]["rate"], NEW["rated"]["rate"]
    larger = (max(old_rate["limit"], new_rate["limit"]), 1, max(old_rate["burst"], new_rate["burst"]))
    for what, window, (limit, per_s, burst) in (
            ("claims of both fleets", claims, larger),
            ("claims once the old fleet stopped", [c for c in claims if c > stopped],
             (new_rate["limit"], 1, new_rate["burst"]))):
        excess = _rate_excess(window, limit, per_s, burst)
        if excess is not None:
            out.append(f"rated: {what}: {excess}")
    return out
