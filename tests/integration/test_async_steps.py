"""Async steps (``async def execute``), on each database.

Checks: an async step's value flows on like a plain one's, mixed with plain steps in one
pipeline; its failures are retried within ``max_retry`` and its idempotency key is stable
across its executions [INV-EXE-3, INV-EXE-4]; ``Context.aget``/``aset`` keep the set-once
guarantee [INV-CTX-1]; a worker awaits the async steps of one claim together (they
overlap on the step loop); an async step with ``timeout=`` is killed at its deadline
[INV-EXE-5]; a keyed lane's concurrency holds while async steps run together [INV-LIM-1].
Timing claims are in bench/b7_async_steps.py, not here.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from ductwork import Pipeline, Step
from ductwork.fleet.worker import Worker
from ductwork.testing import drain
from tests.conftest import installed as _installed
from tests.conftest import make_app
from tests.workloads import Add1, Takes

installed = contextlib.contextmanager(_installed)

SEEN: dict[str, list] = {}
LOCK = threading.RLock()


def seen(name: str, value: object) -> None:
    with LOCK:
        SEEN.setdefault(name, []).append(value)


def executions_of(run):
    """The executions of the run's first step."""
    return run.history().steps[0].executions


class AsyncDouble(Takes):
    async def execute(self):
        await asyncio.sleep(0)
        return self.value * 2


class Mixed(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(AsyncDouble).chain(to=Add1).chain(to=AsyncDouble)


def test_a_mix_of_async_and_plain_steps_runs_in_order(app):
    run = Mixed.trigger(5)
    drain(app)
    assert run.refresh().status == "completed"
    assert [s.output for s in run.steps()] == [10, 11, 22]


class AsyncFlaky(Step):
    """Fails at its first execution, remembered with Context.aset; returns what aget reads."""

    def __init__(self, tag):
        self.tag = tag

    async def execute(self):
        seen("keys", self.idempotency_key)
        try:
            await self.context.aset("attempted", self.tag)
        except self.context.OverwriteError:
            return await self.context.aget("attempted")
        raise RuntimeError("first attempt fails")


class FlakyP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(AsyncFlaky)


def test_an_async_failure_is_retried_with_the_same_key_and_context(app):
    SEEN.clear()
    run = FlakyP.trigger("t")
    drain(app)
    assert run.refresh().status == "completed"
    assert run.steps()[0].output == "t"
    executions = executions_of(run)
    assert [e.outcome for e in executions] == ["failure", "success"]
    assert "first attempt fails" in executions[0].error.message
    assert len(SEEN["keys"]) == 2
    assert len(set(SEEN["keys"])) == 1


class Meet(Step):
    """Waits until ``n`` steps of its claim are inside ``execute`` at once: only steps
    awaited together can all get there (each one alone would wait forever)."""

    def __init__(self, n, patience=30):
        self.n = n
        self.patience = patience

    async def execute(self):
        seen("inside", self.idempotency_key)
        async with asyncio.timeout(self.patience):
            while True:
                with LOCK:
                    if len(SEEN["inside"]) >= self.n:
                        return self.n
                await asyncio.sleep(0.005)


class MeetP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Meet)


def test_one_worker_awaits_the_async_steps_of_its_claim_together(db_url):
    SEEN.clear()
    SEEN["inside"] = []
    with installed(make_app(db_url, job_worker={"batch_size": 8})) as app:
        runs = [MeetP.trigger(8) for _ in range(8)]
        worker = Worker(app, batch_size=8)
        worker.batch = 8  # (a fresh worker takes one until it has a pace; async claims take batch_size)
        while worker.run_once() is not None:
            pass
        assert [r.refresh().status for r in runs] == ["completed"] * 8
        assert worker.batch == 8


class Sleepy(Step):
    def __init__(self, seconds):
        self.seconds = seconds

    async def execute(self):
        await asyncio.sleep(self.seconds)
        return "woke"


class TimedP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Sleepy, timeout=0.5)


def test_an_async_step_past_its_timeout_is_killed(app):
    run = TimedP.trigger(600)
    worker = Worker(app)
    assert worker.run_once().outcome == "timed_out"  # [INV-EXE-5] killed and reaped before this
    assert executions_of(run)[0].outcome == "timed_out"
    quick = TimedP.trigger(0)
    drain(app)
    assert quick.refresh().status == "completed"


