"""The processor that projects the Kafka log into PostgreSQL, plus analytics agents."""

from loomflow.processors.projector import DeadLetter, Projector

__all__ = ["DeadLetter", "Projector"]
