"""The OTLP endpoint ``loomflow otel`` sends to, from the OpenTelemetry variables."""

from __future__ import annotations

import pytest

from loomflow.otel.export import endpoint


@pytest.fixture(autouse=True)
def _no_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)


def test_the_traces_path_goes_after_the_endpoint_and_a_traces_endpoint_is_taken_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert endpoint() == "http://localhost:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318/")
    assert endpoint() == "https://collector:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://other:9/custom")
    assert endpoint() == "http://other:9/custom"


@pytest.mark.parametrize("given", ["http://", "https:///", "ftp://x", "localhost:4318"])
def test_an_endpoint_without_an_http_scheme_and_a_host_is_refused(
    monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    """``http://`` passed once: with ``/v1/traces`` after it, it named a host "v1" (a new
    user's trial: "sent 0 spans ... to http://v1/traces", exit 0)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", given)
    with pytest.raises(ValueError, match=f"OTLP endpoint '{given}' is not an http"):
        endpoint()