class Counted(Takes):
    """Records how many steps of its key run at once."""

    running = 0

    async def execute(self):
        with LOCK:
            Counted.running += 1
            seen("peak", Counted.running)
        await asyncio.sleep(0.01)
        with LOCK:
            Counted.running -= 1
        return self.value


class KeyedP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Counted, limit_by="k")


def test_async_steps_together_keep_their_keys_concurrency(db_url):
    SEEN.clear()
    with installed(make_app(db_url, job_worker={"batch_size": 16, "limits": {"k": {"concurrency": 3}}})) as app:
        runs = [KeyedP.trigger(i) for i in range(12)]
        stop = threading.Event()
        workers = [Worker(app, batch_size=16) for _ in range(2)]

        def work(w):
            while not stop.is_set():
                w.run_once()

        threads = [threading.Thread(target=work, args=(w,)) for w in workers]
        for t in threads:
            t.start()
        try:
            for run in runs:
                run.wait(timeout=60, poll=0.02)
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert max(SEEN["peak"]) <= 3  # [INV-LIM-1]
        assert [r.refresh().status for r in runs] == ["completed"] * 12


@pytest.mark.parametrize("case", ["raises", "cancels_itself", "exits"])
def test_an_async_step_that_cancels_itself_or_raises_fails(app, case):
    """A step's own exception fails it; so do a cancellation it asked for nobody and a
    SystemExit, which would otherwise stop the loop every thread's async steps share."""
    run = Odd.trigger(case)
    worker = Worker(app)
    assert worker.run_once().outcome == "failure"
    execution = executions_of(run)[0]
    assert execution.error.klass == ("builtins.ValueError" if case == "raises"
                                     else "ductwork.execute.AsyncStepInterrupted")
    if case == "exits":
        assert "SystemExit(3)" in execution.error.message


class OddStep(Step):
    def __init__(self, case):
        self.case = case

    async def execute(self):
        if self.case == "raises":
            raise ValueError("no")
        if self.case == "exits":
            raise SystemExit(3)
        asyncio.current_task().cancel()
        await asyncio.sleep(1)


class Odd(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(OddStep)


class ReturnsACoroutine(Takes):
    """A plain ``execute`` that returns a coroutine (it delegates to an async helper)."""

    async def _double(self):
        await asyncio.sleep(0)
        return self.value * 2

    def execute(self):
        return self._double()


class Delegating(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(ReturnsACoroutine).chain(to=Add1)


def test_a_plain_execute_returning_a_coroutine_has_it_awaited(app):
    """``execute`` is not ``async def`` but returns a coroutine: the worker runs it as a
    plain step and awaits what it returned on the step loop; its value flows on."""
    run = Delegating.trigger(5)
    drain(app, timeout=60)
    assert run.refresh().status == "completed"
    assert [s.output for s in run.steps()] == [10, 11]


class Awaiting(Takes):
    async def execute(self):
        await asyncio.sleep(0.2)
        return self.value


class AwaitingP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Awaiting)


@pytest.mark.parametrize("action", ["kill", "raise"])
def test_a_worker_stopped_while_its_async_steps_await_loses_nothing(app, db_url, action):
    """A worker process killed (or failing) at ``while_async_steps_await``, its claimed
    async steps in the middle of their awaits: once its row is reaped, the executions it
    held are crashed and re-run, and every step succeeds exactly once [INV-EXE-2]."""
    from tests.conftest import TEST_CONFIG
    from tests.integration.fault_child import run_then_reap

    runs = [AwaitingP.trigger(i) for i in range(6)]
    config = {**TEST_CONFIG, "pipelines": ["tests.integration.test_async_steps:AwaitingP"]}
    run_then_reap(app, db_url, config, "async-child", f"while_async_steps_await:{action}:2")
    drain(app, timeout=60)
    assert [r.refresh().status for r in runs] == ["completed"] * 6
    assert [r.steps()[0].output for r in runs] == list(range(6))
    outcomes = [[e.outcome for e in executions_of(r)] for r in runs]
    assert all(o.count("success") == 1 for o in outcomes), outcomes  # [INV-EXE-2]
    assert any("process_crashed" in o for o in outcomes), outcomes  # the held ones were re-run
