"""A zombie writer: an agent process paused (SIGSTOP) mid-run while another process takes
its session over, then let go on (SIGCONT)."""

from __future__ import annotations

import asyncio
import functools
import signal
from pathlib import Path

from loomflow.runtime import Scope
from loomflow.schemas import RunStarted
from tests.faults.conftest import Place, Trials
from tests.support.scenario import Research
from tests.support.waiting import eventually

#: seconds each model call of the paused process takes: it is paused inside one
LATENCY = 0.5


def _lines(log: Path, prefix: str) -> list[str]:
    if not log.exists():
        return []
    return [line for line in log.read_text().splitlines() if line.startswith(prefix)]


def _began(log: Path, calls: int) -> bool:
    return len(_lines(log, "model")) >= calls


async def test_a_paused_writer_woken_after_a_take_over_writes_nothing_and_says_so(
    place: Place, trials: Trials, tmp_path: Path
) -> None:
    """Paused inside a model call, its session resumed elsewhere, then woken: the
    zombie's answer never reaches the read model, it fails with StaleWriterError, and
    the run that took over records that it interrupted the zombie's run."""
    for trial in range(trials(ci=1, soak=5)):
        session, log, db = f"z{trial}", tmp_path / f"calls-{trial}.log", tmp_path / f"{trial}.db"
        zombie = await place.agent_process(db, session, log, "--latency", str(LATENCY))
        try:
            # the fourth model call has begun: the process is inside it for LATENCY
            await eventually(functools.partial(_began, log, 4), within=120, what="call 4")
            zombie.send_signal(signal.SIGSTOP)
            acknowledged = _lines(log, "event")

            runtime = place.runtime(db)
            try:
                research = Research(passes=3)
                result = await research.agent(runtime).resume(session_id=session)
                assert result.turns == 9 and result.stop_reason == "completed"
                before = await runtime.store.read_events(Scope(session))
                zombie.send_signal(signal.SIGCONT)
                _, err = await asyncio.wait_for(zombie.communicate(), 120)
                after = await runtime.store.read_events(Scope(session))
                state = await runtime.restore(Scope(session))
            finally:
                await runtime.close()
        finally:
            if zombie.returncode is None:
                zombie.kill()
                await zombie.wait()

        assert zombie.returncode == 1 and "StaleWriterError" in err.decode(), err.decode()
        # none of its writes after the take-over reached the read model
        assert [e.event_id for e in after] == [e.event_id for e in before]
        zombie_run = before[0].run_id
        claim = next(e for e in before if isinstance(e, RunStarted) and e.run_id != zombie_run)
        assert not [e for e in after if e.run_id == zombie_run and e.seq > claim.seq]
        assert state is not None and state.turns == 9
        # the take-over recorded the end of the zombie's run
        assert isinstance(claim, RunStarted) and claim.payload.interrupted == zombie_run
        # what the zombie was told was acknowledged is in the log, before the claim
        ids = {e.event_id for e in after if e.seq < claim.seq}
        assert all(line.split()[2] in ids for line in acknowledged)
        # on Kafka its late answer reached the topic, where the projector refused it;
        # embedded stores refuse the append itself: nothing more was acknowledged to it
        if not place.sends_ahead:
            assert _lines(log, "event") == acknowledged
