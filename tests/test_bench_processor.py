"""bench/processor.py's pool experiment checks what the projector checks: a batch with a
forged event is applied the same with and without the pool."""

from __future__ import annotations

import secrets
from types import SimpleNamespace
from typing import Any

import asyncpg
from aiokafka import TopicPartition

from bench import processor
from loomflow.processors import projector
from loomflow.producers import scope_key
from loomflow.runtime.postgres import PostgresStore
from loomflow.schemas.signing import Keyring, Signatures, Signer
from tests.support.services import postgres_dsn


def _records(events: list[Any]) -> list[Any]:
    return [
        SimpleNamespace(
            topic="t",
            partition=0,
            offset=n,
            key=scope_key(e.user_id, e.session_id),
            value=e.model_dump_json().encode(),
            headers=[],
            timestamp=0,
        )
        for n, e in enumerate(events)
    ]


async def _apply(records: list[Any], keyring: Keyring) -> tuple[int, list[str]]:
    """The events applied and the dead letters' reasons, in a schema of its own."""
    dsn = postgres_dsn()
    schema = f"lf_test_pool_{secrets.token_hex(4)}"
    await PostgresStore(dsn, schema=schema).open()  # made and migrated
    conn = await asyncpg.connect(dsn)
    try:
        batches = {TopicPartition("t", 0): records}
        rule = Signatures("require", keyring)
        outcome = await projector.apply_records(conn, schema, "group", batches, rule)
        return len(outcome.applied), [letter.reason for letter in outcome.dead]
    finally:
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()


async def test_the_pool_refuses_a_forged_event_as_the_projector_does() -> None:
    signer = Signer.generate()
    keyring = Keyring.of(signer.trusted())
    events = [signer.sign_event(e) for e in processor.session_events(1, passes=2)]
    turn = events[2]  # the first model turn, changed after it was signed
    forged = turn.payload.model_copy(update={"model_call": False})
    events[2] = turn.model_copy(update={"payload": forged})

    original = projector.apply_records
    plain = await _apply(_records(events), keyring)
    undo = processor.pool_verification(2)
    try:
        pooled = await _apply(_records(events), keyring)
    finally:
        undo()
    assert projector.apply_records is original
    # the forged event refused for its signature, the rest of its session for the gap
    applied, reasons = plain
    assert applied == 2 and "does not match its signature" in reasons[0]
    assert pooled == plain
