"""The dashboard in-process (Starlette's TestClient), no browser: what each page and
``/metrics`` read and say, the actions' guards, the token, a mount under a prefix.

The read-only check runs on SQLite, PostgreSQL and MySQL: every statement the pages
and ``/metrics`` send is recorded, and none writes or takes a lock (no INSERT, UPDATE,
DELETE, FOR UPDATE/SHARE, LOCK). The rest needs one database (SQLite): the pages read
only through the Python API, which its own tests run on the three. The browser tests
(test_web_browser.py) show the same against a real fleet.
"""

from __future__ import annotations

import html
import json
import re
from datetime import timedelta
from pathlib import Path
from urllib.parse import unquote

import pytest
import sqlalchemy as sa
from markupsafe import escape
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from ductwork.fleet.processes import register
from ductwork.fleet.worker import Worker
from ductwork.limits.claims import claim
from ductwork.pipelines.advance import Advancer
from ductwork.status import snapshot
from ductwork.testing import drain
from ductwork.web import dashboard
from tests.conftest import installed, make_app, migrated_sqlite, skip_ahead
from tests.workloads.web import LIMITS, POOL_KEY, RATED_KEY, XSS, XSS_KEY, Approval, Flaky, Hostile, Metered, Pushes


def _installed_web_app(url):
    """The app of these tests on ``url`` (the dashboard's limits, a clock drain may move),
    installed as the default."""
    from ductwork.db.clock import OffsetClock

    yield from installed(make_app(url, clock=OffsetClock(), job_worker={"limits": LIMITS, "max_retry": 1}))


@pytest.fixture
def web_app(db_url):
    yield from _installed_web_app(db_url)


@pytest.fixture
def sqlite_app(tmp_path):
    """One database is enough where only the page matters."""
    yield from _installed_web_app(migrated_sqlite(tmp_path, "web"))


def _every_state(app, tmp_path: Path) -> dict[str, str]:
    """A halted, a dampened, an in-progress run whose key is full (5/5 in flight, 2 pending),
    a hostile run, and a metered one whose rated key refused its first claim (blocked for
    an hour); returns their ids by name."""
    halted = Flaky.trigger(str(tmp_path / "never"))
    dampened = Approval.trigger({"n": 1})
    hostile = Hostile.trigger(list(XSS))
    drain(app, skip_delays=True)
    pushes = _pushes_pending(app, tmp_path, Worker(app))
    holder = register(app, role="test", label="holder")
    for _ in range(5):  # five of them in flight: the key is full
        assert claim(app, holder) is not None
    metered = Metered.trigger("metered")
    assert claim(app, holder) is None  # refused: the rated key's bucket starts empty
    return {"halted": halted.id, "dampened": dampened.id, "hostile": hostile.id, "pushes": pushes,
            "metered": metered.id}


def _pushes_pending(app, tmp_path: Path, worker: Worker) -> str:
    """A Pushes run whose Fetch ``worker`` ran and an advancer expanded: seven gated
    pushes pending on POOL_KEY; returns its id."""
    pushes = Pushes.trigger({"gate": str(tmp_path / "gate"), "items": 7})
    assert worker.run_once() is not None  # Fetch
    advancer = Advancer(app)
    while advancer.run_once() != "idle":  # the expand
        pass
    return pushes.id


def _pages(runs: dict[str, str]) -> list[str]:
    quoted = "/keys/" + "".join(f"%{b:02X}" for b in XSS_KEY.encode())
    return ["/", "/runs", "/runs?status=halted", "/runs?pipeline=Hostile&since=1h", "/keys", "/keys?busy=1",
            f"/keys/{POOL_KEY}", f"/keys/{RATED_KEY}", quoted, "/processes", "/metrics",
            *(f"/runs/{run_id}" for run_id in runs.values())]


def _key_row(page: str, key: str) -> str:
    """The keys table's row of ``key`` (its name as the page escapes it)."""
    (row,) = [row for row in re.findall(r'<tr class="keyrow.*?</tr>', page, re.S)
              if f">{escape(key)}</a>" in row]
    return row


