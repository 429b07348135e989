"""`loomflow demo`: an agent run is SIGKILLed, resumed from its log, then forked; then
`loomflow worker` processes finish runs nobody resumes by hand.

Three modules, each for one reader's question:

- ``assistant``: which agents run (the researcher's tools, task, reviewer stop hook and
  scripted replies; the approver, whose tool waits for a signal).
- ``scenario``: what the demo does and checks (the worker process, the kill, the resume and
  the fork, the unattended scene and the factory its workers load, the record of model
  calls); it reports each step as a plain record and imports no rich, so the child
  processes need nothing beyond the core install.
- ``view``: how those records look in a terminal, with rich: the ``[cli]`` extra.

Nothing is imported here on purpose: ``import loomflow`` never loads the demo, and the CLI
imports the view only when ``loomflow demo`` runs.
"""

__all__ = ["WORKER_COMMAND"]

#: the hidden subcommand of ``loomflow`` the demo starts its worker process with (kept
#: out of --help); defined here so that the demo never imports the CLI that runs it
WORKER_COMMAND = "_demo-worker"
