"""The lane routine against its specification, state by state: the refinement check.

    >>> world = World.make(url)                       # a database of the pool rows (committed once)
    >>> world.check(case)                             # None, or what the routine did differently

``ductwork.limits.claims.release_and_claim`` is one round trip on PostgreSQL (PL/pgSQL) and
MySQL-family (a stored procedure) and Python on SQLite; each is a *refinement* of the pure
``ductwork.limits.plan.plan`` (the key decision ``buckets.decide`` and the poll order,
composed). A :class:`Case` is a state of the rows (a key's header, buckets, executions
pending, in flight and ended in two lanes, another key's stamp and config) and one call
(the lane, the endings, how many to take, a poll or a hand-off, the time). :meth:`World.check`
writes the case's rows in a transaction, reads them back through the one abstraction
(``ductwork_proof/conformance/abstraction.py``), computes what the specification says (the endings' guard, then
:func:`~ductwork.limits.plan.plan` on the state after them), calls the routine in that same
transaction, reads every row again and compares: what it returned (the guard, the claims in
order, a poll's refusal, the hints) and every row it left, then rolls back, so cases cost a
transaction each and never see each other.

:func:`exhaustive` enumerates a small bounded domain (limits 1 to 3, in flight from 0 to the
limit, up to three pending in each of two lanes, one or two rate entries, bucket levels and
the time at the next token's exact microsecond and one either side, the clock stepping back
behind a bucket, stale stamps and another config's values, endings that are not the
owner's); :func:`cases` generates states beyond it with hypothesis.
``tests/properties/test_refinement.py`` runs both on each database, and
``tests/sql_mutation.py`` runs :func:`exhaustive` against every broken variant of the SQL.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

import sqlalchemy as sa
from hypothesis import strategies as st

from ductwork.app import App
from ductwork.config import Config
from ductwork.db import schema
from ductwork.db.clock import ManualClock, from_us, to_us
from ductwork.db.database import Tx
from ductwork.fleet.processes import register
from ductwork.limit_entries import entry_digest, parse_limits
from ductwork.limits import claims
from ductwork.limits.executions import Ending
from ductwork.limits.plan import Plan, Request, plan
from ductwork_proof.conformance import abstraction
from tests.conftest import TEST_CONFIG, reset_tables
from tests.factories import make_executions, make_run

T0_US = to_us(datetime(2026, 1, 1))
KEY, OTHER = "k", "o"
#: a third static key: the lane the bound's walk finds past ``OTHER`` when the routine's is unkeyed
THIRD = "t"
#: a family case's family (docs/semantics.md §5.1), and ``KEY`` and ``OTHER`` as its partitions;
#: ``SIBLING``: a third partition, holding only executions in flight
FAMILY = "f"
PKEY, POTHER, SIBLING = 'f["k"]', 'f["o"]', 'f[3]'
#: the period of OTHER's bucket in a case with ``other_bucket``: one no entry of the domain has
OTHER_PERIOD = 7
#: the most executions a case has (the pool's steps)
POOL = 14
ID_PREFIX = "01a30000-0000-7000-8000-"


def _id(n: int) -> str:
    """The n-th execution id of a case: time-ordered like the engine's (UUIDv7 text)."""
    return f"{ID_PREFIX}{n:012d}"


@dataclass(frozen=True)
class Row:
    """An execution of a case: its lane (``KEY``, ``OTHER`` or None), its eligible time
    (µs from ``T0_US``), and its state: ``pending``, ``mine`` (in flight, the owner's),
    ``theirs`` (in flight, another process's), ``orphan`` (in flight, no process), ``done``
    (completed, the owner's) or ``done_orphan`` (completed, no process)."""

    lane: str | None
    eligible: int = 0
    state: str = "pending"


