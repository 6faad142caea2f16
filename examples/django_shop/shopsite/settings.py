"""Settings of the example shop: one database, shared by Django and ductwork.

``SHOP_DATABASE_URL`` names it (``sqlite:///path``, ``postgresql://…``, ``mysql://…``).
Django's ``DATABASES`` is built from it, and ``shop.apps`` connects ductwork to the same
URL, so the orders and the runs live in one database: that is what lets an order and its
run commit together.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sqlalchemy.engine import make_url

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only-not-secret"  # an example that serves nothing
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]
INSTALLED_APPS = ["shop.apps.ShopConfig"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "shopsite.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DUCTWORK_DATABASE_URL = os.environ.get(
    "SHOP_DATABASE_URL", f"sqlite:///{Path(tempfile.gettempdir()) / 'django_shop.sqlite3'}")


def django_database(url: str) -> dict[str, object]:
    """Django's ``DATABASES['default']`` for a ductwork database URL."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": parsed.database,
            "OPTIONS": {
                # ductwork's own SQLite transactions take the write lock at BEGIN; Django's
                # do the same here, so writers queue for the lock instead of failing.
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
            },
        }
    if backend in ("mysql", "mariadb"):
        # Django's MySQL backend imports MySQLdb (mysqlclient); PyMySQL can stand in for it.
        import pymysql  # type: ignore[import-untyped]

        pymysql.install_as_MySQLdb()
        engine, options = "django.db.backends.mysql", {"isolation_level": "read committed", "charset": "utf8mb4"}
    elif backend == "postgresql":
        engine, options = "django.db.backends.postgresql", {}
    else:
        raise ValueError(f"SHOP_DATABASE_URL: no Django backend for {backend!r}")
    return {
        "ENGINE": engine,
        "NAME": parsed.database,
        "USER": parsed.username or "",
        "PASSWORD": parsed.password or "",
        "HOST": parsed.host or "",
        "PORT": str(parsed.port or ""),
        "OPTIONS": options,
    }


DATABASES = {"default": django_database(DUCTWORK_DATABASE_URL)}
