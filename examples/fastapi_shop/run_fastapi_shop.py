"""The FastAPI shop (``shop_api.py``) driven through its endpoints, start to end.

    python examples/fastapi_shop/run_fastapi_shop.py [--database-url URL]

Places an order (``POST /orders``) and places it again as a retry would: the same run
comes back. Asks for the run with a short wait while nothing works it (**202**, still
in progress), then with a longer one while a worker thread drains it: **200**,
``dampened``, waiting for the warehouse. Resumes it with the carrier's tracking number
(``POST /runs/{id}/resume``), once: a second resume answers **409**. Waits again: the
run is ``completed`` and says how the order shipped. Then two orders fail after their
trigger, in the same transaction: an unknown sku (the order's foreign key) and too little
stock. Neither leaves an order or a run.

The requests go through FastAPI's ``TestClient`` (the app on its own event loop, as a
server would run it); ``ductwork.testing.drain`` in a thread stands in for the fleet.
Runs on a fresh SQLite file unless ``--database-url`` names another database (one the
example can have to itself): it migrates ductwork's tables and creates the shop's. Exits
0 when every answer is the expected one, else 1 saying which was not.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

import sqlalchemy as sa
from fastapi.testclient import TestClient
from shop_api import create_app, metadata, orders, stock

import ductwork
from ductwork.db import migrate
from ductwork.testing import drain


class Unexpected(Exception):
    pass


def expect(response, status, what):
    if response.status_code != status:
        raise Unexpected(f"{what}: {response.status_code} {response.text}, expected {status}")
    return response.json()


def draining(dw):
    worker = threading.Thread(target=drain, args=(dw,), daemon=True)  # a fleet, in production
    worker.start()
    return worker


def shop(dw, client):
    placed = expect(client.post("/orders", json={"order_id": "A-1", "sku": "mug", "quantity": 2}), 201, "order")
    run_id = placed["run_id"]
    retried = expect(client.post("/orders", json={"order_id": "A-1", "sku": "mug", "quantity": 2}), 200, "retry")
    same = "the same run" if retried["run_id"] == run_id else f"ANOTHER run {retried['run_id']}"
    print(f"order A-1: run {run_id} {placed['status']}; the retried request got {same}")

    pending = expect(client.get("/orders/A-1/run", params={"wait": 0.2}), 202, "short wait")
    print(f"wait 0.2 s with no worker: 202, run {pending['status']}")
    worker = draining(dw)
    dampened = expect(client.get("/orders/A-1/run", params={"wait": 30}), 200, "wait")
    worker.join()
    print(f"wait with a worker: 200, run {dampened['status']}")

    handover = {"carrier": "DHL", "tracking": "JD0001"}
    resumed = expect(client.post(f"/runs/{run_id}/resume", json=handover), 200, "resume")
    again = expect(client.post(f"/runs/{run_id}/resume", json=handover), 409, "second resume")
    print(f"resume: 200, run {resumed['status']}; second resume: 409 ({again['detail']})")
    worker = draining(dw)
    done = expect(client.get("/orders/A-1/run", params={"wait": 30}), 200, "wait after resume")
    worker.join()
    print(f"wait: 200, run {done['status']}: {done.get('shipped')}")
    if done["status"] != "completed" or dampened["status"] != "dampened" or same != "the same run":
        raise Unexpected("order A-1 did not go in_progress → dampened → completed on one run")

    unknown = expect(client.post("/orders", json={"order_id": "C-1", "sku": "kettle", "quantity": 1}), 422, "sku")
    short = expect(client.post("/orders", json={"order_id": "C-2", "sku": "tea", "quantity": 2}), 409, "stock")
    print(f"failed after the trigger: 422 ({unknown['detail']}), 409 ({short['detail']})")
    with dw.engine.connect() as conn:
        order_ids = sorted(conn.execute(sa.select(orders.c.id)).scalars())
    runs = [run.id for run in ductwork.list_runs(app=dw)]
    print(f"orders: {order_ids}; runs: {len(runs)}")
    if order_ids != ["A-1"] or runs != [run_id]:
        raise Unexpected("a failed order left an order or a run behind")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="a database the example may use alone (default: a fresh SQLite file)")
    url = parser.parse_args(argv).database_url or f"sqlite:///{Path(tempfile.mkdtemp()) / 'shop.sqlite3'}"
    dw = ductwork.connect(url)
    migrate.upgrade(dw.engine)
    metadata.create_all(dw.engine)  # the shop's tables (an application migrates its own)
    with dw.engine.begin() as conn:
        conn.execute(stock.insert(), [{"sku": "mug", "available": 5}, {"sku": "tea", "available": 1}])
    try:
        with TestClient(create_app(dw)) as client:  # `with`: the app's lifespan runs
            shop(dw, client)
    except Unexpected as error:
        print(f"FAILED: {error}")
        return 1
    print("ok: each order started its run with the order, or neither exists; the run resumed once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
