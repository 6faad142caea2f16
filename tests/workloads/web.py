"""Pipelines the dashboard's tests run (tests/integration/test_web.py in-process, and
test_web_browser.py on a real fleet, whose workers import them by this module's path).

Gated steps wait for a file the test creates, so a run stays in progress, and a key
stays saturated, exactly as long as the test needs (each polls for its file for at most
a minute, then fails). ``Hostile`` stores every XSS payload in every place the dashboard
shows a value from the database: a step's input and output, an error message, a
context key and value, and a limit key's name. ``Metered`` runs on a rated key whose
first claim is refused (a bucket starts empty) and which then stays blocked for an hour.
"""

from __future__ import annotations

import os
import time

from ductwork import Pipeline, Step
from tests.workloads import Approval, Echo

#: strings a page must show as text: each would run script (set window.__xss) if a page
#: wrote it as markup
XSS = (
    "<script>window.__xss = 'script'</script>",
    '"><img src=x onerror="window.__xss = \'img\'">',
    "'><svg onload=\"window.__xss = 'svg'\">",
)
#: a limit key named with markup, every payload in it (and a slash, to be one URL segment)
XSS_KEY = "<b>k/" + "".join(XSS) + "</b>"
POOL_KEY = "web_pool"
#: one token an hour, burst 1: its first claim finds the bucket empty and stamps the key
#: blocked for an hour (the keys page's bucket, "blocked until" and the entry that blocks)
RATED_KEY = "web_rated"
#: the limits of the fleets and apps of these tests
LIMITS = {POOL_KEY: {"concurrency": 5}, XSS_KEY: {"concurrency": 1}, RATED_KEY: {"rate": {"limit": 1, "per": "1h"}}}


def _wait_for_file(path: str) -> None:
    end = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)


class Fetch(Step):
    """The items to push: ``{"gate": path, "items": n}`` gives n of them."""

    def __init__(self, job):
        self.job = job

    def execute(self):
        return [{"gate": self.job["gate"], "item": i} for i in range(self.job["items"])]


class PushGated(Step):
    """Waits for its gate file, then returns its item."""

    def __init__(self, item):
        self.item = item

    def execute(self):
        _wait_for_file(self.item["gate"])
        return self.item["item"]


class Tally(Step):
    """A fan-in: returns how many pushes it gathered."""

    def __init__(self, pushed):
        self.pushed = pushed

    def execute(self):
        return len(self.pushed)


class Pushes(Pipeline):
    """Fetch, expand to gated pushes on the pool key (concurrency 5), collapse: seven
    items fill the key, five running and two waiting, until the gate opens."""

    @classmethod
    def define(cls, p):
        p.start(Fetch).expand(to=PushGated, limit_by=POOL_KEY).collapse(into=Tally)


class FailsUntil(Step):
    """Raises until its file exists: with the retries spent its run halts
    (``job_retries_exhausted``); revived once the file exists, it completes."""

    def __init__(self, path):
        self.path = path

    def execute(self):
        if not os.path.exists(self.path):
            raise RuntimeError(f"no file {os.path.basename(self.path)} yet")
        return "found"


class Flaky(Pipeline):
    """One FailsUntil step: halted until its file exists, then revived to completion."""

    @classmethod
    def define(cls, p):
        p.start(FailsUntil)


class Explode(Step):
    """Sets one context key per payload, the payload its value too, then raises with all
    of them in its message."""

    def __init__(self, payloads):
        self.payloads = payloads

    def execute(self):
        for payload in self.payloads:
            self.context.set(payload, payload, overwrite=True)
        raise ValueError(" ".join(self.payloads))


class Hostile(Pipeline):
    """Echo, then Explode on the XSS key: every payload in every place a page shows (the
    input and output, the error, the context's keys and values, the key's name)."""

    @classmethod
    def define(cls, p):
        p.start(Echo).chain(to=Explode, limit_by=XSS_KEY)


class Metered(Pipeline):
    """One Echo on the rated key: claimed an hour after the first poll refuses it."""

    @classmethod
    def define(cls, p):
        p.start(Echo, limit_by=RATED_KEY)


PIPELINES = [f"{cls.__module__}:{cls.__qualname__}" for cls in (Pushes, Flaky, Approval, Hostile, Metered)]
