"""The ``ductwork`` command.

    ductwork db upgrade            create or migrate ductwork's tables
    ductwork check                 boot validation; exit 1 with the message on failure
    ductwork start [--role R]      run a supervisor with advancer and worker processes
    ductwork status                runs by state, processes, and each limit key
    ductwork demo                  a pipeline with limits on an embedded SQLite file
                                   (its log, tracebacks included: ./ductwork-demo.log)
    ductwork runs [--status S] [--pipeline P] [--since T] [--limit N] [--json]
                                   runs, newest first
    ductwork show RUN_ID [--json] [--backtrace]
                                   one run's branches, steps, executions, errors and waits
    ductwork prune --finished-before DURATION [--dry-run] [--pipeline P] [--batch-size N]
                                   delete completed and halted runs, whole, in batches
    ductwork revive RUN_ID         continue a halted run as a new run; prints the new run's id
    ductwork --version             the version, the git commit it was built from, where it is
    ductwork web [--host H] [--port P] [--read-only] [--token T]
                                   the dashboard and /metrics (pip install 'ductwork[web]')

Options for every command: ``--database-url`` (else ``DUCTWORK_DATABASE_URL``,
then the config's ``database.url``, then ``sqlite:///ductwork.sqlite3``),
``-c/--config`` (else ``DUCTWORK_CONFIG``, else ``./ductwork.yml``), ``--env`` (else
``DUCTWORK_ENV``, else ``default``), ``--log-level`` and ``--log-format`` (else the
config's ``logging``; the command configures the process's logging, the library never
does). Errors print one line naming what is wrong and exit 1; they never print a
traceback. Only ``db upgrade`` and ``demo`` create a SQLite file; the other commands
report a missing one (MissingDatabaseError).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DBAPIError

from ductwork import logs
from ductwork.config import FORMATS, LEVELS
from ductwork.errors import DuctworkError

if TYPE_CHECKING:
    from ductwork.app import App
    from ductwork.config import Config

log = logging.getLogger("ductwork.cli")


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--database-url", help="database URL (default: $DUCTWORK_DATABASE_URL, config, sqlite)")
    common.add_argument("-c", "--config",
                        help="path to ductwork.yml (default: $DUCTWORK_CONFIG, else ./ductwork.yml if present)")
    common.add_argument("--env", help="config environment (default: $DUCTWORK_ENV or 'default')")
    common.add_argument("-v", "--verbose", action="store_true", help="log at INFO level (--log-level INFO)")
    common.add_argument("--log-level", type=str.upper, choices=LEVELS,
                        help="log records at this level and above (default: the config's logging.level, "
                             "else INFO for start and WARNING for the other commands)")
    common.add_argument("--log-format", choices=FORMATS,
                        help="text: one line per record; json: one JSON object per line "
                             "(default: the config's logging.format, else text)")
    return common


class _Version(argparse.Action):
    """``--version``: :func:`ductwork.version.describe`, worked out only when asked (it may
    run git), then exit 0."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from ductwork.version import describe

        print(describe())
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    """The user commands. ``_child`` is not one of them (see :func:`_child_parser`)."""
    common = _common()
    parser = argparse.ArgumentParser(prog="ductwork", description="Durable pipelines on SQL databases.")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the version and the git commit it was built from, and exit")
    commands = parser.add_subparsers(dest="command", required=True)
    db = commands.add_parser("db", help="schema migrations", parents=[common])
    db.add_argument("action", choices=["upgrade", "current"])
    commands.add_parser("check", help="validate config, pipelines, limits and tables", parents=[common])
    start = commands.add_parser("start", help="run a supervisor and its processes", parents=[common])
    start.add_argument("--role", choices=["all", "advancer", "worker"], help="override the config's role")
    start.add_argument("--label", default="supervisor", help="names this supervisor's process rows")
    commands.add_parser("status", help="runs, processes and limit keys", parents=[common])
    _inspection_parsers(commands, common)
    demo = commands.add_parser("demo", help="run a demo pipeline on an embedded SQLite file", parents=[common])
    demo.add_argument("--orders", type=int, default=12, help="orders to sync (default 12)")
    demo.add_argument("--timeout", type=float, default=120.0,
                      help="seconds to wait for the runs before giving up with status 1 (default 120)")
    _add_revive(commands, common)
    _add_web(commands, common)
    # its options are ductwork_proof.verify's own (`ductwork verify --help`): main() hands it
    # the rest of the command line before this parser sees it
    commands.add_parser("verify", add_help=False,
                        help="run ductwork's proof on a database (the verify extra; docs/verify.md)")
    return parser


