"""What the lane routine costs per lane: the floor under a keyed step at ``concurrency: 1``.

    python -m bench.routine_per_lane [--database-url URL] [--lanes 500] [--repeats 3]

B8's drain goal (issue 34: runs over 10³–10⁴ ``concurrency: 1`` partitions at ≥ 0.5× the
unkeyed drain) asks what batching across partitions could reach. Each partition's
execution needs its own claim and release (a lane's lock, its in-flight count, its
decision and its writes: ``claims.release_and_claim``), however many lanes one
transaction or one round trip carries. This measures that per-lane work alone, against
the same executions unkeyed (one routine call claims them all, one releases them all):

- ``lanes`` partitions of ``bench.workloads.Tenants`` with one pending execution each
  (``b8_partitions.insert_partitioned``), then in one transaction a poll's claim of each
  lane in turn (``release_and_claim(key, owner, [], 1, poll=True)``), then in another the
  release of each (``release_and_claim(key, owner, [Ending(id)])``): wall and this
  process's CPU per lane (the rest of the wall time is the server's and the round trip's);
- on PostgreSQL, the same claims and releases called from one SQL statement
  (``unnest(keys)`` ⋈ ``LATERAL ductwork_release_and_claim_3(…)``): the server's time
  per lane, with no round trip and no Python at all;
- a **prototype** that is not the engine's path: the same claims and
  releases as two set-based statements each (:data:`SET_LOCK` takes every lane's key row
  in key order; :data:`SET_CLAIM` counts each lane's in flight, takes its oldest that its
  ``concurrency`` admits, numbers the claims on from the key's ``seq`` and writes it;
  :data:`SET_RELEASE` ends the executions the same way; MySQL-family, which has neither a
  data-modifying CTE nor LATERAL, reads the admitted executions with
  :data:`SET_ADMITTED_MYSQL`, then claims them and writes the keys in one UPDATE each,
  and so does SQLite, under its write lock). Concurrency-only lanes with
  their rows present: no rates, no family ceiling, no re-base, no stamp, no bound. It
  shows what the per-lane work costs when it is done for all lanes at once;
- ``lanes`` unkeyed executions (``bench.workloads.One``): one routine call claims them
  all, one releases them all, per execution.

Medians of ``repeats``. A diagnostic, not a benchmark of record: it shows the bound
(bench/RESULTS.md "B8 drain: the per-lane floor").
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.b8_partitions import b8_app, insert_partitioned, round_robin
from bench.harness import Target, insert_pending, log
from bench.workloads import TENANT_FAMILY, One
from ductwork.db import dialects
from ductwork.fleet.processes import register
from ductwork.limits.claims import ROUTINE, _routine_args, release_and_claim
from ductwork.limits.executions import Ending


def _timed(fn) -> tuple[float, float, Any]:
    """(wall seconds, this process's CPU seconds, what ``fn`` returned)"""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def _keyed(app, owner: str, keys: list[str]) -> dict[str, float]:
    """Each lane's poll claim, then each one's release, one call a lane, one transaction each."""
    def claims() -> list[tuple[str, str]]:
        with app.begin() as tx:
            return [(key, c.execution_id) for key in keys
                    for c in release_and_claim(app, tx, key, owner, [], 1, poll=True).claimed]

    def releases(claimed: list[tuple[str, str]]) -> None:
        with app.begin() as tx:
            for key, execution_id in claimed:
                assert release_and_claim(app, tx, key, owner, [Ending(execution_id)]).ended

    wall_c, cpu_c, claimed = _timed(claims)
    assert len(claimed) == len(keys), (len(claimed), len(keys))
    wall_r, cpu_r, _ = _timed(lambda: releases(claimed))
    n = len(keys)
    return {"claim_ms": 1000 * wall_c / n, "claim_cpu_ms": 1000 * cpu_c / n,
            "release_ms": 1000 * wall_r / n, "release_cpu_ms": 1000 * cpu_r / n}


def _keyed_in_sql(app, owner: str, keys: list[str]) -> dict[str, float]:
    """PostgreSQL: every lane's claim from one statement, then every release from one."""
    def statement(args: list[Any]) -> tuple[str, list[Any]]:
        from psycopg.types.json import Jsonb

        fixed: list[Any] = []
        marks = []
        for i, a in enumerate(args):
            if i == 0:
                marks.append("k.key")
            elif i == 2:
                marks.append("k.ends")
            else:
                marks.append("%s::text[]" if isinstance(a, list) else "%s")
                fixed.append(Jsonb(a.value) if isinstance(a, dialects.Json) else a)
        return f"LATERAL {ROUTINE}({', '.join(marks)}) r", fixed

    routine, fixed = statement(_routine_args(app, keys[0], owner, [], 1, True))
    with app.begin() as tx:
        wall = time.perf_counter()
        rows = tx.conn.exec_driver_sql(
            f"SELECT r.r_limit_key, r.r_execution_id FROM (SELECT key, ARRAY[]::text[] AS ends "
            f"FROM unnest(%s::text[]) AS u(key)) k, {routine}", (keys, *fixed)).all()
        claim = time.perf_counter() - wall
    claimed = [(row.r_limit_key, row.r_execution_id) for row in rows if row.r_execution_id is not None]
    assert len(claimed) == len(keys), (len(claimed), len(keys))
    routine, fixed = statement(_routine_args(app, keys[0], owner, [Ending("-")], 0, False))
    with app.begin() as tx:
        wall = time.perf_counter()
        rows = tx.conn.exec_driver_sql(
            f"SELECT r.r_status FROM (SELECT key, ARRAY[id] AS ends FROM unnest(%s::text[], %s::text[]) "
            f"AS u(key, id)) k, {routine}", ([k for k, _ in claimed], [i for _, i in claimed], *fixed)).all()
        release = time.perf_counter() - wall
    assert all(row.r_status is None for row in rows), {row.r_status for row in rows}
    n = len(keys)
    return {"claim_in_sql_ms": 1000 * claim / n, "release_in_sql_ms": 1000 * release / n}


#: the prototype's lock: every lane's key row, in key order (two claims never deadlock)
SET_LOCK = "SELECT key FROM ductwork_limit_keys WHERE key = ANY(%(keys)s) ORDER BY key FOR UPDATE"
#: the prototype's claim, a statement after the lock (READ COMMITTED: its snapshot is taken
#: after the lock, so it counts every claim committed before)
SET_CLAIM = """
WITH lanes AS (SELECT * FROM unnest(%(keys)s::text[], %(concurrency)s::int[]) AS l(key, c)),
inflight AS (SELECT e.inflight_key AS key, count(*) AS n FROM ductwork_executions e
             WHERE e.inflight_key = ANY(%(keys)s) GROUP BY 1),
heads AS (SELECT l.key, l.c, h.id, row_number() OVER (PARTITION BY l.key ORDER BY h.eligible_at, h.id) AS rn
          FROM lanes l CROSS JOIN LATERAL (
              SELECT e.id, e.eligible_at FROM ductwork_executions e
              WHERE e.pending_lane = l.key AND e.eligible_at <= %(now)s
              ORDER BY e.eligible_at, e.id LIMIT l.c) h),
admitted AS (SELECT heads.key, heads.id, heads.rn FROM heads LEFT JOIN inflight USING (key)
             WHERE coalesce(inflight.n, 0) + heads.rn <= heads.c),
claimed AS (UPDATE ductwork_executions e SET claimed_at = %(now)s, process_id = %(owner)s,
                   claim_seq = k.seq + a.rn, updated_at = %(now)s
            FROM admitted a JOIN ductwork_limit_keys k ON k.key = a.key
            WHERE e.id = a.id AND e.claimed_at IS NULL RETURNING e.id, e.limit_key),
bumped AS (UPDATE ductwork_limit_keys k SET seq = k.seq + x.n, updated_at = %(now)s
           FROM (SELECT limit_key, count(*) AS n FROM claimed GROUP BY 1) x WHERE k.key = x.limit_key)
SELECT claimed.id, claimed.limit_key FROM claimed
"""
#: the prototype's release (one execution a lane here), after the same lock
SET_RELEASE = """
WITH ended AS (UPDATE ductwork_executions e SET completed_at = %(now)s, updated_at = %(now)s,
                      outcome = 'success', release_seq = k.seq + 1
               FROM ductwork_limit_keys k
               WHERE e.id = ANY(%(ids)s) AND k.key = e.limit_key AND e.completed_at IS NULL
                     AND e.claimed_at IS NOT NULL AND e.process_id = %(owner)s
               RETURNING e.id, e.limit_key),
bumped AS (UPDATE ductwork_limit_keys k SET seq = k.seq + x.n, updated_at = %(now)s
           FROM (SELECT limit_key, count(*) AS n FROM ended GROUP BY 1) x WHERE k.key = x.limit_key)
SELECT count(*) FROM ended
"""


def _set_based(app, owner: str, keys: list[str]) -> dict[str, float]:
    """PostgreSQL, the prototype: every lane's claim in two statements, then every release in two."""
    with app.begin() as tx:
        now = tx.now
        wall = time.perf_counter()
        tx.conn.exec_driver_sql(SET_LOCK, {"keys": keys}).all()
        rows = tx.conn.exec_driver_sql(SET_CLAIM, {"keys": keys, "concurrency": [1] * len(keys), "now": now,
                                                   "owner": owner}).all()
        claim = time.perf_counter() - wall
    assert len(rows) == len(keys) == len({row.limit_key for row in rows}), (len(rows), len(keys))
    with app.begin() as tx:
        wall = time.perf_counter()
        tx.conn.exec_driver_sql(SET_LOCK, {"keys": keys}).all()
        ended = tx.conn.exec_driver_sql(SET_RELEASE, {"ids": [row.id for row in rows], "now": now,
                                                      "owner": owner}).scalar_one()
        release = time.perf_counter() - wall
    assert ended == len(keys), (ended, len(keys))
    n = len(keys)
    return {"set_based_claim_ms": 1000 * claim / n, "set_based_release_ms": 1000 * release / n}


#: MySQL-family's form of the prototype (no data-modifying CTE, no LATERAL): after the same
#: lock (in the key's index order), the admitted executions in one read, then the claims and
#: the keys' ``seq`` in one UPDATE each
SET_ADMITTED_MYSQL = """
SELECT h.id, h.k, h.rn, k.seq FROM (
    SELECT e.id, e.pending_lane AS k,
           ROW_NUMBER() OVER (PARTITION BY e.pending_lane ORDER BY e.eligible_at, e.id) AS rn
    FROM ductwork_executions e WHERE e.pending_lane IN %(keys)s AND e.eligible_at <= %(now)s) h
JOIN ductwork_limit_keys k ON k.`key` = h.k
LEFT JOIN (SELECT inflight_key, COUNT(*) AS n FROM ductwork_executions WHERE inflight_key IN %(keys)s
           GROUP BY inflight_key) f ON f.inflight_key = h.k
WHERE COALESCE(f.n, 0) + h.rn <= %(concurrency)s
"""


def _set_based_mysql(app, owner: str, keys: list[str]) -> dict[str, float]:
    """MySQL-family, the prototype (concurrency 1 for every lane, as ``_set_based``)."""
    import json

    lock = "SELECT `key` FROM ductwork_limit_keys WHERE `key` IN %(keys)s ORDER BY `key` FOR UPDATE"

    def seqs(rows: list[tuple[str, str, int]]) -> str:  # (execution id, key, seq to write) as JSON_TABLE reads it
        return json.dumps([list(row) for row in rows])

    claim = ("UPDATE ductwork_executions e JOIN JSON_TABLE(%(rows)s, '$[*]' COLUMNS (id VARCHAR(64) PATH '$[0]', "
             "seq BIGINT PATH '$[2]')) j ON j.id = e.id SET e.claimed_at = %(now)s, e.process_id = %(owner)s, "
             "e.claim_seq = j.seq, e.updated_at = %(now)s WHERE e.claimed_at IS NULL")
    bump = ("UPDATE ductwork_limit_keys k JOIN JSON_TABLE(%(rows)s, '$[*]' COLUMNS (k VARCHAR(255) PATH '$[1]', "
            "seq BIGINT PATH '$[2]')) j ON j.k = k.`key` SET k.seq = j.seq, k.updated_at = %(now)s")
    end = ("UPDATE ductwork_executions e JOIN JSON_TABLE(%(rows)s, '$[*]' COLUMNS (id VARCHAR(64) PATH '$[0]', "
           "seq BIGINT PATH '$[2]')) j ON j.id = e.id SET e.completed_at = %(now)s, e.updated_at = %(now)s, "
           "e.outcome = 'success', e.release_seq = j.seq WHERE e.completed_at IS NULL "
           "AND e.claimed_at IS NOT NULL AND e.process_id = %(owner)s")
    with app.begin() as tx:
        now = tx.now
        raw = tx.conn.connection.cursor()
        wall = time.perf_counter()
        raw.execute(lock, {"keys": keys})
        raw.fetchall()
        raw.execute(SET_ADMITTED_MYSQL, {"keys": keys, "now": now, "concurrency": 1})
        rows = [(i, k, seq + rn) for i, k, rn, seq in raw.fetchall()]
        raw.execute(claim, {"rows": seqs(rows), "now": now, "owner": owner})
        claimed = raw.rowcount
        raw.execute(bump, {"rows": seqs(rows), "now": now})
        claim_s = time.perf_counter() - wall
    assert claimed == len(keys) == len({k for _, k, _ in rows}), (claimed, len(keys))
    with app.begin() as tx:
        raw = tx.conn.connection.cursor()
        wall = time.perf_counter()
        raw.execute(lock, {"keys": keys})
        raw.fetchall()
        raw.execute("SELECT `key`, seq FROM ductwork_limit_keys WHERE `key` IN %(keys)s", {"keys": keys})
        seq = dict(raw.fetchall())
        ends = [(i, k, seq[k] + 1) for i, k, _ in rows]
        raw.execute(end, {"rows": seqs(ends), "now": now, "owner": owner})
        ended = raw.rowcount
        raw.execute(bump, {"rows": seqs(ends), "now": now})
        release_s = time.perf_counter() - wall
    assert ended == len(keys), (ended, len(keys))
    n = len(keys)
    return {"set_based_claim_ms": 1000 * claim_s / n, "set_based_release_ms": 1000 * release_s / n}


def _set_based_sqlite(app, owner: str, keys: list[str]) -> dict[str, float]:
    """SQLite, the prototype: the write lock taken at BEGIN IMMEDIATE is every key's lock;
    :data:`SET_ADMITTED_MYSQL`'s read, then the claims and the keys' ``seq`` in one UPDATE
    each (``UPDATE … FROM``); a release's sequence number is its key's next (one ending a
    lane here)."""
    import json

    marks = ", ".join("?" * len(keys))
    admitted = (SET_ADMITTED_MYSQL.replace("%(keys)s", f"({marks})", 1).replace("%(now)s", "?")
                .replace("%(keys)s", f"({marks})").replace("%(concurrency)s", "?").replace("`", '"'))
    claim = ("UPDATE ductwork_executions AS e SET claimed_at = ?, process_id = ?, claim_seq = j.value ->> 2, "
             "updated_at = ? FROM json_each(?) AS j WHERE e.id = j.value ->> 0 AND e.claimed_at IS NULL")
    bump = ('UPDATE ductwork_limit_keys AS k SET seq = j.value ->> 2, updated_at = ? FROM json_each(?) AS j '
            'WHERE k."key" = j.value ->> 1')
    end = ("UPDATE ductwork_executions AS e SET completed_at = ?, updated_at = ?, outcome = 'success', "
           "release_seq = (SELECT k.seq + 1 FROM ductwork_limit_keys AS k WHERE k.\"key\" = e.limit_key) "
           "WHERE e.id IN (SELECT value ->> 0 FROM json_each(?)) "
           "AND e.completed_at IS NULL AND e.claimed_at IS NOT NULL AND e.process_id = ?")
    with app.begin() as tx:
        now = tx.now.isoformat(sep=" ")
        raw = tx.conn.connection.cursor()
        wall = time.perf_counter()
        raw.execute(admitted, (*keys, now, *keys, 1))
        rows = [(i, k, seq + rn) for i, k, rn, seq in raw.fetchall()]
        raw.execute(claim, (now, owner, now, json.dumps(rows)))
        claimed = raw.rowcount
        raw.execute(bump, (now, json.dumps(rows)))
        claim_s = time.perf_counter() - wall
    assert claimed == len(keys) == len({k for _, k, _ in rows}), (claimed, len(keys))
    with app.begin() as tx:
        raw = tx.conn.connection.cursor()
        wall = time.perf_counter()
        raw.execute(f'SELECT "key", seq FROM ductwork_limit_keys WHERE "key" IN ({marks})', keys)
        seq = dict(raw.fetchall())
        ends = [(i, k, seq[k] + 1) for i, k, _ in rows]
        raw.execute(end, (now, now, json.dumps(ends), owner))
        ended = raw.rowcount
        raw.execute(bump, (now, json.dumps(ends)))
        release_s = time.perf_counter() - wall
    assert ended == len(keys), (ended, len(keys))
    n = len(keys)
    return {"set_based_claim_ms": 1000 * claim_s / n, "set_based_release_ms": 1000 * release_s / n}


def _unkeyed(app, owner: str, n: int) -> dict[str, float]:
    """``n`` unkeyed executions: one call claims them all, one releases them all."""
    def claims() -> list[str]:
        with app.begin() as tx:
            return [c.execution_id for c in release_and_claim(app, tx, None, owner, [], n, poll=True).claimed]

    def releases(ids: list[str]) -> None:
        with app.begin() as tx:
            assert release_and_claim(app, tx, None, owner, [Ending(i) for i in ids]).ended

    wall_c, cpu_c, ids = _timed(claims)
    assert len(ids) == n, (len(ids), n)
    wall_r, cpu_r, _ = _timed(lambda: releases(ids))
    return {"unkeyed_claim_ms": 1000 * wall_c / n, "unkeyed_claim_cpu_ms": 1000 * cpu_c / n,
            "unkeyed_release_ms": 1000 * wall_r / n, "unkeyed_release_cpu_ms": 1000 * cpu_r / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--lanes", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    target = Target.from_url(options.database_url)
    target.setup()
    got: dict[str, list[float]] = {}
    try:
        for rep in range(options.repeats):
            target.reset()  # (SQLite: a fresh copy of the file, so an app of its own each time)
            app = b8_app(target)
            owner = register(app, role="worker")
            insert_partitioned(app, options.lanes, f"l{rep}", options.lanes, round_robin(options.lanes))
            keys = [f"{TENANT_FAMILY}[{i}]" for i in range(options.lanes)]
            measured = _keyed(app, owner, keys)
            if target.kind == "postgresql":
                insert_partitioned(app, options.lanes, f"s{rep}", options.lanes, round_robin(options.lanes))
                measured |= _keyed_in_sql(app, owner, keys)
                insert_partitioned(app, options.lanes, f"p{rep}", options.lanes, round_robin(options.lanes))
                measured |= _set_based(app, owner, keys)
            elif target.kind == "mysql":
                insert_partitioned(app, options.lanes, f"p{rep}", options.lanes, round_robin(options.lanes))
                measured |= _set_based_mysql(app, owner, keys)
            else:
                insert_partitioned(app, options.lanes, f"p{rep}", options.lanes, round_robin(options.lanes))
                measured |= _set_based_sqlite(app, owner, keys)
            insert_pending(app, One, options.lanes, f"u{rep}")
            measured |= _unkeyed(app, owner, options.lanes)
            for name, value in measured.items():
                got.setdefault(name, []).append(value)
            app.dispose()
            log(f"repetition {rep + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in measured.items()))
    finally:
        target.cleanup()
    print(f"{target.name}, {options.lanes} lanes, medians of {options.repeats} (ms per lane or execution):")
    for name, values in got.items():
        print(f"  {name:<24} {statistics.median(values):8.3f}   ({', '.join(f'{v:.3f}' for v in values)})")
    keyed = statistics.median(got["claim_ms"]) + statistics.median(got["release_ms"])
    unkeyed = statistics.median(got["unkeyed_claim_ms"]) + statistics.median(got["unkeyed_release_ms"])
    print(f"  claim + release: keyed {keyed:.3f} ms a lane, unkeyed {unkeyed:.3f} ms an execution "
          f"({keyed / unkeyed:.0f}×)")


if __name__ == "__main__":
    main()
