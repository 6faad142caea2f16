"""A child process for the fault-checkpoint tests: does all the work it can find.

    python -m tests.integration.fault_child URL CONFIG_JSON LABEL

Registers a process row, then loops — reap stale processes, advance, work (in batches
of up to four) — until nothing is left to do, with whatever ``DUCTWORK_FAULT`` arms. Prints ``READY
<process id>`` first. Exits 0 when idle; a ``kill``/``exit`` fault ends it earlier.
A test runs it with :func:`run_then_reap`.
"""

from __future__ import annotations

import json
import sys
import time

#: how the child ends under each ``DUCTWORK_FAULT`` action: killed, exited 1, or idle (a
#: raised fault is caught and the child goes on; a pause only delays it)
EXIT_CODES = {"kill": -9, "exit": 1, "raise": 0, "sleep": 0}


def run_then_reap(app, url: str, config: dict, label: str, fault: str) -> None:  # type: ignore[no-untyped-def]
    """Run this child on ``url`` with ``config`` and ``DUCTWORK_FAULT=<fault>``
    (``checkpoint:action:nth``), check that the fault fired and that the child ended as its
    action ends it (EXIT_CODES), then do what its supervisor and a reaper would: force-reap
    its process row and reap what it held."""
    import os
    import subprocess

    from ductwork.fleet.reaper import reap, reap_dead

    checkpoint, action, _ = fault.split(":")
    env = {**os.environ, "DUCTWORK_FAULT": fault, "DUCTWORK_FAULT_SLEEP": "0.05"}
    child = subprocess.run([sys.executable, "-m", __name__, url, json.dumps(config), label],
                           env=env, capture_output=True, text=True, timeout=120)
    assert f"FAULT FIRING {checkpoint}:{action}" in child.stderr, child.stderr[-2000:]
    assert child.returncode == EXIT_CODES[action], child.stderr[-2000:]
    (ready,) = [line for line in child.stdout.splitlines() if line.startswith("READY ")]
    reap(app, ready.split()[1], force=True)
    reap_dead(app, None)


def main() -> int:
    from ductwork.app import App
    from ductwork.config import Config
    from ductwork.errors import FaultInjection
    from ductwork.fleet.processes import register
    from ductwork.fleet.reaper import reap_dead
    from ductwork.fleet.worker import Worker
    from ductwork.pipelines.advance import Advancer

    url, config_json, label = sys.argv[1:4]
    app = App(url, Config.from_section(json.loads(config_json), source="<fault child>"))
    process_id = register(app, role="fault_child", label=label)
    print(f"READY {process_id}", flush=True)
    # Batches (up to 4, sized from the recent pace): unkeyed and keyed batches are claimed
    # inside the kill windows too, and a keyed batch's successes' group commit reaches
    # in_keyed_group_commit (the lane routine returned: released and handed off, not committed).
    worker = Worker(app, process_id=process_id, batch_size=4)
    advancer = Advancer(app, process_id=process_id)
    deadline = time.monotonic() + 60
    idle_rounds = 0
    while idle_rounds < 3 and time.monotonic() < deadline:
        did = False
        for unit in (lambda: bool(reap_dead(app, process_id)),
                     lambda: advancer.run_once() != "idle",
                     lambda: worker.run_once() is not None):
            try:
                did = unit() or did
            except FaultInjection as fault:
                print(f"FAULT RAISED {fault.checkpoint}", flush=True)
                did = True
        idle_rounds = 0 if did else idle_rounds + 1
    app.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
