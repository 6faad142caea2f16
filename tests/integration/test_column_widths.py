"""A user's value longer than the bounded column it is stored in, on every database.

SQLite does not check a ``VARCHAR(n)``'s length, so it stores the whole value; PostgreSQL and
MySQL-family refuse it (``value too long``, error 1406) in the statement that writes it, or,
on PostgreSQL, cut it silently where an array is cast to the column's type
(``dialects.insert_rows``). The engine's own values are held against their columns without a
database (``tests/unit/test_column_widths.py``); here are the values a user controls that no
check keeps within the width before a server refuses them, each shown on the three databases.

Each test is a reproducer of a bug, ``xfail(strict=True)`` naming it: it states what should
happen (an error naming the value when the class or the label is defined, or the value cut
when it is recorded), fails today, on the servers with what each does instead, and flips
when the bug is fixed. A class name is made long the way a real one gets long: a class
nested in others (or made by a factory) in a module of its own (``module:qualname``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from ductwork import DefinitionError, Pipeline
from ductwork.app import App
from ductwork.db import schema
from ductwork.fleet.processes import register
from ductwork.fleet.supervisor import Supervisor
from ductwork.fleet.worker import Worker
from ductwork.pipelines.advance import Advancer
from ductwork.pipelines.hooks import open_hooks
from tests.workloads import Boom, Echo, Takes
from tests.workloads.hooks import HaltRecorder

#: the qualname of a class nested 40 classes deep: 280 characters before its own name
DEEP = "Nested." * 40
#: what error_klass, klass, node, pipeline_klass and limit_key hold
WIDTH = 255


def _deep(name: str, base: type, **namespace: Any) -> type:
    """A subclass of ``base`` whose ``module:qualname`` is longer than ``WIDTH``."""
    return type(name, (base,), {"__qualname__": DEEP + name, "__module__": __name__, **namespace})


def _pipeline(name: str, define: Callable[[Any], object]) -> type[Pipeline]:
    """A pipeline of this module, of a short name, defined by ``define(p)``."""
    return type(name, (Pipeline,), {"__module__": __name__, "define": classmethod(lambda _cls, p: define(p))})


def _as_a_fleet(app: App, rounds: int = 40) -> dict[str, int]:
    """Advance and work in this thread as a fleet's loops do (``fleet.supervisor.Loop``): a
    unit that raises is counted and the loop goes on; the ManualClock then moves past any
    retry delay or crash back-off. Until no run is in progress and no hook is owed, or
    ``rounds`` passes. Returns what the units raised (its first line), and how often."""
    worker, advancer = Worker(app), Advancer(app)
    raised: dict[str, int] = {}
    for _ in range(rounds):
        for unit in (advancer.run_once, worker.run_once):
            try:
                unit()
            except Exception as error:  # noqa: BLE001 - what the fleet's loop does: log it, go on
                what = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
                raised[what] = raised.get(what, 0) + 1
        with app.begin(readonly=True) as tx:
            if not open_hooks(tx) and tx.execute(sa.select(schema.runs.c.id).where(
                    schema.runs.c.status == "in_progress")).first() is None:
                return raised
        app.clock.advance(timedelta(seconds=120))
    return raised


def _define_and_run(app: App, pipeline: Callable[[], type[Pipeline]], ends: tuple[str, list[str]]) -> None:
    """What a user does: define a pipeline (``pipeline()``), trigger it, and let a fleet run it,
    which must end its run ``ends`` (status, halt reasons) with nothing raised."""
    run = pipeline().trigger(1)
    raised = _as_a_fleet(app)
    assert (run.refresh().status, run.halt_reasons, raised) == (*ends, {})


# --------------------------------------------------------------------------- errors recorded


class DeepError(Exception):
    """Raised by a step or a handler: its ``module.qualname`` is longer than ``error_klass``."""


DeepError.__qualname__ = DEEP + "DeepError"


class RaisesDeep(Takes):
    """Raises ``DeepError("deep <input>")``."""

    def execute(self):
        raise DeepError(f"deep {self.value}")


class FailsDeep(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(RaisesDeep)


class HandlerRaisesDeep(HaltRecorder):
    """An on_halt handler that raises ``DeepError``."""

    def execute(self):
        raise DeepError("deep hook")


class HookFailsDeep(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Boom).on_halt(HandlerRaisesDeep)


def test_a_step_failure_whose_exception_class_has_a_long_name_is_recorded_as_a_failure(manual_app):
    """Every attempt is recorded a ``failure`` with its message and a class cut to the column
    (``ErrorInfo``: its end kept), retried within ``max_retry`` (2), and the branch halts
    ``job_retries_exhausted``. Before the cut, SQLite stored the whole class (326 characters
    in a VARCHAR(255)); on PostgreSQL and MySQL the failure's transaction failed, the worker
    crashed the execution, and the step ran ``max_crash`` + 1 (5) times, recorded
    ``process_crashed``, until its branch halted ``job_crashes_exhausted``."""
    run = FailsDeep.trigger(1)
    raised = _as_a_fleet(manual_app)
    e = schema.executions
    with manual_app.begin(readonly=True) as tx:
        ended = tx.execute(sa.select(e.c.outcome, e.c.error_klass, e.c.error_message)
                           .order_by(e.c.created_at, e.c.id)).all()
    assert {
        "run": (run.refresh().status, run.halt_reasons),
        "attempts": [(x.outcome, x.error_message) for x in ended],
        "classes longer than the column": [len(x.error_klass) for x in ended if len(x.error_klass) > WIDTH],
        "raised": raised,
    } == {
        "run": ("halted", ["job_retries_exhausted"]),
        "attempts": [("failure", "deep 1")] * 3,
        "classes longer than the column": [],
        "raised": {},
    }


def test_an_on_halt_hook_failure_whose_exception_class_has_a_long_name_is_recorded_as_a_failure(manual_app):
    """Each attempt of the hook is recorded a ``failure`` (retried within ``max_retry``, 2)
    with its class cut to the column. Before the cut, SQLite stored the whole class; on
    PostgreSQL and MySQL recording it failed and the attempt was crashed, 5 times
    (``max_crash`` 4)."""
    HookFailsDeep.trigger(1)
    raised = _as_a_fleet(manual_app)
    h = schema.halt_hooks
    with manual_app.begin(readonly=True) as tx:
        hook = tx.execute(sa.select(h.c.status, h.c.last_outcome, h.c.retry_count, h.c.crash_count,
                                    h.c.error_klass, h.c.error_message)).one()
    assert {
        "hook": (hook.status, hook.last_outcome, hook.retry_count, hook.crash_count, hook.error_message),
        "class longer than the column": len(hook.error_klass) > WIDTH,
        "raised": raised,
    } == {
        "hook": ("failed", "failure", 2, 0, "deep hook"),
        "class longer than the column": False,
        "raised": {},
    }


# --------------------------------------------------------------------------- names defined


def test_a_pipeline_whose_name_is_longer_than_the_column_is_refused_when_defined(manual_app):
    """A DefinitionError naming the limit when the class is created (``_Graph.check_name``).
    Without the check, SQLite stores the name whole and the run completes; PostgreSQL and
    MySQL refuse the trigger's INSERT (DataError)."""
    with pytest.raises(DefinitionError, match=str(WIDTH)):
        _define_and_run(manual_app, lambda: _deep("DeepPipeline", Pipeline,
                                                  define=classmethod(lambda _cls, p: p.start(Echo))), ("completed", []))


