"""The environment checks of ``ductwork verify``: what the engine relies on from the
database, read from the adopter's server through ductwork's own engine.

    checks, settings, version = check_environment(url)

Each check is a probe that reads values (``_probe_…``, needing a database) and a pure
judge (``judge_…``) that decides from them, so a failing environment can be shown
without one. A check that does not apply to the backend has ``passed`` None and says why.

Minimum versions (:data:`MINIMUM_VERSIONS`): the project states none (INVARIANTS.md: tested
on PostgreSQL 15, MariaDB 10.11, SQLite 3.40), so these are the oldest releases with what the
engine uses: ``SKIP LOCKED`` and ``JSON_TABLE`` (the lane routine) need MySQL 8.0 and MariaDB
10.6; PostgreSQL 13 (12 has the stored generated columns; 13 ``DROP DATABASE … WITH
(FORCE)``, which drops verify's scratch database); SQLite 3.35 (``ALTER TABLE DROP COLUMN``
in the downgrades; stored generated columns came in 3.31).

The probes run on a table of their own (``ductwork_verify_probe_<hex>``, created with
the schema's timestamp type and the server's default storage engine, as the migrations
create ductwork's tables) and drop it; they need no migrated schema. Lock waits are
bounded by a lock timeout of :data:`LOCK_TIMEOUT_S` (and a statement timeout, or the
driver's read timeout), so a server that never grants a lock fails a check instead of
hanging verify.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ductwork.db import dialects, engines, schema
from ductwork.pipelines.payloads import STATEMENT_BYTES_NEEDED
from ductwork_proof.results import Check
from ductwork_proof.scratch import first_line

#: the oldest server release verify accepts, per flavour (module docstring says why)
MINIMUM_VERSIONS = {"postgresql": (13,), "mysql": (8, 0), "mariadb": (10, 6), "sqlite": (3, 35)}
NAMES = {"postgresql": "PostgreSQL", "mysql": "MySQL", "mariadb": "MariaDB", "sqlite": "SQLite"}
#: the clock offset (seconds) beyond which ENV-CLOCK fails (:func:`judge_clock` says why)
MAX_CLOCK_OFFSET_S = 5.0
#: how long a probe's second transaction waits for a lock before the server refuses it
LOCK_TIMEOUT_S = 1
#: timestamps ENV-MICROSECONDS writes: both ends of the microsecond field and one between
MICROSECOND_VALUES = (datetime(2026, 1, 2, 3, 4, 5, 1), datetime(2026, 1, 2, 3, 4, 5, 123456),
                      datetime(2026, 1, 2, 3, 4, 5, 999999))

#: a judge's answer: passed (None: not applicable) and the detail, with the values read
Verdict = tuple[bool | None, str]

STATEMENTS = {
    "ENV-VERSION": ("The server is a release verify accepts: PostgreSQL 13, MySQL 8.0, MariaDB 10.6, "
                    "SQLite 3.35 or later."),
    "ENV-ISOLATION": "Connections get the isolation the engine asks for (READ COMMITTED; SQLite: WAL journal).",
    "ENV-SKIP-LOCKED": "FOR UPDATE SKIP LOCKED passes over a row another transaction holds, at once, and no other.",
    "ENV-FOR-UPDATE-BLOCKS": "A locking read (SQLite: a second BEGIN IMMEDIATE) waits while another holds the lock.",
    "ENV-MICROSECONDS": "A timestamp in a column of the schema's timestamp type reads back to the microsecond.",
    "ENV-CLOCK": "The database clock, the one the engine decides by (INV-CLK-1), is within 5 s of this host's.",
    "ENV-PACKET": "MySQL/MariaDB's max_allowed_packet carries a statement holding a payload of the maximum size.",
    "ENV-TIMEZONE": "The engine depends on no session time zone: it reads the clock in UTC, stores naive UTC.",
}


@dataclass
class Server:
    """What the probes share: the backend, its flavour and version, the settings read."""

    backend: str
    flavour: str  # postgresql, mysql, mariadb or sqlite
    version: tuple[int, ...]
    version_text: str
    settings: dict[str, str]


@dataclass(frozen=True)
class LockOutcome:
    """What a second transaction's locking read got while the first held row 1."""

    #: the ids returned, or None when the statement was refused
    rows: tuple[int, ...] | None
    #: refused because the lock wait ran out (lock timeout, SQLite's "database is locked")
    timed_out: bool = False
    error: str = ""