@dataclass(frozen=True)
class Case:
    """One state and one call of the routine (module docstring)."""

    #: ``job_worker.limits`` of the case's config (``KEY`` and ``OTHER``, each or not; a family
    #: case's: ``FAMILY``'s entry, with ``per_partition`` and an optional ceiling)
    limits: Mapping[str, Mapping[str, object]]
    rows: tuple[Row, ...]
    #: the routine's lane: ``KEY``, ``OTHER`` or None (unkeyed); a family case's: a partition too
    lane: str | None = KEY
    #: indexes into ``rows`` of the executions to end, in order (with the owner)
    endings: tuple[int, ...] = ()
    take: int = 1
    poll: bool = True
    #: the time of the call, µs from ``T0_US``
    now: int = 0
    #: each key's header: ``(seq, digest, blocked_until)``, the digest ``"same"`` (this
    #: config's), ``"stale"`` (another's) or None, the stamp µs from ``T0_US`` or None; None:
    #: the key has no row
    headers: Mapping[str, tuple[int, str | None, int | None] | None] = field(default_factory=dict)
    #: ``key``'s stored buckets: period -> (level units, refilled at µs from ``T0_US``)
    buckets: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    #: the endings' outcome (one for all)
    outcome: str = "success"
    #: the call's owner: the owner's process, or None (the endings are orphans')
    orphans: bool = False
    #: whether ``OTHER`` holds a bucket of a period no entry of ``KEY`` has (its row too):
    #: what ``KEY``'s re-base must leave alone
    other_bucket: bool = False
    #: the key ``buckets`` are of: ``KEY``, or in a family case its partition ``PKEY``
    key: str = KEY


@dataclass
class World:
    """A database holding the pool every case uses: a run, steps without executions (each
    case's executions take them in order), the owner's and another process's rows."""

    url: str
    engine: sa.Engine
    steps: list[str]
    owner: str
    other: str
    _apps: dict[tuple[object, ...], App] = field(default_factory=dict)

    @classmethod
    def make(cls, url: str, engine: sa.Engine) -> World:
        reset_tables(engine)
        app = App(url, _config({}), ManualClock(from_us(T0_US)), engine=engine)
        run_id, branch_id = make_run(app)
        ids = make_executions(app, run_id, branch_id, None, from_us(T0_US), POOL)
        e = schema.executions
        with engine.begin() as conn:
            steps = list(conn.execute(sa.select(e.c.step_id).where(e.c.id.in_(ids)).order_by(e.c.id)).scalars())
            conn.execute(e.delete())
        return cls(url, engine, steps, register(app, role="test", label="owner"),
                   register(app, role="test", label="other"))

    def app(self, case: Case) -> App:
        """An App with the case's limits and a clock at the case's time."""
        key = tuple(sorted((k, repr(v)) for k, v in case.limits.items()))
        app = self._apps.get(key)
        if app is None:
            app = self._apps[key] = App(self.url, _config(case.limits), ManualClock(from_us(T0_US)),
                                        engine=self.engine)
        app.clock.set(from_us(T0_US + case.now))  # type: ignore[attr-defined]
        return app

    def check(self, case: Case) -> str | None:
        """Run ``case`` in a transaction rolled back at the end; None when the routine did
        exactly what the specification says, else the first difference."""
        app = self.app(case)
        with self.engine.connect() as conn:
            trans = conn.begin()
            try:
                self._write(conn, app, case)
                return self._compare(conn, app, case)
            finally:
                trans.rollback()

    def _write(self, conn: sa.Connection, app: App, case: Case) -> None:
        e, k, b = schema.executions, schema.limit_keys, schema.limit_buckets
        now = from_us(T0_US)
        keys = ({row.lane for row in case.rows if row.lane} | set(case.headers) | ({case.lane} - {None})
                | ({OTHER} if case.other_bucket else set()))
        # a partition's family's own header row, written with its partitions' (key = the family's name)
        keys |= {family.family for key in keys if (family := app.config.family_of(key)) is not None}  # type: ignore[arg-type]
        for key in sorted(keys):  # type: ignore[type-var]
            header = case.headers.get(key, (0, "same", None))
            if header is None:
                continue  # a key without its row
            seq, digest, blocked = header
            stored = {"same": entry_digest(app.config.entry_for(key)), "stale": "0000stale0000000"}.get(digest or "")
            conn.execute(k.insert().values(key=key, seq=seq, config_digest=stored, created_at=now, updated_at=now,
                                           blocked_until=None if blocked is None else from_us(T0_US + blocked)))
        buckets = [(case.key, period, level, at) for period, (level, at) in case.buckets.items()]
        for key, period, level, at in buckets + ([(OTHER, OTHER_PERIOD, 1, 0)] if case.other_bucket else []):
            conn.execute(b.insert().values(key=key, period_s=period, level_units=level, refilled_at_us=T0_US + at,
                                           updated_at=now))
        owners = {"mine": self.owner, "theirs": self.other, "done": self.owner}
        rows = []
        for n, row in enumerate(case.rows):
            claimed = row.state != "pending"
            rows.append({"id": _id(n), "step_id": self.steps[n], "limit_key": row.lane,
                         "eligible_at": from_us(T0_US + row.eligible), "claimed_at": now if claimed else None,
                         "process_id": owners.get(row.state),
                         "completed_at": now if row.state.startswith("done") else None,
                         "outcome": "success" if row.state.startswith("done") else None, "error_klass": None,
                         "error_message": None, "error_backtrace": None, "retry_count": 0, "crash_count": 0,
                         "claim_seq": None, "release_seq": None, "created_at": now, "updated_at": now})
        if rows:
            conn.execute(e.insert(), rows)

    def _compare(self, conn: sa.Connection, app: App, case: Case) -> str | None:
        before = abstraction.snapshot(conn)
        now_us = T0_US + case.now
        owner, ids = None if case.orphans else self.owner, [_id(i) for i in case.endings]
        entry = app.config.entry_for(case.lane) if case.lane is not None else None
        family = None if case.lane is None else app.config.family_of(case.lane)
        ceiling = None if family is None else family.concurrency
        guard = abstraction.ended(before, ids, owner)
        tx = Tx(conn, app.clock)
        endings = [Ending(i, case.outcome) for i in ids]
        taken = claims.release_and_claim(app, tx, case.lane, owner, endings, case.take, poll=case.poll)
        if taken.ended != guard:
            return f"the guard: ended {taken.ended}, the specification {guard} (endings {ids})"
        if not guard:
            return None  # the caller rolls back: nothing it wrote stands
        released = abstraction.after_endings(before, case.lane, ids, case.outcome, now_us)
        state = abstraction.lane_state(released, case.lane, now_us, case.take, app.config.limits,
                                       app.config.families)
        decided = plan(state, Request(case.lane, entry, case.take, case.poll, ceiling))
        got = [c.execution_id for c in taken.claimed]
        if got != list(decided.claims) or taken.refused != decided.refused:
            return (f"claimed {got} refused {taken.refused!r}, the specification {list(decided.claims)} "
                    f"refused {decided.refused!r} (state {state})")
        expected = _apply(released, case.lane, owner, decided, now_us)
        actual = abstraction.snapshot(conn)
        return _difference(expected, actual)


