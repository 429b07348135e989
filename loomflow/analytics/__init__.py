"""Analytics of the log: what each event adds, and where the sums are kept.

- ``tally``: plain functions, no I/O: which events count and what each adds (runs, turns,
  tool calls, tokens, cost, latency), per hour, model and user; :class:`Stats` is what a
  reader gets back.
- ``embedded``: the embedded half, tables in a SQLite file beside the journal, updated
  from the log by position (the file's SQL and migrations: ``projections/sqlite/stats.py``).
- ``app``: the Kafka half, a faust app with its own consumer group and the reader of its
  table (needs the ``[kafka]`` extra; loaded only when named).
- ``colours``: one colour per model, user and token kind, for every chart of a page.
- ``report``: one self-contained HTML page of either half's tables, and the charts the
  web console draws too (``[report]`` extra).
"""

from loomflow.analytics.tally import Counters, Stats

__all__ = ["Counters", "Stats"]
