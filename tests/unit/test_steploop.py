"""The step loop's two refusals (ductwork/fleet/steploop.py): a step's coroutine that
asks the loop it runs on to run more steps is refused at once (waiting would deadlock:
the loop would wait for itself), and a worker thread interrupted while it waits for its
coroutines cancels them instead of leaving them running; and the one loop serves every
batch (started once, not per batch)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from ductwork.fleet.steploop import StepLoop


def test_a_coroutine_waiting_for_steps_on_its_own_loop_is_refused():
    loop = StepLoop()
    handed: list = []

    async def inner():
        return 1

    async def waits_for_steps():  # what a step that runs a worker inside its coroutine does
        handed.append(inner())
        with pytest.raises(RuntimeError) as refused:
            loop.run(handed)
        return str(refused.value)

    assert loop.run([waits_for_steps()]) == [
        "a step's coroutine cannot wait for steps on its own loop (this would deadlock)"]
    assert handed[0].cr_frame is None  # closed, never awaited: no "never awaited" warning, no leak
    assert loop.run([inner()]) == [1]  # the loop serves on


def test_a_thread_interrupted_while_it_waits_cancels_its_coroutines():
    loop = StepLoop()
    started, cancelled = threading.Event(), threading.Event()

    async def awaits_forever():
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    future = loop.start([awaits_forever()])
    assert started.wait(10)

    def interrupted(timeout=None):  # noqa: ARG001 - Future.result's signature
        raise KeyboardInterrupt  # what Ctrl-C raises in the inline worker's blocked wait

    future.result = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        StepLoop.result(future)
    assert future.cancelled()
    assert cancelled.wait(10)  # the coroutine got its CancelledError on the loop


def test_one_loop_serves_every_batch_of_the_process():
    """The loop is started at first use and then reused: each batch of async steps runs on
    the same event loop in the same thread (a client or lock a step keeps for the next is
    bound to that loop), and no batch leaves a loop thread behind it."""
    loop = StepLoop()

    async def where():
        return asyncio.get_running_loop(), threading.current_thread()

    def loop_threads() -> int:  # (every StepLoop's thread serves forever: the count only grows)
        return sum(thread.name == "ductwork.steps.loop" for thread in threading.enumerate())

    before = loop_threads()
    first = loop.run([where(), where()])
    assert first[0] == first[1]
    assert loop_threads() == before + 1
    for _ in range(3):
        assert loop.run([where()]) == [first[0]]
    assert loop.loop() is first[0][0]
    assert loop_threads() == before + 1
