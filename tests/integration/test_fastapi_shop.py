"""examples/fastapi_shop on each database: its endpoints, with a drain thread doing the
runs' work, under the loop-blocking detector of test_async_client.py.

Checks: the FastAPI recipe of issue 18 (INV-TRG-1, INV-TRG-2 as an application meets
them): an order and its run commit together or not at all; a retried request gets the
same run; a bounded wait answers 202 then 200; a dampened run resumes once from an
endpoint. The requests go through ``httpx2.AsyncClient`` with ``ASGITransport``, on the
detector's event loop, so a handler that blocks the loop fails the test.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
import sqlalchemy as sa

import ductwork
from ductwork.testing import drain
from tests.integration.test_async_client import run_unblocked

SHOP = Path(__file__).resolve().parents[2] / "examples" / "fastapi_shop"


@pytest.fixture
def shop(app, monkeypatch):
    """The example's module, its tables created in the test database and stocked, dropped after."""
    monkeypatch.syspath_prepend(str(SHOP))
    import shop_api

    shop_api.metadata.create_all(app.engine)
    with app.engine.begin() as conn:
        conn.execute(shop_api.stock.insert(), [{"sku": "mug", "available": 5}, {"sku": "tea", "available": 1}])
    yield shop_api
    shop_api.metadata.drop_all(app.engine)
    for name in ("shop_api", "orders_pipeline"):
        sys.modules.pop(name, None)


def _orders(app, shop):
    with app.engine.connect() as conn:
        return {row.id: row.run_id for row in conn.execute(sa.select(shop.orders.c.id, shop.orders.c.run_id))}


def test_orders_start_their_run_with_the_order_wait_and_resume(app, shop):
    api = shop.create_app(app)

    async def main():
        seen = {}
        async with api.router.lifespan_context(api), httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=api), base_url="http://shop") as client:
            placed = await client.post("/orders", json={"order_id": "A-1", "sku": "mug", "quantity": 2})
            assert placed.status_code == 201, placed.text
            run_id = placed.json()["run_id"]
            retried = await client.post("/orders", json={"order_id": "A-1", "sku": "mug", "quantity": 2})
            assert (retried.status_code, retried.json()["run_id"]) == (200, run_id)

            # Nothing works the run yet: a bounded wait ends with 202 and the run in progress.
            pending = await client.get("/orders/A-1/run", params={"wait": 0.2})
            assert (pending.status_code, pending.json()["status"]) == (202, "in_progress")

            worker = asyncio.create_task(asyncio.to_thread(drain, app))  # the fleet's part
            dampened = await client.get("/orders/A-1/run", params={"wait": 30})
            await worker
            assert (dampened.status_code, dampened.json()["status"]) == (200, "dampened"), dampened.text

            handover = {"carrier": "DHL", "tracking": "JD0001"}
            resumed = await client.post(f"/runs/{run_id}/resume", json=handover)
            assert (resumed.status_code, resumed.json()["status"]) == (200, "in_progress"), resumed.text
            again = await client.post(f"/runs/{run_id}/resume", json=handover)
            assert (again.status_code, "nothing to resume" in again.json()["detail"]) == (409, True), again.text

            worker = asyncio.create_task(asyncio.to_thread(drain, app))
            done = await client.get("/orders/A-1/run", params={"wait": 30})
            await worker
            assert done.status_code == 200, done.text
            seen["done"] = done.json()

            assert (await client.get("/orders/B-9/run")).status_code == 404
            assert (await client.post("/runs/no-such-run/resume", json=handover)).status_code == 404
        return run_id, seen

    run_id, seen = run_unblocked(app, main)
    assert seen["done"]["status"] == "completed"
    assert seen["done"]["shipped"] == "order A-1 shipped with DHL, tracking JD0001"
    assert _orders(app, shop) == {"A-1": run_id}
    assert [r.id for r in ductwork.list_runs(app=app)] == [run_id]
    with app.engine.connect() as conn:
        assert conn.execute(sa.select(shop.stock.c.available).where(shop.stock.c.sku == "mug")).scalar() == 3


def test_a_failure_after_the_trigger_leaves_neither_order_nor_run(app, shop):
    """The trigger comes first in the request's transaction; the order's insert (foreign
    key: unknown sku) or the stock reservation (a conditional UPDATE) fails after it. The
    run rolls back with the order, so the key is free: the corrected order gets a run."""
    api = shop.create_app(app)

    async def main():
        async with api.router.lifespan_context(api), httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=api), base_url="http://shop") as client:
            unknown = await client.post("/orders", json={"order_id": "C-1", "sku": "kettle", "quantity": 1})
            assert (unknown.status_code, unknown.json()["detail"]) == (422, "order C-1: unknown sku 'kettle'")
            short = await client.post("/orders", json={"order_id": "C-2", "sku": "tea", "quantity": 2})
            assert (short.status_code, short.json()["detail"]) == (409, "order C-2: not 2 of tea in stock")
            assert (await client.get("/orders/C-1/run")).status_code == 404
            fixed = await client.post("/orders", json={"order_id": "C-2", "sku": "tea", "quantity": 1})
            assert fixed.status_code == 201, fixed.text
            return fixed.json()["run_id"]

    run_id = run_unblocked(app, main)
    assert _orders(app, shop) == {"C-2": run_id}
    assert [r.id for r in ductwork.list_runs(app=app)] == [run_id]  # the two failed orders left no run



def test_a_request_and_its_retry_at_once_get_one_run(app, shop):
    """Two requests for one order in flight together: the second's trigger waits for the
    first's uncommitted key, then returns its run, and finds its order (READ COMMITTED)."""
    api = shop.create_app(app)

    async def main():
        async with api.router.lifespan_context(api), httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=api), base_url="http://shop") as client:
            order = {"order_id": "D-1", "sku": "mug", "quantity": 1}
            return await asyncio.gather(client.post("/orders", json=order), client.post("/orders", json=order))

    answers = run_unblocked(app, main)
    assert sorted(a.status_code for a in answers) == [200, 201], [a.text for a in answers]
    run_ids = {a.json()["run_id"] for a in answers}
    assert [r.id for r in ductwork.list_runs(app=app)] == list(run_ids)
    assert _orders(app, shop) == {"D-1": run_ids.pop()}

def test_the_example_runs_as_a_script(tmp_path):
    """``run_fastapi_shop.py`` (FastAPI's TestClient, the app's lifespan, a drain thread) on
    a SQLite file of its own; it prints no warning (Starlette's about httpx, say)."""
    from tests.integration.test_examples import _env

    script = SHOP / "run_fastapi_shop.py"
    assert "python examples/fastapi_shop/run_fastapi_shop.py [--database-url URL]" in script.read_text()
    done = subprocess.run([sys.executable, str(script), "--database-url", f"sqlite:///{tmp_path / 'shop.sqlite3'}"],
                          cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stderr) == (0, ""), done.stdout + done.stderr
    assert re.search(r"order A-1: run \S+ in_progress; the retried request got the same run", done.stdout)
    assert "wait 0.2 s with no worker: 202, run in_progress" in done.stdout
    assert "wait with a worker: 200, run dampened" in done.stdout
    assert "second resume: 409" in done.stdout
    assert "wait: 200, run completed: order A-1 shipped with DHL, tracking JD0001" in done.stdout
    assert "orders: ['A-1']; runs: 1" in done.stdout
    assert done.stdout.endswith("ok: each order started its run with the order, or neither exists; "
                                "the run resumed once\n")
