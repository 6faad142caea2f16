"""The executable specification of ductwork (docs/semantics.md), in pure Python.

Example::

    from model import LimitsModel, PipelinesModel, check_all
    m = LimitsModel({"vendor_api": {"concurrency": 5}})
    m.enqueue("j1", "vendor_api", 0); m.claim("w1", 0); check_all(m)

Modules, one per noun:

* ``model.limits`` — rate periods, rate entries, token buckets and
  ``LimitsModel`` (jobs, claims, keys, buckets) [INV-LIM-1…7];
* ``model.pipelines`` — definitions (snapshot format 1), ``PipelinesModel``
  (runs, branches, steps, executions, context) and ``run_to_quiescence``
  [INV-ADV-*, INV-EXE-*, INV-RUN-1, INV-CTX-1];
* ``model.invariants`` — one predicate per invariant ID, ``INVARIANT_FUNCTIONS``;
* ``model.mutants`` — model variants with one guard removed, which the
  property tests must catch;
* ``model.explore`` — every interleaving of small bounded configurations,
  breadth first, every invariant in every state (``python -m model.explore``);
* ``model.errors`` — the refusals the model raises.

Rules for changing it: exact arithmetic only (``int``/``Fraction``; time is
integer µs passed in), no import of ``ductwork`` (a test parses every file),
and a new state invariant gets an ID in INVARIANTS.md and a function here.

Adding a feature, in order: change docs/semantics.md; add the state and the
operation to the noun's module (one atomic method per operation, refusals
raise ``model.errors``); record what a checker needs in the model's log
(``LimitsModel.events``, ``PipelinesModel.commits``/``fence_log``/``outcomes``);
write ``inv_<id>_<statement>`` in ``model.invariants`` and register it in
``INVARIANT_FUNCTIONS``; add a rule to the machine in
``tests/properties/test_model_*.py`` and an ``@invariant`` calling the new
function; add a mutant without the new guard to ``model.mutants.MUTANTS``.
"""

from .errors import (
    CommitFailed,
    ConfigError,
    DefinitionError,
    ModelError,
    OverwriteError,
    PreconditionError,
    StaleClaim,
)
from .invariants import INVARIANT_FUNCTIONS, LIMITS_INVARIANTS, PIPELINE_INVARIANTS, check_all
from .limits import (
    Decision,
    KeyLimits,
    LimitsModel,
    RateEntry,
    drop_dominated,
    parse_key_limits,
    parse_period,
    parse_rate_entries,
    render_period,
)
from .pipelines import (
    CRASH,
    FAILURE,
    NO_INPUT,
    TIMED_OUT,
    Outcome,
    PipelineConfig,
    PipelinesModel,
    RunSummary,
    render_key,
    run_to_quiescence,
    success,
)

__all__ = [
    "CRASH",
    "FAILURE",
    "INVARIANT_FUNCTIONS",
    "LIMITS_INVARIANTS",
    "NO_INPUT",
    "PIPELINE_INVARIANTS",
    "TIMED_OUT",
    "CommitFailed",
    "ConfigError",
    "Decision",
    "DefinitionError",
    "KeyLimits",
    "LimitsModel",
    "ModelError",
    "Outcome",
    "OverwriteError",
    "PipelineConfig",
    "PipelinesModel",
    "PreconditionError",
    "RateEntry",
    "RunSummary",
    "StaleClaim",
    "check_all",
    "drop_dominated",
    "parse_key_limits",
    "parse_period",
    "parse_rate_entries",
    "render_key",
    "render_period",
    "run_to_quiescence",
    "success",
]
