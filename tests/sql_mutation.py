"""Every broken variant of the lane routine's SQL against the refinement check.

    python -m tests.sql_mutation                       # both servers (PostgreSQL, MariaDB/MySQL)
    python -m tests.sql_mutation --db postgresql       # one
    python -m tests.sql_mutation --list --db mysql     # the variants, not run

The lane routine (``ductwork/limits/sql/release_and_claim_3.*.sql``) computes in SQL what
``ductwork.limits.plan.plan`` specifies; ``tests/refinement.py`` checks that it does, state
by state. This generates variants of each backend's SQL, one change each, and expects the
check over the bounded domain (``refinement.exhaustive``) to find a state where the variant
does something else:

- ``comparison``: ``<`` for ``>=``, ``>`` for ``<=``, ``=`` for ``<>`` and back, and each
  boundary moved (``<`` for ``<=``, ``>`` for ``>=`` and back);
- ``null``: ``IS NULL`` for ``IS NOT NULL`` and back, ``IS DISTINCT FROM`` for ``IS NOT
  DISTINCT FROM`` (PostgreSQL), ``<=>`` for ``=`` (MySQL);
- ``predicate``: one ``AND …`` line of a condition dropped (the state guard, a lane's rule);
- ``order``: a lane's ``ORDER BY`` reversed;
- ``bound``: ``least`` for ``greatest`` and back (the clamp, the refill time, the stamp);
- ``arithmetic``: a ceiling division made a floor one (``+ x - 1`` dropped), the spend
  applied twice;
- ``negation``: a ``NOT`` dropped.

A variant the server refuses to create is not counted (it is not a routine); one that raises
on a state is killed (the caller's transaction fails). ``FOR UPDATE`` dropped is no variant
of this check: one transaction at a time cannot see a lock missing; the engine mutants
``no_key_lock`` and ``no_key_lock_mysql`` are killed by the race test instead. The variants
are installed into a scratch database of their own (``ductwork_sql_mutation``, made empty
and migrated here, on the server ``tests.databases.provide`` finds), one after the other;
survivors are printed, to be killed by a new state of the domain or argued equivalent
(:data:`ARGUED`). Not run by ``.ci/run`` (minutes per server):
``tests/properties/test_refinement.py`` runs the check itself, and the named engine mutants
of the SQL (``tests/mutants.py``) are killed there in CI.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from ductwork.db import dialects, engines
from tests.refinement import World, exhaustive

SOURCE = Path(__file__).resolve().parents[1] / "ductwork" / "limits" / "sql"
#: the backends, each with the server kind ``tests.databases.provide`` finds
#: (``DUCTWORK_TEST_POSTGRES_URL`` / ``DUCTWORK_TEST_MYSQL_URL``, else a container)
BACKENDS = {"postgresql": "postgresql", "mysql": "mysql"}
SCRATCH = "ductwork_sql_mutation"
_REFILL_WHEN = "IF dt > 0 THEN  -- time that went backwards adds nothing"
_FILLS = {"postgresql": "IF dt >= (cap - lv + p_limit[i] - 1) / p_limit[i] THEN",
          "mysql": "IF dt >= (cap - lv + lim - 1) DIV lim THEN"}
_BOUND_FOR = dict.fromkeys(
    ("postgresql", "mysql"),
    "IF NOT p_poll OR p_take > 1 THEN  -- [INV-LIM-6] the oldest of every other lane a poll would try now")
_ENDS = {"postgresql": "IF v_found AND cardinality(p_ends) > 0 THEN  -- the endings, guarded [INV-EXE-2]",
         "mysql": "IF v_found AND v_n_ends > 0 THEN  -- the endings, guarded [INV-EXE-2]"}
_CLAIMS = {"postgresql": "IF cardinality(v_claims) > 0 THEN  -- the claims, each with the key's next sequence number",
           "mysql": "IF JSON_LENGTH(v_claims) > 0 THEN  -- the claims, each with the key's next sequence number"}
_SPEND = "IF v_write_buckets AND cardinality(v_per) > 0 THEN  -- [INV-LIM-2] the spend commits with the claims"
_MY_SPEND = "IF v_write_buckets AND JSON_LENGTH(v_levels) > 0 THEN  -- [INV-LIM-2] the spend commits with the claims"
#: MySQL's loops over a key's rates, which walk JSON arrays by index
_RATE_LOOPS = ("WHILE i < n DO  -- 3. refill every kept bucket [INV-LIM-4]",
               "WHILE i < n DO  -- 4. the latest next-token time of the short buckets [INV-LIM-5]",
               "WHILE i < n DO  -- 5. admitted: one token from every bucket [INV-LIM-2]",
               "WHILE i < n DO  -- the stamp over the buckets now short, or cleared [INV-LIM-5]",
               "WHILE v_i < JSON_LENGTH(v_rates) DO  -- each kept entry's stored bucket, config order")
#: the lane walk's arguments (routine version 3's bound, tests.sql_mutation --lines of its block)
_WALK_RANGE = (
    "the walk's range ends at the candidates only to read less: a row past them is left at once by "
    'the exit test that follows (`> the last candidate`), so the bound is the same'
)
_KEYSET = (
    'the keyset and the lanes-passed filter each leave out the rows walked already (every row before '
    'the keyset is of a lane the walk passed: it stops at the first lane that may admit), so either '
    'one alone gives the same next lane'
)
_NEVER_EQUAL = (
    "the walked row is never the last candidate: the walk leaves out the routine's own lane, so the "
    'positions are never equal'
)
_NO_FAMILY_LANE = (
    "a lane without '[' meets a family's entry only if its key is the family's name, and no "
    "execution's lane is (a static limit_by naming a family fails the boot: FamilyKeyError)"
)
#: survivors argued equivalent: (backend, the line, the line changed), both stripped -> why
ARGUED: dict[tuple[str, str, str], str] = {
    **{(b, _REFILL_WHEN, _REFILL_WHEN.replace("dt > 0", "dt >= 0")):
       "at dt = 0 a refill adds 0 units either way (the level, or the cap it already holds)" for b in _FILLS},
    **{(b, line, line.replace(" - 1) ", ") ")):
       "the threshold only keeps dt × limit from being formed past the cap: where a ceiling and the floor + 1 "
       "differ (cap − level divisible by limit), dt × limit at the ceiling is exactly cap − level, so both "
       "branches give the cap" for b, line in _FILLS.items()},
    **{(b, line, line.replace("p_take > 1", "p_take >= 1")):
       "the bound is also read for a poll taking one, which nothing then uses (a poll has no lane-first "
       "rule and takes no further claim): a read more, the same decision" for b, line in _BOUND_FOR.items()},
    **{(b, line, line.replace("> 0", ">= 0")):
       "with no endings the guarded UPDATE ends nothing and its count, 0, matches: the same as skipping it"
       for b, line in _ENDS.items()},
    ("mysql", _MY_SPEND, _MY_SPEND.replace("> 0", ">= 0")):
       "the levels are written (a rate refusal, an admission) only by a decision that refilled every rate, so "
       "with none the upsert's JSON_TABLE over the empty rates yields no row: the same as skipping it",
    **{("mysql", line, line.replace(old, new)):
       "a claim and a refusal never come together (a batch that meets a refusal ends without one) and 'taken' "
       "has no claims: with claims the status is NULL, so neither side of the status test changes what is "
       "returned"
       for line, old, new in (("WHERE v_status IS NULL OR v_status <> 'taken'", "<>", "="),
                              ("FROM DUAL WHERE JSON_LENGTH(v_claims) = 0 OR v_status = 'taken'",
                               "v_status = 'taken'", "v_status <> 'taken'"))},
    **{("mysql", line, line.replace(" < ", " <= ")):
       "one turn past the last rate reads NULL from every array (JSON_VALUE past the end): a level or time it "
       "appends or sets lands past the last rate, where nothing reads it (the later loops stop at the rates' "
       "count, the bucket upsert walks the rates with JSON_TABLE), and a NULL 'missing' never stamps"
       for line in _RATE_LOOPS},
    **{(b, line, line.replace("> 0", ">= 0")):
       "with no claims the guarded UPDATE claims nothing, its count, 0, matches and the sequence moves by 0: the "
       "same as skipping it" for b, line in _CLAIMS.items()},
    ("postgresql", _SPEND, _SPEND.replace("> 0", ">= 0")):
       "with no period the upsert's SELECT over generate_subscripts of an empty array inserts no row: the same as "
       "skipping it",
    **{(b, line, line.replace(old, new)): "positions are never equal: the bound is another lane's execution, "
       "whose id no candidate of this lane has"
       for b, line, old, new in (
           ("postgresql", "IF NOT p_poll AND v_bound_id IS NOT NULL AND (v_bound_at, v_bound_id) < "
            "(v_ats[1], v_ids[1]) THEN", ") < (", ") <= ("),
           ("postgresql", "EXIT WHEN v_bound_id IS NOT NULL AND (v_ats[i], v_ids[i]) >= (v_bound_at, v_bound_id);  "
            "-- [INV-LIM-6]", ") >= (", ") > ("),
           ("mysql", "IF NOT p_poll AND v_bound_id IS NOT NULL AND (v_bound_at, v_bound_id) < (v_at_us, v_id) THEN",
            ") < (", ") <= ("),
           ("mysql", "IF v_bound_id IS NOT NULL AND (v_at_us, v_id) >= (v_bound_at, v_bound_id) THEN",
            ") >= (", ") > ("))},
    ('postgresql', 'AND e.eligible_at <= v_ats[cardinality(v_ats)]  -- no later than the candidates (eligible)',
     'AND TRUE'): _WALK_RANGE,
    ('postgresql', 'AND (v_walk_id IS NULL OR (e.eligible_at, e.id) > (v_walk_at, v_walk_id))',
     'AND (v_walk_id IS NULL OR (e.eligible_at, e.id) >= (v_walk_at, v_walk_id))'): _KEYSET,
    ('postgresql', 'OR (v_walk_at, v_walk_id) > (v_ats[cardinality(v_ats)], v_ids[cardinality(v_ids)]);  -- none older',
     'OR (v_walk_at, v_walk_id) >= (v_ats[cardinality(v_ats)], v_ids[cardinality(v_ids)]);  -- none older'): _NEVER_EQUAL,  # noqa: E501
    ('postgresql', "ON m.k = split_part(l.key, '[', 1) AND m.p AND strpos(l.key, '[') > 0  -- or a partition's family's",  # noqa: E501
     "ON m.k = split_part(l.key, '[', 1) AND m.p AND strpos(l.key, '[') >= 0  -- or a partition's family's"): _NO_FAMILY_LANE,  # noqa: E501
    ('mysql', 'AND e.eligible_at <= v_last_at  -- no later than the candidates (eligible)',
     'AND TRUE'): _WALK_RANGE,
    ('mysql', 'AND NOT JSON_CONTAINS(v_passed, JSON_QUOTE(e.pending_lane))  -- not yet tried',
     'AND TRUE'): _KEYSET,
    ('mysql', 'AND (v_walk_id IS NULL OR e.eligible_at > v_walk_at',
     'AND (v_walk_id IS NULL OR e.eligible_at >= v_walk_at'): _KEYSET,
    ('mysql', 'OR (e.eligible_at = v_walk_at AND e.id > v_walk_id))',
     'OR (e.eligible_at <> v_walk_at AND e.id > v_walk_id))'): _KEYSET,
    ('mysql', 'OR (e.eligible_at = v_walk_at AND e.id > v_walk_id))',
     'OR (e.eligible_at = v_walk_at AND e.id <= v_walk_id))'): _KEYSET,
    ('mysql', 'OR (e.eligible_at = v_walk_at AND e.id > v_walk_id))',
     'OR (e.eligible_at = v_walk_at AND e.id >= v_walk_id))'): _KEYSET,
    ('mysql', 'IF (v_walk_us, v_walk_id) > (v_last_us, v_last_id) THEN  -- none older than the candidates',
     'IF (v_walk_us, v_walk_id) >= (v_last_us, v_last_id) THEN  -- none older than the candidates'): _NEVER_EQUAL,
}

_COMPARISONS = {"<": (">=", "<="), ">": ("<=", ">="), "<=": (">", "<"), ">=": ("<", ">"), "=": ("<>",),
                "<>": ("=",)}
#: a comparison operator: not part of ``:=``, ``!=``, ``=>`` or PostgreSQL's JSON ``->`` / ``->>``
_TOKEN = re.compile(r"(?<![:<>!=-])(<=>|<=|>=|<>|<|>|=)(?![=>])")


@dataclass(frozen=True)
class Variant:
    """One changed line of a backend's SQL."""

    backend: str
    line: int
    operator: str
    before: str
    after: str

    def label(self) -> str:
        return f"{self.backend}:{self.line} {self.operator}: {self.before.strip()} -> {self.after.strip()}"


