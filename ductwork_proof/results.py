"""What ``ductwork verify`` found: plain records, written to ``report.json`` and drawn in
``report.html`` (:mod:`ductwork_proof.report`).

A :class:`Check` is one named question with its answer: an environment check
(``ENV-…``), a conformance machine (``CONF-…``) or an invariant checked on the chaos
rounds' histories (``INV-…``, statements in :mod:`ductwork_proof.invariants`).
``passed`` is None for a check that did not run, with the reason in ``detail``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Check:
    id: str
    statement: str
    #: what answered it: a checker function, a conformance machine, an environment probe
    checker: str
    passed: bool | None
    detail: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    #: the first violations or findings (at most a few), for the report
    findings: list[str] = field(default_factory=list)


@dataclass
class Round:
    """One chaos round: its seed, counts and the history file the checkers read."""

    seed: int
    counts: dict[str, int]
    history_path: str
    violations: dict[str, list[str]]
    replay: str


@dataclass
class VerifyResult:
    ductwork_version: str
    #: ``sqlite``, ``postgresql`` or ``mysql``
    backend: str
    #: the URL verified, its password masked
    database_url: str
    server_version: str
    #: settings read from the server (isolation level, time zone, max_allowed_packet, …)
    settings: dict[str, str]
    seed: int
    quick: bool
    started_at: str
    duration_s: float = 0.0
    #: the limits verified: the built-in workload's and the adopter's (synthetic keys)
    limits: dict[str, Any] = field(default_factory=dict)
    #: the adopter's pipelines whose transition kinds the rounds ran (names)
    pipelines: list[str] = field(default_factory=list)
    #: the databases each part ran in (the scratch ones, dropped unless ``--keep``), masked
    databases: list[str] = field(default_factory=list)
    environment: list[Check] = field(default_factory=list)
    conformance: list[Check] = field(default_factory=list)
    invariants: list[Check] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    #: what was not checked, said plainly
    not_checked: list[str] = field(default_factory=list)

    @property
    def checks(self) -> list[Check]:
        return [*self.environment, *self.conformance, *self.invariants]

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.passed is False]

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def write_json(self, path: Path) -> Path:
        path.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True, default=str) + "\n")
        return path

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VerifyResult:
        data = {k: v for k, v in data.items() if k != "ok"}
        for name in ("environment", "conformance", "invariants"):
            data[name] = [Check(**c) for c in data.get(name, [])]
        data["rounds"] = [Round(**r) for r in data.get("rounds", [])]
        return cls(**data)
