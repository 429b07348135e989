"""The values of options that both the schemas and the settings name: apart from the event
models, so that reading the settings (which every runtime does when it is made) loads
none of them."""

from typing import Literal

__all__ = ["DEFAULT_LEASE_SECONDS", "Serializer", "SignatureMode"]

#: how long a run's writer may stay silent before its run counts as abandoned (a worker
#: may then resume it); the writer sends a heartbeat after a third of it without an event
DEFAULT_LEASE_SECONDS = 30.0

#: how journal values are stored: JSON, or pickle for a user who opts into it
Serializer = Literal["json", "pickle"]

#: ``off``: signatures are not looked at; ``check``: a missing or bad one is counted and
#: the event accepted; ``require``: it is refused
SignatureMode = Literal["off", "check", "require"]
