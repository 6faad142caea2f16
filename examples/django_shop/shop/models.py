"""An order, and the id of the pipeline run that fulfils it."""

from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    #: the run of ``FulfilOrder`` for this order; NULL until it is known. The sweep
    #: (``manage.py trigger_missing_runs``) triggers the orders where it is still NULL.
    run_id = models.CharField(max_length=64, null=True, blank=True)

    @property
    def trigger_key(self) -> str:
        """The key of this order's trigger: one run per order, however often it is triggered."""
        return f"order-{self.pk}"
