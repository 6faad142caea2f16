"""The ``ductwork`` command: boot validation row by row, hostile configs, db, status, demo.

Checks: INV-LIM-7 (every row of the seed's boot-validation table, through
``ductwork check``; configuration errors name the offending path and never
print a traceback).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ductwork.cli import main
from ductwork.db import migrate
from tests.conftest import migrated_sqlite

PIPELINE = "tests.workloads.processes:SlowKeyedPipeline"  # references limit key "slow_key"


def _check(tmp_path: Path, url: str, section, capsys, *, env: str = "default"):
    path = tmp_path / "ductwork.yml"
    path.write_text(yaml.safe_dump({env: section}) if section is not None else "")
    code = main(["check", "-c", str(path), "--database-url", url, "--env", env])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def sqlite_url(tmp_path):
    return migrated_sqlite(tmp_path, "check")


def test_ok_with_every_key_configured(tmp_path, sqlite_url, capsys):
    code, out, err = _check(tmp_path, sqlite_url, {"pipelines": [PIPELINE],
                                                    "job_worker": {"limits": {"slow_key": {"concurrency": 2}}}}, capsys)
    assert (code, err) == (0, "")
    assert "ok: 1 pipelines, 1 limit keys" in out


def test_missing_entry_names_the_key_and_the_pipelines(tmp_path, sqlite_url, capsys):
    code, _, err = _check(tmp_path, sqlite_url, {"pipelines": [PIPELINE]}, capsys)
    assert code == 1
    assert err.strip() == (
        "ductwork check: MissingLimitError: job_worker.limits.slow_key: no entry for limit key 'slow_key', "
        "referenced by limit_by in tests.workloads.processes:SlowKeyedPipeline")


def test_boot_validation_checks_the_pipelines_it_is_given_else_the_configured_ones(sqlite_url):
    """``validate(app, pipelines)`` (``check`` and ``start`` load them first) judges those
    pipelines' references; ``validate(app)`` loads the config's: here a pipeline whose
    ``limit_by`` key has no entry, which fails only the second."""
    from ductwork.app import App
    from ductwork.config import Config
    from ductwork.errors import MissingLimitError
    from ductwork.fleet.boot import load_pipelines, validate

    app = App(sqlite_url, Config.from_section({"pipelines": [PIPELINE]}, source="<tests>"))
    try:
        assert validate(app, []) == []
        with pytest.raises(MissingLimitError, match=r"no entry for limit key 'slow_key'"):
            validate(app)
        with pytest.raises(MissingLimitError, match=r"no entry for limit key 'slow_key'"):
            validate(app, load_pipelines(app.config))
    finally:
        app.dispose()


@pytest.mark.parametrize(("limits", "error", "fragment"), [
    ({"slow_key": {}}, "EmptyLimitError", "job_worker.limits.slow_key="),
    ({"slow_key": {"rate": [{"limit": 1, "per": "1s"}, {"limit": 5, "per": 1, "burst": 9}]}},
     "DuplicatePeriodError", "job_worker.limits.slow_key.rate[1].per="),
    ({"slow_key": {"rate": {"limit": 1, "per": "1mo"}}}, "InvalidPeriodError",
     "job_worker.limits.slow_key.rate.per='1mo'"),
    ({"slow_key": {"rate": {"limit": 1, "per": 0}}}, "InvalidPeriodError", "job_worker.limits.slow_key.rate.per=0"),
    ({"slow_key": {"rate": {"limit": 1, "per": "soon"}}}, "InvalidPeriodError",
     "job_worker.limits.slow_key.rate.per='soon'"),
])
def test_bad_entries_fail_the_boot_naming_the_path(tmp_path, sqlite_url, capsys, limits, error, fragment):
    code, _, err = _check(tmp_path, sqlite_url, {"pipelines": [PIPELINE], "job_worker": {"limits": limits}}, capsys)
    assert code == 1
    assert err.startswith(f"ductwork check: {error}: ")
    assert fragment in err
    assert "Traceback" not in err


def test_unreferenced_entry_only_warns(tmp_path, sqlite_url, capsys):
    code, _out, err = _check(tmp_path, sqlite_url, {"pipelines": [PIPELINE], "job_worker": {"limits": {
        "slow_key": {"concurrency": 1}, "retired_key": {"concurrency": 1}}}}, capsys)
    assert code == 0
    assert "warning:" in err
    assert "retired_key" in err


def test_missing_tables_are_named(tmp_path, db_url, capsys):
    """An unmigrated database of each backend: the error names the missing tables."""
    from ductwork.db import engines, schema

    engine = engines.create_engine(db_url)
    schema.limit_buckets.drop(engine)
    engine.dispose()
    try:
        code, _, err = _check(tmp_path, db_url, {"pipelines": [PIPELINE], "job_worker": {
            "limits": {"slow_key": {"concurrency": 1}}}}, capsys)
        assert code == 1
        shown = engines.describe(db_url)
        assert err.strip() == (f"ductwork check: MissingTablesError: missing tables in {shown}: "
                               "ductwork_limit_buckets (run `ductwork db upgrade` to create them)")
    finally:
        engine = engines.create_engine(db_url)
        schema.limit_buckets.create(engine)
        engine.dispose()


def test_check_as_a_real_process_exits_1_with_one_line(tmp_path, sqlite_url):
    path = tmp_path / "ductwork.yml"
    path.write_text(yaml.safe_dump({"default": {"pipelines": [PIPELINE]}}))
    done = subprocess.run([sys.executable, "-m", "ductwork.cli", "check", "-c", str(path),
                           "--database-url", sqlite_url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert "MissingLimitError" in done.stderr


def test_unknown_environment_and_file(tmp_path, sqlite_url, capsys):
    code, _, _err = _check(tmp_path, sqlite_url, {"pipelines": []}, capsys, env="staging")
    assert code == 0
    path = tmp_path / "ductwork.yml"
    code = main(["check", "-c", str(path), "--database-url", sqlite_url, "--env", "production"])
    assert code == 1
    assert "environment not defined" in capsys.readouterr().err
    code = main(["check", "-c", str(tmp_path / "nope.yml"), "--database-url", sqlite_url])
    assert code == 1
    assert "--config=" in capsys.readouterr().err


def test_bad_database_url_is_named(capsys):
    assert main(["check", "--database-url", "oracle://x/y"]) == 1
    assert "DatabaseURLError: database.url='oracle://x/y': unsupported backend 'oracle'" in capsys.readouterr().err


# Hostile documents: anything YAML can express, at any position.
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12))
garbage = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)
sections = st.fixed_dictionaries({}, optional={
    "pipelines": st.one_of(garbage, st.just([PIPELINE])),
    "job_worker": st.one_of(garbage, st.fixed_dictionaries({}, optional={
        "count": garbage, "max_retry": garbage, "polling_timeout": garbage,
        "limits": st.one_of(garbage, st.dictionaries(st.text(min_size=1, max_size=8), st.one_of(
            garbage, st.fixed_dictionaries({}, optional={
                "concurrency": garbage,
                "rate": st.one_of(garbage, st.lists(st.fixed_dictionaries(
                    {"limit": garbage, "per": garbage}, optional={"burst": garbage}), max_size=3))})),
            max_size=3))})),
    "supervisor": garbage,
    "database": garbage,
    "bogus": garbage,
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(section=sections)
def test_hostile_configs_fail_only_with_a_config_error_naming_the_path(tmp_path, sqlite_url, capsys, section):
    path = tmp_path / "ductwork.yml"
    path.write_text(yaml.safe_dump({"default": section}, allow_unicode=True))
    code = main(["check", "-c", str(path), "--database-url", sqlite_url])
    err = capsys.readouterr().err
    assert code in (0, 1)
    assert "Traceback" not in err
    if code == 1:
        assert err.startswith("ductwork check: ")
        assert any(kind in err for kind in ("ConfigError", "PeriodError", "LimitError", "DatabaseURLError")), err
        assert "=" in err or "MissingLimitError" in err  # names the offending path=value


def test_db_upgrade_and_status(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/fresh.sqlite3"
    assert main(["db", "upgrade", "--database-url", url, "-c", "/dev/null"]) == 0
    head = migrate.head()
    assert f"at revision {head} (head {head})" in capsys.readouterr().out
    assert main(["status", "--database-url", url, "-c", "/dev/null"]) == 0
    out = capsys.readouterr().out
    assert "runs:" in out
    assert "limit keys:" in out


def test_demo_runs_and_respects_its_limit(tmp_path):
    done = subprocess.run([sys.executable, "-m", "ductwork.cli", "demo", "--orders", "6"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "SyncOrders run" in done.stdout
    assert ": completed;" in done.stdout
    assert "highest in flight 2 (limit 2)" in done.stdout or "highest in flight 1 (limit 2)" in done.stdout
    # each progress line whole: two worker threads' lines never run together on one line
    assert all(len(re.findall(r"\[\s*\d+\.\d\ds\]", line)) <= 1 for line in done.stdout.splitlines())
    # the deliberate failure: announced before it happens, one line when it does, its traceback
    # only in the log, which the output names
    lines = done.stdout.splitlines()
    announced = lines.index("order 3's first push fails on purpose (a pretend vendor timeout), to show a retry "
                            "that keeps its idempotency key")
    failed = [i for i, line in enumerate(lines) if "order 3: first attempt failed as planned, ConnectionError: "
              "vendor timed out (first attempt of order 3); it will be retried (traceback in the log)" in line]
    assert len(failed) == 1
    assert announced < failed[0]
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr == ""
    log = tmp_path / "ductwork-demo.log"
    assert f"log: {log} (warnings with their tracebacks)" in lines
    assert "Traceback (most recent call last)" in log.read_text()
    assert "ConnectionError: vendor timed out (first attempt of order 3)" in log.read_text()


def test_demo_runs_on_the_database_it_is_given(tmp_path):
    url = f"sqlite:///{tmp_path}/given.sqlite3"
    done = subprocess.run([sys.executable, "-m", "ductwork.cli", "demo", "--orders", "1", "--database-url", url],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"/{tmp_path}/given.sqlite3" in done.stdout  # the file it was given
    assert ": completed;" in done.stdout
    assert not (tmp_path / "ductwork-demo.sqlite3").exists()  # the default file is left alone


def test_a_demo_past_its_timeout_says_so_and_exits_1(tmp_path):
    """``--timeout``: a demo whose runs are not finished by then (none can be in no time:
    its pushes are rate-limited) stops its threads and exits 1 naming the option."""
    done = subprocess.run([sys.executable, "-m", "ductwork.cli", "demo", "--orders", "1", "--timeout", "0"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    # (a line, not the last: the demo's step threads may still print while they stop)
    assert "demo: runs did not finish within 0 s (--timeout)" in done.stdout.splitlines()


def test_schema_behind_the_migration_head_is_named(tmp_path, sqlite_url, capsys):
    import sqlalchemy as sa

    engine = sa.create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE ductwork_alembic_version SET version_num = '0000'"))
    engine.dispose()
    code, _, err = _check(tmp_path, sqlite_url, {"pipelines": []}, capsys)
    assert code == 1
    assert err.strip() == ("ductwork check: SchemaVersionError: schema at revision '0000', this ductwork needs "
                           f"'{migrate.head()}' (run `ductwork db upgrade`)")


def test_an_unreachable_database_is_one_line_not_a_traceback(capsys):
    code = main(["status", "--database-url", "postgresql://nobody@127.0.0.1:1/nowhere", "-c", "/dev/null"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("ductwork status: cannot use postgresql+psycopg://nobody@127.0.0.1:1/nowhere: ")
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_help_lists_only_user_commands(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for command in ("db", "check", "start", "status", "demo", "revive"):
        assert f"\n    {command} " in out
    assert "_child" not in out
    with pytest.raises(SystemExit):
        main(["bogus"])
    err = capsys.readouterr().err
    assert "invalid choice: 'bogus'" in err
    assert "_child" not in err


def test_the_internal_child_command_still_parses(capsys):
    """``_child`` is hidden, not gone: supervisors start their children with it."""
    from ductwork.cli import CHILD, COMMANDS, _child_parser

    args = _child_parser().parse_args(["--database-url", "sqlite://", "--role", "job_worker",
                                       "--threads", "2", "--label", "w", "-v"])
    assert (args.command, args.role, args.threads, args.label, args.verbose) == (CHILD, "job_worker", 2, "w", True)
    assert COMMANDS[args.command].__name__ == "cmd_child"
    with pytest.raises(SystemExit) as exited:
        main([CHILD, "--help"])
    assert exited.value.code == 0
    assert "--threads" in capsys.readouterr().out


def test_status_shows_each_process_host_and_pid(app, db_url, capsys):
    import os
    import socket

    from ductwork.db.hosts import machine_identifier
    from ductwork.fleet.processes import host_name, register

    register(app, role="job_worker", label="host-test.worker", pid=os.getpid())
    assert main(["status", "--database-url", db_url, "-c", "/dev/null"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "host-test.worker" in line]
    assert f" {host_name(machine_identifier())} pid {os.getpid()} " in line
    assert host_name(machine_identifier()) == socket.gethostname()
    assert "stale" not in line


def test_status_marks_a_row_older_than_reaper_timeout_as_stale(app, db_url, capsys):
    """An exited script's ``inline`` row waits for a running supervisor to reap it; status says so."""
    import os
    from datetime import timedelta

    from ductwork.db import schema
    from ductwork.fleet.processes import register

    inline = register(app, role="inline", label="inline", pid=os.getpid())
    with app.begin() as tx:
        tx.execute(schema.processes.update().where(schema.processes.c.id == inline)
                   .values(last_heartbeat_at=tx.now - timedelta(seconds=301)))
    assert main(["status", "--database-url", db_url, "-c", "/dev/null"]) == 0  # reaper_timeout 300
    (line,) = [line for line in capsys.readouterr().out.splitlines() if inline in line]
    assert line.endswith(f"{inline}  stale: any running supervisor reaps it")


