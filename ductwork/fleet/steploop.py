"""The event loop async steps run on: one per worker process, in a thread of its own.

    >>> outcomes = STEP_LOOP.run([fetch_one.execute(), fetch_two.execute()])   # from a worker thread
    [{'ok': True}, ValueError('boom')]

A worker thread that claimed several ``async def execute`` steps hands their coroutines
to this loop together and blocks until every one has ended; they run concurrently, so
a thread's claim of a hundred steps that each await a tenth of a second takes about a
tenth of a second, not ten (``bench/b7_async_steps.py``). Each coroutine's own result or
exception comes back in its place; one that fails does not cancel the others.

Why one loop per process, in a dedicated thread, and not one per worker thread:

- the loop outlives every claim, so what a step's module caches on it (an HTTP client
  session, a connection pool of an async driver) serves every later step of the process;
  with a loop per claim (``asyncio.run``) such objects would be bound to a closed loop;
- all the process's worker threads share it: a loop runs one callback at a time, so
  more loops would only add threads contending for the same interpreter lock;
- the worker threads stay what they are (synchronous: claim, run, record), and a caller
  that already runs a loop (``ductwork.testing.drain`` called from an async test) is
  never asked to run steps on its own loop.

The cost: a step that blocks the loop (a synchronous call inside ``async def execute``)
stalls every async step of its process, not only those of its own thread. Use
``await asyncio.to_thread(...)`` for blocking work (``Context.aget`` and ``Context.aset``
do).

Not done here: timeouts. A cancelled task may swallow its ``CancelledError`` or block
the loop, so an async step with ``timeout=`` runs in a child process that can be
killed, on an event loop of its own (``ductwork.fleet.child``), exactly as a plain one.
A worker thread interrupted while it waits (``KeyboardInterrupt`` in the inline
worker) cancels the coroutines it handed over and does not wait for them to end.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any


class StepLoop:
    """An event loop running forever in a daemon thread, started at first use (and again
    in a forked child, which does not inherit the thread). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started now if there is none in this process)."""
        with self._lock:
            if self._loop is None or self._pid != os.getpid() or not self._thread or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                ready = threading.Event()
                thread = threading.Thread(target=self._serve, args=(loop, ready), name="ductwork.steps.loop",
                                          daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread, self._pid = loop, thread, os.getpid()
            return self._loop

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()

    def start(self, coroutines: list[Coroutine[Any, Any, Any]]) -> Future[list[Any]]:
        """Start ``coroutines`` concurrently on the loop; :meth:`result` waits for them."""
        if threading.current_thread() is self._thread:
            for coroutine in coroutines:
                coroutine.close()
            raise RuntimeError("a step's coroutine cannot wait for steps on its own loop (this would deadlock)")
        return asyncio.run_coroutine_threadsafe(_all(coroutines), self.loop())

    @staticmethod
    def result(future: Future[list[Any]]) -> list[Any]:
        """Block until every coroutine :meth:`start` started has ended. Returns, in order,
        each one's value or the exception it raised (a ``CancelledError`` too)."""
        try:
            return future.result()
        except BaseException:
            future.cancel()  # the thread is leaving (interrupted): cancel what it handed over
            raise

    def run(self, coroutines: list[Coroutine[Any, Any, Any]]) -> list[Any]:
        """:meth:`start` then :meth:`result`."""
        return self.result(self.start(coroutines))


async def _all(coroutines: list[Coroutine[Any, Any, Any]]) -> list[Any]:
    return list(await asyncio.gather(*coroutines, return_exceptions=True))


#: this process's step loop
STEP_LOOP = StepLoop()
