"""The fleet: processes that do the work (no model counterpart: the model's operations run
here). ``worker`` performs executions, ``child`` runs a ``timeout=`` step in a child
process (``invoke`` is what both share), ``processes`` and ``reaper`` keep process rows,
``supervisor`` starts and stops them, ``boot`` loads the configured pipelines.
"""
