"""Writing events to Apache Kafka (the KafkaRuntime's producer and topic admin).

Not built yet: the embedded runtimes append to their own log. See issue 3.
"""
