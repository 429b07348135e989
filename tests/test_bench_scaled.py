"""bench/scaled.py: each target's verdict from its bench's JSON, the import's timing and
probe, and a part's JSON read back (the benches themselves have tests of their own)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import scaled, turn


def _turn(**stores: float) -> dict[str, Any]:
    runs = {s: [{"second_p50": ms, "ok": True}] for s, ms in stores.items()}
    return {"results": {"scripted": runs}}


def test_the_kafka_pass_is_judged_against_postgresqls() -> None:
    (cheaper,) = scaled.pass_targets(_turn(**{"lf-kafka": 9.0, "lf-pg": 10.0}))
    assert cheaper.met is True and cheaper.figure.startswith("0.90x (9.00 / 10.00 ms")
    (dearer,) = scaled.pass_targets(_turn(**{"lf-kafka": 12.0, "lf-pg": 10.0}))
    assert dearer.verdict == "MISSED"
    (alone,) = scaled.pass_targets(_turn(**{"lf-pg": 10.0}))
    assert alone.met is None and "needs lf-kafka" in alone.figure
    # a run whose results were wrong misses whatever its figure
    broken = _turn(**{"lf-kafka": 5.0, "lf-pg": 10.0})
    broken["results"]["scripted"]["lf-kafka"][0]["ok"] = False
    (wrong,) = scaled.pass_targets(broken)
    assert wrong.met is False and "not ok" in wrong.figure


def test_ours_per_turn_is_judged_against_the_best_peer() -> None:
    def peers(ours: float, langgraph: float, dbos: float) -> dict[str, Any]:
        runs = {"ours": ours, "langgraph": langgraph, "dbos": dbos}
        turn = {s: [{"turn_p50": ms, "ok": True}] for s, ms in runs.items()}
        return {"results": {"turn": turn}}

    (met,) = scaled.peers_targets(peers(10.0, 40.0, 25.0))
    assert met.met is True and "0.40x (10.00 ms / dbos's 25.00 ms)" in met.figure
    (missed,) = scaled.peers_targets(peers(16.0, 31.0, 74.0))
    assert missed.verdict == "MISSED" and "langgraph's" in missed.figure


def test_the_projector_targets_per_worker_ceiling_and_lag() -> None:
    data: dict[str, Any] = {
        "results": {
            "throughput:1": [{"events_per_s": 21_000.0, "ok": True}],
            "throughput:2": [{"events_per_s": 30_000.0, "ok": True}],
            "ceiling": [{"events_per_s": 36_000.0}],
            "lag": [{"lag_p99": 40.0, "ok": True}],
        }
    }
    rate, ceiling, lag = scaled.projector_targets(data)
    assert rate.met is True and "2 workers: 15,000 per worker" in rate.figure
    assert ceiling.met is False and ceiling.figure.startswith("0.58x")
    assert lag.met is False and lag.figure == "40.0 ms"
    data["results"]["lag"] = [{"lag_p99": 20.0, "ok": True}, {"error": "KafkaTimeoutError"}]
    *_, lag = scaled.projector_targets(data)
    assert lag.met is True
    assert lag.figure == "20.0 ms; 1 of 2 runs failed (KafkaTimeoutError)"
    failed = {"results": {"throughput:1": [{"error": "boom"}], "lag": []}}
    assert [t.met for t in scaled.projector_targets(failed)] == [None, None, None]


def test_storage_is_judged_on_both_workloads_at_the_default_page() -> None:
    rows = [
        {"workload": "single", "page": 4096, "disk": 700, "transcript": 500},
        {"workload": "single", "page": 8192, "disk": 100, "transcript": 500},
        {"workload": "big", "page": 4096, "disk": 1400, "transcript": 600},
        {"workload": "agent-big", "page": 4096, "disk": 500, "transcript": 600},
    ]
    agent_big, agent_single, big, single = scaled.storage_targets({"rows": rows})
    assert single.met is True and single.figure.startswith("1.40x")
    assert big.met is False and big.figure.startswith("2.33x")
    assert agent_big.met is True and agent_big.figure.startswith("0.83x")
    assert agent_single.met is None  # no row of it: not measured


def test_the_http_turn_is_judged_on_its_worst_span_against_0_20_0s() -> None:
    def http(ours: tuple[float, ...], peer: tuple[float, ...]) -> dict[str, Any]:
        def runs(p50s: tuple[float, ...]) -> list[dict[str, Any]]:
            spans = {f"{w}_p50": ms for w, ms in zip(turn.WINDOWS, p50s, strict=True)}
            return [{**spans, "ok": True}]

        return {"results": {"http": {"lf-sqlite": runs(ours), "lf020-sqlite": runs(peer)}}}

    (met,) = scaled.http_targets(http((4.0, 5.0, 6.0), (10.0, 12.0, 30.0)))
    assert met.met is True and met.figure.startswith("0.40x, 0.42x, 0.20x")
    assert "worst: second, 5.00 / 12.00 ms" in met.figure
    # one span over the limit misses, however far under it the others are
    (missed,) = scaled.http_targets(http((6.0, 5.0, 6.0), (10.0, 12.0, 30.0)))
    assert missed.verdict == "MISSED" and "worst: first" in missed.figure
    alone = http((4.0, 5.0, 6.0), (10.0, 12.0, 30.0))
    del alone["results"]["http"]["lf020-sqlite"]
    (unmeasured,) = scaled.http_targets(alone)
    assert unmeasured.met is None and "needs lf-sqlite and lf020-sqlite" in unmeasured.figure


def test_the_cold_read_is_judged_against_langgraphs() -> None:
    def cold(ours: float, langgraph: float) -> dict[str, Any]:
        runs = {"lf-sqlite": ours, "lg-sqlite": langgraph}
        single = {s: [{"cold_read_p50": ms, "ok": True}] for s, ms in runs.items()}
        return {"results": {"single": single}}

    (met,) = scaled.cold_targets(cold(2.0, 2.5))
    assert met.met is True and met.figure.startswith("0.80x (2.00 / 2.50 ms")
    (missed,) = scaled.cold_targets(cold(11.3, 2.56))
    assert missed.verdict == "MISSED" and missed.figure.startswith("4.41x")
    failed = cold(2.0, 2.5)
    failed["results"]["single"]["lg-sqlite"] = [{"error": "pip install failed"}]
    (unmeasured,) = scaled.cold_targets(failed)
    assert unmeasured.met is None and "needs lf-sqlite and lg-sqlite" in unmeasured.figure


def test_every_part_but_the_import_has_a_bench_command(tmp_path: Path) -> None:
    args = argparse.Namespace(
        reps=3, turns=30, passes=100, events=100_000, lag_seconds=20.0, import_runs=20
    )
    planned = scaled.commands(args, tmp_path)
    assert set(planned) | {"import"} == set(scaled.PARTS) == set(scaled.TARGETS)
    assert "lf-sqlite,lf020-sqlite" in planned["http"] and "http" in planned["http"]
    assert "lf-sqlite,lg-sqlite" in planned["cold"] and "single" in planned["cold"]
    assert planned["cold"][-1] == str(tmp_path / "cold.json")


def test_a_part_that_failed_or_was_left_out_is_not_measured() -> None:
    found = scaled.targets({"storage": {"error": "exit 1, no JSON written"}})
    by_name = {t.name: t for t in found}
    storage = by_name["storage (store, 200 passes) <= 1.5x the transcript"]
    assert storage.verdict == "not measured" and "exit 1" in storage.figure
    assert "not run (--only)" in by_name["Kafka pass <= 1.0x PostgreSQL's"].figure
    http = by_name["HTTP user turn (lf-sqlite) <= 0.5x loomflow 0.20.0's"]
    assert "not run (--only)" in http.figure
    table = scaled.targets_table(found)
    assert table.count("| not measured |") == len(found)


def test_the_import_probe_names_the_heavy_modules_loaded() -> None:
    assert scaled.heavy_modules("import asyncpg") == ["asyncpg"]
    assert scaled.heavy_modules("pass") == []
    timed, none = scaled.import_targets(
        {"import_ms": 180.0, "lean_ms": 200.0, "bare_ms": 20.0, "runs": 5, "heavy": []}
    )
    assert timed.verdict == "MISSED" and none.met is True
    assert "libraries alone" not in timed.figure  # a JSON of before the floor was measured
    timed, _ = scaled.import_targets(
        {
            "import_ms": 180.0,
            "lean_ms": 200.0,
            "bare_ms": 20.0,
            "floor_ms": 170.0,
            "libraries_ms": 150.0,
            "own_ms": 30.0,
            "runs": 5,
            "heavy": [],
        }
    )
    assert "the libraries alone 150 ms, loomflow's own 30 ms" in timed.figure


def test_the_floor_imports_what_the_lean_import_needs_and_nothing_of_loomflow() -> None:
    probe = (
        "import sys\nprint(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pydantic', 'pydantic_settings', 'sqlite3', 'asyncio', 'loomflow'))))"
    )
    floor = set(scaled._run_probe(scaled.FLOOR_CODE + "\n" + probe))
    lean = set(scaled._run_probe(scaled.IMPORT_CODE.format(path=":memory:", probe="") + probe))
    tops = {m.split(".")[0] for m in floor}
    assert tops == {"pydantic", "pydantic_settings", "sqlite3", "asyncio"}
    # the floor loads no more of these libraries than the lean import itself does
    assert floor - lean == set()


def test_the_import_is_timed_with_loomflow_compiled_once_as_an_installed_package_has_it(
    tmp_path: Path,
) -> None:
    code = "import loomflow.settings"
    scaled._wall_ms(code, scaled._bytecode_env(tmp_path))
    cached = {p.name.split(".")[0] for p in tmp_path.rglob("loomflow/**/*.pyc")}
    assert {"__init__", "settings"} <= cached


@pytest.mark.slow
def test_the_import_is_timed_over_a_bare_interpreter() -> None:
    result = scaled.measure_import(2)
    assert result["import_ms"] == result["lean_ms"] - result["bare_ms"]
    assert result["libraries_ms"] == result["floor_ms"] - result["bare_ms"]
    assert result["own_ms"] == result["lean_ms"] - result["floor_ms"]
    assert result["bytecode"] == "cached"
    assert result["lean_ms"] > 0 and result["bare_ms"] > 0
    assert set(result["heavy"]) <= set(scaled.HEAVY)


def test_a_parts_json_is_read_back_and_a_failure_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write = f"import pathlib; pathlib.Path({str(tmp_path / 'storage.json')!r}).write_text("
    ok = [sys.executable, "-c", write + "'{\"rows\": []}'); print('| a table |')"]
    assert scaled.run_part("storage", ok, tmp_path) == {"rows": []}
    assert "| a table |" in capsys.readouterr().out
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    assert scaled.run_part("pass", failing, tmp_path) == {"error": "exit 3, no JSON written"}


def test_a_turn_s_cpu_is_reported_per_process_with_the_turn() -> None:
    """bench.turn: each process's CPU a turn, from /proc before and after the session,
    in the table beside the turn's wall time (what bounds a pass on a small machine)."""
    before = {"agent": 1.0, "processor": 2.0, "postgres": 10.0, "kafka": None}
    after = {"agent": 1.3, "processor": 2.6, "postgres": 10.15, "kafka": None}
    per_turn = turn._cpu_per_turn(before, after, 100)
    assert per_turn["cpu_agent_ms"] == pytest.approx(3.0)
    assert per_turn["cpu_processor_ms"] == pytest.approx(6.0)
    assert per_turn["cpu_postgres_ms"] == pytest.approx(1.5)
    assert per_turn["cpu_kafka_ms"] is None  # not measured: never a zero
    run = {"second_p50": 9.0, "ok": True, **per_turn}
    table = turn.report("scripted", ["lf-kafka"], {"lf-kafka": [run]}, 30)
    assert "| 3.00 / 6.00 / 1.50 / — |" in table
    mine = turn._cpu(turn.Store(runtime=None, session=None))  # type: ignore[arg-type]
    assert mine["processor"] is None and mine["agent"] is not None and mine["agent"] > 0