# --------------------------------------------------------------------------- judges


def judge_version(flavour: str, version: tuple[int, ...]) -> Verdict:
    """At least :data:`MINIMUM_VERSIONS`' release of ``flavour``."""
    floor = MINIMUM_VERSIONS[flavour]
    shown, wanted = ".".join(map(str, version)), ".".join(map(str, floor))
    if tuple(version[:len(floor)]) >= floor:
        return True, f"{NAMES[flavour]} {shown} (at least {wanted})"
    return False, f"{NAMES[flavour]} {shown} is older than {wanted}, the oldest release verify accepts"


def judge_isolation(asked: str, got: str) -> Verdict:
    """The isolation the connection reports (``read committed``, ``READ-COMMITTED``) is the one asked."""
    if got.replace("-", " ").upper() == asked.upper():
        return True, f"{got} (the engine asks for {asked})"
    return False, f"connections get {got}, not the {asked} the engine asks for: something between them (a " \
                  "proxy, init_connect, a pooler) changes it"


def judge_journal_mode(got: str) -> Verdict:
    """SQLite's journal is WAL, as the engine sets it on every connection."""
    if got.lower() == "wal":
        return True, "journal_mode wal (the engine sets it): readers read beside the one writer"
    return False, f"journal_mode {got}, not the wal the engine sets: this file system or build does not take it"


def judge_skip_locked(outcome: LockOutcome) -> Verdict:
    """With row 1 of rows 1 and 2 locked, SKIP LOCKED returns row 2 only, without waiting."""
    if outcome.timed_out:
        return False, f"waited for the locked row until the lock timeout: SKIP LOCKED did not skip ({outcome.error})"
    if outcome.rows is None:
        return False, f"refused: {outcome.error}"
    if outcome.rows == (2,):
        return True, "returned row 2 of rows 1, 2 while row 1 was locked, without waiting"
    if 1 in outcome.rows:
        return False, f"returned rows {list(outcome.rows)} while row 1 was locked: the lock was not respected"
    return False, f"returned rows {list(outcome.rows)}, not [2]: the unlocked row was not returned"


def judge_blocks(outcome: LockOutcome) -> Verdict:
    """The second locking read waits until its lock timeout while the first holds the lock."""
    if outcome.timed_out:
        return True, f"waited while the lock was held, until the {LOCK_TIMEOUT_S} s lock timeout ({outcome.error})"
    if outcome.rows is not None:
        return False, f"went through while another transaction held the lock (returned rows {list(outcome.rows)})"
    return False, f"refused without waiting for the lock: {outcome.error}"


def judge_microseconds(pairs: list[tuple[datetime, datetime]]) -> Verdict:
    """Every value read back equals the one written."""
    wrong = [f"{written.isoformat()} read back as {read.isoformat()}" for written, read in pairs if written != read]
    if wrong:
        return False, "; ".join(wrong)
    return True, "read back exactly: " + ", ".join(written.isoformat() for written, _ in pairs)


def judge_clock(offset_s: float, uncertainty_s: float, bound_s: float = MAX_CLOCK_OFFSET_S) -> Verdict:
    """Fail only when the database clock is surely more than ``bound_s`` from this host's.

    The engine decides by one clock, the database's (INV-CLK-1): eligibility, staleness
    of heartbeats (written with database time, their intervals measured on each host's
    monotonic clock), token refills and the prune cutoff all read it, so an offset changes
    no decision and is reported. What the host clock does stamp is outside the decisions:
    ductwork's log lines (``ductwork/logs.py``) carry host time beside the database times
    they report (``next_at``), and step code comparing ``datetime.now()`` with a time
    ductwork stored sees the offset. Clocks kept by NTP agree within milliseconds; more
    than 5 s means this host (or the server) keeps no synchronised time, which makes logs
    and history disagree, so it fails. ``uncertainty_s`` is half the round trip of the read.
    """
    sure = max(0.0, abs(offset_s) - uncertainty_s)
    text = f"database clock {offset_s:+.4f} s from this host's (± {uncertainty_s:.4f} s)"
    if sure > bound_s:
        return False, f"{text}: more than {bound_s:g} s; log lines and stored times will disagree by that much"
    return True, f"{text}: within {bound_s:g} s"


