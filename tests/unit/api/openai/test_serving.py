"""The /v1 app and its serving logic over a scripted runtime (no Triton, no model).

The e2e tests check the real text; these check the plumbing that is hard to provoke there: how
choices are seeded and merged, that every engine stream is closed whatever ends a response, and
which errors surface where.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.serving_support import FakeRuntime, client_for, events, post
from trtllm_service.api.generation.protocol import parse_request
from trtllm_service.api.openai.chat.protocol import ChatCompletionChunk, ChatCompletionRequest
from trtllm_service.api.openai.completions.protocol import CompletionChunk, CompletionRequest
from trtllm_service.api.openai.serving import OpenAIServing


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


CHAT = {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3, "temperature": 0}


def test_chat_answer_usage_and_finish_reason(runtime: FakeRuntime) -> None:
    response = post(runtime, "/chat/completions", {**CHAT, "model": "fake-model"})
    assert response.status_code == 200
    body = response.json()
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": " w0 w1 w2"},
            "finish_reason": "length",
            "logprobs": None,
        }
    ]
    # "<user> hi there <assistant>": 4 prompt tokens
    assert body["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 3,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert runtime.open == 0 and runtime.closed_early == 0


def test_chat_stream_frames(runtime: FakeRuntime) -> None:
    response = post(
        runtime, "/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    *chunks, done = events(response)
    assert done == "[DONE]"
    parsed = [ChatCompletionChunk.model_validate_json(c) for c in chunks]
    assert parsed[0].choices[0].delta.role == "assistant"
    # Tokens that arrive while the previous event is being written share the next event.
    contents = [p.choices[0].delta.content for p in parsed[1:-2]]
    assert "".join(contents) == " w0 w1 w2" and all(contents)
    assert parsed[-2].choices[0].finish_reason == "length" and parsed[-2].choices[0].delta.content is None
    assert parsed[-1].choices == [] and parsed[-1].usage is not None and parsed[-1].usage.total_tokens == 7
    assert all('"usage":null' in c for c in chunks[:-1])


def test_n_choices_are_seeded_and_merged(runtime: FakeRuntime) -> None:
    response = post(
        runtime, "/chat/completions", {**CHAT, "n": 3, "seed": 10, "temperature": 1.0, "stream": True}
    )
    chunks = [ChatCompletionChunk.model_validate_json(c) for c in events(response)[:-1]]
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert texts == {i: f" w0s{10 + i} w1s{10 + i} w2s{10 + i}" for i in range(3)}
    assert [request.seed for request in runtime.requests] == [10, 11, 12]

    runtime.requests.clear()
    post(runtime, "/chat/completions", {**CHAT, "n": 3, "temperature": 1.0})
    seeds = [request.seed for request in runtime.requests]
    assert None not in seeds and len(set(seeds)) == 3, "unseeded choices sample independently"

    runtime.requests.clear()
    post(runtime, "/chat/completions", {**CHAT, "n": 2, "temperature": 0, "seed": 5})
    assert [(r.seed, r.top_k) for r in runtime.requests] == [(None, 1), (None, 1)], (
        "greedy choices need no seed of their own"
    )


def test_a_response_s_only_choice_is_its_prepared_request(
    runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a copy of it: its random seed was drawn with its sampling parameters."""
    prepared: list[Any] = []
    prepare = runtime.prepare_chat

    async def recording(*args: Any, **kwargs: Any) -> Any:
        prepared.append(await prepare(*args, **kwargs))
        return prepared[-1]

    monkeypatch.setattr(runtime, "prepare_chat", recording)
    post(runtime, "/chat/completions", {**CHAT, "temperature": 1.0})
    [sent] = runtime.requests
    assert sent is prepared[0] and sent.seed is not None
    runtime.requests.clear()
    post(runtime, "/chat/completions", {**CHAT, "n": 2, "temperature": 1.0})
    assert all(request is not prepared[1] for request in runtime.requests)
    assert [request.seed for request in runtime.requests] == [prepared[1].seed, prepared[1].seed + 1]


def test_seed_wraps_at_uint64(runtime: FakeRuntime) -> None:
    post(runtime, "/chat/completions", {**CHAT, "n": 2, "seed": (1 << 64) - 1, "temperature": 1})
    assert [request.seed for request in runtime.requests] == [(1 << 64) - 1, 0]


def test_completions_prompts_times_n_and_echo(runtime: FakeRuntime) -> None:
    body = {"prompt": ["a b", "c d e"], "n": 2, "max_tokens": 2, "echo": True, "temperature": 0}
    response = post(runtime, "/completions", body).json()
    assert [(c["index"], c["text"]) for c in response["choices"]] == [
        (0, "a b w0 w1"),
        (1, "a b w0 w1"),
        (2, "c d e w0 w1"),
        (3, "c d e w0 w1"),
    ]
    assert response["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 8,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 0},
    }

    streamed = post(runtime, "/completions", {**body, "stream": True})
    chunks = [CompletionChunk.model_validate_json(c) for c in events(streamed)[:-1]]
    first_per_index: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            first_per_index.setdefault(choice.index, choice.text)
    assert first_per_index == {0: "a b", 1: "a b", 2: "c d e", 3: "c d e"}


