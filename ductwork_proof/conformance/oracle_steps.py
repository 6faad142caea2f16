"""Step classes whose behaviour an oracle decides: the engine side of pipeline conformance.

:mod:`ductwork_proof.conformance.strategies` generates definitions whose nodes use these
classes (``ductwork_proof.conformance.oracle_steps:Fetch`` …) and an oracle
``(node, input_args, attempt) -> Outcome``. Each step asks the oracle installed
with :func:`install` what to do, given its node and how many executions of it
already ended (read from the database, as the model counts them), and then
returns the value, raises (a failure), raises ``StepTimedOut`` as the timeout
path does, raises ``StepInvalid`` as an unresolvable class or unbindable input
does, or raises :class:`SimulatedCrash` (a ``BaseException``: the worker's
cleanup records the execution as crashed, exactly as a dying thread would).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ductwork import Pipeline, Step
from ductwork.db import schema

_current: dict[str, Any] = {}


class SimulatedCrash(BaseException):
    """Raised by a step the oracle crashes; the driving loop catches it."""


def install(app: Any, oracle: Any) -> None:
    _current["app"], _current["oracle"] = app, oracle


class Generated(Pipeline):
    """The pipeline every generated definition names (abstract: each scenario brings its
    definition). Only configured code runs: a worker resolves stored class names among
    the classes of the pipelines this process defined and the modules they come from, so
    this class is what makes this module's steps resolvable."""


class OracleStep(Step):
    def __init__(self, *args):
        self.args = list(args)

    def execute(self):
        from ductwork.fleet.invoke import StepInvalid, StepTimedOut
        from ductwork.limits.executions import ErrorInfo

        app, oracle = _current["app"], _current["oracle"]
        s, e = schema.steps, schema.executions
        with app.begin(readonly=True) as tx:
            node, attempt = tx.execute(
                sa.select(s.c.node, e.c.retry_count + e.c.crash_count)
                .join(e, e.c.step_id == s.c.id)
                # a revived step's key is the failed step's: its open execution tells them apart
                .where(sa.func.coalesce(s.c.idempotency_key, s.c.id) == self.idempotency_key,
                       e.c.completed_at.is_(None))).one()
        outcome = oracle(node, self.args, attempt)
        if outcome.kind == "success":
            return outcome.value
        if outcome.kind == "failure":
            raise RuntimeError(f"oracle: {node} fails attempt {attempt}")
        if outcome.kind == "timed_out":
            raise StepTimedOut(f"oracle: {node} times out on attempt {attempt}")
        if outcome.kind == "invalid":  # as a class that does not resolve or input that does not bind
            raise StepInvalid(ErrorInfo("builtins.TypeError", f"oracle: {node} is invalid", None))
        raise SimulatedCrash(f"oracle: {node} crashes on attempt {attempt}")


class Fetch(OracleStep):
    pass


class Push(OracleStep):
    pass


class Record(OracleStep):
    pass


class Check(OracleStep):
    pass


class Split(OracleStep):
    pass


class OnHalt(Step):
    """The on_halt handler of generated definitions: each attempt ends as the installed hook
    plan says (``install_hooks``), by the attempt's number read from the hook row, as the
    model counts it: ``success``, ``failure`` (raises) or ``process_crashed``
    (:class:`SimulatedCrash`: the worker's cleanup crashes the attempt, as a dying thread's
    would). Past the plan's end, it succeeds."""

    def __init__(self, halt):
        self.halt = halt

    def execute(self):
        app, plan = _current["app"], _current.get("hook_plan", [])
        h = schema.halt_hooks
        with app.begin(readonly=True) as tx:
            attempt = tx.execute(sa.select(h.c.retry_count + h.c.crash_count)
                                 .where(h.c.id == self.idempotency_key)).scalar_one()
        kind = plan[attempt] if attempt < len(plan) else "success"
        if kind == "failure":
            raise RuntimeError(f"oracle: on_halt fails attempt {attempt}")
        if kind == "process_crashed":
            raise SimulatedCrash(f"oracle: on_halt crashes on attempt {attempt}")


def install_hooks(plan: list[str]) -> None:
    """How each attempt of an on_halt hook ends (``OnHalt``), by attempt number."""
    _current["hook_plan"] = list(plan)