def _apply(rows: abstraction.Rows, key: str | None, owner: str | None, decided: Plan,
           now_us: int) -> abstraction.Rows:
    """The rows the specification says the routine leaves after its endings: the plan's claims,
    buckets and header."""
    out = rows.copy()
    header = out.keys.get(key) if key is not None else None
    seq = None if header is None else header.seq
    for i, execution_id in enumerate(decided.claims, start=1):
        out.executions[execution_id] = replace(out.executions[execution_id], claimed_us=now_us, process_id=owner,
                                               claim_seq=None if seq is None else seq + i)
    if header is not None and key is not None:
        for period in decided.dropped:
            out.buckets.pop((key, period), None)
        for bucket in decided.buckets or ():
            out.buckets[(key, bucket.period_s)] = bucket
        out.keys[key] = replace(header, seq=header.seq + len(decided.claims),
                                digest=decided.digest if decided.digest is not None else header.digest,
                                blocked_until_us=decided.blocked_until_us if decided.stamp else header.blocked_until_us)
    return out


def _difference(expected: abstraction.Rows, actual: abstraction.Rows) -> str | None:
    for name in ("executions", "keys", "buckets"):
        want, got = getattr(expected, name), getattr(actual, name)
        if want != got:
            keys = sorted(set(want) | set(got), key=str)
            diff = [f"{k}: {want.get(k)} != {got.get(k)}" for k in keys if want.get(k) != got.get(k)]
            return f"{name} differ from the specification's: " + "; ".join(diff)
    return None


def _config(limits: Mapping[str, Mapping[str, object]]) -> Config:
    section = {name: dict(values) for name, values in TEST_CONFIG.items()}
    section["job_worker"] = {**section["job_worker"], "limits": {k: dict(v) for k, v in limits.items()}}
    return Config.from_section(section, source="<refinement>")


# --------------------------------------------------------------------------- the bounded domain