def judge_packet(max_allowed_packet: int) -> Verdict:
    """``max_allowed_packet`` at least ``payloads.STATEMENT_BYTES_NEEDED``."""
    if max_allowed_packet >= STATEMENT_BYTES_NEEDED:
        return True, f"max_allowed_packet {max_allowed_packet:,} bytes (at least {STATEMENT_BYTES_NEEDED:,})"
    return False, (f"max_allowed_packet {max_allowed_packet:,} bytes, less than the {STATEMENT_BYTES_NEEDED:,} a "
                   f"payload of the maximum needs: storing one is refused (SET GLOBAL max_allowed_packet = "
                   f"{STATEMENT_BYTES_NEEDED})")


# --------------------------------------------------------------------------- probes


#: the MySQL/MariaDB variables reported (the first two also as the server's global default)
_MYSQL = ("transaction_isolation", "tx_isolation", "time_zone", "system_time_zone", "max_allowed_packet", "sql_mode",
          "innodb_lock_wait_timeout", "wait_timeout", "max_connections", "default_storage_engine",
          "character_set_database", "collation_database")


def _variables(scope: str, names: tuple[str, ...]) -> str:
    return f"SHOW {scope} VARIABLES WHERE Variable_name IN (" + ", ".join(f"'{n}'" for n in names) + ")"


def _server(conn: sa.Connection) -> Server:
    """The backend, flavour, version and settings, read on a ductwork connection (so
    what its sessions get: READ COMMITTED where the server's default differs)."""
    name = dialects.backend(conn)
    version = tuple(part for part in conn.dialect.server_version_info or () if isinstance(part, int))
    if name == "postgresql":
        text = "PostgreSQL " + str(conn.exec_driver_sql("SHOW server_version").scalar_one())
        rows = conn.exec_driver_sql(
            "SELECT name, setting FROM pg_settings WHERE name IN ('transaction_isolation', "
            "'default_transaction_isolation', 'TimeZone', 'lock_timeout', 'statement_timeout', "
            "'idle_in_transaction_session_timeout', 'max_connections', 'server_encoding')").all()
        return Server(name, name, version, text, {str(k): str(v) for k, v in rows})
    if name == "mysql":
        flavour = "mariadb" if getattr(conn.dialect, "is_mariadb", False) else "mysql"
        text = f"{NAMES[flavour]} {conn.exec_driver_sql('SELECT VERSION()').scalar_one()}"
        settings = {f"global.{k}": str(v) for k, v in conn.exec_driver_sql(_variables("GLOBAL", _MYSQL[:2]))}
        settings.update({str(k): str(v) for k, v in conn.exec_driver_sql(_variables("SESSION", _MYSQL))})
        return Server(name, flavour, version, text, dict(sorted(settings.items())))
    text = "SQLite " + str(conn.exec_driver_sql("SELECT sqlite_version()").scalar_one())
    settings = {p: str(conn.exec_driver_sql(f"PRAGMA {p}").scalar_one())
                for p in ("journal_mode", "synchronous", "foreign_keys")}
    return Server(name, name, version, text, settings)


def _lock_timed_out(error: sa.exc.DBAPIError) -> bool:
    """The server refused a statement because its lock wait ran out."""
    orig = error.orig
    args = getattr(orig, "args", ())
    return (getattr(orig, "sqlstate", None) == "55P03"  # PostgreSQL lock_not_available (lock_timeout)
            or bool(args and args[0] == 1205)  # MySQL/MariaDB ER_LOCK_WAIT_TIMEOUT
            or "database is locked" in str(orig))  # SQLite, after busy_timeout


def _bound_waits(conn: sa.Connection) -> None:
    """Bound the lock waits of ``conn``'s transaction by :data:`LOCK_TIMEOUT_S`."""
    if dialects.backend(conn) == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_S * 1000}ms'")
        conn.exec_driver_sql("SET LOCAL statement_timeout = '10s'")  # the driver has no read timeout
    else:  # MySQL/MariaDB: whole seconds; the engine's read timeout bounds the rest
        conn.exec_driver_sql(f"SET SESSION innodb_lock_wait_timeout = {LOCK_TIMEOUT_S}")