def test_empty_prompt_starts_from_bos(runtime: FakeRuntime) -> None:
    response = post(runtime, "/completions", {"prompt": "", "max_tokens": 1, "temperature": 0}).json()
    assert runtime.tokenizer.encoded == ["<s>"]
    assert response["choices"][0]["text"] == " w0"


def test_unset_max_tokens_is_what_is_left_and_too_long_is_400(runtime: FakeRuntime) -> None:
    post(runtime, "/completions", {"prompt": "a " * 60})
    assert runtime.requests[0].max_tokens == 4

    response = post(runtime, "/completions", {"prompt": "a " * 60, "max_tokens": 5})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "prompt")
    assert "60 in the prompt, 5 in the completion" in error["message"]

    response = post(runtime, "/chat/completions", {**CHAT, "max_completion_tokens": 61})
    assert (response.status_code, response.json()["error"]["param"]) == (400, "messages")


def test_error_before_the_first_delta_is_a_json_error_and_stops_the_others() -> None:
    runtime = FakeRuntime(fail_at=0)
    for stream in (False, True):
        response = post(runtime, "/chat/completions", {**CHAT, "n": 2, "stream": stream})
        assert response.status_code == 500
        assert response.json()["error"]["type"] == "server_error"
    assert runtime.open == 0

    runtime = FakeRuntime(not_ready=True)
    response = post(runtime, "/chat/completions", CHAT)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "service_unavailable"


def test_error_mid_stream_is_an_error_event_and_closes_every_choice() -> None:
    runtime = FakeRuntime(fail_at=2)
    for n in (1, 3):
        response = post(runtime, "/chat/completions", {**CHAT, "n": n, "stream": True})
        assert response.status_code == 200
        frames = events(response)
        assert "[DONE]" not in frames
        assert json.loads(frames[-1])["error"]["message"] == "Inference server error: engine exploded"
        assert runtime.open == 0

    response = post(runtime, "/chat/completions", {**CHAT, "n": 2})
    assert response.status_code == 500
    assert runtime.open == 0


def test_closing_a_stream_closes_every_engine_stream() -> None:
    """The client goes away after the opening and n text frames (one choice: the pushed response;
    several: the merged generator): every engine stream is closed early."""

    async def go(n: int) -> tuple[FakeRuntime, int]:
        runtime = FakeRuntime(hang=True)
        serving = OpenAIServing(runtime)  # type: ignore[arg-type]  # a FakeRuntime for the Runtime
        request = parse_request(ChatCompletionRequest, {**CHAT, "n": n, "max_tokens": 50, "stream": True})
        response = await serving.chat(request)
        gone = asyncio.Event()
        bodies: list[bytes] = []
        open_then = -1

        async def send(message: dict[str, Any]) -> None:
            nonlocal open_then
            if message.get("body"):
                bodies.append(message["body"])
                if len(bodies) == n + 1:
                    open_then = runtime.open
                    gone.set()

        async def receive() -> dict[str, Any]:
            await gone.wait()
            return {"type": "http.disconnect"}

        await response({"type": "http"}, receive, send)
        return runtime, open_then

    for n in (1, 3):
        runtime, open_then = asyncio.run(go(n))
        assert open_then == n
        assert (runtime.open, runtime.closed_early) == (0, n)


def test_a_client_that_goes_away_stops_a_non_streamed_request() -> None:
    async def go() -> tuple[FakeRuntime, int]:
        runtime = FakeRuntime(hang=True)
        serving = OpenAIServing(runtime)  # type: ignore[arg-type]  # a FakeRuntime for the Runtime

        async def receive() -> dict[str, Any]:
            await asyncio.sleep(0.3)
            return {"type": "http.disconnect"}

        http_request = SimpleNamespace(receive=receive)
        request = parse_request(CompletionRequest, {"prompt": "a", "n": 2, "max_tokens": 50})
        response = await serving.completions(request, http_request)  # type: ignore[arg-type]  # a SimpleNamespace for the Request
        return runtime, response.status_code

    runtime, status = asyncio.run(go())
    assert status == 499
    assert (runtime.open, runtime.closed_early) == (0, 2)


def test_models_and_model_check(runtime: FakeRuntime) -> None:
    async def go() -> list[httpx.Response]:
        async with client_for(runtime) as client:
            return [
                await client.get("/models"),
                await client.get("/models/fake-model"),
                await client.get("/models/other"),
                await client.post("/completions", json={"model": "other", "prompt": "a"}),
                await client.get("/nothing/here"),
                await client.delete("/completions"),
            ]

    models, card, missing, wrong, unknown, method = asyncio.run(go())
    assert models.json()["data"][0]["id"] == "fake-model"
    assert models.json()["data"][0]["max_model_len"] == 64
    assert card.json()["id"] == "fake-model"
    for response in (missing, wrong):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "model_not_found"
    assert (
        unknown.status_code == 404 and unknown.json()["error"]["message"] == "Invalid URL (GET /nothing/here)"
    )
    assert method.status_code == 405 and method.json()["error"]["code"] == "method_not_allowed"
    assert runtime.requests == []


def test_invalid_bodies_never_reach_the_runtime(runtime: FakeRuntime) -> None:
    response = post(runtime, "/chat/completions", {**CHAT, "audio": {"voice": "alloy"}})
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "Unsupported parameter: 'audio': audio output is not supported.",
        "type": "invalid_request_error",
        "param": "audio",
        "code": "unsupported_parameter",
    }
    assert runtime.requests == []