def test_a_step_class_whose_name_is_longer_than_the_column_is_refused_when_defined(manual_app):
    """A DefinitionError naming the limit when the pipeline is defined. Without the check,
    the definition builds and the run completes on SQLite; on PostgreSQL the step row holds
    the name cut to 255 characters, which resolves to no class (``unknown_step_class``); on
    MySQL the worker's success transaction, which creates the step, fails, and the first
    step is crashed and re-run until ``job_crashes_exhausted``."""
    with pytest.raises(DefinitionError, match=str(WIDTH)):
        _define_and_run(manual_app, lambda: _pipeline(
            "ThenDeep", lambda p: p.start(Echo).chain(to=_deep("DeepStep", Echo))), ("completed", []))


def test_an_on_halt_handler_whose_name_is_longer_than_the_column_is_refused_when_defined(manual_app):
    """A DefinitionError naming the limit when the pipeline is defined. Without the check,
    the run halts and its hook runs on SQLite; on PostgreSQL and MySQL every transaction
    that would halt the branch owes the hook, whose INSERT fails: the advancer's halt, its
    error's record, its crash (``advancer_crashes_exhausted``) alike. The run stays in
    progress however long the fleet runs."""
    with pytest.raises(DefinitionError, match=str(WIDTH)):
        _define_and_run(manual_app, lambda: _pipeline(
            "HaltsToDeep", lambda p: p.start(Boom).on_halt(_deep("DeepHandler", HaltRecorder))),
            ("halted", ["job_retries_exhausted"]))