def _locking_read(conn: sa.Connection, table: sa.Table, *, skip_locked: bool) -> LockOutcome:
    """Rows 1 and 2 (SKIP LOCKED) or row 1 (FOR UPDATE), read for update in a transaction of its own."""
    ids = [1, 2] if skip_locked else [1]
    stmt = dialects.for_update(sa.select(table.c.id).where(table.c.id.in_(ids)).order_by(table.c.id), conn,
                               skip_locked=skip_locked)
    tx = conn.begin()
    try:
        _bound_waits(conn)
        return LockOutcome(tuple(conn.execute(stmt).scalars()))
    except sa.exc.DBAPIError as error:
        return LockOutcome(None, _lock_timed_out(error), first_line(error))
    finally:
        tx.rollback()


def _probe_locks(engine: Engine, table: sa.Table) -> tuple[LockOutcome, LockOutcome]:
    """PostgreSQL, MySQL: one transaction holds row 1 FOR UPDATE; another reads rows 1
    and 2 FOR UPDATE SKIP LOCKED, then row 1 FOR UPDATE. SQLite: one transaction holds the
    write lock (BEGIN IMMEDIATE); another begins (no SKIP LOCKED to try)."""
    with engine.connect() as holder, engine.connect() as other, holder.begin():
        if dialects.backend(engine) == "sqlite":
            holder.execute(sa.select(table.c.id))
            try:
                with other.begin():
                    return LockOutcome(None), LockOutcome(tuple(other.execute(sa.select(table.c.id)).scalars()))
            except sa.exc.DBAPIError as error:
                return LockOutcome(None), LockOutcome(None, _lock_timed_out(error), first_line(error))
        holder.execute(dialects.for_update(sa.select(table.c.id).where(table.c.id == 1), holder))
        return _locking_read(other, table, skip_locked=True), _locking_read(other, table, skip_locked=False)


def _probe_isolation(engine: Engine, server: Server) -> str:
    """The isolation (PostgreSQL, MySQL) or journal mode (SQLite) a ductwork transaction runs with."""
    with engine.begin() as conn:
        if server.backend == "postgresql":
            return str(conn.exec_driver_sql("SHOW transaction_isolation").scalar_one())
        if server.backend == "sqlite":
            return str(conn.exec_driver_sql("PRAGMA journal_mode").scalar_one())
        # MariaDB before 11.1 names it tx_isolation; MySQL 8.0.3 and later transaction_isolation
        variable = "tx_isolation" if server.flavour == "mariadb" and server.version < (11, 1) else \
            "transaction_isolation"
        return str(conn.exec_driver_sql(f"SELECT @@{variable}").scalar_one())


def _probe_clock(engine: Engine) -> tuple[float, float]:
    """The database clock's offset from this host's and half the read's round trip (the
    best of three reads)."""
    samples = []
    with engine.connect() as conn:
        for _ in range(3):
            before = datetime.now(UTC).replace(tzinfo=None)
            db = dialects.db_now(conn)
            after = datetime.now(UTC).replace(tzinfo=None)
            half = (after - before) / 2
            samples.append(((db - (before + half)).total_seconds(), half.total_seconds()))
        conn.rollback()
    return min(samples, key=lambda sample: sample[1])


def _probe_microseconds(engine: Engine, table: sa.Table) -> list[tuple[datetime, datetime]]:
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"id": 10 + i, "at": at} for i, at in enumerate(MICROSECOND_VALUES)])
    with engine.connect() as conn:
        read = dict(conn.execute(sa.select(table.c.id, table.c.at).where(table.c.id >= 10)).all())
    return [(at, read[10 + i]) for i, at in enumerate(MICROSECOND_VALUES)]


# --------------------------------------------------------------------------- the checks


