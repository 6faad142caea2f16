"""Running one step in a child process that can be killed: the home of ``timeout=``.

    >>> value = run_in_child(app, claimed)     # raises StepTimedOut after the timeout

Python threads cannot be killed, so a step that declares ``timeout=`` runs in a
fresh interpreter (``python -m ductwork.fleet.child``) in its own process group. The
child tells the parent the moment it calls ``execute``; the timeout is measured
from then (execution start), so interpreter start-up never eats into it (start-up
has its own deadline, ``STARTUP_S``). Past the deadline the parent SIGKILLs the
whole group (and any descendant that left it, ``fleet/tree.py``) and waits until the
child is reaped by the OS, and only then is the
execution recorded ``timed_out`` and its concurrency slot freed [INV-EXE-5]. The
child is a keeper (:func:`_keep`): the step runs in a process of its own below it, and
when the worker's process dies (``PR_SET_PDEATHSIG`` on Linux) the keeper kills that
process and everything below it, the orphans of the step's subprocesses included (it is
their subreaper), so a killed worker leaves no step code and nothing it started running,
with or without a supervisor above it.

An async step with ``timeout=`` runs here too, on an event loop of its own
(``asyncio.run``): cancelling its task could not stop code that blocks the loop or
ignores the cancellation, a kill does.

Costs and limits: one interpreter start per execution (tens of milliseconds);
the child imports the run's pipeline by its module path (the parent checked that
it and the step class are of its configured pipelines), so both must be defined
at module level;
its return value crosses back as JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from ductwork.fleet import tree

if TYPE_CHECKING:
    from ductwork.db.database import Database
    from ductwork.limits.executions import Claimed

STARTUP_S = 60.0
RUNNING = b"R"


def run_in_child(app: Database, claimed: Claimed) -> Any:
    """Run the claimed step in a child process; returns its value or raises.

    Raises ``StepTimedOut`` (killed at the deadline), ``ChildStepError`` (the step
    raised), ``ReturnRejected`` (its return value cannot be stored), ``StepInvalid``
    (the child cannot resolve the class or bind the input) or ``BuildFailed``
    (``__init__`` raised, or the child died or never started).
    """
    assert claimed.timeout_us, "run_in_child runs a timeout= step"
    request = {
        "url": app.url, "sys_path": [p for p in sys.path if p], "klass": claimed.klass,
        "pipeline": claimed.pipeline_klass, "input_json": claimed.input_json,
        "idempotency_key": claimed.idempotency_key,
        "run_id": claimed.run_id,
    }
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ductwork.fleet.child", str(write_fd), str(os.getpid())],
        stdin=subprocess.PIPE, pass_fds=(write_fd,), start_new_session=True,
        env=tree.marked_environment(),  # [INV-EXE-5] what it starts is found by this process's mark
    )
    os.close(write_fd)
    try:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(request).encode())
        proc.stdin.close()
        chunks = _read_within_deadlines(proc, read_fd, claimed.klass, claimed.timeout_us / 1_000_000)
        proc.wait()
    finally:
        os.close(read_fd)
        if proc.poll() is None:
            _kill_group(proc)
    return _reply(proc, chunks)


def _read_within_deadlines(proc: subprocess.Popen[bytes], read_fd: int, klass: str, timeout_s: float) -> list[bytes]:
    """The child's reply, read until it closes the pipe: the start-up deadline
    (``STARTUP_S``) until the child says it is running, then ``timeout_s`` from there.
    Past a deadline the child's group is killed and reaped first [INV-EXE-5], then
    ``StepTimedOut`` (it was running) or ``BuildFailed`` (it never started) is raised."""
    from ductwork.fleet.invoke import BuildFailed, StepTimedOut
    from ductwork.limits.executions import ErrorInfo

    chunks: list[bytes] = []
    deadline = time.monotonic() + STARTUP_S
    running = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _kill_group(proc)  # [INV-EXE-5] stopped and reaped before the outcome is recorded
            if running:
                raise StepTimedOut(f"{klass} ran past its timeout of {timeout_s:g} s; killed")
            raise BuildFailed(ErrorInfo("ductwork.ChildStartup",
                                        f"step child did not start within {STARTUP_S:g} s; killed", None))
        if not select.select([read_fd], [], [], remaining)[0]:  # nothing to read yet: the deadline again
            continue
        chunk = os.read(read_fd, 65536)
        if not chunk:
            return chunks
        if not running and not chunks and chunk.startswith(RUNNING):
            running, chunk = True, chunk[len(RUNNING):]
            deadline = time.monotonic() + timeout_s  # measured from execution start
        if chunk:
            chunks.append(chunk)


def _reply(proc: subprocess.Popen[bytes], chunks: list[bytes]) -> Any:
    """The step's value from the exited child's reply, or the error it reports raised (of
    the ``kind`` it names: the step's own by default)."""
    from ductwork.fleet.invoke import BuildFailed, ChildStepError, ReturnRejected, StepInvalid
    from ductwork.limits.executions import ErrorInfo

    if not chunks:
        raise BuildFailed(ErrorInfo("ductwork.ChildDied",
                                    f"step child exited with status {proc.returncode} without a result", None))
    message = json.loads(b"".join(chunks))
    if "ok" in message:
        return json.loads(message["ok"])
    kinds = {"returned": ReturnRejected, "invalid": StepInvalid, "build": BuildFailed}
    raise kinds.get(message.get("kind"), ChildStepError)(ErrorInfo(**message["error"]))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child, its process group, and every descendant that left the group
    (``setsid``), then wait for the child [INV-EXE-5]."""
    below = tree.descendants(proc.pid)  # read before the kill: orphans lose their link to it
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    tree.kill(below)
    proc.wait()


#: what a keeper gets when the worker's process dies (a signal it can handle, unlike SIGKILL)
KEEPER_SIGNAL = signal.SIGTERM
#: how long a keeper whose worker died goes on killing what appears below it
KEEPER_KILL_S = 5.0


def _keep(parent: int, out: int) -> None:
    """Split into a keeper and the step's process; returns in the latter only.

    The keeper (this process, the one the worker started and waits for) is a subreaper
    that does nothing but wait for the step's process, which dies with it. When the
    worker's process dies (SIGKILLed in an adopter's process that ran ``drain()`` or
    ``Worker.run_once``, with no supervisor to adopt what is left), the keeper is told
    (``KEEPER_SIGNAL``) and kills every process below it, the step's and those its
    subprocesses left (re-parented to the keeper), before it exits [INV-EXE-5]. It then
    exits as the step's process did. Not Linux: no keeper, the step runs here (the
    worker's kill of the group at a timeout still applies)."""
    signal.signal(KEEPER_SIGNAL, _worker_died)
    if not tree.die_with_parent(KEEPER_SIGNAL):  # pragma: no cover - not Linux
        signal.signal(KEEPER_SIGNAL, signal.SIG_DFL)
        return
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)
    tree.become_subreaper()  # [INV-EXE-5] what the step's subprocesses leave is re-parented here
    keeper = os.getpid()
    step = os.fork()
    if step == 0:
        signal.signal(KEEPER_SIGNAL, signal.SIG_DFL)
        tree.die_with_parent(signal.SIGKILL)  # [INV-EXE-5] the step's process dies with its keeper
        if os.getppid() != keeper:  # pragma: no cover  the keeper died before the signal was armed
            os._exit(1)
        return
    os.close(out)  # the step's process writes the result: the worker reads until it closes it
    os.close(0)
    _, status = os.waitpid(step, 0)
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


