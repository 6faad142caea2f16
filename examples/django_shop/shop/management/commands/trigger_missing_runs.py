"""``python manage.py trigger_missing_runs``: the sweep of the on-commit way.

Run it after a crash, or from cron every few minutes: it triggers, by key, every order
with no run recorded. An order whose trigger did happen (the process died before it
recorded the run's id) gets its existing run back, because the key is taken.
"""

from typing import Any

from django.core.management.base import BaseCommand

from shop.orders import trigger_missing_runs


class Command(BaseCommand):
    help = "Trigger, by key, the run of every order that has none recorded (idempotent)."

    def handle(self, *_args: Any, **_options: Any) -> None:
        swept = trigger_missing_runs()
        self.stdout.write(f"triggered runs for {len(swept)} orders: {swept}")
