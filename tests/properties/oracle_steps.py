"""Step classes whose behaviour an oracle decides: the engine side of pipeline conformance.

``tests/properties/strategies.py`` generates definitions whose nodes use these
classes (``tests.properties.oracle_steps:Fetch`` …) and an oracle
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
        from ductwork.fleet.worker import StepInvalid, StepTimedOut
        from ductwork.limits.executions import ErrorInfo

        app, oracle = _current["app"], _current["oracle"]
        s, j, e = schema.steps, schema.jobs, schema.executions
        with app.begin(readonly=True) as tx:
            node, attempt = tx.execute(
                sa.select(s.c.node, e.c.retry_count + e.c.crash_count)
                .join(j, j.c.step_id == s.c.id).join(e, e.c.job_id == j.c.id)
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
