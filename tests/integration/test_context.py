"""The run-scoped Context and idempotency keys, on each database.

Checks: INV-CTX-1 (a key is set once per run; of racing setters exactly one wins),
INV-EXE-3 (the key a step sees is its step id, stable across its executions).
"""

from __future__ import annotations

import threading

import pytest

from ductwork import Context, Pipeline, Step
from ductwork.errors import InputError, OverwriteError
from ductwork.testing import drain

SEEN: dict[str, list] = {}


class Remember(Step):
    """Fails once, then succeeds; records its idempotency key each time."""

    def __init__(self, value):
        self.value = value

    def execute(self):
        SEEN.setdefault("keys", []).append(self.idempotency_key)
        try:
            self.context.set("attempted", True)
        except self.context.OverwriteError:
            return self.context.get("attempted")
        raise RuntimeError("first attempt fails")


class RememberP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Remember).chain(to=Remember)


def test_set_get_overwrite(app):
    run = RememberP.trigger("x")
    context = Context(app, run.id)
    assert context.get("k") is None
    assert context.set("k", {"a": [1, 2]}) == {"a": [1, 2]}
    assert context.get("k") == {"a": [1, 2]}
    with pytest.raises(OverwriteError, match="'k' is already set"):
        context.set("k", 3)
    assert context.set("k", 3, overwrite=True) == 3
    assert context.get("k") == 3
    assert Context(app, RememberP.trigger("y").id).get("k") is None  # scoped to the run


@pytest.mark.parametrize("bad", [None, "", 7, "x" * 256, "total ", "\x00total"])
def test_bad_keys_and_values_are_named(app, bad):
    run = RememberP.trigger("x")
    with pytest.raises(InputError):
        Context(app, run.id).set(bad, 1)
    with pytest.raises(InputError, match="not JSON-serialisable"):
        Context(app, run.id).set("ok", object())


def test_each_key_of_a_run_reads_its_own_value_up_to_the_longest_key(app):
    """Several keys in one run, the longest 255 characters (the column's width, accepted):
    ``get`` reads each key's own value, and a key never set reads None."""
    run = RememberP.trigger("x")
    context = Context(app, run.id)
    values = {"a": 1, "b": [2], "x" * 255: "longest"}
    for key, value in values.items():
        context.set(key, value)
    assert {key: context.get(key) for key in [*values, "c"]} == {**values, "c": None}


def test_racing_setters_one_wins(app):
    run = RememberP.trigger("x")
    racers = 6
    barrier = threading.Barrier(racers)
    outcomes: list[str] = []

    def attempt(n: int) -> None:
        barrier.wait(10)
        try:
            Context(app, run.id).set("guard", n)
            outcomes.append("won")
        except OverwriteError:
            outcomes.append("overwrite")

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["overwrite"] * (racers - 1) + ["won"]  # [INV-CTX-1]


def test_a_steps_key_is_its_id_across_retries_and_distinct_across_steps(app):
    SEEN.clear()
    run = RememberP.trigger("z")
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    steps = run.steps()
    # step 1 runs twice (its first attempt fails); step 2 finds the context key set and returns
    assert SEEN["keys"] == [steps[0].id, steps[0].id, steps[1].id]
    assert steps[0].idempotency_key == steps[0].id != steps[1].id
