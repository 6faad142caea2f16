"""Crash and restart on one host: seconds until a limited key's slots are free again.

    python -m bench.crash_restart [--database-url URL] [--checkout DIR] [--deadline 600]

What a user sees after ``kill -9`` of ``ductwork start`` and its children, then
``ductwork start`` again at once on the same host: two bodies hold both slots of a key
(``concurrency: 2``) when the fleet is killed; the figure is the seconds from the
restart until both of their executions are recorded crashed (their slots free, their
re-runs claimable). Defaults throughout (``reaper_timeout`` 300 s, heartbeats every
5 s), as a new user runs it.

``--checkout`` runs another checkout's engine (an older commit, for the before figure):
every ``ductwork`` process of the measurement imports it, and the database is migrated
with its revisions. The database is emptied first: never point it at one whose rows you
want.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import sqlalchemy as sa

PIPELINE = textwrap.dedent('''
    import os, time
    from ductwork import Pipeline, Step

    class Hold(Step):
        """Writes its pid, then holds its slot until the file named ``release`` exists."""
        def __init__(self, path): self.path = path
        def execute(self):
            with open(self.path, "a") as f:
                f.write(f"{os.getpid()}\\n")
            while not os.path.exists(os.path.join(os.path.dirname(self.path), "release")):
                time.sleep(0.05)
            return 1

    class Held(Pipeline):
        @classmethod
        def define(cls, p):
            p.start(Hold, limit_by="held_key")
''')
CONFIG = 'default:\n  pipelines: ["held_pipeline:Held"]\n  job_worker:\n    limits:\n      held_key: {concurrency: 2}\n'


def _env(checkout: Path, work: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DUCTWORK_")}
    return {**clean, "PYTHONPATH": os.pathsep.join([str(checkout), str(work)])}


def _ductwork(env: dict[str, str], work: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "ductwork.cli", *args], cwd=work, env=env, check=True,
                   stdout=subprocess.DEVNULL)


def _start(env: dict[str, str], work: Path, url: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "ductwork.cli", "start", "--database-url", url,
                                 "-c", "ductwork.yml"], cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _drop_ductwork_tables(engine: sa.Engine) -> None:
    """Every ductwork table of the database, whatever revision made it (this checkout's
    schema may not be the measured one's)."""
    found = sa.MetaData()
    found.reflect(engine, only=lambda name, _meta: name.startswith("ductwork_"))
    found.drop_all(engine)


def _wait(predicate, what: str, deadline_s: float) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > deadline_s:
            raise SystemExit(f"within {deadline_s:g} s, never: {what}")
        time.sleep(0.1)
    return time.monotonic() - started


def measure(url: str, checkout: Path, deadline_s: float) -> float:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1)
                              .replace("mysql://", "mysql+pymysql://", 1))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "held_pipeline.py").write_text(PIPELINE)
        (work / "ductwork.yml").write_text(CONFIG)
        env = _env(checkout, work)
        _drop_ductwork_tables(engine)
        _ductwork(env, work, "db", "upgrade", "--database-url", url, "-c", "ductwork.yml")
        trigger = ("import ductwork, sys; from held_pipeline import Held; ductwork.connect(sys.argv[1]); "
                   "[Held.trigger(f'{sys.argv[2]}/{i}') for i in range(2)]")
        subprocess.run([sys.executable, "-c", trigger, url, str(work)], cwd=work, env=env, check=True)
        fleet = _start(env, work, url, work / "first.log")
        try:
            _wait(lambda: all((work / str(i)).exists() for i in range(2)), "both bodies hold the key's slots", 120)
        finally:
            os.killpg(fleet.pid, signal.SIGKILL)
            fleet.wait()

        def crashed() -> bool:
            with engine.connect() as conn:
                return conn.execute(sa.text("SELECT COUNT(*) FROM ductwork_executions WHERE outcome = "
                                            "'process_crashed'")).scalar_one() >= 2

        again = _start(env, work, url, work / "again.log")
        try:
            return _wait(crashed, "the restarted fleet freed both slots", deadline_s)
        finally:
            (work / "release").touch()
            os.killpg(again.pid, signal.SIGTERM)
            again.wait(60)
            engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout whose engine runs (default: this one)")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds to wait for the slots")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{tmp}/crash_restart.sqlite3"
        seconds = measure(url, args.checkout.resolve(), args.deadline)
    print(f"slots free {seconds:.1f} s after the restart ({url.split(':')[0]}, checkout {args.checkout})")


if __name__ == "__main__":
    main()
