"""The engine's statistics restated under vLLM's names on /metrics (trtllm_service/triton/metrics.py),
from Triton's exposition as each flavour's `tensorrt_llm` model writes it, without Triton."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from trtllm_service.triton import metrics
from trtllm_service.triton.metrics import engine_metrics, engine_values

LLMAPI = """\
# HELP trtllm_engine_info The engine serving the model
# TYPE trtllm_engine_info gauge
trtllm_engine_info{model="tensorrt_llm",engine="reference"} 1
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{model="tensorrt_llm",engine="reference"} 0.125
# TYPE trtllm_kv_cache_hit_rate gauge
trtllm_kv_cache_hit_rate{model="tensorrt_llm",engine="reference"} 0.375
# TYPE trtllm_kv_cache_tokens_per_block gauge
trtllm_kv_cache_tokens_per_block{model="tensorrt_llm",engine="reference"} 32
# TYPE trtllm_kv_cache_reused_blocks_total counter
trtllm_kv_cache_reused_blocks_total{model="tensorrt_llm",engine="reference"} 3
# TYPE trtllm_kv_cache_missed_blocks_total counter
trtllm_kv_cache_missed_blocks_total{model="tensorrt_llm",engine="reference"} 5
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{model="tensorrt_llm",engine="reference"} 2
# TYPE trtllm_spec_decode_num_drafts_total counter
trtllm_spec_decode_num_drafts_total{model="tensorrt_llm",engine="reference"} 4
# TYPE trtllm_spec_decode_num_draft_tokens_total counter
trtllm_spec_decode_num_draft_tokens_total{model="tensorrt_llm",engine="reference"} 16
# TYPE trtllm_spec_decode_num_accepted_tokens_total counter
trtllm_spec_decode_num_accepted_tokens_total{model="tensorrt_llm",engine="reference"} 9
nv_inference_request_success{model="tensorrt_llm",version="1"} 2
"""

ENSEMBLE = """\
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.25
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="reused",model="tensorrt_llm",version="1"} 6
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 100
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 3
"""


def test_llmapi_statistics_under_vllms_names() -> None:
    assert engine_values(LLMAPI) == {
        "trtllm:kv_cache_usage_perc": 0.125,
        "trtllm:prefix_cache_hits": 3 * 32,
        "trtllm:prefix_cache_queries": (3 + 5) * 32,
        "trtllm:num_requests_waiting": 2,
        "trtllm:spec_decode_num_drafts": 4,
        "trtllm:spec_decode_num_draft_tokens": 16,
        "trtllm:spec_decode_num_accepted_tokens": 9,
    }


def test_cpp_backend_statistics_under_vllms_names() -> None:
    # The C++ backend counts reused blocks but no misses: hits without queries.
    assert engine_values(ENSEMBLE) == {
        "trtllm:kv_cache_usage_perc": 0.25,
        "trtllm:prefix_cache_hits": 6 * 64,
        "trtllm:num_requests_waiting": 1,
    }


def test_nothing_without_the_engines_statistics() -> None:
    assert engine_values('nv_inference_request_success{model="x",version="1"} 2\n') == {}
    assert engine_metrics("", "m") == ""


@pytest.mark.parametrize("triton", [LLMAPI, ENSEMBLE])
def test_the_restated_metrics_parse_as_prometheus_text(triton: str) -> None:
    text = engine_metrics(triton, 'my "model"')
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert families["trtllm:kv_cache_usage_perc"].type == "gauge"
    hits = families["trtllm:prefix_cache_hits"]
    assert hits.type == "counter"
    (sample,) = hits.samples
    assert sample.name == "trtllm:prefix_cache_hits_total"
    assert sample.labels == {"model_name": 'my "model"'}
    assert 0 <= families["trtllm:kv_cache_usage_perc"].samples[0].value <= 1


def test_append_triton_metrics_adds_them_after_tritons(monkeypatch: pytest.MonkeyPatch) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=ENSEMBLE))
    real = httpx.AsyncClient
    monkeypatch.setattr(metrics.httpx, "AsyncClient", lambda **kwargs: real(transport=transport, **kwargs))
    text = asyncio.run(metrics.append_triton_metrics("ours 1", "http://triton/metrics", model_name="m"))
    assert text.startswith("ours 1\n" + ENSEMBLE)
    assert 'trtllm:kv_cache_usage_perc{model_name="m"} 0.25\n' in text
    plain = asyncio.run(metrics.append_triton_metrics("ours 1", "http://triton/metrics"))
    assert plain == "ours 1\n" + ENSEMBLE
