"""The pipeline each order starts: charge, then ship."""

from ductwork import Pipeline, Step


class Charge(Step):
    def __init__(self, order_id):
        self.order_id = order_id

    def execute(self):
        return self.order_id


class Ship(Step):
    def __init__(self, order_id):
        self.order_id = order_id

    def execute(self):
        return f"shipped order {self.order_id}"


class FulfilOrder(Pipeline):
    @classmethod
    def define(cls, pipeline):
        pipeline.start(Charge).chain(to=Ship)
