"""The type of a value that users hand to ductwork and get back as JSON: :data:`Json`.

    def get(self, key: str) -> Json: ...             # Context.get: what was set
    def trigger(cls, *args: Json, ...) -> Run: ...   # Pipeline.trigger: the first step's input

Step inputs and outputs, trigger and resume arguments, context values, an expand's items
and an ``on_halt`` handler's argument are stored as JSON (``pipelines.payloads.dump``
checks each, naming it, before anything is written) and come back as what ``json.loads``
makes of them. They are annotated :data:`Json`, never a bare ``Any``, so a reader (and
``tests/lint/test_budgets.py``, which fails on ``Any`` in a signature that crosses a
layer) tells a JSON value from a hole in the types.

Why :data:`Json` is ``Any`` and not the union ``dict[str, Json] | list[Json] | str | int |
float | bool | None``: the value is the user's, typed by the user's own code (a step's
``__init__`` parameters, what its ``run`` returns), and ductwork only stores and passes it
on. With the union every caller would have to narrow a value it already knows
(``ctx.get("n") + 1`` would not type-check), and a tuple or a ``Mapping`` would not enter
without a cast though ``json.dumps`` takes it; and the check that matters, "is it JSON",
is made at run time by ``dump``, where no static type could make it (NaN, a circular
list, the size limit). Not API: an internal annotation, which type checkers read as
``Any`` in the public signatures it appears in.
"""

from __future__ import annotations

from typing import Any, TypeAlias

#: a JSON value (``json.loads``' result or a value ``pipelines.payloads.dump`` accepts):
#: dynamic on purpose, see the module docstring
Json: TypeAlias = Any
