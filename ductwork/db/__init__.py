"""The bottom layer: the database and nothing above it (↔ the state every model operation reads and writes).

Engine, transactions and the database clock (``database``), tables (``schema``), the
backends' differences (``dialects``), ``clock``, ``ids``, migrations (``migrate``) and
wake-ups. Imports nothing of ductwork but the base modules (errors, config, ...).
"""
