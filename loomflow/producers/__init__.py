"""Writing events to Apache Kafka: the producer and the topic admin."""

from loomflow.producers.kafka import EventProducer, Position
from loomflow.producers.topics import Topics, ensure_topics, scope_key

__all__ = ["EventProducer", "Position", "Topics", "ensure_topics", "scope_key"]
