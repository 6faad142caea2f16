"""The dashboard in a real browser against a real fleet, on SQLite and PostgreSQL.

Per database, one module-wide setup: a fresh database, a fleet (``ductwork start``:
a supervisor, a worker of eight threads, an advancer) and ``ductwork web`` serving it, refreshing
its pages every second; one headless Chromium (Debian's ``chromium`` package, driven
by Playwright; .ci/run installs it) for the module. Each test triggers its own runs
and watches the page change by itself (Playwright's ``expect`` waits on a condition
with a deadline):

- a run fills its key (5/5 in flight, 2 pending, its claims on the chart) and then
  completes on the page; a rated key shows its empty bucket, until when it is blocked
  and by which entry, and the fleet's heartbeats bring its refusal to ``/metrics``;
- a halted run shows its reason and is revived from the page (confirmation, POST);
- a dampened run is resumed with JSON input from the page;
- markup stored in payloads, an error message, a context key and value and a key's
  name stays text: no script runs, no element is made of it.

Without chromium or playwright the module skips, unless ``DUCTWORK_REQUIRE_BROWSER=1``
(.ci/run sets it): then it fails, so CI never passes without them.

They take the screenshots of docs/dashboard.md on SQLite, into
``$DUCTWORK_WEB_SCREENSHOTS`` when set (docs/images to regenerate them), else into a
temporary directory; a screenshot that differs from the one in docs is never a
failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from ductwork_proof.fleet import Fleet, wait_for, write_config
from tests.conftest import _migrated_url, make_app
from tests.workloads import Approval
from tests.workloads.web import LIMITS, PIPELINES, POOL_KEY, RATED_KEY, XSS, XSS_KEY, Flaky, Hostile, Metered, Pushes


def _unavailable(reason: str) -> NoReturn:
    """Skip the module, or fail it when DUCTWORK_REQUIRE_BROWSER=1 (.ci/run)."""
    if os.environ.get("DUCTWORK_REQUIRE_BROWSER") == "1":
        pytest.fail(f"DUCTWORK_REQUIRE_BROWSER is set, but: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


try:
    from playwright import sync_api as playwright_api
except ImportError:
    _unavailable("playwright is not installed (the test extra)")
expect = playwright_api.expect

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: how long a page may take to show what the fleet did
SHOWS = 30_000


@dataclass
class Site:
    backend: str
    base: str
    app: object
    tmp: Path
    web_log: Path

    def url(self, path: str) -> str:
        return self.base + path


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        _unavailable(f"{CHROMIUM} is not installed (apt-get install chromium; .ci/run does)")
    with playwright_api.sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def site(request, worker_id, tmp_path_factory):
    backend = request.param
    tmp = tmp_path_factory.mktemp(f"web-{backend}")
    url = _migrated_url(backend, tmp_path_factory, worker_id, purpose="web")
    # eight worker threads: five pushes hold the pool key while the other tests' steps run
    config = write_config(tmp / "ductwork.yml", pipelines=PIPELINES, limits=LIMITS,
                          overrides={"job_worker": {"count": 8}})
    port = _free_port()
    web_log = tmp / "web.log"
    fleet = Fleet(url, config, label="web-fleet", shared=True).start()
    with open(web_log, "ab") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "ductwork.cli", "web", "--database-url", url, "-c", str(config),
             "--port", str(port), "--refresh", "1"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    app = make_app(url, job_worker={"limits": LIMITS})
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: server.poll() is not None or _answers(base + "/"), "ductwork web answered")
        assert server.poll() is None, web_log.read_text()
        yield Site(backend, base, app, tmp, web_log)
    finally:
        app.dispose()
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(10)
        if server.poll() is None:
            server.kill()
        fleet.kill_host()


@pytest.fixture
def page(browser, site):  # noqa: ARG001 - site: the module's fleet and server before each tab
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    tab = context.new_page()
    dialogs: list[str] = []
    tab.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    yield tab
    context.close()
    assert dialogs == [], f"a page opened dialogs: {dialogs}"


def _shot(site: Site, page, name: str) -> None:
    """A screenshot for docs/dashboard.md, taken on SQLite (one set is enough)."""
    if site.backend != "sqlite":
        return
    folder = Path(os.environ.get("DUCTWORK_WEB_SCREENSHOTS") or site.tmp / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"dashboard-{name}.png"), full_page=False)


def _status(page):
    return page.locator("[data-run-status]")


def _key_row(page, key: str):
    return page.locator("tr.keyrow", has=page.locator(f'a.key:text-is("{key}")'))


def _refusals(site: Site) -> dict[tuple[str, str], float]:
    """``ductwork_key_refusals_total`` of a scrape: (key, reason) -> count."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(site.url("/metrics"), timeout=10) as response:
        text = response.read().decode()
    return {(s.labels["key"], s.labels["reason"]): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "ductwork_key_refusals_total"}


