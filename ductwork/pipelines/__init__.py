"""Pipelines (↔ ``model/pipelines.py``): definitions and steps as users write them
(``definition``, ``step``, ``pipeline``, ``context``, ``payloads``), and the rows and
transitions of a run (``steps``, ``runs``, ``advance``). Built on ``ductwork.limits``
and ``ductwork.db``; knows nothing of processes.
"""
