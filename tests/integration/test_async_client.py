"""The async client (``Pipeline.atrigger``, ``Run.arefresh``, ``Run.await_completion``,
``App.arun``, ``Run.aresume``), on each database, with a loop-blocking detector.

The detector is deterministic (no wall-clock threshold), and a test fails on either of its
parts: a listener on the app's synchronous engine failing any statement run in the event
loop's thread (a sync driver call there blocks the loop, however fast the local database
answers); and wrappers, for the duration of the run, around the calls that wait in the
calling thread (``time.sleep``, ``threading.Event.wait``, ``threading.Condition.wait`` and
what waits through it: ``queue.Queue.get``, ``concurrent.futures.Future.result``,
``threading.Thread.join``, and the blocking socket calls), recording each made in the
loop's thread however short it is. Both are shown to fire on a blocking call.

Not detected: CPU-bound work on the loop (nothing waits; only a clock could tell), a bare
``threading.Lock.acquire`` (a C type whose methods cannot be replaced; a ``Condition``,
``Event``, ``Queue`` or ``Future`` wait goes through ``Condition.wait`` and is caught),
a name bound before the run (``from time import sleep``), and C extensions waiting
below Python (a sync driver's statement is caught by the engine listener instead).
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import aiomysql  # noqa: F401 - imported before any loop runs: a first import is slow, not blocking
import aiosqlite  # noqa: F401
import psycopg  # noqa: F401
import pytest
import sqlalchemy.ext.asyncio  # noqa: F401
from sqlalchemy import event

from ductwork import Pipeline, Step
from ductwork.errors import RunStateError, UnknownRunError
from ductwork.testing import drain
from tests.workloads import Approval


class Blocked(AssertionError):
    pass


#: The socket methods that wait for the peer when the socket is blocking (its timeout is
#: not 0); asyncio's own socket calls are on non-blocking sockets and pass.
_SOCKET_CALLS = ("accept", "connect", "recv", "recv_into", "recvfrom", "recvfrom_into",
                 "send", "sendall", "sendto")


def _waits(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether this call waits in its thread: a zero timeout (``Condition.wait(0)``, which
    ``threading.Semaphore.acquire(timeout=0)`` in asyncio's executor makes) or
    ``time.sleep(0)`` (a yield of the interpreter lock) does not; a non-blocking socket
    does not."""
    if name == "time.sleep":
        return bool(args and args[0] > 0)
    if name.startswith("socket."):
        return args[0].gettimeout() != 0
    timeout = kwargs.get("timeout", args[1] if len(args) > 1 else None)
    return timeout is None or timeout > 0


@contextmanager
def _blocking_calls_recorded(on_thread: Callable[[], bool]) -> Iterator[list[str]]:
    """Replaces the waiting calls (module docstring) while the block runs, restoring them
    after; yields the list of those made while ``on_thread()`` is true, each with its
    caller's stack. A wait nested in another (``Condition.wait`` in ``Event.wait``)
    is recorded once, as the outer. Excluded by call site: ``threading.Thread.start``, which waits for
    the new thread to say it started (a bounded hand-shake; asyncio's executor and
    aiosqlite start their threads from the loop)."""
    seen: list[str] = []
    inside = threading.local()
    thread_start = threading.Thread.start.__code__
    replaced: list[tuple[object, str, object]] = []

    def wrap(owner: object, attr: str, name: str) -> None:
        original = getattr(owner, attr)

        def recording(*args, **kwargs):
            if (on_thread() and not getattr(inside, "depth", 0) and _waits(name, args, kwargs)
                    and sys._getframe(1).f_code is not thread_start):
                stack = traceback.extract_stack(limit=8)[:-1]
                where = "".join(traceback.format_list(stack[-4:]))
                seen.append(f"{name} on the loop's thread, from:\n{where}")
            inside.depth = getattr(inside, "depth", 0) + 1
            try:
                return original(*args, **kwargs)
            finally:
                inside.depth -= 1

        replaced.append((owner, attr, original))
        setattr(owner, attr, recording)

    wrap(time, "sleep", "time.sleep")
    wrap(threading.Event, "wait", "threading.Event.wait")
    wrap(threading.Condition, "wait", "threading.Condition.wait")
    wrap(threading.Thread, "join", "threading.Thread.join")
    for call in _SOCKET_CALLS:
        wrap(socket.socket, call, f"socket.{call}")
    try:
        yield seen
    finally:
        for owner, attr, original in reversed(replaced):
            setattr(owner, attr, original)


