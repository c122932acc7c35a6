"""`/metrics` carries Triton's metrics next to BentoML's."""

from __future__ import annotations

import urllib.request

import bentoml

from tests.e2e.conftest import BentoService


def _metrics(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def test_metrics_include_triton_and_engine_counters(service: BentoService) -> None:
    with bentoml.SyncHTTPClient(service.url) as client:
        text = "".join(client.generate(prompt="Count me", max_tokens=4, temperature=0))
    assert isinstance(text, str)
    metrics = _metrics(service.url)
    assert "bentoml_service_request_total" in metrics or "bentoml_" in metrics  # BentoML's own
    assert "nv_inference_request_success" in metrics  # Triton's, per model
    assert 'trtllm_reference_requests_total{model="tensorrt_llm",outcome="completed"}' in metrics
