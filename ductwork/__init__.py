"""ductwork: durable pipelines on SQL databases.

    >>> import ductwork
    >>> app = ductwork.connect("sqlite:///ductwork.sqlite3")

Advancing a branch from one step to the next is exactly-once (one transaction
behind a fencing claim token); a step's code runs at least once, made safe with
``Step.idempotency_key`` and the run-scoped ``Context``; ``limit_by`` keys get
exact fleet-wide concurrency and rate limits from ``ductwork.yml``.
"""

from ductwork.app import App, connect
from ductwork.errors import (
    CollapseError,
    CombineError,
    ConfigError,
    ConvergeError,
    DefinitionError,
    DivertError,
    DuctworkError,
    OverwriteError,
    ReviveError,
    RunFilterError,
    StartError,
    TriggerConnectionError,
    TriggeredConcurrently,
    TriggerKeyError,
    TriggerKeyWindowError,
    UnknownRunError,
)
from ductwork.pipelines.context import Context
from ductwork.pipelines.definition import PipelineBuilder
from ductwork.pipelines.history import (
    AdvancementRecord,
    BranchRecord,
    ErrorRecord,
    ExecutionRecord,
    HookRecord,
    RunHistory,
    RunRecord,
    StepRecord,
    Wait,
    list_runs,
)
from ductwork.pipelines.pipeline import Pipeline
from ductwork.pipelines.prune import PruneResult, prune
from ductwork.pipelines.runs import Run, StepError, StepInfo
from ductwork.pipelines.step import Step

__all__ = [
    "AdvancementRecord",
    "App",
    "BranchRecord",
    "CollapseError",
    "CombineError",
    "ConfigError",
    "Context",
    "ConvergeError",
    "DefinitionError",
    "DivertError",
    "DuctworkError",
    "ErrorRecord",
    "ExecutionRecord",
    "HookRecord",
    "OverwriteError",
    "Pipeline",
    "PipelineBuilder",
    "PruneResult",
    "ReviveError",
    "Run",
    "RunFilterError",
    "RunHistory",
    "RunRecord",
    "StartError",
    "Step",
    "StepError",
    "StepInfo",
    "StepRecord",
    "TriggerConnectionError",
    "TriggerKeyError",
    "TriggerKeyWindowError",
    "TriggeredConcurrently",
    "UnknownRunError",
    "Wait",
    "connect",
    "list_runs",
    "prune",
]

__version__ = "0.1.0"
