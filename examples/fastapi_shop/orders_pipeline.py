"""The shop's pipeline: pack an order, wait for the warehouse's hand-over, ship.

Workers import this module (``ductwork start`` with ``pipelines: [orders_pipeline.FulfilOrder]``),
so it holds only the steps: no web framework.
"""

from __future__ import annotations

from ductwork import Pipeline, Step


class PackOrder(Step):
    def __init__(self, order_id, sku, quantity):
        self.order_id, self.sku, self.quantity = order_id, sku, quantity

    def execute(self):
        # The step after the dampen gets the warehouse's input, not this output: keep the
        # order id in the run's Context. overwrite=True because a re-run stores the same value.
        self.context.set("order_id", self.order_id, overwrite=True)
        return f"order {self.order_id}: {self.quantity} x {self.sku} packed"


class ShipOrder(Step):
    def __init__(self, handover):
        self.handover = handover  # POST /runs/{id}/resume's body: {"carrier": ..., "tracking": ...}

    def execute(self):
        return (f"order {self.context.get('order_id')} shipped with {self.handover['carrier']}, "
                f"tracking {self.handover['tracking']}")


class FulfilOrder(Pipeline):
    """Pack, then wait (dampened: no worker, no lock) until the warehouse hands the parcel
    to a carrier and says so through ``POST /runs/{id}/resume``, then ship."""

    @classmethod
    def define(cls, pipeline):
        pipeline.start(PackOrder).dampen(before=ShipOrder)
