"""``ductwork status`` with key families: a family's partitions are shown under it, the
busiest first and at most ``TOP_PARTITIONS`` of them, never one line per partition ever
seen; the family's own row (its partitions' lock) is no key; static keys as before."""

from __future__ import annotations

from datetime import datetime

from ductwork.status import TOP_PARTITIONS, KeyStatus, Status, render

NOW = datetime(2026, 1, 1, 12)


def _key(name: str, in_flight: int = 0, pending: int = 0, concurrency: int | None = 2) -> KeyStatus:
    return KeyStatus(name, in_flight, pending, concurrency, [], None, configured=True)


def _keys_section(status: Status) -> list[str]:
    lines = render(status).splitlines()
    return lines[lines.index("limit keys:") + 1:]


def test_a_familys_busiest_partitions_are_listed_under_it_and_the_rest_counted():
    partitions = [_key(f'api["acct-{i:04}"]', in_flight=i % 3, pending=i) for i in range(1000)]
    status = Status(NOW, {}, [], [_key("api", concurrency=None), _key("static", 1, 4, 3), *partitions],
                    families={"api": 50})
    lines = _keys_section(status)
    assert lines[0] == "  static: 1/3 in flight, 4 pending"
    in_flight = sum(i % 3 for i in range(1000))
    assert lines[1] == f"  family api: 1000 partitions, {in_flight}/50 in flight, {sum(range(1000))} pending"
    shown = [line.strip().split(":")[0] for line in lines[2:2 + TOP_PARTITIONS]]
    assert shown == ['api["acct-0998"]', 'api["acct-0995"]', 'api["acct-0992"]', 'api["acct-0989"]',
                     'api["acct-0986"]']  # two in flight, then the most pending
    assert lines[2 + TOP_PARTITIONS:] == [f"    … and {1000 - TOP_PARTITIONS} more partitions"]


def test_a_family_without_a_ceiling_or_partitions_says_so_and_a_partition_like_key_of_no_family_is_a_key():
    status = Status(NOW, {}, [], [_key('other["x"]', 1, 0)], families={"api": None})
    assert _keys_section(status) == ['  other["x"]: 1/2 in flight, 0 pending',
                                     "  family api: 0 partitions, 0 in flight, 0 pending"]
    assert _keys_section(Status(NOW, {}, [], [])) == ["  (none)"]
