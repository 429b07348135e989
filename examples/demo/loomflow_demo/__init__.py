"""loomflow's demo: an agent run is SIGKILLed, resumed from its log, then forked; then
`loomflow worker` processes finish runs nobody resumes by hand.

A distribution of its own (``examples/demo/`` in loomflow's repository, ``loomflow-demo``),
installed into ``.venv`` and run by ``make demo``; it uses loomflow as any user would, and
``loomflow`` imports none of it. Five modules, each for one reader's question:

- ``assistant``: which agents run (the researcher's tools, task, reviewer stop hook and
  scripted replies; the approver, whose tool waits for a signal).
- ``scenario``: what the demo does and checks (the kill, the resume and the fork, the
  unattended scene and the factory its `loomflow worker` processes load, the record of
  model calls); it reports each step as a plain record and imports no rich, so the child
  processes need nothing beyond the core install.
- ``worker``: the child process the demo kills (``python -m loomflow_demo.worker``).
- ``view``: how those records look in a terminal, with rich.
- ``cli``: the ``loomflow-demo`` command (also ``python -m loomflow_demo``).

Nothing is imported here on purpose: the worker process loads the scenario alone.
"""
