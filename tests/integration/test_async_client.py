"""The async client (``Pipeline.atrigger``, ``Run.arefresh``, ``Run.await_completion``), on
each database, with a loop-blocking detector.

The detector has two parts, and a test fails on either: asyncio's debug mode with
``slow_callback_duration`` small, its "Executing … took" warning turned into a failure
by a logging handler; and a listener on the app's synchronous engine failing any
statement run in the event loop's thread (a sync driver call there blocks the loop,
however fast the local database answers). Both are shown to fire on a blocking call.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import aiomysql  # noqa: F401 - imported before any loop runs: a first import is slow, not blocking
import aiosqlite  # noqa: F401
import psycopg  # noqa: F401
import pytest
import sqlalchemy.ext.asyncio  # noqa: F401
from sqlalchemy import event

from ductwork import Pipeline, Step
from ductwork.errors import UnknownRunError
from ductwork.testing import drain

#: asyncio debug mode's threshold. A sync database call is caught by the engine listener
#: however fast it is; this catches any other blocking (a sleep, a CPU-bound loop). It is
#: above what a callback waits for the interpreter lock while a drain thread works beside
#: the loop on a loaded two-core machine (0.15 s was seen for an aiomysql connect that
#: takes 2 ms alone).
SLOW_CALLBACK_S = 0.25


class Blocked(AssertionError):
    pass


class _SlowCallbacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Executing") and " took " in message:
            self.seen.append(message)


def run_unblocked(app, main):
    """``asyncio.run(main())`` in debug mode; raises :class:`Blocked` when a callback took
    longer than SLOW_CALLBACK_S or the app's sync engine ran a statement in the loop's thread."""
    handler = _SlowCallbacks()
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.addHandler(handler)
    loop_thread: list[threading.Thread] = []
    sync_on_loop: list[str] = []

    def before(_conn, _cursor, statement, *_):
        if loop_thread and threading.current_thread() is loop_thread[0]:
            sync_on_loop.append(statement)

    async def checked():
        asyncio.get_running_loop().slow_callback_duration = SLOW_CALLBACK_S
        loop_thread.append(threading.current_thread())
        return await main()

    event.listen(app.engine, "before_cursor_execute", before)
    try:
        result = asyncio.run(checked(), debug=True)
    finally:
        event.remove(app.engine, "before_cursor_execute", before)
        asyncio_log.removeHandler(handler)
    if handler.seen or sync_on_loop:
        raise Blocked(f"the event loop was blocked: {handler.seen + sync_on_loop}")
    return result


class Add(Step):
    def __init__(self, a, b):
        self.a, self.b = a, b

    def execute(self):
        return self.a + self.b


class AddP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Add)


def test_atrigger_arefresh_and_await_completion_never_block_the_loop(app):
    async def main():
        runs = await asyncio.gather(*(AddP.atrigger(i, 1) for i in range(5)))
        assert [(await r.arefresh()).status for r in runs] == ["in_progress"] * 5
        worker = asyncio.create_task(asyncio.to_thread(drain, app))  # the fleet's part, in a thread
        settled = await asyncio.gather(*(r.await_completion(timeout=60, poll=0.02) for r in runs))
        await worker
        return settled

    runs = run_unblocked(app, main)
    assert [r.status for r in runs] == ["completed"] * 5
    assert [r.steps()[0].output for r in runs] == [1, 2, 3, 4, 5]


def test_await_completion_times_out_and_arefresh_of_an_unknown_run_raises(app):
    async def main():
        run = await AddP.atrigger(1, 2)
        with pytest.raises(TimeoutError, match="still in_progress"):
            await run.await_completion(timeout=0.2, poll=0.05)
        run.id = "no-such-run"
        with pytest.raises(UnknownRunError):
            await run.arefresh()

    run_unblocked(app, main)


def test_the_detector_fails_a_blocking_call(app):
    run = AddP.trigger(1, 2)

    async def sync_refresh():
        run.refresh()  # the sync client inside a coroutine: blocks the loop

    with pytest.raises(Blocked, match="SELECT"):
        run_unblocked(app, sync_refresh)

    async def sleeps():
        import time

        time.sleep(SLOW_CALLBACK_S * 3)

    with pytest.raises(Blocked, match="Executing"):
        run_unblocked(app, sleeps)


def test_atrigger_passes_its_checks_on():
    from ductwork.errors import InputError

    with pytest.raises(InputError, match="cannot take the arguments"):
        asyncio.run(AddP.atrigger(1, 2, 3))


def test_atrigger_in_the_callers_async_transaction_commits_or_rolls_back_with_it(app):
    """``atrigger(connection=AsyncConnection)`` writes through the caller's transaction on
    the loop (the async driver), never blocking it: a rollback leaves nothing, a commit the
    run, and a second keyed trigger in another transaction returns that run [INV-TRG-2]."""
    from ductwork.db import dialects

    async def main():
        engine = dialects.create_async_engine(app.url)
        try:
            async def order_that_fails():
                async with engine.begin() as conn:
                    await AddP.atrigger(1, 2, connection=conn, key="order-rolled-back")
                    raise RuntimeError("the order failed")

            with pytest.raises(RuntimeError, match="the order failed"):
                await order_that_fails()
            async with engine.begin() as conn:
                run = await AddP.atrigger(3, 4, connection=conn, key="order-1")
                assert run.status == "in_progress"  # read through the caller's transaction
            async with engine.begin() as conn:
                again = await AddP.atrigger(5, 6, connection=conn, key="order-1")
            return run, again
        finally:
            await engine.dispose()

    run, again = run_unblocked(app, main)
    assert again.id == run.id
    from ductwork import list_runs

    assert [r.id for r in list_runs(app=app)] == [run.id]  # the rolled-back trigger left nothing
    drain(app)
    assert run.refresh().status == "completed"
    assert run.steps()[0].output == 7


def test_atrigger_refuses_a_synchronous_connection(app):
    from ductwork.errors import TriggerConnectionError

    async def main():
        with app.engine.connect() as conn, pytest.raises(TriggerConnectionError, match="AsyncConnection"):
            await AddP.atrigger(1, 2, connection=conn)

    asyncio.run(main())