def _samples(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A scrape of ``/metrics``: (name, sorted labels) -> value."""
    text = client.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_pages_and_metrics_only_read_on_each_database(web_app, tmp_path):
    runs = _every_state(web_app, tmp_path)
    client = TestClient(dashboard(web_app))
    sent: list[str] = []

    def record(_conn, _cursor, statement, *_args):
        sent.append(statement)

    sa.event.listen(web_app.engine, "before_cursor_execute", record)
    try:
        for path in _pages(runs):
            response = client.get(path)
            assert response.status_code == 200, (path, response.text[:2000])
    finally:
        sa.event.remove(web_app.engine, "before_cursor_execute", record)
    assert len(sent) > 30
    writes = [s for s in sent if re.search(r"^\s*(INSERT|UPDATE|DELETE|LOCK|BEGIN\s+IMMEDIATE)\b"
                                           r"|\bFOR\s+(NO\s+KEY\s+)?(UPDATE|SHARE)\b", s, re.IGNORECASE)]
    assert writes == []


def test_what_the_pages_say(sqlite_app, tmp_path):
    runs = _every_state(sqlite_app, tmp_path)
    client = TestClient(dashboard(sqlite_app))
    overview = client.get("/").text
    assert re.search(r'data-runs="halted">2<', overview)  # Flaky and Hostile
    assert re.search(r'data-runs="in_progress">2<', overview)  # Pushes and Metered
    keys = client.get("/keys").text
    pool = _key_row(keys, POOL_KEY)
    assert re.search(r"data-key-inflight>5/5<", pool)
    assert re.search(r"data-key-pending>2<", pool)
    assert re.search(r'class="keyrow refusing".*<span class="warn">full</span>', pool, re.S)
    rated = _key_row(keys, RATED_KEY)
    assert re.search(r'<div class="bucket empty">0\.00/1 tokens \(1 per 3600 s\)', rated)  # tokens vs burst
    assert re.search(r'<span class="warn">blocked until [0-9-]+ [0-9:]+ \(in (59\.9|60\.0) min\)</span>\s*'
                     r'<div class="muted">by 1 per 3600 s</div>', rated)  # until when, and the entry
    assert re.search(r"data-key-pending>1<", rated)
    assert "no rate" in pool
    assert "blocked until" not in pool
    run = client.get(f"/runs/{runs['pushes']}").text
    states = dict(re.findall(r'data-node="([^"]+)" data-state="([^"]+)"', run))
    assert states == {"Fetch#0": "done", "PushGated#1": "running", "Tally#2": "none"}
    assert "5 running, 2 waiting" in run
    metered = client.get(f"/runs/{runs['metered']}").text
    assert re.search(r"key <a class=\"key\" href=\"/keys/web_rated\">web_rated</a> is rate-blocked until", metered)
    halted = client.get(f"/runs/{runs['halted']}").text
    assert "job_retries_exhausted" in halted
    assert "RuntimeError: no file never yet" in halted
    assert 'action="/runs/' + runs["halted"] + '/revive"' in halted
    dampened = client.get(f"/runs/{runs['dampened']}").text
    assert 'action="/runs/' + runs["dampened"] + '/resume"' in dampened
    assert 'data-state="dampened"' in dampened
    assert client.get("/runs/nope").status_code == 404
    assert client.get("/keys/nope").status_code == 404
    bad = client.get("/runs?since=yesterday")
    assert bad.status_code == 400
    assert "--since=&#39;yesterday&#39;" in bad.text


def _listed(client, path: str) -> tuple[list[str], list[str]]:
    """The run ids ``path`` lists, following its "older" links to the last page; and
    those links."""
    listed: list[str] = []
    links: list[str] = []
    while True:
        page = client.get(path).text
        listed += re.findall(r'href="/runs/([0-9a-f-]{36})"', page)
        older = re.findall(r'<a rel="next" href="([^"]+)"', page)
        if not older:
            return listed, links
        path = html.unescape(older[0])
        links.append(path)


def test_runs_are_paged_by_keyset_and_filtered(sqlite_app, tmp_path):
    ids = [Approval.trigger({"n": i}).id for i in range(53)]
    halted = [Flaky.trigger(str(tmp_path / "never")).id for _ in range(2)]
    drain(sqlite_app, skip_delays=True)  # the approvals dampened, the flaky runs halted
    client = TestClient(dashboard(sqlite_app))
    every, links = _listed(client, "/runs")
    assert every == sorted(ids + halted, reverse=True)  # ids are time-ordered: newest first, each once
    assert len(links) == 1
    second = client.get(links[0]).text
    assert 'rel="next"' not in second
    assert "« newest" in second
    for path in ("/runs?status=dampened", f"/runs?pipeline={Approval.__module__}:Approval", "/runs?pipeline=Approval"):
        listed, links = _listed(client, path)
        assert listed == sorted(ids, reverse=True), path
        query = path.split("?")[1].replace(":", "%3A")
        (older,) = links
        assert query in older, path  # the older link keeps the filter
    assert _listed(client, "/runs?status=halted") == (sorted(halted, reverse=True), [])
    assert _listed(client, "/runs?status=completed&pipeline=Flaky") == ([], [])
    skip_ahead(sqlite_app, timedelta(hours=2))
    assert _listed(client, "/runs?since=3h")[0] == every
    assert _listed(client, "/runs?since=1h")[0] == []
    assert "no run matches" in client.get("/runs?since=1h").text


#: where a page writes each value from the database: the field's HTML, by field
FIELDS = {
    "input": r'<dt>input</dt><dd><pre class="payload">(.*?)</pre>',
    "output": r'<dt>output</dt><dd><pre class="payload">(.*?)</pre>',
    "error message": r'<span class="error">(.*?)</span>',
    "context key": r'<td class="ctxkey">(.*?)</td>',
    "context value": r'<td class="ctxkey">.*?</td><td><pre class="payload">(.*?)</pre>',
    "key name": r'<a class="key" href="[^"]*">(.*?)</a>',
}


def test_every_payload_is_escaped_in_every_field(sqlite_app, tmp_path):
    """Each XSS payload is stored in each field (Hostile), and each field shows it as
    text: its HTML holds no markup character, and unescaped it is the stored value."""
    runs = _every_state(sqlite_app, tmp_path)
    client = TestClient(dashboard(sqlite_app))
    texts = {path: client.get(path).text for path in _pages(runs)}
    for path, text in texts.items():
        if path != "/metrics":
            assert "<script>window" not in text, path
            assert "<img src=x" not in text, path
            assert "<svg onload" not in text, path
            assert "<b>k/" not in text, path
    hostile = texts[f"/runs/{runs['hostile']}"] + texts["/keys"]
    fields = {name: re.findall(pattern, hostile, re.S) for name, pattern in FIELDS.items()}
    shown = {name: [html.unescape(raw) for raw in found] for name, found in fields.items()}
    for name, found in fields.items():
        assert found, name
        assert [raw for raw in found if set(raw) & set("<>\"'")] == [], name  # every markup character escaped
    for name in ("input", "output"):  # Echo's and Explode's: the list of every payload
        assert all(json.dumps(payload) in value for payload in XSS for value in shown[name]), name
    assert all(payload in XSS_KEY for payload in XSS)
    assert XSS_KEY in shown["key name"]
    assert shown["error message"] == [f"builtins.ValueError: {' '.join(XSS)}"] * 2  # a failure and its retry
    assert shown["context key"] == sorted(XSS)  # each payload a key, its own value
    assert shown["context value"] == [json.dumps(payload) for payload in sorted(XSS)]
    links = re.findall(r'<a class="key" href="([^"]*)">', hostile)
    assert "/keys/" + XSS_KEY in [unquote(link) for link in links]  # one path segment, percent-encoded


def test_actions_are_posts_with_a_csrf_token_and_a_confirmation(sqlite_app):
    run = Approval.trigger({"n": 1})
    drain(sqlite_app, skip_delays=True)
    client = TestClient(dashboard(sqlite_app))
    page = client.get(f"/runs/{run.id}").text
    csrf = client.cookies["ductwork_csrf"]
    assert f'name="csrf" value="{csrf}"' in page
    assert client.get(f"/runs/{run.id}/resume").status_code == 405  # nothing through GET
    assert client.get(f"/runs/{run.id}/revive").status_code == 405
    form = {"input_from": "given", "input": '{"approved": "<yes>"}'}
    assert client.post(f"/runs/{run.id}/resume", data=form).status_code == 403  # no token
    assert client.post(f"/runs/{run.id}/resume", data={**form, "csrf": "x" * 43}).status_code == 403
    foreign = client.post(f"/runs/{run.id}/resume", data={**form, "csrf": csrf, "confirmed": "yes"},
                          headers={"Origin": "http://evil.example"})
    assert (foreign.status_code, run.refresh().status) == (403, "dampened")  # the right token, from elsewhere
    same = client.post(f"/runs/{run.id}/resume", data={**form, "csrf": csrf}, headers={"Origin": "http://testserver"})
    assert same.status_code == 200  # this host's Origin: the confirmation
    confirm = client.post(f"/runs/{run.id}/resume", data={**form, "csrf": csrf})
    assert confirm.status_code == 200
    assert "&#34;approved&#34;: &#34;&lt;yes&gt;&#34;" in confirm.text
    assert run.refresh().status == "dampened"  # shown, not done
    bad = client.post(f"/runs/{run.id}/resume", data={**form, "input": "{nope", "csrf": csrf, "confirmed": "yes"})
    assert (bad.status_code, run.refresh().status) == (400, "dampened")
    done = client.post(f"/runs/{run.id}/resume", data={**form, "csrf": csrf, "confirmed": "yes"},
                       follow_redirects=False)
    assert (done.status_code, done.headers["location"]) == (303, f"/runs/{run.id}?done=resume")
    drain(sqlite_app, skip_delays=True)
    assert run.refresh().status == "completed"
    assert run.steps()[-1].output == {"approved": "<yes>"}
    again = client.post(f"/runs/{run.id}/resume", data={**form, "csrf": csrf, "confirmed": "yes"})
    assert again.status_code == 409
    assert "RunStateError" in again.text


def test_revive_from_the_dashboard_and_read_only(sqlite_app, tmp_path):
    halted = Flaky.trigger(str(tmp_path / "found"))
    drain(sqlite_app, skip_delays=True)
    (tmp_path / "found").touch()
    watching = TestClient(dashboard(sqlite_app, read_only=True))
    page = watching.get(f"/runs/{halted.id}").text
    assert "Revive" not in page
    refused = watching.post(f"/runs/{halted.id}/revive",
                            data={"csrf": watching.cookies["ductwork_csrf"], "confirmed": "yes"})
    assert refused.status_code == 403
    assert halted.history().run.revived_as is None
    client = TestClient(dashboard(sqlite_app))
    client.get(f"/runs/{halted.id}")
    done = client.post(f"/runs/{halted.id}/revive", data={"csrf": client.cookies["ductwork_csrf"],
                                                           "confirmed": "yes"}, follow_redirects=False)
    revived = halted.history().run.revived_as
    assert (done.status_code, done.headers["location"]) == (303, f"/runs/{revived}?done=revive")
    drain(sqlite_app, skip_delays=True)
    assert sqlite_app.run(revived).status == "completed"


def test_a_token_guards_every_page_and_metrics(sqlite_app):
    client = TestClient(dashboard(sqlite_app, token="s3cret"))
    assert client.get("/", follow_redirects=False).headers["location"] == "/login?next=%2F"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/metrics", headers={"Authorization": "Bearer s3cre"}).status_code == 401
    login = client.get("/login")
    assert login.status_code == 200
    csrf = client.cookies["ductwork_csrf"]
    assert client.post("/login", data={"csrf": csrf, "token": "wrong", "next": "/"}).status_code == 401
    assert client.get("/").history[0].status_code == 303  # still out
    ok = client.post("/login", data={"csrf": csrf, "token": "s3cret", "next": "//elsewhere"}, follow_redirects=False)
    assert (ok.status_code, ok.headers["location"]) == (303, "/")
    assert "s3cret" not in client.cookies["ductwork_session"]
    assert client.get("/").status_code == 200


def test_metrics_are_the_snapshot_in_prometheus_text(sqlite_app, tmp_path):
    _every_state(sqlite_app, tmp_path)
    samples = _samples(TestClient(dashboard(sqlite_app)))
    status = snapshot(sqlite_app)
    for state, count in status.runs.items():
        assert samples[("ductwork_runs", (("status", state),))] == count
    assert samples[("ductwork_key_in_flight", (("key", POOL_KEY),))] == 5
    assert samples[("ductwork_key_pending", (("key", POOL_KEY),))] == 2
    assert samples[("ductwork_key_concurrency", (("key", POOL_KEY),))] == 5
    assert samples[("ductwork_key_claims_total", (("key", POOL_KEY),))] == 5
    assert samples[("ductwork_key_claims_total", (("key", XSS_KEY),))] == 2  # Explode: a failure, its retry
    assert samples[("ductwork_key_claims_total", (("key", RATED_KEY),))] == 0
    refusing = {(key, reason): samples[("ductwork_key_refusing", (("key", key), ("reason", reason)))]
                for key in (POOL_KEY, RATED_KEY, XSS_KEY) for reason in ("concurrency", "rate")}
    assert refusing == {(POOL_KEY, "concurrency"): 1, (POOL_KEY, "rate"): 0, (RATED_KEY, "concurrency"): 0,
                        (RATED_KEY, "rate"): 1, (XSS_KEY, "concurrency"): 0, (XSS_KEY, "rate"): 0}
    bucket = (("key", RATED_KEY), ("period_seconds", "3600"))
    assert 0 <= samples[("ductwork_key_tokens", bucket)] < 0.01  # refilled for seconds of an hour's token
    assert samples[("ductwork_key_burst", bucket)] == 1
    assert 3500 < samples[("ductwork_key_blocked_seconds", (("key", RATED_KEY),))] <= 3600
    assert samples[("ductwork_key_blocked_seconds", (("key", POOL_KEY),))] == 0
    assert ("ductwork_key_tokens", (("key", POOL_KEY), ("period_seconds", "3600"))) not in samples
    assert samples[("ductwork_executions", (("state", "running"),))] == 5
    assert samples[("ductwork_executions", (("state", "failure"),))] == 4  # Flaky's and Explode's two each
    assert ("ductwork_scrape_duration_seconds", ()) in samples
    ages = [key for key in samples if key[0] == "ductwork_process_heartbeat_age_seconds"]
    assert len(ages) == len(status.processes) >= 1


def test_refusals_a_worker_counts_reach_metrics_at_its_heartbeat_on_each_database(web_app, tmp_path, monkeypatch,
                                                                                   caplog):
    """A worker process counts in memory the claims its polls were refused, by key and
    reason; its heartbeat adds them to ``ductwork_key_refusals`` and ``/metrics`` shows
    them from there, fleet-wide. Nothing is written on the claim path; a failed heartbeat
    keeps its counts for the next; a crash loses only what was counted since the last
    heartbeat. The heartbeat is driven by hand (``Runner.beat``), never waited for."""
    from ductwork.fleet import supervisor
    from ductwork.limits import claims
    from ductwork.limits.claims import restart_with
    from ductwork.limits.lanes import Lane, scan_lanes

    runner = supervisor.Runner(web_app, "job_worker", 1, "counting")
    runner.process_id = register(web_app, role="job_worker", label="counting")
    runner._units()  # its worker, sharing the process's counts; no thread started
    (worker,) = runner.units
    client = TestClient(dashboard(web_app))

    def refusals() -> dict[tuple[str, str], float]:
        return {(dict(labels)["key"], dict(labels)["reason"]): value for (name, labels), value
                in _samples(client).items() if name == "ductwork_key_refusals_total"}

    Metered.trigger("refused")
    for _ in range(3):  # three polls, each refused for rate: the bucket starts empty and refills for an hour
        restart_with(web_app)  # clears the stamp a refusal leaves, which would make the next poll pass the key by
        assert worker.run_once() is None
    assert refusals() == {}  # counted in memory: the claim path wrote nothing
    assert runner.beat()
    assert refusals() == {(RATED_KEY, "rate"): 3}
    _pushes_pending(web_app, tmp_path, worker)
    with web_app.begin(readonly=True) as tx:
        before = scan_lanes(web_app, tx)  # the pool key has room
    holder = register(web_app, role="test", label="holder")
    for _ in range(5):  # another process fills it
        assert claim(web_app, holder) is not None
    monkeypatch.setattr(claims, "scan_lanes", lambda *_, **__: before)  # each poll's scan raced that: it saw room
    for _ in range(2):  # refused for concurrency under the key's lock
        assert worker.run_once() is None
    assert runner.beat()
    assert refusals() == {(RATED_KEY, "rate"): 3, (POOL_KEY, "concurrency"): 2}
    with monkeypatch.context() as emptied:  # a lane whose work went between the scan and the lock
        emptied.setattr(claims, "scan_lanes", lambda *_, **__: [Lane(before[0].oldest, "emptied")])
        assert worker.run_once() is None  # "gone": not a refusal, not counted
    assert worker.run_once() is None  # a third

    def unreachable(*_):
        raise sa.exc.OperationalError("UPDATE", {}, ConnectionError("server closed the connection"))

    with monkeypatch.context() as failing:
        failing.setattr(supervisor, "heartbeat", unreachable)
        assert runner.beat()  # failed and logged; the watchdog decides when that is fatal
    assert "heartbeat failed" in caplog.text
    assert refusals()[(POOL_KEY, "concurrency")] == 2
    assert runner.beat()  # the next one writes what the failed one took
    assert refusals()[(POOL_KEY, "concurrency")] == 3
    assert worker.run_once() is None  # a fourth, and the process dies before its next heartbeat
    replacement = supervisor.Runner(web_app, "job_worker", 1, "counting")
    replacement.process_id = register(web_app, role="job_worker", label="counting")  # reaps the dead one
    replacement._units()
    assert replacement.beat()
    assert refusals() == {(RATED_KEY, "rate"): 3, (POOL_KEY, "concurrency"): 3}  # lost: the one since the last


def test_mounted_under_a_prefix(sqlite_app):
    run = Approval.trigger({"n": 1})
    host = Starlette(routes=[Mount("/ops/ductwork", app=dashboard(sqlite_app))])
    client = TestClient(host)
    page = client.get("/ops/ductwork/runs")
    assert page.status_code == 200
    assert f'href="/ops/ductwork/runs/{run.id}"' in page.text
    assert 'href="/ops/ductwork/static/dashboard.css"' in page.text
    assert client.get("/ops/ductwork/static/dashboard.js").status_code == 200
    assert client.get(f"/ops/ductwork/runs/{run.id}").status_code == 200
    assert "Content-Security-Policy" in page.headers
    assert json.loads(json.dumps(page.headers["Content-Security-Policy"])).startswith("default-src 'none'")


def test_mounted_in_a_wsgi_app_through_an_adapter(sqlite_app):
    """docs/dashboard.md's WSGI mount: a2wsgi's ``ASGIMiddleware`` under a WSGI prefix
    (``SCRIPT_NAME``, as a dispatcher such as werkzeug's sets it) serves the pages with the
    prefix in their links, the static files, and refuses a POST without its CSRF token."""
    from wsgiref.util import setup_testing_defaults

    from a2wsgi import ASGIMiddleware

    run = Approval.trigger({"n": 1})
    wsgi = ASGIMiddleware(dashboard(sqlite_app))

    def call(path: str, method: str = "GET") -> tuple[str, str]:
        environ: dict[str, object] = {"SCRIPT_NAME": "/ops/ductwork", "PATH_INFO": path, "REQUEST_METHOD": method}
        setup_testing_defaults(environ)
        got: list[str] = []
        body = b"".join(wsgi(environ, lambda status, _headers, _exc_info=None: got.append(status)))
        return got[0], body.decode()

    status, page = call("/runs")
    assert status.startswith("200"), status
    assert f'href="/ops/ductwork/runs/{run.id}"' in page
    assert call("/static/dashboard.js")[0].startswith("200")
    assert call(f"/runs/{run.id}")[0].startswith("200")
    assert call(f"/runs/{run.id}/revive", "POST")[0].startswith("403")


def test_docs_list_every_metric_with_its_type_and_labels(sqlite_app):
    """docs/dashboard.md's table is ``metrics.METRICS``, and a scrape exposes exactly those."""
    from ductwork.web.metrics import METRICS

    page = (Path(__file__).resolve().parents[2] / "docs" / "dashboard.md").read_text()
    rows = set(re.findall(r"^\| `(ductwork_\w+)` \| (\w+) \|([^|]*)\|", page, re.M))
    expected = {(name, kind, ", ".join(f"`{label}`" for label in labels.split(", ") if label))
                for name, kind, labels, _ in METRICS}
    assert {(name, kind, labels.strip()) for name, kind, labels in rows} == expected
    text = TestClient(dashboard(sqlite_app)).get("/metrics").text
    exposed = {family.name for family in text_string_to_metric_families(text)}
    assert {name.removesuffix("_total") for name, *_ in METRICS} == exposed


def test_ductwork_web_names_a_missing_database_before_serving(tmp_path, capsys):
    from ductwork.cli import main
    from ductwork.web.serve import loopback

    code = main(["web", "--database-url", f"sqlite:///{tmp_path}/absent.sqlite3", "-c", "/dev/null"])
    assert code == 1
    assert capsys.readouterr().err.startswith("ductwork web: MissingDatabaseError: ")
    assert list(tmp_path.iterdir()) == []
    assert [loopback(h) for h in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "10.0.0.1", "example.org")] == [
        True, True, True, False, False, False]
