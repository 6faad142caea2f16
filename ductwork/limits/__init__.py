"""Fleet-wide limits and executions (↔ ``model/limits.py``): token buckets (``buckets``),
claiming and releasing keyed executions (``claims``), and recording their outcomes
(``executions``). Built on ``ductwork.db``; knows nothing of pipelines or the fleet.
"""
