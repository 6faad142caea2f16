"""The witnessed calls of tests/integration/test_rolling_deploy.py: two fleets with
different limits on one database (``"tests.workloads.rolling:RollingRaised"``, …).

Every body writes a witness row when it starts and stamps it when it returns, each in its
own short transaction with database time, naming the fleet that ran it
(``DUCTWORK_ROLLING_FLEET``); ``DUCTWORK_ROLLING_WITNESS_URL`` names the database.
"""

from __future__ import annotations

import time

from ductwork import Pipeline, Step

_rolling_engine = None


def rolling_witness_table(metadata=None):
    """The table ``RollingCall`` bodies write (created next to ductwork's tables)."""
    import sqlalchemy as sa

    from ductwork.db import schema

    return sa.Table(
        "rolling_witnesses", metadata if metadata is not None else sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("step_id", schema.Id, nullable=False),
        sa.Column("fleet", schema.Name, nullable=False),  # DUCTWORK_ROLLING_FLEET of the body's process
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("limit_key", schema.Name, nullable=False),
        sa.Column("started_at", schema.Timestamp, nullable=False),
        sa.Column("ended_at", schema.Timestamp, nullable=True),  # NULL: did not return
    )


class RollingCall(Step):
    """Writes its witness row, pauses ``seconds``, stamps the row's end."""

    limit_key = ""

    def __init__(self, seconds):
        self.seconds = seconds

    def execute(self):
        import os

        from ductwork.db.dialects import db_now
        from ductwork.db.engines import create_engine

        global _rolling_engine
        if _rolling_engine is None:
            _rolling_engine = create_engine(os.environ["DUCTWORK_ROLLING_WITNESS_URL"], pool_size=2,
                                            io_timeout=10)
        table = rolling_witness_table()
        with _rolling_engine.begin() as conn:
            witness_id = conn.execute(table.insert().values(
                step_id=self._ductwork_step_id, fleet=os.environ["DUCTWORK_ROLLING_FLEET"],
                pid=os.getpid(), limit_key=self.limit_key, started_at=db_now(conn))).inserted_primary_key[0]
        time.sleep(self.seconds)
        with _rolling_engine.begin() as conn:
            conn.execute(table.update().where(table.c.id == witness_id).values(ended_at=db_now(conn)))
        return self.seconds


class RaisedCall(RollingCall):
    """A witnessed call on key ``raised`` (its concurrency is raised by the deploy)."""

    limit_key = "raised"


class LoweredCall(RollingCall):
    """A witnessed call on key ``lowered`` (its concurrency is lowered by the deploy)."""

    limit_key = "lowered"


class RatedCall(RollingCall):
    """A witnessed call on key ``rated`` (its rate changes with the deploy)."""

    limit_key = "rated"


class RollingRaised(Pipeline):
    """One RaisedCall on key ``raised``."""

    @classmethod
    def define(cls, p):
        p.start(RaisedCall, limit_by="raised")


class RollingLowered(Pipeline):
    """One LoweredCall on key ``lowered``."""

    @classmethod
    def define(cls, p):
        p.start(LoweredCall, limit_by="lowered")


class RollingRated(Pipeline):
    """One RatedCall on key ``rated``."""

    @classmethod
    def define(cls, p):
        p.start(RatedCall, limit_by="rated")
