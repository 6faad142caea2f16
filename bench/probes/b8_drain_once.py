"""One repetition of B8's drain, printed on one line: a diagnostic of issue 34 for A/B runs.

    python -m bench.probes.b8_drain_once [URL]

``bench.b8_partitions.drain`` at its default sizes (2,000 runs unkeyed, then over 10 and
over 10³ ``concurrency: 1`` partitions, a default ``ductwork start`` fleet), one
repetition, on an emptied bench database (SQLite by default): runs completed per second of
each, and the fleet's CPU and SQL statements per step. Run from a checkout with it first on
``PYTHONPATH`` to measure that checkout (the fleet's processes inherit it), alternating
two checkouts for an A/B. A probe, no change to the engine.
"""

from __future__ import annotations

import sys

from bench import b8_partitions as b8
from bench.harness import Sizes, Target


class _Once(Sizes):
    @property
    def repeats(self) -> int:
        return 1


def main() -> None:
    target = Target.from_url(sys.argv[1] if len(sys.argv) > 1 else None)
    target.setup()
    target.reset()
    out = {name: metric.value for name, metric in b8.drain(target, target.app(), _Once()).items()}
    fields = {"runs/s": "runs completed/s", "cpu_ms": "CPU per completed step", "statements": "statements per step"}
    print(" ".join(f"{label}_{name.split(':')[0].replace(' ', '_')}={value:.4g}"
                   for label, needle in fields.items() for name, value in out.items()
                   if needle in name and ":" in name))


if __name__ == "__main__":
    main()