def run_unblocked(app, main):
    """``asyncio.run(main())``; raises :class:`Blocked`, listing them, when the app's sync
    engine ran a statement in the loop's thread or a waiting call (module docstring) was
    made there while ``main()`` ran, however short. Timing plays no part: a loaded machine
    slows the loop without failing the test; CPU-bound work on the loop is not caught."""
    loop_thread: list[threading.Thread] = []
    running = threading.Event()
    sync_on_loop: list[str] = []

    def on_loop() -> bool:
        return running.is_set() and bool(loop_thread) and threading.current_thread() is loop_thread[0]

    def before(_conn, _cursor, statement, *_):
        if on_loop():
            sync_on_loop.append(statement)

    async def checked():
        loop_thread.append(threading.current_thread())
        running.set()
        try:
            return await main()
        finally:
            running.clear()  # asyncio.run's shutdown (joining its executor) is not main's

    event.listen(app.engine, "before_cursor_execute", before)
    try:
        with _blocking_calls_recorded(on_loop) as waits:
            result = asyncio.run(checked())
    finally:
        event.remove(app.engine, "before_cursor_execute", before)
    if sync_on_loop or waits:
        raise Blocked("the event loop was blocked by:\n" + "\n".join(sync_on_loop + waits))
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


def test_await_completion_gives_up_when_the_clock_reads_its_deadline(app, monkeypatch):
    """``await_completion`` on a run in progress (no worker here) reads it every ``poll`` s
    and raises TimeoutError as soon as the clock reads the deadline, not a read later: with a
    monotonic clock that moves 0.25 s per read of the run, a 0.5 s timeout is two reads."""
    from types import SimpleNamespace

    from ductwork.pipelines import runs as runs_module

    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr(runs_module, "time", SimpleNamespace(monotonic=lambda: clock.now))
    reads: list[float] = []

    async def main():
        run = await AddP.atrigger(1, 2)
        read = run.arefresh

        async def timed_read():
            reads.append(clock.now)
            await read()
            clock.now += 0.25
            return run

        run.arefresh = timed_read
        with pytest.raises(TimeoutError, match=rf"^run {run.id} still in_progress after 0\.5 s$"):
            await run.await_completion(timeout=0.5, poll=0.01)

    run_unblocked(app, main)
    assert reads == [100.0, 100.25]


def test_arun_and_aresume_never_block_the_loop(app):
    """``app.arun(id)`` is a handle read through the async driver (an unknown id raises
    ``UnknownRunError``); ``run.aresume(input)`` resumes a dampened run once, in a thread
    (a second one raises ``RunStateError``, as ``resume`` does)."""
    run = Approval.trigger(3)
    drain(app)
    assert run.refresh().status == "dampened"

    async def main():
        handle = await app.arun(run.id)
        assert (handle.id, handle.status) == (run.id, "dampened")
        with pytest.raises(UnknownRunError):
            await app.arun("no-such-run")
        resumed = await handle.aresume(input=7)
        assert resumed is handle
        assert handle.status == "in_progress"
        with pytest.raises(RunStateError, match="nothing to resume"):
            await handle.aresume()
        worker = asyncio.create_task(asyncio.to_thread(drain, app))
        settled = await handle.await_completion(timeout=60, poll=0.02)
        await worker
        return settled

    settled = run_unblocked(app, main)
    assert settled.status == "completed"
    assert settled.steps()[-1].output == 7  # the resume's input, Quick's output


def test_an_apps_first_read_may_be_async_its_schema_checked_off_the_loop(app):
    """An App whose only use so far is a trigger in the caller's async transaction (which
    checks nothing: the caller's connection) checks the schema before its first ``aread``,
    in a thread: a sync check on the loop would block it."""
    from ductwork.db import engines
    from tests.conftest import make_app

    fresh = make_app(app.url)

    async def main():
        engine = engines.create_async_engine(app.url)
        try:
            async with engine.begin() as conn:
                run = await AddP.atrigger(1, 2, connection=conn, app=fresh)
            assert not fresh._schema_checked
            return (await run.arefresh()).status
        finally:
            await engine.dispose()

    try:
        assert run_unblocked(fresh, main) == "in_progress"
        assert fresh._schema_checked
    finally:
        fresh.dispose()