def test_the_cli_imports_pipelines_from_the_current_directory(tmp_path, sqlite_url):
    """The console script (not ``python -m``, which adds the directory itself) finds a
    pipeline module in the directory it runs in, as the docs tell users to rely on."""
    import os
    import shutil

    script = shutil.which("ductwork", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("no ductwork console script next to this interpreter")
    (tmp_path / "here_pipelines.py").write_text(
        "from ductwork import Pipeline, Step\n\n\nclass Only(Step):\n    def execute(self):\n        return 1\n\n\n"
        "class HerePipeline(Pipeline):\n    @classmethod\n    def define(cls, p):\n        p.start(Only)\n")
    (tmp_path / "ductwork.yml").write_text(yaml.safe_dump({"default": {"pipelines": ["here_pipelines:HerePipeline"]}}))
    repo = str(Path(__file__).resolve().parents[2])  # this checkout's ductwork, not the directory
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DUCTWORK_")}, "PYTHONPATH": repo}
    done = subprocess.run([script, "check", "--database-url", sqlite_url], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok: 1 pipelines")


def test_a_second_start_on_one_host_warns_and_still_starts(tmp_path, sqlite_url):
    import sqlalchemy as sa

    from ductwork_proof.fleet import Fleet, process_rows, wait_for, write_config

    config = write_config(tmp_path / "ductwork.yml", pipelines=[])
    engine = sa.create_engine(sqlite_url)
    try:
        with Fleet(sqlite_url, config, label="first", role="advancer") as first:
            (row,) = wait_for(lambda: process_rows(engine, role="supervisor"), "the first supervisor registered")
            assert "another ductwork supervisor" not in first.log()
            with Fleet(sqlite_url, config, label="second", role="advancer") as second:
                wait_for(lambda: "another ductwork supervisor" in second.log(), "the second start warned")
                wait_for(lambda: process_rows(engine, label_prefix="second.advancer"),
                         f"the second supervisor started anyway; log: {second.log()[-2000:]}")
                assert f"pid {row.pid}, label 'first'" in second.log()
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- what a new adopter hit


@pytest.mark.parametrize("command", [["check"], ["status"], ["db", "current"], ["start"]])
def test_reading_commands_never_create_a_sqlite_file(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    code = main([*command, "--database-url", "sqlite:///typo.sqlite3", "-c", "/dev/null"])
    err = capsys.readouterr().err
    assert code == 1
    assert err == (f"ductwork {command[0]}: MissingDatabaseError: no database at sqlite+pysqlite:///typo.sqlite3: "
                   f"no file {tmp_path}/typo.sqlite3 (run `ductwork db upgrade` to create it)\n")
    assert list(tmp_path.iterdir()) == []
    assert main(["db", "upgrade", "--database-url", "sqlite:///typo.sqlite3", "-c", "/dev/null"]) == 0
    assert (tmp_path / "typo.sqlite3").exists()


def test_the_default_database_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DUCTWORK_DATABASE_URL", raising=False)
    assert main(["check", "-c", "/dev/null"]) == 1
    assert capsys.readouterr().err.startswith(
        "ductwork check: MissingDatabaseError: no database at sqlite+pysqlite:///ductwork.sqlite3 (ductwork's "
        "default: no database URL configured): no file ")
    assert main(["db", "upgrade", "-c", "/dev/null"]) == 0
    capsys.readouterr()
    assert main(["check", "-c", "/dev/null"]) == 0
    assert capsys.readouterr().out == ("ok: 0 pipelines, 0 limit keys, env 'default', database "
                                       "sqlite+pysqlite:///ductwork.sqlite3 (ductwork's default: no database URL "
                                       "configured)\n")


def test_ductwork_config_selects_the_file_and_config_wins(tmp_path, sqlite_url, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ductwork.yml").write_text("default: {job_worker: {limits: {a: {concurrency: 1}}}}\n")
    chosen = tmp_path / "chosen.yml"
    chosen.write_text("default: {job_worker: {limits: {a: {concurrency: 1}, b: {concurrency: 1}}}}\n")
    monkeypatch.setenv("DUCTWORK_CONFIG", str(chosen))
    assert main(["check", "--database-url", sqlite_url]) == 0
    assert "2 limit keys" in capsys.readouterr().out
    assert main(["check", "--database-url", sqlite_url, "-c", "ductwork.yml"]) == 0
    assert "1 limit keys" in capsys.readouterr().out
    monkeypatch.setenv("DUCTWORK_CONFIG", "missing.yml")
    assert main(["check", "--database-url", sqlite_url]) == 1
    assert capsys.readouterr().err == "ductwork check: ConfigError: DUCTWORK_CONFIG='missing.yml': no such file\n"


def test_a_config_option_naming_no_file_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--config", "nope.yml"]) == 1
    assert capsys.readouterr().err == "ductwork check: ConfigError: --config='nope.yml': no such file\n"
    assert list(tmp_path.iterdir()) == []


def test_an_import_error_escaping_a_command_is_one_line(monkeypatch, capsys):
    """A driver or module a command needs that is not installed: its message, no traceback."""
    import ductwork.cli

    def needs_a_driver(_args):
        raise ModuleNotFoundError("No module named 'psycopg'")

    monkeypatch.setitem(ductwork.cli.COMMANDS, "check", needs_a_driver)
    assert main(["check"]) == 1
    assert capsys.readouterr().err == "ductwork check: No module named 'psycopg'\n"


def test_a_mysql_url_without_a_database_is_one_line(capsys):
    assert main(["check", "--database-url", "mysql://root:pw@127.0.0.1:3306", "-c", "/dev/null"]) == 1
    assert capsys.readouterr().err == (
        "ductwork check: DatabaseURLError: database.url='mysql://root:***@127.0.0.1:3306': "
        "names no database; add one, e.g. mysql://user@host/ductwork\n")


def test_a_duplicated_key_fails_the_check(tmp_path, sqlite_url, capsys):
    path = tmp_path / "ductwork.yml"
    path.write_text("default:\n  job_worker: {count: 2}\n  job_worker: {max_retry: 0}\n")
    assert main(["check", "-c", str(path), "--database-url", sqlite_url]) == 1
    assert capsys.readouterr().err == (
        f"ductwork check: DuplicateKeyError: {path}: default.job_worker: key 'job_worker' appears twice, "
        "at lines 2 and 3 (YAML keeps only the last; merge the two)\n")


def test_the_check_counts_key_families_beside_keys_and_warns_of_one_no_pipeline_uses(tmp_path, sqlite_url, capsys):
    path = tmp_path / "ductwork.yml"
    path.write_text("default:\n  job_worker:\n    limits:\n      api: {concurrency: 1}\n"
                    "      vendor_api: {per_partition: {concurrency: 2}, concurrency: 50}\n")
    assert main(["check", "-c", str(path), "--database-url", sqlite_url]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("ok: 0 pipelines, 1 limit keys, 1 key families, env 'default', database ")
    assert "job_worker.limits.api: configured but no loaded pipeline" in err  # neither is used by a pipeline
    assert "job_worker.limits.vendor_api" in err


_NO_DRIVERS = """
import sys
sys.modules["psycopg"] = sys.modules["pymysql"] = None  # as if not installed: imports fail, find_spec is None
from ductwork.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sqlite_needs_neither_server_driver(tmp_path):
    """``pip install ductwork`` has no driver extra: SQLite must work without psycopg and
    PyMySQL, and a server URL must say which extra to install."""
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", _NO_DRIVERS, *args, "-c", "/dev/null"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)

    for command in (["db", "upgrade"], ["check"], ["status"]):
        done = run(*command, "--database-url", "sqlite:///shop.sqlite3")
        assert done.returncode == 0, done.stderr
    done = run("check", "--database-url", "postgresql://u:secret@db/shop")
    assert done.returncode == 1
    assert done.stderr == ("ductwork check: MissingExtraError: database.url='postgresql+psycopg://u:***@db/shop' "
                           "needs psycopg, which is not installed: pip install 'ductwork[postgres]' "
                           "(nothing was written)\n")


#: ``ductwork`` in a process where jinja2 (of the web extra) is not installed (``missing``)
#: or is installed but does not import (``broken``: found, then its import fails)
_NO_JINJA2 = """
import importlib.abc, importlib.machinery, sys

how = sys.argv.pop(1)

class Broken(importlib.abc.Loader):
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        raise ImportError("built for another Python")

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] != "jinja2":
            return None
        if how == "missing":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return importlib.machinery.ModuleSpec(name, Broken())

sys.meta_path.insert(0, Blocked())
from ductwork.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(("how", "reason"), [("missing", "is not installed"),
                                             ("broken", "does not import (built for another Python)")])
def test_the_dashboard_without_its_extra_names_it_before_serving(tmp_path, how, reason):
    """``ductwork web`` without the web extra: one line naming ``pip install
    'ductwork[web]'`` and exit 1, before it connects (the SQLite file is never made),
    let alone serves. Checked by import, so an installed module that cannot load says why."""
    done = subprocess.run([sys.executable, "-c", _NO_JINJA2, how, "web", "--port", "0", "-c", "/dev/null",
                           "--database-url", "sqlite:///shop.sqlite3"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (1, f"ductwork web: MissingExtraError: the dashboard needs jinja2, "
                                                 f"which {reason}: pip install 'ductwork[web]' (nothing was written)\n")
    assert not (tmp_path / "shop.sqlite3").exists()


def test_a_command_run_in_process_leaves_the_callers_default_app(tmp_path):
    """``main()`` called from Python (a script, a test) connects, which makes its app the
    default; when the command ends it disposes that app and the caller's default is back,
    not the disposed one (through which a later trigger would reopen connections nobody
    closes)."""
    from ductwork.app import App, set_default_app
    from ductwork.config import Config
    from ductwork.db.database import current_default_app

    url = f"sqlite:///{tmp_path}/in_process.sqlite3"
    mine = App(url, Config())
    set_default_app(mine)
    try:
        assert main(["db", "upgrade", "--database-url", url, "-c", "/dev/null"]) == 0
        assert current_default_app() is mine
        set_default_app(None)
        assert main(["db", "current", "--database-url", url, "-c", "/dev/null"]) == 0
        assert current_default_app() is None
    finally:
        set_default_app(None)
        mine.dispose()


def test_start_hands_its_options_to_its_children_and_prints_the_checks_warnings(tmp_path, sqlite_url):
    """``ductwork start --env staging --log-level INFO --role worker``: the boot check's
    warnings are printed, the start lines name only worker processes, and the children get
    the same options (a child without ``--env staging`` would find no such section)."""
    import sqlalchemy as sa

    from ductwork_proof.fleet import FLEET_SETTINGS, Fleet, process_rows, wait_for

    section = {name: dict(values) for name, values in FLEET_SETTINGS.items()}
    section["pipelines"] = []
    section["job_worker"]["limits"] = {"nobody_uses_it": {"concurrency": 1}}
    section["supervisor"]["reaper_timeout"] = 600  # a loaded machine's late heartbeat ends no runner
    config = tmp_path / "ductwork.yml"
    config.write_text(yaml.safe_dump({"staging": section}))
    engine = sa.create_engine(sqlite_url)
    try:
        fleet = Fleet(sqlite_url, config, label="staged", role="worker",
                      args=["--env", "staging", "--log-level", "INFO"])
        with fleet:
            (row,) = wait_for(lambda: process_rows(engine, label_prefix="staged.worker"),
                              f"the worker started with the staging section; log: {fleet.log()[-2000:]}")
            wait_for(lambda: f"job_worker {row.id} started" in fleet.log(), "the worker logged its start at INFO")
            assert fleet.terminate(30) == 0, fleet.log()[-2000:]
        log = fleet.log()
        assert re.search(r"^warning: .*'nobody_uses_it'", log, re.MULTILINE), log[-2000:]
        assert "processes: 1 worker process with 2 threads" in log
        assert "advancer" not in log
    finally:
        engine.dispose()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_built_copy_outside_the_checkout_names_the_commit_it_was_built_from(tmp_path):
    """The build (setup.py's build_py, which ``pip wheel`` runs) records the checkout's commit
    in ``ductwork/_build.py``; the built package, imported from a directory that is no
    checkout, prints it. The checkout itself gets no ``_build.py``."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        pytest.skip("the tests do not run from a git checkout")
    built = tmp_path / "lib"
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(built)], cwd=root,
                   capture_output=True, text=True, timeout=120, check=True)
    git = ["git", "-C", str(root)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = "-dirty" if subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout else ""
    assert (built / "ductwork" / "_build.py").read_text().endswith(f"COMMIT = '{head}{dirty}'\n")
    assert not (root / "ductwork" / "_build.py").exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-m", "ductwork.cli", "--version"], cwd=elsewhere,
                          env={**os.environ, "PYTHONPATH": str(built)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(f" (commit {head}{dirty}) from {built / 'ductwork'}\n")