def _worker_died(_signum: int, _frame: object) -> None:
    """The keeper's ``KEEPER_SIGNAL``: SIGKILL every process below the keeper, again while
    new ones appear (each round reaps what died, so the orphans of the killed are seen),
    then exit [INV-EXE-5]."""
    deadline = time.monotonic() + KEEPER_KILL_S
    while (left := tree.descendants(os.getpid())) and time.monotonic() < deadline:
        tree.kill(left)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        time.sleep(0.01)
    os._exit(1)


def main() -> None:
    out, parent = int(sys.argv[1]), int(sys.argv[2])
    _keep(parent, out)
    request = json.loads(sys.stdin.read())
    sys.path[:0] = [p for p in request["sys_path"] if p not in sys.path]

    from ductwork.config_file import config_from_mapping
    from ductwork.db.database import Database
    from ductwork.errors import StepReturnError
    from ductwork.fleet.invoke import BuildFailed, StepInvalid, build_step, returned
    from ductwork.limits.executions import ErrorInfo
    from ductwork.pipelines.payloads import dump
    from ductwork.pipelines.pipeline import import_pipeline

    app = Database(request["url"], config_from_mapping({"default": {}}))
    pipe = os.fdopen(out, "wb")
    try:
        # The parent resolved both names among its configured pipelines' classes: import
        # that pipeline's module (its define() registers the step class), nothing else.
        try:
            import_pipeline(request["pipeline"])
        except Exception as error:  # the module no longer imports: it will not next time
            raise StepInvalid(ErrorInfo.of(error)) from error
        instance = build_step(app, request["klass"], request["input_json"], request["idempotency_key"],
                              request["run_id"])
        pipe.write(RUNNING)
        pipe.flush()
        value = instance.execute()
        if asyncio.iscoroutine(value):  # an async step: on a loop of its own, killed with the child
            value = asyncio.run(value)
        try:
            message: dict[str, Any] = {"ok": dump(value, returned(request["klass"], value))}
        except StepReturnError as error:  # the parent fails the execution once (ReturnRejected)
            message = {"kind": "returned", "error": vars(ErrorInfo.of(error))}
    except (StepInvalid, BuildFailed) as refused:  # raised again in the parent as the kind named (_reply)
        message = {"kind": "invalid" if isinstance(refused, StepInvalid) else "build", "error": vars(refused.info)}
    except BaseException as error:  # noqa: BLE001 - reported to the parent, which records it (SystemExit too)
        message = {"error": vars(ErrorInfo.of(error))}
    with pipe:
        pipe.write(json.dumps(message).encode())  # (only str and None: ``dump``'s text, ErrorInfo's fields, kind)
    app.dispose()


if __name__ == "__main__":
    main()
