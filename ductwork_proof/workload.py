"""The chaos workload: pipelines covering every transition, keys shared across them.

Every step body writes a witness row when it starts and stamps it when it
returns, each in its own short transaction with database time
(``DUCTWORK_CHAOS_WITNESS_URL`` names the database), so the checkers can see
which step bodies actually ran at the same time — not only what was claimed.

Keys: ``api`` (concurrency 3 and a rate) is shared by ``ChaosFan``'s items and
``ChaosDivideKeyed``; ``vendor`` (concurrency 2 and two rate entries) by
``ChaosChain`` and ``ChaosDivertKeyed``. A step class that writes a key into its
witness rows is only ever used with that ``limit_by``. ``Flaky`` fails its first
attempt (a retry), ``Nap`` after a ``delay``. ``ChaosHalts`` runs always halt and owe
their ``PageOnHalt`` hook, whose first attempt fails. Durations come from the input, so a
round with one seed is the same workload every time.

``tenant`` is a key family (docs/semantics.md §5.1): each partition 2 at once and its own
rate, the family 3 at once over all its partitions [INV-LIM-8]. ``ChaosTenantFan`` fans out
to ``TenantCall`` items partitioned by their input's ``tenant`` (``limit_by=("tenant",
"value.tenant")``), half of a run's items on one hot tenant and the rest over tenants with
hostile values (a quote, a ``]``, a backslash, an accent, an integer), so the family's
ceiling and a partition's own limit both bind; ``TenantCall`` renders its partition's key
itself for its witness rows.

``ChaosAsyncFan`` fans out to ``AsyncApiCall``, an async step on the ``api`` key: a kill
lands while several of them await on the worker's step loop.

``ChaosRetained`` is what the round's prunes delete (``ductwork prune --pipeline``):
unwitnessed steps (a pruned run's witness rows would name steps that no longer exist),
a delay so some of its runs are in progress when a prune runs, a step that fails every
attempt for every third input, so those halt, and a dampen after it, so the others
stay dampened: live runs that nothing resumes, which no prune may ever delete.
attempt (a retry), ``Nap`` after a ``delay``. ``Halting`` fails on odd values until its
run is a revived one, so ``ChaosReviveFan`` and ``ChaosReviveChain`` runs halt and the
harness revives them (from two threads at once) while the faults go on. Durations come
from the input, so a round with one seed is the same workload every time.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ductwork import Pipeline, Step
from ductwork.limit_entries import LimitEntry
from ductwork_proof.history import make_witness_table

WITNESS = make_witness_table()
LIMITS = {
    "api": {"concurrency": 3, "rate": {"limit": 40, "per": "1s", "burst": 10}},
    "vendor": {"concurrency": 2, "rate": [{"limit": 10, "per": "1s", "burst": 3},
                                          {"limit": 240, "per": "1m", "burst": 20}]},
    # a key family: each partition tenant[<value>] its own limits, the family a ceiling [INV-LIM-8]
    "tenant": {"per_partition": {"concurrency": 2, "rate": {"limit": 20, "per": "1s", "burst": 5}},
               "concurrency": 3},
}
#: the tenants ChaosTenantFan's items are partitioned by: the first is the hot one, the others
#: values a key must render faithfully (a quote, a ``]``, a backslash, an accent, an integer)
TENANTS: tuple[str | int, ...] = ("acct-1", 'acct"2', "acct]3", "acct\\4", "café", 7)
_engine = None


def _witness_engine():
    global _engine
    if _engine is None:
        from ductwork.db.engines import create_engine

        _engine = create_engine(os.environ["DUCTWORK_CHAOS_WITNESS_URL"], pool_size=2, io_timeout=10)
    return _engine


class Witnessed(Step):
    """A step that records its body's start and end; subclasses implement ``body``."""

    #: the limit key this step is declared with in the pipelines below (None: unkeyed)
    limit_key: str | None = None

    def __init__(self, value):
        self.value = value

    def execute(self):
        from ductwork.db.dialects import db_now

        engine = _witness_engine()
        with engine.begin() as conn:
            witness_id = conn.execute(WITNESS.insert().values(
                step_id=self._ductwork_step_id, idempotency_key=self.idempotency_key, pid=os.getpid(),
                limit_key=self.limit_key, started_at=db_now(conn))).inserted_primary_key[0]
        result = self.body()
        with engine.begin() as conn:
            conn.execute(WITNESS.update().where(WITNESS.c.id == witness_id).values(ended_at=db_now(conn)))
        return result

    def body(self):
        return self.value

    def pause(self, salt: int = 0) -> None:
        """Sleep 10-49 ms, determined by the input (so the workload is reproducible)."""
        time.sleep((zlib.crc32(f"{self.value!r}:{salt}".encode()) % 40 + 10) / 1000)


