"""A FastAPI shop: an order and its pipeline commit together, in the request's transaction.

    uvicorn --factory shop_api:from_environment   (DUCTWORK_DATABASE_URL names the database)

Three endpoints, all on the event loop, none blocking it:

- ``POST /orders`` inserts the order and triggers its ``FulfilOrder`` run in one
  transaction of the app's ``AsyncEngine`` (``await FulfilOrder.atrigger(...,
  connection=conn)``): both commit or neither does. The trigger key is ``order-<id>``
  and the order id is the client's, so a retried request (a timeout, a double click)
  gets the same run back: **201** with a new run, **200** with the run the order already
  has. A failure after the trigger rolls the run back with the order: an unknown ``sku``
  (the order's foreign key) answers **422**, too little stock (a conditional UPDATE that
  changed no row) **409**; either way no order, no run, and the key is free again.
- ``GET /orders/{id}/run?wait=S`` awaits the run for up to ``S`` seconds (0 to 30,
  default 0: no wait) with ``run.await_completion``: **200** once the run is settled
  (``completed``, ``halted`` or ``dampened``, the last meaning it waits for the
  warehouse), **202** if it is still ``in_progress`` when the wait ends (ask again);
  **404** for an unknown order.
- ``POST /runs/{id}/resume`` with ``{"carrier": ..., "tracking": ...}`` resumes a
  dampened run: the body becomes ``ShipOrder``'s input. **200**; **409** if the run has no
  dampened branch (already resumed, or not there yet); **404** for an unknown run.

``app.arun(run_id)`` reads the run through the async driver; ``run.aresume`` and
``run.steps`` run in a thread (``asyncio.to_thread``), as ``atrigger`` does without a
connection. Everything else goes through the async driver.

Workers (``ductwork start``, or ``ductwork.testing.drain`` in the smoke test) do the
runs' work; they import ``orders_pipeline``. ``run_fastapi_shop.py`` runs it all.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import sqlalchemy as sa
from fastapi import FastAPI, HTTPException, Query, Response
from orders_pipeline import FulfilOrder
from pydantic import BaseModel, Field

import ductwork
from ductwork.db import engines
from ductwork.errors import RunStateError, UnknownRunError

metadata = sa.MetaData()
stock = sa.Table(
    "shop_stock", metadata,
    sa.Column("sku", sa.String(64), primary_key=True),
    sa.Column("available", sa.Integer, nullable=False),
)
orders = sa.Table(
    "shop_orders", metadata,
    sa.Column("id", sa.String(64), primary_key=True),  # the client's order id
    sa.Column("sku", sa.String(64), sa.ForeignKey(stock.c.sku), nullable=False),
    sa.Column("quantity", sa.Integer, nullable=False),
    sa.Column("run_id", sa.String(64), nullable=False),  # no foreign key: `ductwork prune` deletes runs
)


class OrderIn(BaseModel):
    order_id: str = Field(pattern=r"^[A-Za-z0-9-]{1,40}$")
    sku: str = Field(min_length=1, max_length=64)
    quantity: int = Field(gt=0)


class Handover(BaseModel):
    carrier: str
    tracking: str


class OutOfStock(Exception):
    pass


def create_app(dw: ductwork.App) -> FastAPI:
    """The shop on ``dw``'s database: ductwork's tables migrated, ``metadata``'s created."""
    engine = engines.create_async_engine(dw.url)  # or your own AsyncEngine on the same database

    @asynccontextmanager
    async def lifespan(_api):
        yield
        await engine.dispose()

    api = FastAPI(title="shop", lifespan=lifespan)

    @api.post("/orders", status_code=201)
    async def place_order(order: OrderIn, response: Response):
        try:
            async with engine.begin() as conn:  # the request's transaction
                # Written through conn: visible to workers only when this block commits. A
                # trigger with the key of a run another request has not committed yet waits
                # for that request, then returns its run (or, if it rolled back, inserts).
                run = await FulfilOrder.atrigger(order.order_id, order.sku, order.quantity, app=dw,
                                                 key=f"order-{order.order_id}", connection=conn)
                existing = (await conn.execute(
                    sa.select(orders.c.run_id).where(orders.c.id == order.order_id))).first()
                if existing is not None:  # a retried request: the key returned the order's run
                    response.status_code = 200
                    return {"order_id": order.order_id, "run_id": existing.run_id, "status": run.status}
                await conn.execute(orders.insert().values(id=order.order_id, sku=order.sku,
                                                          quantity=order.quantity, run_id=run.id))
                reserved = await conn.execute(
                    stock.update().where(stock.c.sku == order.sku, stock.c.available >= order.quantity)
                    .values(available=stock.c.available - order.quantity))
                if reserved.rowcount != 1:
                    raise OutOfStock  # leaving the block rolls back the order and the run
        except sa.exc.IntegrityError:
            # The order's foreign key: the only constraint the insert can break here (the
            # key made a concurrent retry of this order wait, then find the order above).
            raise HTTPException(422, f"order {order.order_id}: unknown sku {order.sku!r}") from None
        except OutOfStock:
            raise HTTPException(409, f"order {order.order_id}: not {order.quantity} of {order.sku} in stock") from None
        return {"order_id": order.order_id, "run_id": run.id, "status": run.status}

    @api.get("/orders/{order_id}/run")
    async def order_run(order_id: str, response: Response, wait: float = Query(0, ge=0, le=30)):
        async with engine.connect() as conn:
            row = (await conn.execute(sa.select(orders.c.run_id).where(orders.c.id == order_id))).first()
        if row is None:
            raise HTTPException(404, f"no order {order_id}")
        run = await dw.arun(row.run_id)
        try:
            await run.await_completion(timeout=wait, poll=0.05)
        except TimeoutError:
            response.status_code = 202  # still in progress: ask again
        body = {"order_id": order_id, "run_id": run.id, "status": run.status, "halt_reasons": run.halt_reasons}
        if run.status == "completed":
            steps = await asyncio.to_thread(run.steps)
            body["shipped"] = steps[-1].output
        return body

    @api.post("/runs/{run_id}/resume")
    async def resume_run(run_id: str, handover: Handover):
        try:
            run = await (await dw.arun(run_id)).aresume(input=handover.model_dump())
        except UnknownRunError:
            raise HTTPException(404, f"no run {run_id}") from None
        except RunStateError as error:
            raise HTTPException(409, str(error)) from None
        return {"run_id": run.id, "status": run.status}

    return api


def from_environment() -> FastAPI:
    """``uvicorn --factory shop_api:from_environment``: the database ``ductwork.connect()``
    finds (``DUCTWORK_DATABASE_URL``, or ``ductwork.yml``)."""
    return create_app(ductwork.connect())
