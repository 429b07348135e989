"""Signatures in the runtime conformance suite: a runtime whose store has a signing key
signs every event it appends (a run, its resume, a fork, an erasure), and each reads
back from the store with its signature holding."""

from __future__ import annotations

from loomflow.runtime import Runtime, Scope
from loomflow.schemas.signing import Keyring, Signer
from loomflow.testing._support import Opened, follower
from loomflow.testing.scenario import Research

__all__ = ["Signing"]


class Signing:
    """Tests of signed writes; mixed into RuntimeConformance."""

    async def test_a_runtime_with_a_key_signs_every_event_and_each_reads_back_valid(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        signer = Signer.generate()
        keyring = Keyring.of(signer.trusted())
        runtime = new_runtime()
        runtime.store.signer = signer  # what the settings' LOOMFLOW_SIGNING_KEY gives a store
        research = Research(passes=2)
        agent = await research.ran(runtime)  # its claim, turns, checkpoints, its end
        await follower(runtime).resume("And then?", session_id="s1")
        (newest, *_) = await agent.list_checkpoints("s1")
        fork = await runtime.fork(Scope("s1"), newest.checkpoint_id, session_id="branch")
        assert await runtime.store.erase(fork.session_id)

        reader = new_runtime()  # another process, with no key: reads what is stored
        for scope in (Scope("s1"), fork):
            events = await reader.store.read_events(scope)
            assert events and all(e.sig is not None for e in events)
            assert [keyring.event_problem(e) for e in events] == [None] * len(events)
        types = {e.type for e in await reader.store.read_events(Scope("s1"))}
        assert {"run.started", "turn.appended", "checkpoint.written", "run.finished"} <= types
        resumed = await follower(reader).resume("Still there?", session_id="s1")
        assert resumed.restored_turns > 0  # the signed transcript restores as it was
