"""The faust-streaming processor that projects Kafka events into PostgreSQL.

Not built yet: the embedded runtimes apply the same fold in their own transaction.
See issue 3.
"""