class Fan(Witnessed):
    def body(self):
        return list(range(self.value))


class ApiCall(Witnessed):
    limit_key = "api"

    def body(self):
        self.pause()
        return self.value * 2 if isinstance(self.value, int) else self.value


class VendorCall(Witnessed):
    limit_key = "vendor"

    def body(self):
        self.pause(1)
        return self.value


class Total(Witnessed):
    """Counts a fan-in's inputs (a list), or passes a single value through."""

    def body(self):
        return len(self.value) if isinstance(self.value, list) else self.value


class Seed(Witnessed):
    pass


class Route(Witnessed):
    def body(self):
        return self.value % 3


class Flaky(Witnessed):
    """Fails its step's first attempt (remembered in the run's Context), then succeeds."""

    def body(self):
        marker = f"flaky:{self.idempotency_key}"
        try:
            self.context.set(marker, True)
        except self.context.OverwriteError:
            return self.value
        raise RuntimeError("flaky step: first attempt fails")


class Nap(Witnessed):
    def body(self):
        self.pause(2)
        return self.value


class Halting(Witnessed):
    """Fails every attempt on an odd value until its run is a revived one: its branch halts
    (retries exhausted), and the harness's reviver revives the run (the fix deployed)."""

    def body(self):
        import sqlalchemy as sa

        from ductwork.db import schema

        if isinstance(self.value, int) and self.value % 2:
            with _witness_engine().connect() as conn:
                revived = conn.execute(sa.select(schema.runs.c.revived_from)
                                       .where(schema.runs.c.id == self._ductwork_run_id)).scalar()
            if revived is None:
                raise RuntimeError(f"halting step: {self.value} fails until its run is revived")
        self.pause(3)
        return self.value


