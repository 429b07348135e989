"""What signing adds to an append, in µs per event.

    .venv/bin/python -m bench.signing [--events 2000] [--repeat 5]

Appends one session's events one append at a time (a run's turns: ~1.3 KB of messages
each) to an in-process store and to a SQLite store, without a signing key and with one,
and prints the median time per append of ``--repeat`` rounds, with the difference; then
the cost of signing one event alone, and of checking it (what every reader of the log
pays per event with ``LOOMFLOW_SIGNATURES`` on).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loomflow.runtime import EventStore, InProcStore, SqliteStore
from loomflow.schemas import Event, Message, RunStarted, TurnAppended, Usage
from loomflow.schemas.events import TurnAppendedPayload
from loomflow.schemas.signing import Keyring, Signer
from loomflow.settings import Settings

_TEXT = "The findings so far, restated in full for the reader. " * 24


def _events(session_id: str, count: int) -> list[Event]:
    events: list[Event] = [RunStarted(session_id=session_id, run_id="run_b", seq=1, epoch=1)]
    for seq in range(2, count + 1):
        payload = TurnAppendedPayload(
            messages=[Message.assistant(_TEXT)],
            usage=Usage(input_tokens=900, output_tokens=300),
            model_call=True,
        )
        events.append(
            TurnAppended(session_id=session_id, run_id="run_b", seq=seq, epoch=1, payload=payload)
        )
    return events


async def _per_append(make: Callable[[], EventStore], signer: Signer | None, count: int) -> float:
    """µs per append of ``count`` events, one append each, on a new store."""
    store = make()
    store.signer = signer
    events = _events("s1", count)
    try:
        await store.append(events[:1])  # opened before the clock starts
        began = time.perf_counter()
        for event in events[1:]:
            await store.append([event])
        return (time.perf_counter() - began) / (count - 1) * 1e6
    finally:
        await store.close()


def _per_call(call: Callable[[], object], count: int) -> float:
    began = time.perf_counter()
    for _ in range(count):
        call()
    return (time.perf_counter() - began) / count * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    signer = Signer.generate()
    plain = Settings(signing_key=None, signing_key_file=None)
    with tempfile.TemporaryDirectory() as tmp:
        counter = iter(range(10**6))
        stores: dict[str, Callable[[], EventStore]] = {
            "InProcStore": lambda: InProcStore(settings=plain),
            "SqliteStore": lambda: SqliteStore(Path(tmp) / f"{next(counter)}.db", settings=plain),
        }
        print(
            f"# µs per append of one ~1.3 KB turn, median of {args.repeat} rounds of {args.events}"
        )
        print("| store | unsigned | signed | added |")
        print("|---|---|---|---|")
        for name, make in stores.items():
            unsigned, signed = [], []
            for _ in range(args.repeat):  # taking turns, so drift hits both alike
                unsigned.append(await _per_append(make, None, args.events))
                signed.append(await _per_append(make, signer, args.events))
            a, b = statistics.median(unsigned), statistics.median(signed)
            print(f"| {name} | {a:.1f} | {b:.1f} | {b - a:.1f} |")
    event = _events("s1", 2)[1]
    keyring = Keyring.of(signer.trusted())
    signed_event = signer.sign_event(event)
    print(f"\nsign one event: {_per_call(lambda: signer.sign_event(event), args.events):.1f} µs")
    check = _per_call(lambda: keyring.event_problem(signed_event), args.events)
    print(f"check one event: {check:.1f} µs")


if __name__ == "__main__":
    asyncio.run(main())
