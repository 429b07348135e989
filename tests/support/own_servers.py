"""Servers a test starts and stops itself, on ports of their own: the outage tests stop a
server to test what happens while it is away, so it must be a server nobody else uses, and
a stop must be seen to have stopped it.

``dev/postgres.sh`` runs a Debian cluster of its own (``LOOMFLOW_POSTGRES_CLUSTER``) and
``dev/kafka.sh`` a broker with a folder of its own (``LOOMFLOW_KAFKA_DIR``); the ports are
``LOOMFLOW_OUTAGE_POSTGRES_PORT`` (25432), ``LOOMFLOW_OUTAGE_KAFKA_PORT`` (29092) and
``LOOMFLOW_OUTAGE_KAFKA_CONTROLLER_PORT`` (29093). The scripts install what is missing
(Debian's postgresql with apt, the Kafka jars with Maven), as on a fresh CI machine.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass

import pytest

from tests.support.kafka_env import ROOT

HOST = "127.0.0.1"


@dataclass
class OwnServer:
    """A server started by ``dev/<script>.sh`` with ``variables``, listening on ``port``."""

    #: what it is, in messages
    name: str
    script: str
    port: int
    #: the LOOMFLOW_* variables that make the script act on this server alone
    variables: dict[str, str]
    #: the variable that moves it to another port
    port_variable: str
    #: what ``start`` printed: the DSN or bootstrap address
    address: str = ""
    #: whether this process started it (and so may stop it)
    started: bool = False

    def accepts(self) -> bool:
        """Whether something accepts connections on the server's port now."""
        try:
            with socket.create_connection((HOST, self.port), timeout=2):
                return True
        except OSError:
            return False

    def _run(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(ROOT / "dev" / f"{self.script}.sh"), command],
            env={**os.environ, **self.variables},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def _how(self, command: str) -> str:
        variables = " ".join(f"{k}={v}" for k, v in self.variables.items())
        return f"{variables} dev/{self.script}.sh {command}"

    def start(self) -> None:
        """Start it; fail when something already listens on its port, which would be a
        server this process did not start."""
        if self.accepts():
            pytest.fail(
                f"{HOST}:{self.port} accepts connections before this test started its "
                f"{self.name} there: it is not this test's to stop. If it is one left "
                f"running by an aborted run of these tests, stop it with `{self._how('stop')}`; "
                f"else set {self.port_variable} to a free port",
                pytrace=False,
            )
        done = self._run("start")
        assert done.returncode == 0, f"`{self._how('start')}` failed:\n{done.stderr}"
        self.address = done.stdout.strip().split("=", 1)[1]
        self.started = True
        assert self.accepts(), f"{self.name} started, yet {HOST}:{self.port} refuses connections"

    def stop(self) -> None:
        """Stop it, and fail unless its port stopped accepting connections: a stop that
        stopped nothing would test an outage that never happened."""
        assert self.started, f"the {self.name} on {HOST}:{self.port} was not started here"
        done = self._run("stop")
        assert done.returncode == 0, f"`{self._how('stop')}` failed:\n{done.stderr}"
        self.started = False
        # the scripts return once the server's process has exited
        if self.accepts():
            said = done.stderr.strip().replace("\n", "; ")
            pytest.fail(
                f"`{self._how('stop')}` returned ({said}), but {HOST}:{self.port} still "
                f"accepts connections: the stop stopped nothing, so no outage would be tested",
                pytrace=False,
            )


def _port(variable: str, default: int) -> int:
    return int(os.environ.get(variable) or default)


def outage_postgres() -> OwnServer:
    """The outage tests' PostgreSQL: Debian cluster ``loomflow_outage``."""
    port = _port("LOOMFLOW_OUTAGE_POSTGRES_PORT", 25432)
    return OwnServer(
        "PostgreSQL",
        "postgres",
        port,
        {"LOOMFLOW_POSTGRES_PORT": str(port), "LOOMFLOW_POSTGRES_CLUSTER": "loomflow_outage"},
        "LOOMFLOW_OUTAGE_POSTGRES_PORT",
    )


def outage_kafka() -> OwnServer:
    """The outage tests' Kafka broker, kept in .cache/kafka-outage of the checkout."""
    port = _port("LOOMFLOW_OUTAGE_KAFKA_PORT", 29092)
    controller = _port("LOOMFLOW_OUTAGE_KAFKA_CONTROLLER_PORT", port + 1)
    return OwnServer(
        "Kafka broker",
        "kafka",
        port,
        {
            "LOOMFLOW_KAFKA_PORT": str(port),
            "LOOMFLOW_KAFKA_CONTROLLER_PORT": str(controller),
            "LOOMFLOW_KAFKA_DIR": str(ROOT / ".cache" / "kafka-outage"),
        },
        "LOOMFLOW_OUTAGE_KAFKA_PORT",
    )
