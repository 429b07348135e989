"""`loomflow demo`: an agent run is SIGKILLed, resumed from its log, then forked.

Three modules, each for one reader's question:

- ``assistant``: which agent runs (its tools, task, reviewer stop hook, scripted replies).
- ``scenario``: what the demo does and checks (the worker process, the kill, the resume and
  the fork, the record of model calls); it reports each step as a plain record and imports
  no rich, so the worker process needs nothing beyond the core install.
- ``view``: how those records look in a terminal, with rich: the ``[cli]`` extra.

Nothing is imported here on purpose: ``import loomflow`` never loads the demo, and the CLI
imports the view only when ``loomflow demo`` runs.
"""
