"""The audit consumer: every record of the log chained by hash into a trail, verified.

``auditor`` holds the consumer and the verification, written once against the log reader,
so an embedded log (the trail in a SQLite file beside it) and Kafka (the audit group, the
trail in the read model's PostgreSQL schema) are audited the same way. The hash chain is
plain functions in ``loomflow.projections.chain``, keyed by ``Scope``; the trail's SQL and
its migrations are its dialect's (``projections/sqlite/audit.py``,
``projections/postgres/audit.py``).
"""

from loomflow.audit.auditor import Auditor, SessionCheck, Verification, verify_trail

__all__ = ["Auditor", "SessionCheck", "Verification", "verify_trail"]