def test_a_run_fills_its_key_then_completes_on_the_page(site, page):
    opened = site.tmp / "gate-open"
    opened.touch()
    first = Pushes.trigger({"gate": str(opened), "items": 1}, app=site.app)  # one claim of the pool key
    Metered.trigger("metered", app=site.app)  # its first claim refused: the bucket starts empty
    wait_for(lambda: site.app.run(first.id).status == "completed", "a first push on the pool key")
    page.goto(site.url("/keys"))
    expect(_key_row(page, POOL_KEY).locator("svg.spark polyline")).to_have_count(1, timeout=SHOWS)  # two samples
    gate = site.tmp / "gate-pushes"
    run = Pushes.trigger({"gate": str(gate), "items": 7}, app=site.app)
    try:
        page.goto(site.url(f"/runs/{run.id}"))
        expect(_status(page)).to_have_text("in progress", timeout=SHOWS)
        expect(page.locator('[data-node="PushGated#1"]')).to_have_attribute("data-state", "running", timeout=SHOWS)
        expect(page.locator('[data-node="PushGated#1"] .node-counts')).to_have_text("5 running, 2 waiting",
                                                                                   timeout=SHOWS)
        expect(page.locator('[data-node="Fetch#0"]')).to_have_attribute("data-state", "done")
        _shot(site, page, "run")
        page.goto(site.url("/keys"))
        row = _key_row(page, POOL_KEY)
        expect(row.locator("[data-key-inflight]")).to_have_text("5/5", timeout=SHOWS)
        expect(row.locator("[data-key-pending]")).to_have_text("2", timeout=SHOWS)
        # the five claims since the samples above: the chart is not flat
        expect(row.locator("svg.spark")).not_to_have_attribute("aria-label", "claims per second, peak 0.00",
                                                               timeout=SHOWS)
        rated = _key_row(page, RATED_KEY)
        expect(rated.locator(".bucket")).to_have_text(re.compile(r"^0\.00/1 tokens \(1 per 3600 s\)"))
        expect(rated.locator(".warn")).to_contain_text("blocked until", timeout=SHOWS)
        expect(rated.locator(".warn + .muted")).to_have_text("by 1 per 3600 s")
        _shot(site, page, "keys")
        wait_for(lambda: _refusals(site).get((RATED_KEY, "rate"), 0) >= 1, "the worker's heartbeat counted the refusal")
        page.goto(site.url("/"))
        expect(page.locator('[data-runs="in_progress"]')).not_to_have_text("0", timeout=SHOWS)
        _shot(site, page, "overview")
        page.goto(site.url("/runs"))
        expect(page.locator(f'a[href="/runs/{run.id}"]')).to_be_visible()
        _shot(site, page, "runs")
        page.goto(site.url("/processes"))
        for role in ("supervisor", "job_worker", "pipeline_advancer"):
            expect(page.locator("table.processes td", has_text=role).first).to_be_visible(timeout=SHOWS)
        _shot(site, page, "processes")
        page.goto(site.url(f"/runs/{run.id}"))
        expect(_status(page)).to_have_text("in progress", timeout=SHOWS)
    finally:
        gate.touch()
    expect(_status(page)).to_have_text("completed", timeout=SHOWS)  # the page refreshed itself
    expect(page.locator('[data-node="Tally#2"]')).to_have_attribute("data-state", "done", timeout=SHOWS)