class TenantFan(Witnessed):
    """``value`` items, each ``{"tenant": …, "n": i}``: even items on the hot tenant
    (:data:`TENANTS`' first), odd ones spread over the others, from ``value`` alone."""

    def body(self):
        others = len(TENANTS) - 1
        return [{"tenant": TENANTS[0] if i % 2 == 0 else TENANTS[1 + (i // 2 + self.value) % others], "n": i}
                for i in range(self.value)]


class TenantCall(Witnessed):
    """A step on a partition of the ``tenant`` family (``family``): its input's ``tenant``
    picks it."""

    family = "tenant"

    @property
    def limit_key(self) -> str:  # type: ignore[override]
        """The partition's key as semantics §5.1 renders it (``tenant[<canonical JSON>]``),
        computed here, not by the engine: INV-LIM-8's checker compares it with the step's."""
        return f"{self.family}[{json.dumps(self.value['tenant'], ensure_ascii=False, separators=(',', ':'))}]"

    def body(self):
        self.pause(4)  # 20-98 ms: longer than a partition's token interval (50 ms), so
        self.pause(5)  # several partitions' bodies overlap and the family's ceiling binds
        return self.value["n"]


class ChaosTenantFan(Pipeline):
    """An expand over partitions of the ``tenant`` family, then a fan-in [INV-LIM-8]."""

    @classmethod
    def define(cls, p):
        p.start(TenantFan).expand(to=TenantCall, limit_by=("tenant", "value.tenant")).collapse(into=Total)


class ChaosFan(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Fan).expand(to=ApiCall, limit_by="api").collapse(into=Total)


class ChaosChain(Pipeline):
    @classmethod
    def define(cls, p):
        (p.start(Seed).chain(to=VendorCall, limit_by="vendor").chain(to=Flaky)
         .chain(to=Nap, delay=0.3))


class ChaosDivide(Pipeline):
    """divide with branch builders: the left branch chains on before the combine."""

    @classmethod
    def define(cls, p):
        left, right = p.start(Seed).divide(to=[Seed, Nap])
        left.chain(to=Nap)
        left.combine(right, into=Total)


class ChaosDivideKeyed(Pipeline):
    """divide where both targets are keyed (options apply to every target)."""

    @classmethod
    def define(cls, p):
        p.start(Seed).divide(to=[ApiCall, ApiCall], limit_by="api").combine(into=Total)


class ChaosDivert(Pipeline):
    @classmethod
    def define(cls, p):
        (p.start(Route)
         .divert(to={0: Seed, 1: Nap, "otherwise": Flaky})
         .converge(into=Seed))


class ChaosDivertKeyed(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Route).divert(to={0: VendorCall, "otherwise": VendorCall}, limit_by="vendor").converge(into=Total)


# --- on_halt hooks (issue 16): runs that halt and owe a hook -----------------------------


class Refuse(Witnessed):
    """Always fails: its step's retries are spent and its run halts."""

    def body(self):
        raise RuntimeError("refuse: this step always fails")


class PageOnHalt(Step):
    """The on_halt handler: fails its hook's first attempt (remembered in the halted run's
    Context, keyed by the hook's idempotency key), then succeeds. Writes no witness row:
    witnesses are step bodies' (INV-EXE-3 checks them against steps)."""

    def __init__(self, halt):
        self.halt = halt

    def execute(self):
        try:
            self.context.set(f"paged:{self.idempotency_key}", True)
        except self.context.OverwriteError:
            return None
        raise ConnectionError("pager: first attempt fails")


class ChaosHalts(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Seed).chain(to=Refuse).on_halt(PageOnHalt)


class Echo(Step):
    """Returns its input (unwitnessed: the retained runs are pruned, witness rows would
    name steps that no longer exist)."""

    def __init__(self, value):
        self.value = value

    def execute(self):
        return self.value


class FailsOnThirds(Echo):
    """Fails every attempt when its input is a multiple of 3: the run halts."""

    def execute(self):
        if self.value % 3 == 0:
            raise RuntimeError(f"retained run {self.value}: fails on purpose")
        return self.value


class ChaosRetained(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Echo).chain(to=FailsOnThirds, delay=0.5).dampen(before=Echo)


#: the pipeline the round's prunes are limited to (``ductwork prune --pipeline``)
RETAINED = "ductwork_proof.workload:ChaosRetained"


class ChaosReviveFan(Pipeline):
    """The odd items' branches halt; the revived run re-runs them and the collapse fires."""

    @classmethod
    def define(cls, p):
        p.start(Fan).expand(to=Halting).collapse(into=Total)


class ChaosReviveChain(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Seed).chain(to=Halting).chain(to=Nap)


class AsyncApiCall(ApiCall):
    """``ApiCall`` as an async step: its witness rows are written in a thread and its pause is
    an ``asyncio.sleep``, so a kill lands while many of them await on the step loop
    (``while_async_steps_await`` among the faults); the ``api`` key's concurrency holds."""

    async def execute(self):
        import asyncio

        from ductwork.db.dialects import db_now

        def start():
            with _witness_engine().begin() as conn:
                return conn.execute(WITNESS.insert().values(
                    step_id=self._ductwork_step_id, idempotency_key=self.idempotency_key, pid=os.getpid(),
                    limit_key=self.limit_key, started_at=db_now(conn))).inserted_primary_key[0]

        def end(witness_id):
            with _witness_engine().begin() as conn:
                conn.execute(WITNESS.update().where(WITNESS.c.id == witness_id).values(ended_at=db_now(conn)))

        witness_id = await asyncio.to_thread(start)
        await asyncio.sleep((zlib.crc32(f"{self.value!r}:0".encode()) % 40 + 10) / 1000)
        await asyncio.to_thread(end, witness_id)
        return self.value * 2


class ChaosAsyncFan(Pipeline):
    """An expand whose items are async steps (awaited together by a worker thread), then plain ones."""

    @classmethod
    def define(cls, p):
        p.start(Fan).expand(to=AsyncApiCall, limit_by="api").collapse(into=Total)


def _stored_name(pipeline: type[Pipeline]) -> str:
    """The pipeline name ``pipeline``'s runs store: its definition's (a pipeline that
    defines nothing is abstract and has none)."""
    if pipeline.definition is None:
        raise TypeError(f"{pipeline.__qualname__} has no definition: it is abstract, no run stores its name")
    return pipeline.definition.pipeline


PIPELINES: list[type[Pipeline]] = [
    ChaosFan, ChaosChain, ChaosDivide, ChaosDivideKeyed, ChaosDivert, ChaosDivertKeyed, ChaosHalts, ChaosRetained,
    ChaosReviveFan, ChaosReviveChain, ChaosAsyncFan, ChaosTenantFan]
#: pipelines whose halted runs the harness revives (by the name runs store)
REVIVED = tuple(_stored_name(p) for p in (ChaosReviveFan, ChaosReviveChain))


def trigger_workload(app, scale: int) -> list:
    """Trigger one round's runs; returns their handles."""
    runs = []
    for i in range(6 * scale):  # first: the earliest prunes find some of them halted
        runs.append(ChaosRetained.trigger(i, app=app))
    for i in range(2 * scale):  # (ChaosFan gives ChaosTenantFan about 10 of its items per run)
        runs.append(ChaosFan.trigger(50 + 20 * i, app=app))
        runs.append(ChaosAsyncFan.trigger(30 + 10 * i, app=app))
        runs.append(ChaosTenantFan.trigger(12 + i, app=app))
    for i in range(8 * scale):
        runs.append(ChaosChain.trigger(i, app=app))
        runs.append(ChaosDivert.trigger(i, app=app))
    for i in range(4 * scale):
        runs.append(ChaosDivide.trigger(i, app=app))
        runs.append(ChaosDivideKeyed.trigger(i, app=app))
        runs.append(ChaosDivertKeyed.trigger(i, app=app))
    for i in range(2 * scale):
        runs.append(ChaosHalts.trigger(i, app=app))
        runs.append(ChaosReviveFan.trigger(4, app=app))
        runs.append(ChaosReviveChain.trigger(2 * i + 1, app=app))
    return runs


# --- the adopter's shapes (ductwork verify -c ductwork.yml) --------------------------------

#: the environment variable that names the adopter's synthetic keys (a JSON list) in the
#: fleet's processes, which build the same pipeline classes when they import this module
ADOPTER_KEYS_ENV = "DUCTWORK_VERIFY_KEYS"
#: the same for the adopter's synthetic key families
ADOPTER_FAMILIES_ENV = "DUCTWORK_VERIFY_FAMILIES"
#: a synthetic key's name: the adopter's key, prefixed, so no real vendor's key is used
SYNTHETIC_PREFIX = "verify:"
#: how long a synthetic key's runs should take at its own rate, at most (seconds): the
#: number of items a key gets is what its rate entries admit in this time
SYNTHETIC_SECONDS = 8
#: the most items one synthetic key's run fans out to
SYNTHETIC_ITEMS = 24


def adopter_pipelines(keys: Sequence[str], families: Sequence[str] = ()) -> list[type[Pipeline]]:
    """For each synthetic key, ``AdopterCall<i>`` (a witnessed step on that key) and
    ``AdopterFan<i>`` (a fan-out of it, then a fan-in); for each synthetic family,
    ``AdopterTenantCall<i>`` (a witnessed step on a partition of it) and
    ``AdopterTenantFan<i>`` (a fan-out over :data:`TENANTS`' partitions, as
    ``ChaosTenantFan``'s); made module globals so that a fleet process importing this module
    with :data:`ADOPTER_KEYS_ENV` and :data:`ADOPTER_FAMILIES_ENV` set finds them by name.
    Keys first, then families."""
    made: list[type[Pipeline]] = []
    for i, key in enumerate(keys):
        call = type(f"AdopterCall{i}", (ApiCall,), {"limit_key": key, "__module__": __name__})

        def define(_cls, p, call=call, key=key):
            p.start(Fan).expand(to=call, limit_by=key).collapse(into=Total)

        made.append(_made(call, f"AdopterFan{i}", define))
    for i, family in enumerate(families):
        call = type(f"AdopterTenantCall{i}", (TenantCall,), {"family": family, "__module__": __name__})

        def define_family(_cls, p, call=call, family=family):
            p.start(TenantFan).expand(to=call, limit_by=(family, "value.tenant")).collapse(into=Total)

        made.append(_made(call, f"AdopterTenantFan{i}", define_family))
    return made


def _made(call: type[Step], name: str, define) -> type[Pipeline]:
    pipeline = type(name, (Pipeline,), {"define": classmethod(define), "__module__": __name__})
    globals()[call.__name__] = call
    globals()[pipeline.__name__] = pipeline
    return pipeline


def items_for(concurrency: int | None, rates: list[tuple[int, int, int]]) -> int:
    """How many items a synthetic key's run fans out to: three times its concurrency (so
    its ceiling is reached), no more than its rate entries ``(limit, per_s, burst)`` admit in
    :data:`SYNTHETIC_SECONDS` (a bucket starts empty, so that is ``limit × seconds / per_s``),
    at most :data:`SYNTHETIC_ITEMS`. 0: the key's first token comes too late for a round
    (a rate slower than one per :data:`SYNTHETIC_SECONDS`): the key is not run, and the
    report says so."""
    wanted = 3 * concurrency if concurrency is not None else SYNTHETIC_ITEMS
    for limit, per_s, _burst in rates:
        wanted = min(wanted, limit * SYNTHETIC_SECONDS // per_s)
    return min(wanted, SYNTHETIC_ITEMS)


@dataclass
class AdopterShapes:
    """The adopter's limits on synthetic keys: ``limits`` (config entries by synthetic key,
    the adopter's values), the pipelines that use them and each key's item count."""

    limits: dict[str, Any] = field(default_factory=dict)
    items: dict[str, int] = field(default_factory=dict)
    pipelines: list[type[Pipeline]] = field(default_factory=list)
    #: the adopter's keys (and key families) not run: a rate too slow for a round's length
    skipped: list[str] = field(default_factory=list)
    #: which of ``limits`` are key families (their entries ``per_partition`` and a ceiling)
    families: list[str] = field(default_factory=list)
    #: the adopter's own pipelines and inputs (the ``ductwork_chaos`` fixture): each input
    #: is one run, whose bodies are the adopter's own code
    runs: list[tuple[type[Pipeline], Any]] = field(default_factory=list)

    @classmethod
    def from_limits(cls, entries: Mapping[str, Any], families: Mapping[str, Any] | None = None) -> AdopterShapes:
        """From parsed :class:`ductwork.limit_entries.LimitEntry` values by key and
        :class:`~ductwork.limit_entries.FamilyEntry` values by family. A family's run fans out
        over :data:`TENANTS`' partitions, half of its items on the first: twice what one
        partition's entry wants (:func:`items_for`), so that partition's own limits bind,
        and its other items spread, so the family's ceiling can."""
        limits: dict[str, Any] = {}
        items: dict[str, int] = {}
        skipped: list[str] = []
        for key, entry in sorted(entries.items()):
            if count := _items(entry):
                limits[SYNTHETIC_PREFIX + key], items[SYNTHETIC_PREFIX + key] = _entry(entry), count
            else:
                skipped.append(key)
        named: list[str] = []
        for family, f in sorted((families or {}).items()):
            one = _items(f.per_partition)
            if not one:
                skipped.append(family)
                continue
            name = SYNTHETIC_PREFIX + family
            limits[name] = {"per_partition": _entry(f.per_partition),
                            **({} if f.concurrency is None else {"concurrency": f.concurrency})}
            items[name] = min(2 * one, SYNTHETIC_ITEMS)
            named.append(name)
        keys = [name for name in limits if name not in named]
        return cls(limits, items, adopter_pipelines(keys, named), skipped, families=named)

    def environ(self) -> dict[str, str]:
        """The fleet's processes build the synthetic keys' and families' pipelines
        (:func:`adopter_pipelines`)."""
        keys = [name for name in self.items if name not in self.families]
        return {**({ADOPTER_KEYS_ENV: json.dumps(keys)} if keys else {}),
                **({ADOPTER_FAMILIES_ENV: json.dumps(self.families)} if self.families else {})}

    def trigger(self, app) -> list:
        """One run per synthetic key, fanning out to its item count; then the adopter's runs."""
        pairs = zip(self.pipelines, self.items, strict=True)
        synthetic = [pipeline.trigger(self.items[key], app=app) for pipeline, key in pairs]
        return synthetic + [pipeline.trigger(value, app=app) for pipeline, value in self.runs]


def _items(entry: LimitEntry) -> int:
    """:func:`items_for` a parsed entry."""
    return items_for(entry.concurrency, [(r.limit, r.per_s, r.burst) for r in entry.rates])


def _entry(entry: LimitEntry) -> dict[str, Any]:
    """A parsed entry's values as config (``job_worker.limits``) writes them."""
    body: dict[str, Any] = {}
    if entry.concurrency is not None:
        body["concurrency"] = entry.concurrency
    if entry.rates:
        body["rate"] = [{"limit": r.limit, "per": f"{r.per_s}s", "burst": r.burst} for r in entry.rates]
    return body


if os.environ.get(ADOPTER_KEYS_ENV) or os.environ.get(ADOPTER_FAMILIES_ENV):
    adopter_pipelines(json.loads(os.environ.get(ADOPTER_KEYS_ENV) or "[]"),
                      json.loads(os.environ.get(ADOPTER_FAMILIES_ENV) or "[]"))