# --------------------------------------------------------------------------- inspection and retention


def _inspection_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """``runs``, ``show`` and ``prune`` (issue 16: inspection without SQL, retention)."""
    from ductwork.pipelines.history import DEFAULT_LIMIT
    from ductwork.pipelines.prune import DEFAULT_BATCH_SIZE

    runs = commands.add_parser("runs", help="list runs, newest first (read-only)", parents=[common])
    runs.add_argument("--status", help="in_progress, dampened, completed or halted")
    runs.add_argument("--pipeline", help="module:Class, or the bare class name")
    runs.add_argument("--since", help="triggered at or after: a duration back from now ('1h', '2d') "
                                      "or an ISO 8601 time")
    runs.add_argument("--limit", default=str(DEFAULT_LIMIT), help=f"at most this many (default {DEFAULT_LIMIT})")
    runs.add_argument("--json", action="store_true", help="one JSON document (docs/operating.md)")
    show = commands.add_parser("show", help="one run's branches, steps, executions and waits (read-only)",
                               parents=[common])
    show.add_argument("run_id", metavar="RUN_ID")
    show.add_argument("--json", action="store_true", help="one JSON document (docs/operating.md)")
    show.add_argument("--backtrace", action="store_true", help="include each error's traceback")
    prune = commands.add_parser("prune", help="delete completed and halted runs that finished long ago",
                                parents=[common])
    prune.add_argument("--finished-before", required=True, metavar="DURATION",
                       help="runs that finished more than this long ago (database time), e.g. '30d', '1w'")
    prune.add_argument("--dry-run", action="store_true", help="count what would go; delete nothing")
    prune.add_argument("--pipeline", help="only runs of this pipeline (module:Class, or the bare class name)")
    prune.add_argument("--batch-size", default=str(DEFAULT_BATCH_SIZE),
                       help=f"runs per transaction (default {DEFAULT_BATCH_SIZE})")


def _whole(option: str, text: str) -> int:
    from ductwork.errors import RunFilterError

    if not text.isdigit():
        raise RunFilterError(option, text, "expected a whole number")
    return int(text)


def cmd_runs(args: argparse.Namespace) -> int:
    import json

    from ductwork.history_text import JSON_FORMAT, render_runs, run_json
    from ductwork.pipelines.history import list_runs

    limit = _whole("--limit", args.limit)
    app = _connect(args)
    records = list_runs(app, status=args.status, pipeline=args.pipeline, since=args.since, limit=limit)
    if args.json:
        print(json.dumps({"format": JSON_FORMAT, "runs": [run_json(r) for r in records]}, indent=2))
    else:
        print(render_runs(records))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    import json

    from ductwork.history_text import history_json, render_history
    from ductwork.pipelines.history import run_history

    history = run_history(_connect(args), args.run_id, backtraces=args.backtrace)
    print(json.dumps(history_json(history), indent=2) if args.json else render_history(history))
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from datetime import datetime, timedelta

    from ductwork.durations import parse_period
    from ductwork.errors import DurationError, RunFilterError
    from ductwork.pipelines.prune import prune, render

    try:
        seconds = 0 if args.finished_before == "0" else parse_period(args.finished_before)
    except DurationError as error:
        raise RunFilterError("--finished-before", args.finished_before, str(error)) from None
    batch_size = _whole("--batch-size", args.batch_size)
    app = _connect(args)

    def start(cutoff: datetime) -> None:
        print(f"pruning runs finished before {cutoff.isoformat(sep=' ')} UTC", flush=True)

    def progress(runs: int, rows: dict[str, int]) -> None:
        print(f"batch: {runs} runs, {sum(rows.values())} rows", flush=True)

    result = prune(app, timedelta(seconds=seconds), batch_size=batch_size, dry_run=args.dry_run,
                   pipeline=args.pipeline, on_start=start, on_batch=progress)
    print(render(result))
    return 0


# -- revive (issue 16) ---------------------------------------------------------------------


def _add_revive(commands: Any, common: argparse.ArgumentParser) -> None:
    revive = commands.add_parser("revive", parents=[common],
                                 help="continue a halted run as a new run; prints the new run's id")
    revive.add_argument("run_id", metavar="RUN_ID", help="the halted run")
    revive.add_argument("--duplicate-context", action="store_true",
                        help="copy the halted run's context into the new run (default: start empty)")


