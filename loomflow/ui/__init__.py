"""The web console (``loomflow ui``, the ``[ui]`` extra): an ASGI application over the
store the command line opens, its pages, JSON API and live streams.

``create_app(ConsoleConfig(source=...))`` is the application ``loomflow ui`` serves with
uvicorn; another ASGI server, or a test's client, can serve it as well.
"""

from loomflow.ui.app import create_app
from loomflow.ui.backend import ConsoleConfig

__all__ = ["ConsoleConfig", "create_app"]
