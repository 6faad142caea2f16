"""Connects ductwork when Django starts, to the database Django uses."""

from django.apps import AppConfig
from django.conf import settings

import ductwork


class ShopConfig(AppConfig):
    name = "shop"
    default_auto_field = "django.db.models.BigAutoField"
    #: the ductwork app on Django's database (also the default app of Pipeline.trigger)
    ductwork_app: ductwork.App

    def ready(self) -> None:
        ShopConfig.ductwork_app = ductwork.connect(settings.DUCTWORK_DATABASE_URL)
