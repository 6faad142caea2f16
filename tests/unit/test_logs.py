"""The log formats and settings: the JSON formatter, ``configure``, ``emit``, the
``logging`` config section, the ``ductwork`` options' precedence and the start summary.

Checks: none of the invariants.
"""

from __future__ import annotations

import io
import json
import logging
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from ductwork import logs
from ductwork.cli import _log_settings, _parser
from ductwork.config import Config, LoggingConfig
from ductwork.config_file import config_from_mapping
from ductwork.errors import ConfigError


def _record(**extra) -> logging.LogRecord:
    record = logging.LogRecord("ductwork.executions", logging.WARNING, __file__, 1, "step %s", ("failed",), None)
    record.__dict__.update(extra)
    return record


def test_json_is_one_object_per_line_with_the_context_as_keys():
    record = _record(run_id="r1", attempt=2, next_at=datetime(2026, 1, 1, tzinfo=UTC))
    record.exc_text = "Traceback (most recent call last):\n  File \"x\", line 1\nValueError: boom"
    line = logs.JsonFormatter().format(record)
    assert "\n" not in line
    out = json.loads(line)
    assert out == {"time": out["time"], "level": "WARNING", "logger": "ductwork.executions",
                   "process": record.process, "message": "step failed", "run_id": "r1", "attempt": 2,
                   "next_at": "2026-01-01 00:00:00+00:00", "exc_info": record.exc_text}
    assert datetime.fromisoformat(out["time"]).utcoffset().total_seconds() == 0


def test_json_formats_a_live_exception():
    try:
        raise KeyError("gone")
    except KeyError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), __import__("sys").exc_info())
    out = json.loads(logs.JsonFormatter().format(record))
    assert out["exc_info"].startswith("Traceback")
    assert out["exc_info"].endswith("KeyError: 'gone'")


def test_json_carries_a_records_stack_info():
    """``logger.warning(..., stack_info=True)``: the stack text, as the text format prints it."""
    record = _record()
    record.stack_info = "Stack (most recent call last):\n  File \"x\", line 1, in <module>"
    out = json.loads(logs.JsonFormatter().format(record))
    assert out["stack_info"] == record.stack_info
    assert "exc_info" not in out


def test_emit_carries_context_and_traceback_text_and_names_the_caller():
    logger = logging.getLogger("ductwork.test_emit")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(filename)s %(funcName)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        logs.emit(logger, logging.WARNING, "step failed (run_id=r1)", {"run_id": "r1"}, "Traceback …\nValueError: x")
        logs.emit(logger, logging.INFO, "not shown", {})
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    assert stream.getvalue() == (
        "test_logs.py test_emit_carries_context_and_traceback_text_and_names_the_caller WARNING "
        "step failed (run_id=r1)\nTraceback …\nValueError: x\n")


def test_configure_replaces_its_handler_quiets_alembic_and_restores():
    root, alembic = logging.getLogger(), logging.getLogger("alembic")
    before = (root.level, alembic.level, list(root.handlers))
    first, second = io.StringIO(), io.StringIO()
    logs.configure("INFO", "text", first)
    restore = logs.configure("INFO", "json", second)  # replaces the first: one handler
    try:
        logging.getLogger("ductwork.test").info("hello")
        logging.getLogger("alembic.runtime.migration").info("Context impl SQLiteImpl.")
        assert first.getvalue() == ""
        (line,) = second.getvalue().splitlines()
        assert json.loads(line)["message"] == "hello"
        logs.configure("DEBUG", "text", second)
        logging.getLogger("alembic.runtime.migration").info("Context impl SQLiteImpl.")
        assert "alembic.runtime.migration INFO Context impl SQLiteImpl." in second.getvalue()
    finally:
        restore()
    assert (root.level, alembic.level, list(root.handlers)) == before


@pytest.mark.parametrize(("level", "fmt"), [("LOUD", "text"), ("INFO", "xml")])
def test_configure_refuses_unknown_levels_and_formats(level, fmt):
    with pytest.raises(ValueError, match="must be one of"):
        logs.configure(level, fmt)


