"""`/metrics`: the service's own request metrics, right with several workers, and Triton's appended."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import bentoml
import httpx
import openai

from tests.e2e.conftest import BentoService


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of one metric's samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)$", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total += float(match.group(2))
    return total


def test_request_metrics_count_what_was_asked_across_two_workers(
    make_service: Callable[..., BentoService], model_name: str
) -> None:
    service = make_service({"TRTLLM_WORKERS": "2"})
    body = {"prompt": "Count", "max_tokens": 5, "temperature": 0, "ignore_eos": True}

    def generate(_: int) -> int:
        with httpx.Client(base_url=service.url, timeout=60) as client:  # a connection of its own
            return client.post("/generate", json=body).status_code

    with ThreadPoolExecutor(8) as pool:  # at once, so that both workers take some
        assert list(pool.map(generate, range(8))) == [200] * 8
    completion_tokens = 8 * 5
    client = openai.OpenAI(base_url=f"{service.url}/v1", api_key="x", max_retries=0)
    for stream in (False, True):
        for _ in range(3):
            kwargs = {"stream_options": {"include_usage": True}} if stream else {}
            result = client.chat.completions.create(
                model=model_name,
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=7,
                temperature=0,
                stream=stream,
                extra_body={"ignore_eos": True},
                **kwargs,
            )
            usage = [chunk.usage for chunk in result if chunk.usage][-1] if stream else result.usage
            completion_tokens += usage.completion_tokens
    completion = client.completions.create(
        model=model_name, prompt="Once", max_tokens=3, extra_body={"ignore_eos": True}
    )
    completion_tokens += completion.usage.completion_tokens
    bad = httpx.post(f"{service.url}/v1/chat/completions", json={"messages": [], "max_tokens": 3}, timeout=30)
    assert bad.status_code == 400

    text = scrape(service.url)
    labels = {"model_name": model_name}
    counted = "trtllm:requests_total"
    assert sample(text, counted, route="/generate", status="200", finished_reason="length", **labels) == 8
    assert (
        sample(text, counted, route="/v1/chat/completions", status="200", finished_reason="length", **labels)
        == 6
    )
    assert (
        sample(text, counted, route="/v1/completions", status="200", finished_reason="length", **labels) == 1
    )
    assert (
        sample(text, counted, route="/v1/chat/completions", status="400", finished_reason="", **labels) == 1
    )
    assert sample(text, "trtllm:time_to_first_token_seconds_count", **labels) == 15
    assert sample(text, "trtllm:e2e_request_latency_seconds_count", **labels) == 15
    assert sample(text, "trtllm:inter_token_latency_seconds_count", **labels) == 15
    assert sample(text, "trtllm:request_generation_tokens_sum", **labels) == completion_tokens
    assert sample(text, "trtllm:num_requests_running", **labels) == 0
    assert sample(text, "trtllm:triton_restarts_total", **labels) == 0
    # Every worker's scrape sums the same samples: a second scrape (maybe another worker) agrees.
    again = scrape(service.url)
    assert sample(again, counted, **labels) == sample(text, counted, **labels) == 16
    # Both workers took requests: each process that counted has its own samples file.
    files = list((service.home / "prometheus_multiproc_dir").glob("gauge_livesum_*.db"))
    assert len(files) == 2, files
    assert "nv_inference_request_success" in text  # Triton's, appended
    assert "trtllm_reference_requests_total{" in text


def test_metrics_include_triton_and_engine_counters(service: BentoService) -> None:
    with bentoml.SyncHTTPClient(service.url) as client:
        text = "".join(client.generate(prompt="Count me", max_tokens=4, temperature=0))
    assert isinstance(text, str)
    metrics = scrape(service.url)
    assert "bentoml_service_request_total" in metrics  # BentoML's own
    assert "nv_inference_request_success" in metrics  # Triton's, per model
    assert sample(metrics, "trtllm_reference_requests_total", model="tensorrt_llm", outcome="completed") >= 1
