"""Pipelines shared by tests that run real child processes (importable by module path).

Steps used by process tests must live in an importable module: a child process
resolves ``"tests.workloads:Work"`` by importing it.
"""

from __future__ import annotations

import time

from ductwork import Pipeline, Step

FAULT_KEY = "fault_key"


class Start(Step):
    def __init__(self, n):
        self.n = n

    def execute(self):
        return list(range(self.n))


class Work(Step):
    def __init__(self, i):
        self.i = i

    def execute(self):
        return self.i * self.i


class Total(Step):
    def __init__(self, squares):
        self.squares = squares

    def execute(self):
        return self.squares


class FaultPipeline(Pipeline):
    """start → expand (keyed) → collapse: passes every fault checkpoint."""

    @classmethod
    def define(cls, p):
        p.start(Start).expand(to=Work, limit_by=FAULT_KEY).collapse(into=Total)


def fault_pipeline_expected(n: int) -> dict:
    return {"Start#0": 1, "Work#1": n, "Total#2": 1}


class Nap(Step):
    """Sleeps ``seconds`` (a stand-in for a slow call), then returns them."""

    def __init__(self, seconds):
        self.seconds = seconds

    def execute(self):
        time.sleep(self.seconds)
        return self.seconds


class Forever(Step):
    """Never returns: only a timeout (a killed process) ends it."""

    def __init__(self, marker_path):
        self.marker_path = marker_path

    def execute(self):
        import os

        with open(self.marker_path, "a") as marker:
            marker.write(f"{os.getpid()}\n")
        while True:
            time.sleep(0.05)


class NapPipeline(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Nap).chain(to=Nap)


class ForeverPipeline(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Forever, timeout=1)