def cmd_revive(args: argparse.Namespace) -> int:
    """Print the id of the run that revives RUN_ID (the existing one if it was revived
    already); ReviveError (one line, exit 1) when RUN_ID is not halted or unknown."""
    from ductwork.pipelines.revive import revive_run

    app = _connect(args)
    print(revive_run(app, args.run_id, args.duplicate_context))
    return 0


# -- web (issue 35) ------------------------------------------------------------------------


def _add_web(commands: Any, common: argparse.ArgumentParser) -> None:
    web = commands.add_parser("web", parents=[common],
                              help="serve the dashboard and /metrics (pip install 'ductwork[web]')")
    web.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine)")
    web.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    web.add_argument("--read-only", action="store_true", help="offer and accept no action (resume, revive)")
    web.add_argument("--token", help="require this bearer token (default: $DUCTWORK_WEB_TOKEN, else none); "
                                     "the variable keeps it out of the process list")
    web.add_argument("--refresh", type=float, default=5.0, help="seconds between page refreshes (0: never)")


def cmd_web(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; ImportError naming the extra when it is not installed."""
    from ductwork.web.serve import serve

    app = _connect(args)
    app.check_schema()  # a missing database or tables: one line now, not a 500 per page
    token = args.token or os.environ.get("DUCTWORK_WEB_TOKEN") or None
    serve(app, args.host, args.port, read_only=args.read_only, token=token, refresh_s=args.refresh)
    return 0


#: the internal command a supervisor starts its children with
CHILD = "_child"


def _child_parser() -> argparse.ArgumentParser:
    """``ductwork _child``, parsed apart from the user commands so that ``--help``, the
    usage line and the "invalid choice" message never list it."""
    child = argparse.ArgumentParser(prog=f"ductwork {CHILD}", parents=[_common()])
    child.add_argument("--role", required=True)
    child.add_argument("--threads", type=int, required=True)
    child.add_argument("--label", required=True)
    child.add_argument("--parent-pid", type=int, default=None,
                       help="the supervisor's pid: the runner stops when that process dies")
    child.set_defaults(command=CHILD)
    return child


#: the apps this command opened
_opened: list[App] = []


def _connect(args: argparse.Namespace, **settings: Any) -> App:
    """Connect as the options say; ``main`` disposes the app when the command ends."""
    from ductwork.app import connect

    config = args.config
    if config is not None and not Path(config).exists():
        from ductwork.errors import ConfigError

        raise ConfigError("--config", config, "no such file")
    app = connect(args.database_url, config, args.env, **settings)
    _opened.append(app)
    logs.configure(*_log_settings(args, app.config))  # the config's logging, unless the options say
    return app


def _log_settings(args: argparse.Namespace, config: Config | None = None) -> tuple[str, str]:
    """The log level and format: the options, else the config's ``logging``, else the defaults."""
    level = (args.log_level or ("INFO" if args.verbose else None) or (config.logging.level if config else None)
             or ("INFO" if args.command in ("start", "_child", "web") else "WARNING"))
    return level, args.log_format or (config.logging.format if config else "text")


def _common_args(args: argparse.Namespace) -> list[str]:
    out = []
    if args.database_url:
        out += ["--database-url", args.database_url]
    if args.config:
        out += ["--config", str(Path(args.config).resolve())]
    if args.env:
        out += ["--env", args.env]
    if args.verbose:
        out.append("--verbose")
    if args.log_level:
        out += ["--log-level", args.log_level]
    if args.log_format:
        out += ["--log-format", args.log_format]
    return out


def cmd_db(args: argparse.Namespace) -> int:
    from ductwork.db import migrate

    app = _connect(args)
    if args.action == "upgrade":
        migrate.upgrade(app.engine)
    else:
        app.check_database()  # `db current` reads: it must not create a SQLite file
    print(f"ductwork schema at revision {migrate.current(app.engine)} (head {migrate.head()})")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from ductwork.fleet.boot import load_pipelines, validate

    app = _connect(args)
    pipelines = load_pipelines(app.config)
    for warning in validate(app, pipelines):
        print(f"warning: {warning}", file=sys.stderr)
    families = f", {len(app.config.families)} key families" if app.config.families else ""
    print(f"ok: {len(pipelines)} pipelines, {len(app.config.limits)} limit keys{families}, env {app.config.env!r}, "
          f"database {app.database}")
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    from ductwork.fleet.boot import load_pipelines, validate
    from ductwork.fleet.processes import same_host_warning, supervisors_on_this_host
    from ductwork.fleet.supervisor import Supervisor

    app = _connect(args)
    pipelines = load_pipelines(app.config)
    for warning in validate(app, pipelines):
        print(f"warning: {warning}", file=sys.stderr)
    for row in supervisors_on_this_host(app):  # legal, so only a warning
        log.warning("%s", same_host_warning(row))
    role = args.role or app.config.role
    from ductwork.version import describe

    for line in logs.start_lines(app.config, app.engine.url.render_as_string(hide_password=True),
                                 [p.definition.pipeline for p in pipelines if p.definition], role, describe()):
        log.info("%s", line)
    command = [sys.executable, "-m", "ductwork.cli", CHILD, *_common_args(args)]
    code = Supervisor(app, command, role=args.role, label=args.label).run()
    log.info("ductwork start: stopped, exit status %d", code)
    return code


def cmd_child(args: argparse.Namespace) -> int:
    from ductwork.fleet.boot import load_pipelines
    from ductwork.fleet.supervisor import Runner

    app = _connect(args, pool_size=args.threads + 2)
    load_pipelines(app.config)
    return Runner(app, args.role, args.threads, args.label, parent_pid=args.parent_pid).run()


def cmd_status(args: argparse.Namespace) -> int:
    from ductwork.fleet.reaper import reap_dead
    from ductwork.status import render, snapshot

    app = _connect(args)
    status = snapshot(app)
    print(f"database: {app.database}")
    print(render(status))
    if any(proc.dead for proc in status.processes):
        # proof of death on this machine: its claims need not wait for a supervisor
        reaped = len(reap_dead(app, None, stale=False))
        print(f"\nreaped {reaped} dead process{'es' if reaped != 1 else ''} of this machine: "
              f"{'their' if reaped != 1 else 'its'} claims are free now (the counts above were read before)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from ductwork.demo import main as demo_main

    return demo_main(args.database_url or os.environ.get("DUCTWORK_DATABASE_URL"), args.orders, args.timeout,
                     *_log_settings(args))


COMMANDS = {"db": cmd_db, "check": cmd_check, "start": cmd_start, "status": cmd_status,
            "demo": cmd_demo, "runs": cmd_runs, "show": cmd_show, "prune": cmd_prune, "revive": cmd_revive,
            "web": cmd_web, CHILD: cmd_child}


def cmd_verify(argv: list[str]) -> int:
    """``ductwork verify``: the proof ships beside the engine (``ductwork_proof``, the
    ``verify`` extra), which never imports it: loaded by name, only when asked for."""
    try:
        proof = importlib.import_module("ductwork_proof.verify")
    except ImportError as error:
        print(f"ductwork verify: {error}; install the verify extra: pip install 'ductwork[verify]'",
              file=sys.stderr)
        return 2
    if os.getcwd() not in sys.path:  # the config's pipelines import from the current directory
        sys.path.insert(0, os.getcwd())
    code: int = proof.main(argv)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["verify"]:
        return cmd_verify(argv[1:])
    args = _child_parser().parse_args(argv[1:]) if argv[:1] == [CHILD] else _parser().parse_args(argv)
    if os.getcwd() not in sys.path:  # like `python -m`: pipelines in the current directory import
        sys.path.insert(0, os.getcwd())
    restore = logs.configure(*_log_settings(args))  # the command owns logging; _connect adds the config's
    from ductwork.db.database import current_default_app

    before = current_default_app()  # the caller's, given back when the command ends
    try:
        return COMMANDS[args.command](args)
    except BrokenPipeError:
        # The reader went away (`ductwork runs | head`): no traceback, and nothing more is
        # written to the closed pipe (the interpreter would try again at exit). What was
        # committed stays committed: a prune stops after its last whole batch.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a process killed by SIGPIPE reports it in a shell (128 + 13)
    except DuctworkError as error:
        print(f"ductwork {args.command}: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    except ImportError as error:
        print(f"ductwork {args.command}: {error}", file=sys.stderr)
        return 1
    except DBAPIError as error:
        where = _opened[-1].engine.url.render_as_string(hide_password=True) if _opened else "the database"
        reason = str(error.orig).strip().splitlines()[0] if error.orig else type(error).__name__
        print(f"ductwork {args.command}: cannot use {where}: {reason}", file=sys.stderr)
        return 1
    finally:
        if _opened:  # called in-process (from Python, a test): the caller's default app again,
            from ductwork.app import set_default_app  # not one disposed here

            set_default_app(before)
        while _opened:
            _opened.pop().dispose()
        restore()


if __name__ == "__main__":
    sys.exit(main())