#: entries of ``KEY``: limits 1 to 3, one or two rate entries (a second of another period),
#: with and without a ceiling
ENTRIES: tuple[Mapping[str, object], ...] = (
    {"concurrency": 1}, {"concurrency": 3},
    {"rate": {"limit": 1, "per": 1, "burst": 1}},
    {"concurrency": 2, "rate": {"limit": 2, "per": 1, "burst": 2}},
    {"rate": [{"limit": 3, "per": 1, "burst": 1}, {"limit": 2, "per": 60, "burst": 2}]},
)
UNIT = 1_000_000  # a token of a 1 s period, in units


def _bucket_states(entry: Mapping[str, object]) -> list[tuple[dict[int, tuple[int, int]], int]]:
    """``(buckets, now)`` pairs for an entry: no bucket yet; the first rate's bucket one unit
    short of a token with the time at its next token's exact µs and one µs either side; a
    full bucket; a bucket refilled after now (the clock stepped back)."""
    rate = entry.get("rate")
    if rate is None:
        return [({}, 0)]
    first = (rate if isinstance(rate, list) else [rate])[0]
    limit, per = int(first["limit"]), int(first["per"])  # type: ignore[call-overload, index]
    short = per * UNIT - 1  # one unit short of a token: the next token 1 unit / limit µs on
    states: list[tuple[dict[int, tuple[int, int]], int]] = [({}, 0)]
    arrival = -(-1 // limit)  # ceil(1 / limit) µs after the refill time
    states += [({per: (short, 0)}, arrival + offset) for offset in (-1, 0, 1)]
    states += [({per: (int(first["burst"]) * per * UNIT, 0)}, 5), ({per: (per * UNIT, 1000)}, 500)]  # type: ignore[call-overload, index]
    if isinstance(rate, list):  # every bucket holds a token, the first half a token more: both short after a spend
        rates = [(int(r["limit"]), int(r["per"])) for r in rate]  # type: ignore[call-overload, index]
        states += [({p: (p * UNIT + (p * UNIT // 2 if i == 0 else 0), 0) for i, (_, p) in enumerate(rates)}, 0),
                   ({p: (p * UNIT, 0) for _, p in rates}, 0)]
    return states


def exhaustive() -> Iterator[Case]:
    """Every case of the bounded domain (module docstring), in a fixed order."""
    yield from _decisions()
    yield from _lanes()
    yield from _guards()
    yield from _edges()
    yield from _delays()
    yield from _unstamped()
    yield from _families()
    yield from _family_lanes()
    yield from _walks()


def _decisions() -> Iterator[Case]:
    """One key, its decision: each entry, in flight from 0 to the limit, the bucket states,
    one to three pending, take 1 or 3, a poll or a hand-off (after ending one of the
    owner's), the stored values this config's or another's."""
    for entry in ENTRIES:
        ceiling = int(entry.get("concurrency", 2))  # type: ignore[call-overload]
        for flying, (stored, now), pending, take, poll, digest in itertools.product(
                range(ceiling + 1), _bucket_states(entry), (1, 3), (1, 3), (True, False), ("same", "stale")):
            rows = [Row(KEY, 0, "theirs")] * flying + [Row(KEY, i) for i in range(pending)]
            endings: tuple[int, ...] = ()
            if not poll:
                rows.append(Row(KEY, 0, "mine"))
                endings = (len(rows) - 1,)
            yield Case({KEY: entry}, tuple(rows), KEY, endings, take, poll, now, {KEY: (3, digest, None)}, stored,
                       other_bucket=digest == "stale")


def _lanes() -> Iterator[Case]:
    """Two lanes: the routine's (``KEY`` or unkeyed) and another (unkeyed, or ``OTHER``
    stamped long before now, at now, one µs after and long after, saturated, or under
    another config's values), their pending executions interleaved in time, take 1 to 3,
    a poll or a hand-off."""
    # the other lane's places (1) among the routine's (0), in time order: its oldest first,
    # between, last, and two of it around the routine's
    layouts = ((0, 1, 0), (1, 0, 0), (0, 0, 1), (0, 0, 0, 1), (1, 0, 1, 0), (0, 1, 0, 1))
    others: tuple[tuple[str | None, Mapping[str, tuple[int, str | None, int | None]], int], ...] = (
        (None, {}, 0), (OTHER, {}, 0), (OTHER, {OTHER: (0, "same", 50)}, 0),
        (OTHER, {OTHER: (0, "stale", 50)}, 0), (OTHER, {OTHER: (0, "same", 5)}, 0),
        (OTHER, {OTHER: (0, "same", 20)}, 0), (OTHER, {OTHER: (0, "same", 21)}, 0), (OTHER, {}, 1))
    for lane, (other, headers, saturated), layout, take, poll in itertools.product(
            (KEY, None), others, layouts, (1, 2, 3), (True, False)):
        if lane is None and other is None:
            continue  # one lane
        rows = [Row(other if slot == 1 else lane, 5 * i) for i, slot in enumerate(layout)]
        rows += [Row(OTHER, 0, "theirs")] * saturated
        limits = {KEY: {"concurrency": 3}, OTHER: {"concurrency": 1}}
        yield Case(limits, tuple(rows), lane, (), take, poll, 20, {KEY: (0, "same", None), **headers})


def _guards() -> Iterator[Case]:
    """The endings' guard: one or two endings of the owner's (keyed and unkeyed), or of no
    process's (orphans: a recovery's), with one of them completed, another's, pending, or
    held the other way; each outcome."""
    for lane, orphans, bad, outcome in itertools.product(
            (KEY, None), (False, True), ("mine", "orphan", "done", "done_orphan", "theirs", "pending"),
            ("success", "failure", "process_crashed")):
        good = "orphan" if orphans else "mine"
        rows = (Row(lane, 0, good), Row(lane, 0, bad), Row(lane, 5))
        take = 1 if outcome == "success" and not orphans else 0
        for endings in ((0,), (1,), (0, 1)):
            yield Case({KEY: {"concurrency": 2}}, rows, lane, endings, take, False, 10,
                       {KEY: (7, "same", None)}, outcome=outcome, orphans=orphans)


def _edges() -> Iterator[Case]:
    """A poll of a key without its row (gone) and of each lane with nothing to take, and
    calls that take nothing, a poll's and a hand-off's."""
    for lane, take, poll in itertools.product((KEY, None), (0, 1), (True, False)):
        yield Case({KEY: {"concurrency": 2}}, (Row(lane, 0),), lane, (), take, poll, 5, {KEY: (1, "same", None)})
        yield Case({KEY: {"concurrency": 2}}, (Row(None, 0),) if lane else (), lane, (), take, poll, 5,
                   {KEY: None if take else (1, "same", None)})


def _unstamped() -> Iterator[Case]:
    """A key whose row holds no stored values (a NULL digest), a poll's and a hand-off's: the
    decision re-bases it, as under another config's."""
    for poll in (True, False):
        rows = (Row(KEY, 0),) if poll else (Row(KEY, 0), Row(KEY, 0, "mine"))
        yield Case({KEY: {"concurrency": 2, "rate": {"limit": 2, "per": 1}}}, rows, KEY, () if poll else (1,), 1,
                   poll, 5, {KEY: (1, None, None)})


def _delays() -> Iterator[Case]:
    """Executions eligible one µs after now, exactly now and before it, in the routine's lane
    and in another, created in an order that puts the later ones first: only the eligible
    are candidates, and only another lane's eligible ones bound a batch."""
    for lane, other, take, poll in itertools.product((KEY, None), (None, OTHER), (1, 3), (True, False)):
        if lane == other:
            continue
        rows = (Row(lane, 11), Row(other, 11), Row(lane, 10), Row(other, 5), Row(lane, 3), Row(lane, 10))
        yield Case({KEY: {"concurrency": 3}, OTHER: {"concurrency": 3}}, rows, lane, (), take, poll, 10,
                   {KEY: (0, "same", None)})
        # another lane's only eligible execution, exactly at now, between two of the routine's
        rows = (Row(other, 11), Row(lane, 10), Row(other, 10), Row(lane, 10))
        yield Case({KEY: {"concurrency": 3}, OTHER: {"concurrency": 3}}, rows, lane, (), take, poll, 10,
                   {KEY: (0, "same", None)})
        # another lane's oldest at the same time as the routine's, its id lower, its next one's higher:
        # the bound is the oldest's time and id together
        rows = (Row(other, 5), Row(lane, 5), Row(other, 8))
        yield Case({KEY: {"concurrency": 3}, OTHER: {"concurrency": 3}}, rows, lane, (), take, poll, 10,
                   {KEY: (0, "same", None)})
        # fewer eligible than the take: the one due a µs after now stays, though the batch has room
        rows = (Row(lane, 11), Row(lane, 10), Row(other, 11))
        yield Case({KEY: {"concurrency": 3}, OTHER: {"concurrency": 3}}, rows, lane, (), take, poll, 10,
                   {KEY: (0, "same", None)})


def _walks() -> Iterator[Case]:
    """The bound's walk past a lane a poll would not try: ``OTHER``, with executions older
    than the routine's lane's (two in most layouts: the walk meets a lane it passed already),
    saturated or stamped rate-blocked until after now, then a third lane (the unkeyed one,
    or ``THIRD`` for the unkeyed lane's routine) before, between or after the routine's
    executions, or none; take 1 or 3, a poll or a hand-off [INV-LIM-6]."""
    # the places of the routine's lane (0), OTHER (1) and the third lane (2), in time order
    layouts = ((1, 1, 2, 0, 0), (1, 2, 1, 0, 0), (1, 0, 1, 2, 0), (1, 0, 2, 0, 1), (2, 1, 0, 1, 0),
               (1, 1, 0, 0, 2), (1, 0, 1, 0))
    blocked = (({OTHER: (0, "same", None)}, 1), ({OTHER: (0, "same", 50)}, 0))  # saturated; stamped to 50
    for lane, (headers, saturated), layout, take, poll in itertools.product(
            (KEY, None), blocked, layouts, (1, 3), (True, False)):
        names = {0: lane, 1: OTHER, 2: None if lane == KEY else THIRD}
        rows = [Row(names[slot], 5 * i) for i, slot in enumerate(layout)] + [Row(OTHER, 0, "theirs")] * saturated
        limits = {KEY: {"concurrency": 3}, OTHER: {"concurrency": 1}, THIRD: {"concurrency": 3}}
        yield Case(limits, tuple(rows), lane, (), take, poll, 20,
                   {KEY: (0, "same", None), THIRD: (0, "same", None), **headers})


# --------------------------------------------------------------------------- key families (semantics §5.1)

#: ``per_partition`` entries of a family case's ``KEY`` (``PKEY``), each with its bucket states:
#: a ceiling above the family's and one below, with a rate whose bucket is empty (a refusal the
#: family's must come before: it would refill and stamp) or full
FAMILY_ENTRIES: tuple[tuple[Mapping[str, object], tuple[tuple[dict[int, tuple[int, int]], int], ...]], ...] = (
    ({"concurrency": 3}, (({}, 0),)),
    ({"concurrency": 2, "rate": {"limit": 2, "per": 1, "burst": 2}}, (({}, 0), ({1: (2 * UNIT, 0)}, 5))),
)


def _family(entry: Mapping[str, object], ceiling: int | None) -> dict[str, Mapping[str, object]]:
    """A config with ``FAMILY`` (``entry`` for each partition, ``ceiling`` over them all)."""
    return {FAMILY: {"per_partition": entry, **({} if ceiling is None else {"concurrency": ceiling})}}


def _families() -> Iterator[Case]:
    """``KEY`` a partition (``PKEY``) of a family with a ceiling of 1 to 3 (or none), from none
    to the ceiling of its executions in flight in the family's other partition (``POTHER``),
    none or one more in ``PKEY``, three pending, take 1 or 3, a poll or a hand-off (after
    ending one of the owner's in ``PKEY``: the family's count is read after it), the stored
    values this config's or another's (a family at its ceiling re-bases nothing) [INV-LIM-8]."""
    for (entry, states), ceiling in itertools.product(FAMILY_ENTRIES, (1, 2, 3, None)):
        for others, own, (stored, now), take, poll, digest in itertools.product(
                (0, 3) if ceiling is None else range(ceiling + 1), (0, 1), states, (1, 3), (True, False),
                ("same", "stale")):
            rows = ([Row(POTHER, 0, "theirs")] * others + [Row(PKEY, 0, "theirs")] * own
                    + [Row(PKEY, i) for i in range(3)])
            endings: tuple[int, ...] = ()
            if not poll:
                rows.append(Row(PKEY, 0, "mine"))
                endings = (len(rows) - 1,)
            yield Case(_family(entry, ceiling), tuple(rows), PKEY, endings, take, poll, now, {PKEY: (3, digest, None)},
                       stored, key=PKEY)


def _family_lanes() -> Iterator[Case]:
    """The bound: another partition of the family (``POTHER``) pending before or between the
    routine's lane's (a static key, the unkeyed lane, or the family's partition ``PKEY``), and
    ``POTHER`` a lane a poll would try or not: its family below its ceiling or at it by
    executions in flight in a third partition (``SIBLING``), ``POTHER`` itself saturated by its
    ``per_partition`` concurrency, or stamped under the family's ``per_partition`` values: a
    partition of a saturated family is no lane a poll would try [INV-LIM-8]."""
    layouts = ((1, 0, 0), (0, 1, 0), (1, 0, 1, 0))
    #: (executions in flight in SIBLING, in POTHER, POTHER's stamp)
    others = ((1, 0, None), (3, 0, None), (0, 2, None), (1, 0, 50))
    for lane, (flying, own, stamp), layout, take, poll in itertools.product(
            (KEY, None, PKEY), others, layouts, (1, 3), (True, False)):
        rows = [Row(POTHER if slot == 1 else lane, 5 * i) for i, slot in enumerate(layout)]
        rows += [Row(SIBLING, 0, "theirs")] * flying + [Row(POTHER, 0, "theirs")] * own
        limits = {KEY: {"concurrency": 3}, **_family({"concurrency": 2}, 3)}
        yield Case(limits, tuple(rows), lane, (), take, poll, 20,
                   {KEY: (0, "same", None), PKEY: (0, "same", None), POTHER: (0, "same", stamp)},
                   key=PKEY if lane == PKEY else KEY)


# --------------------------------------------------------------------------- beyond it

_rate = st.fixed_dictionaries({"limit": st.integers(1, 5), "per": st.sampled_from([1, 2, 60])},
                              optional={"burst": st.integers(1, 4)})
_entry = st.one_of(
    st.fixed_dictionaries({"concurrency": st.integers(1, 5)}),
    st.fixed_dictionaries({"rate": st.lists(_rate, min_size=1, max_size=2, unique_by=lambda r: r["per"])},
                          optional={"concurrency": st.integers(1, 5)}))


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A state and a call beyond the bounded domain: up to five keys' worth of rows in three
    lanes at random times and states, stored buckets at any level and time around now, any
    stamp and stored values, up to three endings and five to take. Half the cases are a
    family's: ``KEY`` is its partition ``PKEY``, ``OTHER`` its partition ``POTHER`` or a static
    key, the family's ceiling 1 to 3 or none, and its third partition ``SIBLING`` holds
    executions in flight."""
    family = draw(st.booleans())
    key, other = KEY, OTHER
    if family:
        key, other = PKEY, draw(st.sampled_from([POTHER, OTHER]))
        ceiling = draw(st.one_of(st.none(), st.integers(1, 3)))
        entry = draw(_entry)
        extra = {OTHER: draw(_entry)} if other == OTHER and draw(st.booleans()) else {}
        limits = {**_family(entry, ceiling), **extra}
    else:
        entry = draw(_entry)
        limits = {KEY: entry, **({OTHER: draw(_entry)} if draw(st.booleans()) else {})}
    lanes = st.sampled_from([key, other, None])
    states = st.sampled_from(["pending", "pending", "pending", "mine", "theirs", "done", "orphan", "done_orphan"])
    rows = draw(st.lists(st.builds(Row, lanes, st.integers(-100, 100), states), max_size=POOL - 2))
    if family:
        rows = rows[:POOL - 4] + [Row(SIBLING, 0, "theirs")] * draw(st.integers(0, 2))
    lane = draw(lanes)
    mine = [i for i, row in enumerate(rows) if row.state == "mine" and row.lane == lane]
    endings = tuple(draw(st.lists(st.sampled_from(mine), unique=True, max_size=3))) if mine else ()
    stamp = st.one_of(st.none(), st.integers(-50, 150))
    headers = {name: (draw(st.integers(0, 9)), draw(st.sampled_from(["same", "stale", None])), draw(stamp))
               for name in (key, other)}
    rates = parse_limits({KEY: entry})[KEY].rates
    stored = {rate.per_s: (draw(st.integers(0, rate.capacity_units)), draw(st.integers(-2_000_000, 200)))
              for rate in rates if draw(st.booleans())}
    return Case(limits, tuple(rows), lane, endings, draw(st.integers(0, 5)), draw(st.booleans()),
                draw(st.integers(-5, 120)), headers, stored, other_bucket=draw(st.booleans()), key=key)