def test_the_logging_section():
    assert Config().logging == LoggingConfig(level=None, format="text")
    section = config_from_mapping({"default": {"logging": {"level": "info", "format": "json"}}}).logging
    assert section == LoggingConfig(level="INFO", format="json")


@pytest.mark.parametrize(("body", "message"), [
    ({"level": "LOUD"}, "logging.level='LOUD': expected one of DEBUG, INFO, WARNING, ERROR"),
    ({"level": 10}, "logging.level=10: expected one of DEBUG, INFO, WARNING, ERROR"),
    ({"format": "xml"}, "logging.format='xml': expected one of text, json"),
    ({"fromat": "json"}, "logging.fromat='json': unknown key; valid keys: level, format"),
    ("json", "logging='json': expected a mapping, got str"),
])
def test_logging_section_errors_name_the_value(body, message):
    with pytest.raises(ConfigError) as info:
        config_from_mapping({"default": {"logging": body}})
    assert str(info.value) == message


@pytest.mark.parametrize(("argv", "section", "expected"), [
    (["start"], None, ("INFO", "text")),
    (["check"], None, ("WARNING", "text")),
    (["db", "upgrade"], {"level": "DEBUG", "format": "json"}, ("DEBUG", "json")),
    (["start", "--log-level", "warning", "--log-format", "text"], {"level": "DEBUG", "format": "json"},
     ("WARNING", "text")),
    (["start", "-v"], {"level": "ERROR"}, ("INFO", "text")),
    (["status", "--log-format", "json"], {}, ("WARNING", "json")),
])
def test_options_then_config_then_defaults(argv, section, expected):
    config = config_from_mapping({"default": {"logging": section}}) if section is not None else None
    assert _log_settings(_parser().parse_args(argv), config) == expected


def test_start_lines_say_what_runs_where_with_which_limits():
    config = config_from_mapping({"default": {"job_worker": {"processes": 2, "count": 4, "limits": {
        "vendor_api": {"concurrency": 5, "rate": [{"limit": 1, "per": "1s"}, {"limit": 2000, "per": "1h",
                                                                              "burst": 50}]},
        "mail": {"concurrency": 1}}}}}, source="ductwork.yml")
    url = sa.engine.make_url("postgresql+psycopg://ops:s3cret@db.internal/shop")
    lines = logs.start_lines(config, url.render_as_string(hide_password=True), ["shop.pipelines:Sync"], "all")
    assert lines[0].startswith("ductwork start: database postgresql+psycopg://ops:***@db.internal/shop, config /")
    assert lines[0].endswith("/ductwork.yml, env 'default', role all")
    assert lines[1:] == [
        "pipelines (1): shop.pipelines:Sync",
        "processes: 1 advancer process with 3 threads, 2 worker processes with 4 threads each",
        "limit keys (2): mail: concurrency 1; vendor_api: concurrency 5, rate 1 per 1s (burst 1), "
        "2000 per 3600s (burst 50)",
    ]
    families = config_from_mapping({"default": {"job_worker": {"limits": {
        "mail": {"concurrency": 1}, "api": {"per_partition": {"rate": {"limit": 10, "per": "1s"}}, "concurrency": 50},
        "ftp": {"per_partition": {"concurrency": 2}}}}}})
    assert logs.start_lines(families, "sqlite:///x", [], "all")[-1] == (
        "limit keys (3): mail: concurrency 1; api[…]: each partition rate 10 per 1s (burst 10), 50 over the "
        "family; ftp[…]: each partition concurrency 2")
    assert logs.start_lines(Config(), "sqlite:///x", [], "advancer")[1:] == [
        "pipelines: none listed", "processes: 1 advancer process with 3 threads", "limit keys: none"]
    assert logs.start_lines(Config(), "sqlite:///x", [], "worker")[2] == (
        "processes: 1 worker process with 5 threads each")
    assert logs.start_lines(Config(), "sqlite:///x", [], "all", "ductwork 0.1.0 (commit 1a2b3c4) from /x")[0] \
        .endswith("role all; ductwork 0.1.0 (commit 1a2b3c4) from /x")