def _code(line: str) -> tuple[str, str]:
    """A line's code and its comment (``-- …``)."""
    at = line.find("--")
    return (line, "") if at < 0 else (line[:at], line[at:])


def _assignment(code: str, at: int, backend: str) -> bool:
    """Whether the ``=`` at ``at`` assigns (``SET x =``, an UPDATE's ``SET a = b, c = d``,
    ``ON DUPLICATE KEY UPDATE``, a declaration) rather than compares."""
    before = code[:at].upper()
    if backend == "mysql" and re.search(r"\bSET\b", before) and not re.search(r"\bWHERE\b|\bIF\b|\bWHEN\b", before):
        return True
    stripped = before.strip()
    return bool(re.match(r"^(SET\s+)?[A-Z_.]+$", stripped)) or stripped.endswith(",") or "UPDATE" in stripped


def variants(backend: str) -> Iterator[Variant]:
    """Every variant of ``backend``'s routine (module docstring), each change once."""
    seen: set[tuple[int, str]] = set()
    for variant in _variants(backend):
        if (variant.line, variant.after) not in seen:
            seen.add((variant.line, variant.after))
            yield variant


def _variants(backend: str) -> Iterator[Variant]:
    lines = (SOURCE / f"release_and_claim_3.{backend}.sql").read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        code, comment = _code(line)
        if not code.strip() or code.lstrip().upper().startswith(("CREATE ", "DECLARE ", "RETURNS ", "IN ", "OUT ")):
            continue
        for match in _TOKEN.finditer(code):
            token = match.group(1)
            if token == "<=>":
                yield Variant(backend, number, "null", line, code[:match.start()] + "=" + code[match.end():] + comment)
                continue
            if token == "=" and _assignment(code, match.start(), backend):
                continue
            for other in _COMPARISONS[token]:
                after = code[:match.start()] + other + code[match.end():] + comment
                yield Variant(backend, number, "comparison", line, after)
        for old, new, kind in ((" IS NOT NULL", " IS NULL", "null"), (" IS NULL", " IS NOT NULL", "null"),
                               (" IS NOT DISTINCT FROM", " IS DISTINCT FROM", "null"),
                               (" IS DISTINCT FROM", " IS NOT DISTINCT FROM", "null"),
                               ("least(", "greatest(", "bound"), ("greatest(", "least(", "bound"),
                               ("LEAST(", "GREATEST(", "bound"), ("GREATEST(", "LEAST(", "bound"),
                               ("NOT ", "", "negation"), (" - 1) / ", ") / ", "arithmetic"),
                               (" - 1) DIV ", ") DIV ", "arithmetic")):
            start = 0
            while (at := code.find(old, start)) >= 0:
                if not (old == " IS NULL" and code[:at].endswith(" NOT")):
                    yield Variant(backend, number, kind, line, code[:at] + new + code[at + len(old):] + comment)
                start = at + len(old)
        stripped = code.strip()
        if stripped.upper().startswith("AND ") and "OR " not in stripped.upper():
            indent = code[:len(code) - len(code.lstrip())]
            end = ";" if stripped.endswith(";") else ""
            yield Variant(backend, number, "predicate", line, indent + "AND TRUE" + end)
        if "ORDER BY e.eligible_at, e.id" in code:
            reversed_order = code.replace("ORDER BY e.eligible_at, e.id", "ORDER BY e.eligible_at DESC, e.id DESC")
            yield Variant(backend, number, "order", line, reversed_order + comment)
        if "* 1000000;" in code and ("level[i] - " in code or "levels, CONCAT" in code):
            yield Variant(backend, number, "arithmetic", line, code.replace("* 1000000", "* 2000000") + comment)