def test_the_detector_fails_a_blocking_call(app):
    """Each part fires on a call that blocks the loop, however short: a sync statement, a
    10 ms sleep, a thread wait, a recv on a blocking socket. The same waits in a worker
    thread, on a non-blocking socket through the loop, or once ``main`` returned, pass."""
    originals = (time.sleep, socket.socket.recv)
    run = AddP.trigger(1, 2)

    async def sync_refresh():
        run.refresh()  # the sync client inside a coroutine: blocks the loop

    with pytest.raises(Blocked, match="SELECT"):
        run_unblocked(app, sync_refresh)

    async def sleeps():
        time.sleep(0.01)  # the detected call itself: short, below any clock threshold

    with pytest.raises(Blocked, match=r"(?s)time\.sleep on the loop's thread, from:\n.*in sleeps"):
        run_unblocked(app, sleeps)

    async def waits_for_a_thread():
        done = threading.Event()
        threading.Thread(target=done.set).start()  # Thread.start's own hand-shake passes
        done.wait()

    with pytest.raises(Blocked, match=r"(?s)threading\.Event\.wait on.*in waits_for_a_thread") as caught:
        run_unblocked(app, waits_for_a_thread)
    assert str(caught.value).count("on the loop's thread") == 1  # not again for its Condition.wait

    async def reads_a_blocking_socket():
        a, b = socket.socketpair()
        with a, b:
            a.sendall(b"x")
            assert b.recv(1) == b"x"  # the byte is there: it returns at once, yet may wait

    with pytest.raises(Blocked, match=r"(?s)socket\.sendall on.*socket\.recv on") as caught:
        run_unblocked(app, reads_a_blocking_socket)
    assert "in reads_a_blocking_socket" in str(caught.value)

    async def waits_the_right_way():
        await asyncio.to_thread(time.sleep, 0.01)  # in a worker thread
        a, b = socket.socketpair()
        with a, b:
            a.setblocking(False)
            b.setblocking(False)
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(a, b"x")
            return await loop.sock_recv(b, 1)

    assert run_unblocked(app, waits_the_right_way) == b"x"
    assert (time.sleep, socket.socket.recv) == originals  # the wrappers are gone after a run


def test_atrigger_passes_its_checks_on():
    from ductwork.errors import InputError

    with pytest.raises(InputError, match="cannot take the arguments"):
        asyncio.run(AddP.atrigger(1, 2, 3))


def test_atrigger_in_the_callers_async_transaction_commits_or_rolls_back_with_it(app):
    """``atrigger(connection=AsyncConnection)`` writes through the caller's transaction on
    the loop (the async driver), never blocking it: a rollback leaves nothing, a commit the
    run, and a second keyed trigger in another transaction returns that run [INV-TRG-2]."""
    from ductwork.db import engines

    async def main():
        engine = engines.create_async_engine(app.url)
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


#: a process without the async extra (``pip install ductwork``: no greenlet, so no SQLAlchemy
#: asyncio extension) calls each async method, then runs async steps; prints what each said
_WITHOUT_THE_EXTRA = """
import asyncio, importlib.abc, json, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] == "greenlet":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
import ductwork
from ductwork.errors import MissingExtraError
from ductwork.testing import drain
from tests.integration.test_async_steps import Mixed
from tests.workloads import Approval

app = ductwork.connect(sys.argv[1])
run = app.run(sys.argv[2])
said = {}

async def each():
    for name, call in (("atrigger", lambda: Approval.atrigger(1)), ("arefresh", run.arefresh),
                       ("await_completion", lambda: run.await_completion(1)), ("arun", lambda: app.arun(run.id)),
                       ("aresume", lambda: run.aresume(2))):
        try:
            await call()
            said[name] = "no error"
        except MissingExtraError as error:
            said[name] = str(error)

asyncio.run(each())
mixed = Mixed.trigger(5)
drain(app)
said["async steps"] = [step.output for step in mixed.steps()]
print(json.dumps(said))
"""


def test_without_the_async_extra_each_async_method_names_it_before_writing(app):
    """Without greenlet, every async method raises MissingExtraError naming
    ``pip install 'ductwork[async]'`` before it writes: no run from ``atrigger``, the
    dampened run not resumed by ``aresume``. Async steps need no extra (their event loop
    is the standard library's): they run."""
    import json
    import subprocess
    from pathlib import Path

    from ductwork.pipelines.history import list_runs

    run = Approval.trigger(3)
    drain(app)
    assert run.refresh().status == "dampened"
    done = subprocess.run([sys.executable, "-c", _WITHOUT_THE_EXTRA, app.url, run.id],
                          cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    needs = "needs greenlet, which is not installed: pip install 'ductwork[async]' (nothing was written)"
    assert json.loads(done.stdout) == {
        "atrigger": f"Approval.atrigger {needs}", "arefresh": f"Run.arefresh {needs}",
        "await_completion": f"Run.await_completion {needs}", "arun": f"App.arun {needs}",
        "aresume": f"Run.aresume {needs}", "async steps": [10, 11, 22]}
    assert [r.id for r in list_runs(app, pipeline="Approval")] == [run.id]
    assert run.refresh().status == "dampened"
