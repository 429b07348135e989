"""What the console's routes take from a request alike: its backend, and the session
list's filters (``user``, ``status``, ``since``, ``agent``), read one way by the list
page, its live stream and the API."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request

from loomflow.ui import views
from loomflow.ui.backend import Backend

__all__ = ["ListFilters", "backend_of", "list_filters"]


def backend_of(request: Request) -> Backend:
    """The backend of the console that serves ``request``."""
    backend: Backend = request.app.state.backend
    return backend


def list_filters(
    user: str | None = None,
    status: Annotated[list[str] | None, Query()] = None,
    since: str | None = None,
    agent: str | None = None,
) -> views.Filters:
    """The list's filters from the query string; Refused (400) naming what is wrong.
    ``user``: a user's id, ``-`` for the sessions run without a user, empty or absent
    for every user's; ``status``: statuses as ``loomflow sessions ls --status`` takes them, repeated
    or comma-separated; ``since``: an ISO time or an age (``30m``)."""
    return views.Filters.of(user=user, status=status or [], since=since, agent=agent)


#: the list's filters, as a route's parameter
ListFilters = Annotated[views.Filters, Depends(list_filters)]
