"""`/metrics`: the service's own request metrics, right with several workers, and Triton's appended."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bentoml
import httpx
import openai
import pytest

from tests.e2e.conftest import BentoService, pack_demo, serving
from tests.support import wait_for as poll


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
    files = list((service.home / "prometheus_multiproc_dir").rglob("gauge_livesum_*.db"))  # serve-<pid>/
    assert len(files) == 2, files
    assert "nv_inference_request_success" in text  # Triton's, appended
    assert "trtllm_reference_requests_total{" in text


def test_metrics_include_triton_and_engine_counters(service: BentoService) -> None:
    with bentoml.SyncHTTPClient(service.url) as client:
        text = "".join(client.generate(prompt="Count me", max_tokens=4, temperature=0))
    assert isinstance(text, str)
    # the engine model hands its counts to Triton every 0.1 s (MetricsPublisher): a scrape at once
    # may come before the first hand-over on a loaded machine
    metrics = wait_for(service.url, "trtllm_reference_requests_total", above=0)
    assert "bentoml_service_request_total" in metrics  # BentoML's own
    assert "nv_inference_request_success" in metrics  # Triton's, per model
    assert sample(metrics, "trtllm_reference_requests_total", model="tensorrt_llm", outcome="completed") >= 1


@pytest.mark.flavors("llmapi")  # BentoML's metrics directory does not depend on the flavour
def test_two_services_sharing_one_bentoml_home_keep_their_own_metrics(
    service: BentoService, bentoml_home: Path, tmp_path: Path
) -> None:
    """`bentoml serve` empties BentoML's Prometheus directory under BENTOML_HOME when it starts: a
    second service on the same home must neither wipe the first one's counts nor show them."""
    counted = "bentoml_service_request_total"

    def models_requests(url: str, times: int = 0) -> float:
        for _ in range(times):
            assert httpx.get(f"{url}/v1/models", timeout=30).status_code == 200
        return sample(scrape(url), counted, endpoint="/v1/models", http_response_code="200")

    before = models_requests(service.url, 3)
    other = BentoService(bentoml_home, tmp_path)
    other.env["BENTOML_HOME"] = str(service.home)  # the first service's home, shared
    other.start()
    try:
        assert models_requests(other.url, 7) == 7
        assert models_requests(service.url, 2) == before + 2
    finally:
        other.stop_soon()


@pytest.fixture(scope="module")
def reusing_service(flavor: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BentoService]:
    """The demo model packed with --enable-kv-cache-reuse, served."""
    home = pack_demo(
        tmp_path_factory.mktemp(f"bentoml_home_reuse_{flavor}"), flavor, "--enable-kv-cache-reuse"
    )
    with serving(home, tmp_path_factory.mktemp("serve_reuse")) as server:
        yield server


def wait_for(url: str, name: str, above: float | None = None, timeout_s: float = 20.0) -> str:
    """A scrape that has `name` (above `above`, if given): the engine's stats are polled every second."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = scrape(url)
        present = re.search(rf"^{re.escape(name)}\{{", text, re.MULTILINE) is not None
        if (present and (above is None or sample(text, name) > above)) or time.monotonic() > deadline:
            return text
        time.sleep(0.5)


def test_a_repeated_prompt_shows_as_prefix_cache_hits(flavor: str, reusing_service: BentoService) -> None:
    url = reusing_service.url
    prompt = "The quick brown fox jumps over the lazy dog while the cat sleeps. " * 10  # several blocks
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    first = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert first.status_code == 200, first.text
    text = wait_for(url, "trtllm:kv_cache_usage_perc")
    assert "trtllm:kv_cache_usage_perc{" in text, (
        "the engine's KV cache usage is not on /metrics\n"
        + "\n".join(line for line in text.splitlines() if "kv_cache" in line)
    )
    hits_before = sample(text, "trtllm:prefix_cache_hits_total")
    assert hits_before == 0  # nothing to reuse the first time
    second = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert second.status_code == 200, second.text
    assert second.text == first.text
    text = wait_for(url, "trtllm:prefix_cache_hits_total", hits_before)
    hits = sample(text, "trtllm:prefix_cache_hits_total")
    assert hits >= 64, "the second identical prompt reused no KV blocks"  # whole 32-token blocks
    assert 0.0 <= sample(text, "trtllm:kv_cache_usage_perc") <= 1.0
    if flavor == "llmapi":  # trtllm-serve's names count misses too: hits are part of the queries
        assert sample(text, "trtllm:prefix_cache_queries_total") > hits
        assert sample(text, "trtllm_kv_cache_reused_blocks_total") == hits / 32
    else:  # the C++ backend's families, as its reporter names them
        assert sample(text, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="reused") == hits / 32
        assert sample(text, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="tokens_per") == 32


NGRAM = "speculative_config={decoding_type: NGram, max_draft_len: 4, max_matching_ngram_size: 3}"
REPEATED = "Repeat this list: apple, banana, cherry, date, elderberry, fig, grape. " * 3


@pytest.mark.flavors("llmapi")  # the C++ backend has no NGram mode (its drafts come from a draft model)
def test_ngram_drafts_packed_with_set_show_on_metrics_and_change_no_token(
    service: BentoService, model_name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`pack_model.py --set speculative_config=...` as a user types it: the start-up log names the
    option, the answer is the same text as the model packed without drafts, and /metrics counts
    the drafts the engine made and the ones it accepted."""
    home = pack_demo(tmp_path_factory.mktemp("bentoml_home_ngram"), "llmapi", "--set", NGRAM)
    body = {"model": model_name, "prompt": REPEATED, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    plain = httpx.post(f"{service.url}/v1/completions", json=body, timeout=120)
    assert plain.status_code == 200, plain.text
    with serving(home, tmp_path_factory.mktemp("serve_ngram")) as drafting:
        # The owner worker logs the options once Triton is ready, a moment after /readyz may answer.
        def logged() -> bool:
            return "LLM API options from --set" in drafting.log() and "decoding_type=NGram" in drafting.log()

        assert poll(logged, timeout=20), drafting.log()[-3000:]
        answer = httpx.post(f"{drafting.url}/v1/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
        text = wait_for(drafting.url, "trtllm:spec_decode_num_accepted_tokens_total", 0)
    drafted = sample(text, "trtllm:spec_decode_num_draft_tokens_total")
    accepted = sample(text, "trtllm:spec_decode_num_accepted_tokens_total")
    assert 0 < accepted <= drafted, (accepted, drafted)
    assert sample(text, "trtllm:spec_decode_num_drafts_total") >= 1
