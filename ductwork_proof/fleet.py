"""Running real ``ductwork start`` processes from tests.

    with Fleet(db_url, tmp_path, pipelines=["tests.workloads.processes:NapPipeline"]) as fleet:
        fleet.wait_for(lambda: fleet.rows("job_worker"), "a worker registered")

A :class:`Fleet` writes a ``ductwork.yml`` with short timeouts, starts
``ductwork start`` in its own session (so the whole host — supervisor and
children — can be SIGKILLed at once), and stops it on exit. Waits poll a
condition against a deadline and say what never happened.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml

from ductwork.db import schema

FLEET_SETTINGS = {
    "job_worker": {"count": 2, "processes": 1, "polling_timeout": 0.05, "retry_delay": 0.05,
                   "max_retry": 2, "max_crash": 4, "shutdown_timeout": 3},
    "pipeline_advancer": {"count": 1, "polling_timeout": 0.05, "shutdown_timeout": 3},
    "supervisor": {"polling_timeout": 0.2, "reaper_timeout": 3, "heartbeat_interval": 0.2,
                   "shutdown_timeout": 8},
}


def wait_for(predicate: Callable[[], Any], what: str, deadline_s: float = 30.0, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until truthy; AssertionError naming ``what`` at the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"within {deadline_s} s, never: {what}")
        time.sleep(interval)


def write_config(path: Path, *, pipelines: list[str], limits: dict | None = None,
                 overrides: dict | None = None) -> Path:
    section: dict[str, Any] = {k: dict(v) for k, v in FLEET_SETTINGS.items()}
    section["pipelines"] = pipelines
    for name, values in (overrides or {}).items():
        section.setdefault(name, {}).update(values)
    if limits:
        section["job_worker"]["limits"] = limits
    path.write_text(yaml.safe_dump({"default": section}))
    return path

#: every fleet started by this process and not yet killed: a test process that ends
#: (SIGTERM from a ``timeout``, an interrupted session) kills them at exit instead of
#: leaving whole fleets running against a database nobody reads (they used a 2-core
#: machine's CPU for the rest of the day once)
_LIVE: set[Fleet] = set()


def kill_all_fleets() -> None:
    """SIGKILL every fleet this process started and has not stopped."""
    for fleet in list(_LIVE):
        with contextlib.suppress(Exception):
            fleet.kill_host()


atexit.register(kill_all_fleets)


class Fleet:
    """One ``ductwork start`` (a supervisor and its children) in its own session."""

    def __init__(self, url: str, config: Path, *, label: str = "supervisor", role: str | None = None,
                 env: dict[str, str] | None = None, log: Path | None = None, args: list[str] | None = None,
                 shared: bool = False):
        self.url, self.config, self.label, self.role = url, config, label, role
        #: serves several tests: the module fixture that started it stops it, so the check
        #: after each test (conftest's no_fleet_left_running) leaves it running
        self.shared = shared
        self.args = list(args or ["--verbose"])  # more options for `ductwork start`
        self.env = {**os.environ, **(env or {})}
        self.log_path = log or config.with_name(f"{label}.log")
        self.proc: subprocess.Popen | None = None

    def start(self) -> Fleet:
        command = [sys.executable, "-m", "ductwork.cli", "start", "--database-url", self.url,
                   "-c", str(self.config), "--label", self.label, *self.args]
        if self.role:
            command += ["--role", self.role]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - open while the fleet runs; close_log() closes it
        self.proc = subprocess.Popen(command, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        _LIVE.add(self)
        return self

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if os.environ.get("COVERAGE_PROCESS_START") and self.proc is not None and self.proc.poll() is None:
            # measured (.ci/coverage): a graceful stop first, so that the fleet's processes
            # write their coverage data, which a SIGKILL would lose; the test is over
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.terminate(timeout=15)
        self.kill_host()

    def close_log(self) -> None:
        if hasattr(self, "_log") and not self._log.closed:
            self._log.close()

    def kill_host(self) -> None:
        """SIGKILL the supervisor and every child at once (the host vanished)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # children that outlived the supervisor
        _LIVE.discard(self)
        self.close_log()

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM the supervisor and wait for it: a graceful shutdown."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def process_rows(engine: sa.Engine, *, role: str | None = None, label_prefix: str | None = None) -> Sequence[sa.Row]:
    p = schema.processes
    stmt = sa.select(p.c.id, p.c.pid, p.c.role, p.c.label, p.c.last_heartbeat_at)
    if role:
        stmt = stmt.where(p.c.role == role)
    if label_prefix:
        stmt = stmt.where(p.c.label.like(f"{label_prefix}%"))
    with engine.connect() as conn:
        return conn.execute(stmt).all()


def killed(pid: int) -> bool:
    """Whether ``pid`` is gone (or a zombie) or has a SIGKILL pending: it runs no more of its
    code. A SIGKILLed process leaves the process table only once it is scheduled to exit,
    so right after the kill (a group's, whose leader alone was waited for) it may still
    show as running, with the signal pending."""
    if not pid_alive(pid):
        return True
    try:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status.read().splitlines() if ":" in line)
    except OSError:
        return True
    sigkill = 1 << (signal.SIGKILL - 1)
    return any(int(fields.get(name, "0").strip() or "0", 16) & sigkill for name in ("SigPnd", "ShdPnd"))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
