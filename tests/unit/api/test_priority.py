"""Priority on every route, settled once (generation/protocol.py -> SamplingParams.queue_rank), and
what the answers say of it: OpenAI's echoed `service_tier`, Anthropic's `usage.service_tier`, the
queue's refusals in each API's shape, the queue's bounds from the settings, and its gauge."""

from __future__ import annotations

from typing import Any

import pytest

from trtllm_service.api.anthropic.errors import status_of
from trtllm_service.api.anthropic.events import MessageBuilder
from trtllm_service.api.anthropic.protocol import MessagesRequest
from trtllm_service.api.generate.protocol import GenerateRequest
from trtllm_service.api.generation.protocol import parse_request
from trtllm_service.api.openai.chat.protocol import ChatCompletionRequest
from trtllm_service.api.openai.completions.protocol import CompletionRequest
from trtllm_service.api.openai.responses.protocol import ResponsesRequest
from trtllm_service.api.openai.sse import ChatChunkEncoder
from trtllm_service.api.server.admission import QueueLimits, queue_full, queue_timeout
from trtllm_service.api.server.deployment import queue_limits
from trtllm_service.errors import APIError
from trtllm_service.settings import Settings
from trtllm_service.triton.metrics import engine_metrics

USER = [{"role": "user", "content": "hi"}]

ENSEMBLE = """\
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 3
"""
"""The C++ backend's request gauges as Triton exports them: one request waiting in the engine."""


def chat(**fields: Any) -> ChatCompletionRequest:
    return parse_request(ChatCompletionRequest, {"messages": USER, **fields})


@pytest.mark.parametrize(
    ("fields", "rank", "echoed"),
    [
        ({}, (1, 0), "default"),
        ({"priority": -7}, (1, -7), "default"),
        ({"service_tier": "auto", "priority": 3}, (1, 3), "default"),
        ({"service_tier": "default"}, (1, 0), "default"),
        ({"service_tier": "scale"}, (1, 0), "scale"),
        ({"service_tier": "priority", "priority": 9}, (0, 9), "priority"),
        ({"service_tier": "flex", "priority": -9}, (2, -9), "flex"),
    ],
)
def test_openai_priority_and_tier_settle_into_one_rank(
    fields: dict[str, Any], rank: tuple[int, int], echoed: str
) -> None:
    request = chat(**fields)
    assert (request.sampling_params().queue_rank, request.answered_tier) == (rank, echoed)
    completion = parse_request(CompletionRequest, {"prompt": "hi", **fields})
    responses = parse_request(ResponsesRequest, {"input": "hi", **fields})
    assert completion.sampling_params().queue_rank == responses.sampling_params().queue_rank == rank


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"service_tier": "gold"}, "service_tier"),
        ({"priority": "1"}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": 1 << 63}, "priority"),
    ],
)
def test_a_bad_priority_or_tier_is_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as refused:
        chat(**fields)
    assert (refused.value.status, refused.value.param) == (400, param)


def test_messages_take_anthropics_tiers_as_the_default_one_and_vllms_priority() -> None:
    body = {"model": "m", "max_tokens": 4, "messages": USER}
    for tier in ("auto", "standard_only"):
        request = parse_request(MessagesRequest, {**body, "service_tier": tier, "priority": 2})
        assert request.sampling_params().queue_rank == (1, 2)
    with pytest.raises(APIError) as refused:
        parse_request(MessagesRequest, {**body, "service_tier": "priority"})
    assert refused.value.status == 400
    message = MessageBuilder(parse_request(MessagesRequest, body), "m", 3).message(
        None, "hi", None, "stop", 1
    )
    assert message["usage"]["service_tier"] == "standard"


def test_generate_takes_priority() -> None:
    assert GenerateRequest(prompt="hi", priority=-2).sampling_params().queue_rank == (1, -2)
    assert GenerateRequest(prompt="hi").sampling_params().queue_rank == (1, 0)


def test_streamed_chunks_echo_the_tier() -> None:
    frame = ChatChunkEncoder("id", "m", 1, service_tier="flex").content("x")
    assert '"service_tier":"flex"' in frame


def test_the_queues_refusals_are_429_with_retry_after_and_529_on_messages() -> None:
    limits = QueueLimits(slots=1, max_waiting=2, timeout_s=3)
    for error in (queue_full(limits), queue_timeout(limits)):
        assert (error.status, error.headers()) == (429, {"Retry-After": "1"})
        assert status_of(error) == 529
    assert status_of(APIError.rate_limited(retry_after=1)) == 429  # the concurrency limit's stays 429


def test_queue_bounds_from_the_settings() -> None:
    traffic = {"concurrency": 8, "max_concurrency": 256}
    assert queue_limits(Settings.from_env({"TRTLLM_ENGINE_SLOTS": "off"}), traffic) is None
    assert queue_limits(Settings.from_env({}), traffic) == QueueLimits(8, 256, 600.0), "on by default"
    assert queue_limits(Settings.from_env({"TRTLLM_ENGINE_SLOTS": "auto"}), traffic) == QueueLimits(
        8, 256, 600.0
    )
    settings = Settings.from_env(
        {"TRTLLM_ENGINE_SLOTS": "3", "TRTLLM_MAX_WAITING": "0", "TRTLLM_QUEUE_TIMEOUT": "2.5"}
    )
    assert queue_limits(settings, traffic) == QueueLimits(3, 0, 2.5)


def test_the_waiting_gauge_adds_the_services_queue_to_the_engines() -> None:
    assert 'trtllm:num_requests_waiting{model_name="m"} 1.0' in engine_metrics(ENSEMBLE, "m")
    assert 'trtllm:num_requests_waiting{model_name="m"} 5.0' in engine_metrics(ENSEMBLE, "m", waiting=4)
    assert 'trtllm:num_requests_waiting{model_name="m"} 4' in engine_metrics("", "m", waiting=4)
