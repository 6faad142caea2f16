"""Placing an order and starting its pipeline together, two ways.

1. **On commit** (:func:`place_order_on_commit`): the order commits, then
   ``transaction.on_commit`` triggers its run with the key ``order-<id>``. Simple, and a
   retried trigger returns the same run. But the trigger is a second step: a crash after
   the commit and before the trigger leaves an order without a run. The sweep
   (:func:`trigger_missing_runs`, ``manage.py trigger_missing_runs``) triggers every such
   order again, by its key, so it can run any time and as often as you like.
2. **Atomic** (:func:`place_order_atomic`): the run is written in the same database
   transaction as the order, through :func:`ductwork_connection`, a SQLAlchemy
   ``Connection`` on the very DBAPI connection Django's ``transaction.atomic()`` uses.
   Both commit or neither does; there is no gap to sweep.

``ductwork_connection`` is in the module ``ductwork_django`` beside ``manage.py``, which
says how it borrows Django's connection without ever ending Django's transaction.
"""

from __future__ import annotations

from django.db import transaction
from ductwork_django import ductwork_connection

from shop.models import Order
from shop.pipelines import FulfilOrder


def place_order_on_commit(item: str) -> Order:
    """Way 1: the order commits, then its run is triggered (idempotent by key)."""
    with transaction.atomic():
        order = Order.objects.create(item=item)
        transaction.on_commit(lambda: start_run(order))
    return order


def start_run(order: Order) -> str:
    """Trigger ``order``'s run by its key and record the run's id on the order.

    Idempotent: a second call (a retry, the sweep) returns the run that holds the key.
    """
    run = FulfilOrder.trigger(order.pk, key=order.trigger_key)
    Order.objects.filter(pk=order.pk, run_id__isnull=True).update(run_id=run.id)
    order.run_id = run.id
    return run.id


def trigger_missing_runs() -> list[int]:
    """The sweep of way 1: trigger, by key, every order that has no run recorded; returns
    their ids. Safe to run at any time, also while orders are being placed: an order whose
    run exists gets that run back (its key), and nothing is triggered twice."""
    swept = []
    for order in Order.objects.filter(run_id__isnull=True).order_by("pk"):
        start_run(order)
        swept.append(order.pk)
    return swept


def place_order_atomic(item: str) -> Order:
    """Way 2: the order and its run in one transaction; both commit or neither does."""
    with transaction.atomic():
        order = Order.objects.create(item=item)
        with ductwork_connection() as conn:
            run = FulfilOrder.trigger(order.pk, key=order.trigger_key, connection=conn)
        order.run_id = run.id
        order.save(update_fields=["run_id"])
    return order