def test_a_static_limit_key_longer_than_the_column_is_refused_when_defined(manual_app):
    """A DefinitionError naming the limit when the pipeline is defined, as a partition's key
    longer than ``MAX_KEY_CHARS`` is refused when it is rendered. Without the check, SQLite
    stores the key and the run completes; PostgreSQL and MySQL refuse the trigger."""
    with pytest.raises(DefinitionError, match=str(WIDTH)):
        _define_and_run(manual_app, lambda: _pipeline("DeepKeyed", lambda p: p.start(Echo, limit_by="k" * (WIDTH + 1))),
                        ("completed", []))


# --------------------------------------------------------------------------- process rows


def test_a_supervisor_label_too_long_for_its_childrens_rows_is_refused(app):
    """A label that fits the column but whose children's labels do not (``<label>.advancer``,
    ``<label>.worker.<i>``) is refused with an error naming it and the limit before anything
    starts (``Supervisor``: a ConfigError). Without the check, SQLite registers every row; on
    PostgreSQL and MySQL each child fails to register (DataError) and is restarted, with
    back-off, for as long as the supervisor runs."""
    with pytest.raises(ValueError, match="100"):
        _start_children(app, "l" * 95)


def test_a_supervisor_label_whose_childrens_rows_fit_exactly_registers_them(app):
    """The boundary of the check above: ``<label>.worker.0`` and ``<label>.advancer`` of 100
    characters register on every database."""
    _start_children(app, "l" * (100 - len(".worker.0")))
    p = schema.processes
    with app.begin(readonly=True) as tx:
        assert max(len(label) for label in tx.execute(sa.select(p.c.label)).scalars()) == 100


def _start_children(app: App, label: str) -> None:
    """Make ``ductwork start --label <label>``'s supervisor, and register each of its children's
    process rows, as each child does when it starts (``supervisor.Runner``)."""
    supervisor = Supervisor(app, [sys.executable, "-m", "ductwork.cli"], label=label)
    for child in supervisor.children:
        register(app, role=child.role, label=child.label)


# --------------------------------------------------------------------------- not a width: a NUL


class RaisesNul(Takes):
    """Raises a ValueError whose message holds a NUL character (text read from a binary file)."""

    def execute(self):
        raise ValueError(f"bad record {self.value}: b'\x00\x01'")


class FailsNul(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(RaisesNul)


def test_a_step_failure_whose_message_holds_a_nul_character_is_recorded_as_a_failure(manual_app):
    """Not a width, the same failure path: PostgreSQL's text holds no NUL character, which
    SQLite and MySQL store. Each attempt is a ``failure``, its message kept with the NUL
    written ``\\x00`` (``ErrorInfo``), retried within ``max_retry``. Before, on PostgreSQL,
    recording it failed and the execution was crashed instead, as for a class name too long."""
    run = FailsNul.trigger(1)
    raised = _as_a_fleet(manual_app)
    e = schema.executions
    with manual_app.begin(readonly=True) as tx:
        outcomes = tx.execute(sa.select(e.c.outcome).order_by(e.c.created_at, e.c.id)).scalars().all()
    assert ((run.refresh().status, run.halt_reasons), outcomes, raised) == (
        ("halted", ["job_retries_exhausted"]), ["failure"] * 3, {})
    with manual_app.begin(readonly=True) as tx:
        messages = set(tx.execute(sa.select(e.c.error_message)).scalars())
    assert messages == {"bad record 1: b'\\x00\x01'"}