def check_environment(url: str) -> tuple[list[Check], dict[str, str], str]:
    """The ENV-… checks on ``url``'s database (one that verify may write a table to and
    drop it: the scratch database), the settings read, and the server's version text."""
    engine = engines.create_engine(url, connect_timeout=10, io_timeout=10, busy_timeout=LOCK_TIMEOUT_S)
    try:
        with engine.connect() as conn:
            server = _server(conn)
        table = sa.Table(f"ductwork_verify_probe_{secrets.token_hex(4)}", sa.MetaData(),
                         sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
                         sa.Column("at", schema.Timestamp, nullable=True))
        table.create(engine)
        try:
            with engine.begin() as conn:
                conn.execute(table.insert(), [{"id": 1}, {"id": 2}])
            probed = Probed(engine, server, table)
            checks = [_run(check_id, probed) for check_id in CHECKS]
        finally:
            table.drop(engine, checkfirst=True)
    finally:
        engine.dispose()
    return checks, server.settings, server.version_text


@dataclass
class Probed:
    """What the checks run on: the engine, the server read, the probe table (rows 1, 2)."""

    engine: Engine
    server: Server
    table: sa.Table
    #: the lock probe's outcomes (skip locked, plain for update), read once for both checks
    locks: tuple[LockOutcome, LockOutcome] | None = None


def check_version(p: Probed) -> Verdict:
    return judge_version(p.server.flavour, p.server.version)


def check_isolation(p: Probed) -> Verdict:
    got = _probe_isolation(p.engine, p.server)
    if p.server.backend == "sqlite":
        return judge_journal_mode(got)
    # what ductwork's create_engine passes SQLAlchemy (engines.py's per-backend options)
    asked: str = engines._engine_options(p.server.backend, {})["isolation_level"]
    return judge_isolation(asked, got)


def check_skip_locked(p: Probed) -> Verdict:
    p.locks = _probe_locks(p.engine, p.table)
    if p.server.backend == "sqlite":
        return None, ("not applicable: SQLite has no row locks; its writers serialise on the database lock "
                      "(ENV-FOR-UPDATE-BLOCKS), so a claim never meets a row another transaction holds")
    return judge_skip_locked(p.locks[0])


def check_for_update_blocks(p: Probed) -> Verdict:
    if p.locks is None:
        p.locks = _probe_locks(p.engine, p.table)
    return judge_blocks(p.locks[1])


def check_microseconds(p: Probed) -> Verdict:
    return judge_microseconds(_probe_microseconds(p.engine, p.table))


def check_clock(p: Probed) -> Verdict:
    if p.server.backend == "sqlite":
        return None, ("not applicable: SQLite has no server clock; the database clock is this host's "
                      "(dialects.db_now reads it)")
    return judge_clock(*_probe_clock(p.engine))


def check_packet(p: Probed) -> Verdict:
    if p.server.backend != "mysql":
        return None, f"not applicable: {NAMES[p.server.flavour]} takes a statement of up to 1 GB"
    return judge_packet(int(p.server.settings["max_allowed_packet"]))


def check_timezone(p: Probed) -> Verdict:
    zone = p.server.settings.get("TimeZone") or p.server.settings.get("time_zone")
    read = f"session time zone {zone}" if zone else "SQLite has no time zone"
    clock = {"postgresql": "clock_timestamp() AT TIME ZONE 'UTC'", "mysql": "UTC_TIMESTAMP(6)",
             "sqlite": "the host clock in UTC"}[p.server.backend]
    return None, f"not applicable ({read}): db_now reads {clock} and the timestamp columns store no zone"


#: the checks in the order they run and are reported
CHECKS: dict[str, Callable[[Probed], Verdict]] = {
    "ENV-VERSION": check_version, "ENV-ISOLATION": check_isolation, "ENV-SKIP-LOCKED": check_skip_locked,
    "ENV-FOR-UPDATE-BLOCKS": check_for_update_blocks, "ENV-MICROSECONDS": check_microseconds,
    "ENV-CLOCK": check_clock, "ENV-PACKET": check_packet, "ENV-TIMEZONE": check_timezone}


def _run(check_id: str, probed: Probed) -> Check:
    """One check; a probe the server refuses fails it, naming the refusal."""
    check = CHECKS[check_id]
    try:
        passed, detail = check(probed)
    except sa.exc.DBAPIError as error:
        passed, detail = False, f"the probe failed: {first_line(error)}"
    return Check(check_id, STATEMENTS[check_id], check.__name__, passed, detail)