def test_the_kafka_pass_is_measured_on_a_warmed_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench.turn warms the broker's JVM with one untimed lf-kafka session before any rep
    (a just-started broker took 10-12 ms of CPU a turn against 2-4 warm), says so in the
    header, and stops on a warm-up that failed rather than measure a cold broker."""
    asked: list[tuple[str, str, int]] = []

    def child(store: str, variant: str, turns: int, server: str | None) -> dict[str, Any]:
        asked.append((store, variant, turns))
        return {"ok": True, "problems": [], "cpu_kafka_ms": 2.5}

    monkeypatch.setattr(turn, "run_child", child)
    said = turn.warm_broker(1000)
    assert asked == [("lf-kafka", "scripted", 1000)]
    assert "warmed first by an untimed session of 1000" in said and "2.50 ms" in said
    assert "cold" in turn.warm_broker(0) and len(asked) == 1
    monkeypatch.setattr(turn, "run_child", lambda *a: {"error": "timed out"})
    with pytest.raises(SystemExit, match="warm-up session failed: timed out"):
        turn.warm_broker(1000)
    monkeypatch.setattr(turn, "run_child", lambda *a: {"problems": ["turn 3: wrong"]})
    with pytest.raises(SystemExit, match="turn 3: wrong"):
        turn.warm_broker(1000)


def test_sessions_at_once_are_judged_on_every_session_s_turns() -> None:
    """bench.turn --sessions N: each span's p50 pools the turns of all N sessions (one
    session's turns alone would hide what the others waited), and the table gives the
    turns per second of all of them."""
    fast = [1.0] * 30
    slow = [5.0] * 30
    windows = turn._windows([fast, slow, slow])
    assert windows["second_p50"] == 5.0 and windows["turns"] == 30
    assert turn._windows([fast])["second_p50"] == 1.0
    run = {**windows, "ok": True, "turns_per_s": 412.4, "sessions": 3}
    table = turn.report("scripted", ["lf-kafka"], {"lf-kafka": [run]}, 30, sessions=3)
    assert "turns/s, all sessions" in table and "| 412 (412\u2013412) |" in table
    assert "3 sessions at once on one runtime" in table
    assert "turns/s" not in turn.report("scripted", ["lf-kafka"], {"lf-kafka": [run]}, 30)