def test_a_halted_run_shows_its_reason_and_is_revived_from_the_page(site, page):
    found = site.tmp / "found-flaky"
    run = Flaky.trigger(str(found), app=site.app)
    page.goto(site.url(f"/runs/{run.id}"))
    expect(_status(page)).to_have_text("halted", timeout=SHOWS)
    expect(page.locator("[data-halt-reasons]")).to_have_text("job_retries_exhausted", timeout=SHOWS)
    expect(page.locator("text=RuntimeError: no file found-flaky yet").first).to_be_visible()
    found.touch()
    page.get_by_role("button", name="Revive…").click()
    expect(page.locator("h2", has_text="Revive run")).to_be_visible()  # the confirmation page
    assert site.app.run(run.id).history().run.revived_as is None  # asked, not done
    page.get_by_role("button", name="Yes, revive it").click()
    expect(page.locator(".flash")).to_contain_text("This run revives")
    revived = site.app.run(run.id).history().run.revived_as
    assert revived is not None
    assert page.url.startswith(site.url(f"/runs/{revived}"))
    expect(_status(page)).to_have_text("completed", timeout=SHOWS)
    page.goto(site.url(f"/runs/{run.id}"))
    expect(page.locator(f'a[href="/runs/{revived}"]').first).to_be_visible()
    expect(page.get_by_role("button", name="Revive…")).to_have_count(0)


def test_a_dampened_run_is_resumed_with_input_from_the_page(site, page):
    run = Approval.trigger({"order": 7}, app=site.app)
    page.goto(site.url(f"/runs/{run.id}"))
    expect(_status(page)).to_have_text("dampened", timeout=SHOWS)  # reloads to show the form
    page.locator('textarea[name="input"]').fill('{"approved": "yes", "by": "ops"}')
    page.get_by_role("button", name="Resume…").click()
    expect(page.locator("[data-confirm-input]")).to_contain_text('"approved": "yes"')
    assert site.app.run(run.id).status == "dampened"  # asked, not done
    page.get_by_role("button", name="Yes, resume it").click()
    expect(page.locator(".flash")).to_have_text("Resumed.")
    expect(_status(page)).to_have_text("completed", timeout=SHOWS)
    assert site.app.run(run.id).steps()[-1].output == {"approved": "yes", "by": "ops"}


#: elements the payloads would make if a page wrote them as markup
MADE_OF_PAYLOADS = """[...document.querySelectorAll("img, svg[onload], script, b")].filter(
    e => e.matches("img[src='x'], svg[onload]") || (e.tagName === "SCRIPT" && e.textContent.includes("__xss"))
         || (e.tagName === "B" && e.textContent.startsWith("k/"))).length"""


def _no_markup_ran(page, where: str) -> None:
    assert page.evaluate("window.__xss") is None, where
    assert page.evaluate(MADE_OF_PAYLOADS) == 0, where


def test_stored_markup_stays_text_in_a_real_browser(site, page):
    run = Hostile.trigger(list(XSS), app=site.app)
    wait_for(lambda: site.app.run(run.id).status == "halted", "the hostile run halted")
    page.goto(site.url(f"/runs/{run.id}"))
    expect(_status(page)).to_have_text("halted")
    _no_markup_ran(page, "run")
    failed = page.locator("details[data-step='Explode#1']")  # open: it failed
    expect(failed.locator(".error").first).to_have_text(f"builtins.ValueError: {' '.join(XSS)}")
    expect(failed.locator("pre.payload").first).to_have_text(json.dumps([list(XSS)], indent=2, ensure_ascii=False))
    expect(page.locator("td.ctxkey")).to_have_text(sorted(XSS))  # each payload a key, its own value
    expect(page.locator("table.context pre.payload")).to_have_text([json.dumps(p) for p in sorted(XSS)])
    expect(page.locator("[data-node='Explode#1'] .node-key")).to_contain_text("key <b>k/")
    page.locator("details[data-step='Explode#1'] summary a.key").click()  # the key's own page, by its link
    expect(page.locator("h2 .key")).to_have_text(XSS_KEY)
    _no_markup_ran(page, "key")
    for path in ("/", "/runs?status=halted", "/keys", "/processes"):
        page.goto(site.url(path))
        _no_markup_ran(page, path)
    page.goto(site.url("/keys"))
    expect(page.get_by_role("link", name=XSS_KEY, exact=True)).to_have_count(1)
    assert re.search(r"ductwork web: .* on http://127\.0\.0\.1:\d+/", site.web_log.read_text())
