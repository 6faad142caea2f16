"""The lane routine's SQL, read as text: its statements in the order the guarantees need.

The refinement test (``tests/properties/test_refinement.py``) checks what each backend's
routine decides and writes, state by state, in one transaction at a time; what it cannot
see is *when* within the routine a value is read: one transaction alone cannot tell a
clock or a count read before the key's lock from one read after it. So the order is pinned
here, on the routines' text, as compile assertions pin the locking reads (and the race
tests, ``tests/integration/test_lock_races.py``, show the lock working on a server): in
each routine the key's lock (``SELECT … FOR UPDATE`` of its header row) comes before the
clock is read and before the in-flight count and the candidates are read, and the clock is
read once.

Checks: INV-LIM-1 (the count under the lock), INV-CLK-1 (the clock after the lock), INV-LIM-8
(a partition's family locked before it, its count under both).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ductwork.limits

#: the routines of the package imported (a mutant's copy, when one is under test)
SQL = Path(ductwork.limits.__file__).resolve().parent / "sql"
ROUTINES = sorted(SQL.glob("release_and_claim_*.sql"))
#: per backend: the key's lock, the clock read, the in-flight count, the keyed candidates
PATTERNS = {
    "postgresql": (r"FROM ductwork_limit_keys k WHERE k\.key = p_key FOR UPDATE;",
                   r"v_now := coalesce\(p_now, \(clock_timestamp\(\)",
                   r"SELECT count\(\*\) INTO v_in_flight", r"WHERE e\.pending_lane = p_key"),
    "mysql": (r"FROM ductwork_limit_keys k WHERE k\.`key` = p_key FOR UPDATE;",
              r"SET v_now = COALESCE\(p_now, TIMESTAMPADD\(MICROSECOND, p_offset_us, UTC_TIMESTAMP\(6\)\)\)",
              r"SELECT COUNT\(\*\) INTO v_in_flight", r"OPEN keyed;"),
}


def _body(path: Path) -> str:
    """The routine's own statement (after the decision's), comments dropped."""
    text = path.read_text().split("CREATE PROCEDURE ductwork_release_and_claim_3(" if "mysql" in path.name
                                  else "CREATE FUNCTION ductwork_release_and_claim_3(")[1]
    return "\n".join(line.split("--")[0] for line in text.splitlines())


@pytest.mark.parametrize("path", ROUTINES, ids=lambda p: p.name)
def test_the_routine_locks_the_key_before_it_reads_the_clock_or_counts(path):
    backend = path.name.split(".")[1]
    body = _body(path)
    lock, clock, count, candidates = found = [re.search(p, body) for p in PATTERNS[backend]]
    assert None not in found, f"{path.name}: a statement the order pins is missing"
    assert len(re.findall(PATTERNS[backend][1], body)) == 1, f"{path.name}: the clock is read more than once"
    assert lock.start() < clock.start(), f"{path.name}: [INV-CLK-1] the clock is read before the key's lock"
    assert lock.start() < count.start(), f"{path.name}: [INV-LIM-1] in flight is counted before the key's lock"
    assert lock.start() < candidates.start(), f"{path.name}: the candidates are read before the key's lock"


#: per backend: a partition's family's lock, and its family in-flight count [INV-LIM-8] (a backend
#: is listed once its routine takes them)
FAMILY_PATTERNS = {
    "mysql": (r"FROM ductwork_limit_keys k WHERE k\.`key` = p_family FOR UPDATE;",
              r"SELECT COUNT\(\*\) INTO v_family_in_flight"),
}


@pytest.mark.parametrize("path", [p for p in ROUTINES if p.name.split(".")[1] in FAMILY_PATTERNS],
                         ids=lambda p: p.name)
def test_the_routine_locks_a_partitions_family_first_and_counts_it_under_both_locks(path):
    """Lock order: the family's row, then the partition's, always; the family's in-flight count
    under both [INV-LIM-8]."""
    backend = path.name.split(".")[1]
    body = _body(path)
    key, family, counted = found = [re.search(p, body) for p in (PATTERNS[backend][0], *FAMILY_PATTERNS[backend])]
    assert None not in found, f"{path.name}: a statement the order pins is missing"
    assert len(re.findall(FAMILY_PATTERNS[backend][0], body)) == 1, f"{path.name}: the family is locked twice"
    assert family.start() < key.start(), f"{path.name}: [INV-LIM-8] the partition is locked before its family"
    assert key.start() < counted.start(), f"{path.name}: [INV-LIM-8] the family is counted before the locks"


def test_every_backend_with_routines_has_its_routine():
    assert {p.name.split(".")[1] for p in ROUTINES} == set(PATTERNS)