def install(engine: sa.Engine, backend: str, text: str) -> None:
    """Replace the routines with ``text``'s (dropped first: MySQL has no CREATE OR REPLACE
    PROCEDURE)."""
    with engine.begin() as conn:
        if backend == "postgresql":
            conn.exec_driver_sql("DROP FUNCTION IF EXISTS ductwork_release_and_claim_3")
            conn.exec_driver_sql("DROP FUNCTION IF EXISTS ductwork_decide_3")
        else:
            conn.exec_driver_sql("DROP PROCEDURE IF EXISTS ductwork_release_and_claim_3")
            conn.exec_driver_sql("DROP PROCEDURE IF EXISTS ductwork_decide_3")
        dialects.install_routine(conn, text)


def killed(world: World) -> str | None:
    """The first state of the bounded domain where the installed routine differs (or
    raises), or None."""
    for case in exhaustive():
        try:
            difference = world.check(case)
        except Exception as error:  # noqa: BLE001 - a routine that raises is killed by the caller's failure
            _stop_leftovers(world.engine)
            return f"raised on {case}: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
        if difference is not None:
            return f"{case}: {difference[:160]}"
    return None


def _stop_leftovers(engine: sa.Engine) -> None:
    """End what a variant left running on the server: a routine that loops forever (a
    ``WHILE`` whose condition was flipped) outlives the client's read timeout there, holding
    the rows it locked, and every later variant would time out behind it and count as
    killed."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                                 "current_database() AND pid <> pg_backend_pid() AND state <> 'idle'").all()
            return
        for (thread,) in conn.exec_driver_sql(
                "SELECT id FROM information_schema.PROCESSLIST WHERE db = DATABASE() AND id <> CONNECTION_ID()"
                " AND command = 'Query'").all():
            conn.exec_driver_sql(f"KILL {int(thread)}")


def run(backend: str, chosen: Callable[[Variant], bool] = lambda _: True) -> tuple[int, int, list[Variant]]:
    """Every variant of ``backend`` against the check (only those ``chosen``): (killed,
    invalid, survivors)."""
    from tests.conftest import migrated
    from tests.databases import fresh_database, provide

    server = provide(BACKENDS[backend])
    if isinstance(server, str):
        raise SystemExit(f"no {backend} server: {server}")
    url = fresh_database(server, SCRATCH)
    migrated(url)
    engine = engines.create_engine(url)
    source = (SOURCE / f"release_and_claim_3.{backend}.sql").read_text()
    world = World.make(url, engine)
    lines = source.splitlines()
    kills = invalid = 0
    survivors = []
    try:
        for variant in variants(backend):
            if not chosen(variant):
                continue
            text = "\n".join([*lines[:variant.line - 1], variant.after, *lines[variant.line:]])
            try:
                install(engine, backend, text)
            except Exception:  # noqa: BLE001 - the server refuses it: not a routine
                invalid += 1
                continue
            found = killed(world)
            if found is None:
                survivors.append(variant)
                print(f"SURVIVED {variant.label()}", flush=True)
            else:
                kills += 1
                print(f"killed   {variant.label()}\n         by {found}", flush=True)
    finally:
        install(engine, backend, source)
        engine.dispose()
    return kills, invalid, survivors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sql_mutation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=sorted(BACKENDS), action="append")
    parser.add_argument("--list", action="store_true", help="print the variants, run nothing")
    parser.add_argument("--tag", help="only the variants of lines whose comment names TAG (e.g. INV-LIM-8)")
    parser.add_argument("--lines", help="only the variants of the lines FIRST-LAST of each backend's file, "
                        "for one backend (e.g. 240-262: a block just changed)")
    args = parser.parse_args(argv)
    first, last = (int(n) for n in args.lines.split("-")) if args.lines else (1, sys.maxsize)

    def chosen(variant: Variant) -> bool:
        return (args.tag is None or args.tag in variant.before) and first <= variant.line <= last
    backends = args.db or sorted(BACKENDS)
    if args.list:
        for backend in backends:
            for variant in variants(backend):
                if chosen(variant):
                    print(variant.label())
        return 0
    status = 0
    for backend in backends:
        started = time.monotonic()
        kills, invalid, survivors = run(backend, chosen)
        argued = [v for v in survivors if (v.backend, v.before.strip(), v.after.strip()) in ARGUED]
        left = [v for v in survivors if v not in argued]
        print(f"{backend}: {kills + len(survivors)} variants, {kills} killed, {len(argued)} argued, "
              f"{len(left)} surviving ({invalid} refused by the server) in {time.monotonic() - started:.0f} s")
        status |= bool(left)
    return status


if __name__ == "__main__":
    sys.exit(main())
