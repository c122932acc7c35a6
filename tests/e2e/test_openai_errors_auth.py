"""Every error class of the /v1 API, with its status and OpenAI's error shape; API keys; /docs.json.

Most checks use the shared service (no API keys). One private service has keys, a concurrency limit
of 1 and a long Triton restart backoff, so that 401, 429, a failure mid-stream and 503 can all be
provoked on it, in that order (the last two kill its Triton).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support import held_request, wait_for

KEYS = "k1,k2"


def user(text: str = "Hello") -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def running(url: str) -> float:
    """Generation requests in flight, from the service's own metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("trtllm:num_requests_running{")
    )


def assert_error_shape(
    body: Any, *, type: str | None = None, code: str | None = None, param: Any = ...
) -> None:
    """`{"error": {"message", "type", "param", "code"}}` with a non-empty message."""
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    if type is not None:
        assert error["type"] == type
    if code is not None:
        assert error["code"] == code
    if param is not ...:
        assert error["param"] == param


# ---- the shared service (no API keys) ------------------------------------------------------------------


def test_models_lists_the_packed_model(client: openai.OpenAI, model_name: str, flavor: str) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]
    extra = models.data[0].model_extra
    assert extra is not None and extra["max_model_len"] == 2048
    # No tensorrt_llm here: both flavours say that the reference engine answers.
    assert (extra["flavor"], extra["engine"]) == (flavor, "reference")
    assert client.models.retrieve(model_name).id == model_name


@pytest.mark.parametrize(
    ("endpoint", "extra", "param"),
    [
        ("chat", {"prediction": {"type": "content", "content": "Hello"}}, "prediction"),
        ("chat", {"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ("chat", {"audio": {"voice": "alloy"}}, "audio"),
        ("chat", {"modalities": ["text", "audio"]}, "modalities"),
        ("completions", {"suffix": "end"}, "suffix"),
    ],
)
def test_unsupported_parameter_is_a_400_naming_it(
    client: openai.OpenAI, model_name: str, endpoint: str, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        if endpoint == "chat":
            client.chat.completions.create(model=model_name, messages=user(), max_tokens=4, **extra)
        else:
            client.completions.create(model=model_name, prompt="Hello", max_tokens=4, **extra)
    assert info.value.status_code == 400
    assert info.value.param == param
    assert info.value.code == "unsupported_parameter"
    assert param in info.value.message


def test_invalid_values_and_bodies_are_400s_in_openai_shape(http: httpx.Client, model_name: str) -> None:
    cases = [
        ({"model": model_name, "messages": user(), "temperature": 5}, "temperature"),
        ({"model": model_name, "messages": user(), "n": 9}, "n"),
        ({"model": model_name, "messages": []}, "messages"),
        ({"model": model_name, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": model_name, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"model": model_name}, "messages"),
        ({"model": model_name, "messages": user(), "min_p": 0.1}, "min_p"),
    ]
    for body, param in cases:
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, (body, response.text)
        assert_error_shape(response.json(), type="invalid_request_error", param=param)

    response = http.post(
        "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert_error_shape(response.json(), type="invalid_request_error")


def test_context_length_exceeded(client: openai.OpenAI, model_name: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_name, messages=user(), max_tokens=2048)
    assert (info.value.code, info.value.param) == ("context_length_exceeded", "messages")
    assert "maximum context length is 2048 tokens" in info.value.message

    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model_name, prompt="go " * 3000)
    assert (info.value.code, info.value.param) == ("context_length_exceeded", "prompt")
    assert "in the prompt" in info.value.message


def test_unknown_model_is_a_404(client: openai.OpenAI) -> None:
    for call in (
        lambda: client.chat.completions.create(model="gpt-4o", messages=user(), max_tokens=4),
        lambda: client.completions.create(model="gpt-4o", prompt="Hello", max_tokens=4),
        lambda: client.models.retrieve("gpt-4o"),
    ):
        with pytest.raises(openai.NotFoundError) as info:
            call()
        assert (info.value.code, info.value.param) == ("model_not_found", "model")
        assert_error_shape({"error": info.value.body}, type="invalid_request_error")


def test_unknown_route_and_method_under_v1(http: httpx.Client) -> None:
    for method, path, status in (
        ("GET", "/v1/nope", 404),
        ("POST", "/v1/embeddings", 404),
        ("POST", "/v1/load_lora_adapter", 404),  # off without TRTLLM_ALLOW_RUNTIME_LORA_UPDATING
        ("POST", "/v1/unload_lora_adapter", 404),
        ("GET", "/v1/chat/completions", 405),
    ):
        response = http.request(method, path)
        assert response.status_code == status, (method, path)
        assert_error_shape(response.json(), type="invalid_request_error")
        assert path in response.json()["error"]["message"]


def test_no_key_needed_without_api_keys(http: httpx.Client, model_name: str) -> None:
    response = http.post(
        "/v1/chat/completions", json={"model": model_name, "messages": user(), "max_tokens": 2}
    )
    assert response.status_code == 200
    assert http.post("/generate", json={"prompt": "Hello", "max_tokens": 2}).status_code == 200


def test_docs_json_describes_the_v1_routes(http: httpx.Client) -> None:
    spec = http.get("/docs.json").json()
    paths = spec["paths"]
    for path in ("/v1/models", "/v1/chat/completions", "/v1/completions"):
        assert path in paths
    chat = paths["/v1/chat/completions"]["post"]
    schema = chat["requestBody"]["content"]["application/json"]["schema"]
    assert {"messages", "max_tokens", "temperature", "stream", "n", "seed", "stop"} <= set(
        schema["properties"]
    )
    assert "ChatCompletionResponse" in str(chat["responses"]["200"])
    assert "/generate" in paths
    assert not any(path.startswith("/v1/{") for path in paths), "the catch-all is not documented"


# ---- a private service: API keys, a concurrency limit of 1, Triton killed at the end --------------------


@pytest.mark.flavors("ensemble")  # keys, the limit and a dead Triton answer the same on both
def test_api_keys_rate_limit_and_unavailable(
    make_service: Callable[..., Any], model_name: str, subtests: Any
) -> None:
    server = make_service(
        {
            "TRTLLM_API_KEYS": KEYS,
            "TRITON_RESTART_BACKOFF": "30",
            "TRTLLM_MAX_CONCURRENCY": "1",
        }
    )
    url = server.url
    chat = {"model": model_name, "messages": user(), "max_tokens": 3}

    def keyed(key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)

    with subtests.test("no key or a wrong key: 401 on /v1 and /generate"):
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic azE6"}):
            for method, path, body in (
                ("GET", "/v1/models", None),
                ("POST", "/v1/chat/completions", chat),
                ("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
                ("POST", "/v1/unknown", {}),
                ("POST", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "a"}),
                ("POST", "/generate", {"prompt": "Hi", "max_tokens": 2}),
                ("POST", "/tokenize", {"prompt": "Hi"}),
            ):
                response = httpx.request(method, url + path, json=body, headers=headers, timeout=30)
                assert response.status_code == 401, (headers, path)
                assert_error_shape(response.json(), type="invalid_request_error", code="invalid_api_key")
                assert response.headers["www-authenticate"] == "Bearer"
                assert "nope" not in response.text
        with pytest.raises(openai.AuthenticationError) as info:
            keyed("wrong").chat.completions.create(**chat)
        assert info.value.code == "invalid_api_key"

    with subtests.test("either right key works"):
        for key in KEYS.split(","):
            response = keyed(key).chat.completions.create(**chat)
            assert response.choices[0].finish_reason in ("stop", "length")
        response = httpx.post(
            f"{url}/generate",
            json={"prompt": "Hi", "max_tokens": 2},
            headers={"Authorization": "bearer k2"},
            timeout=30,
        )
        assert response.status_code == 200

    def claude(key: str, bearer: bool = False) -> anthropic.Anthropic:
        credentials = {"auth_token": key} if bearer else {"api_key": key}
        return anthropic.Anthropic(base_url=url, max_retries=0, timeout=60, **credentials)  # type: ignore[arg-type]  # api_key or auth_token, both str

    message = {"model": model_name, "max_tokens": 3, "messages": user()}

    with subtests.test("Anthropic's clients: x-api-key or a bearer token; 401 authentication_error"):
        for key, bearer in (("k1", False), ("k2", True)):
            answer = claude(key, bearer).messages.create(**message)
            assert answer.stop_reason in ("end_turn", "max_tokens")
        assert claude("k1").messages.count_tokens(model=model_name, messages=user()).input_tokens > 0
        for key, bearer in (("nope", False), ("nope", True)):
            with pytest.raises(anthropic.AuthenticationError) as denied:
                claude(key, bearer).messages.create(**message)
            body = denied.value.body
            assert isinstance(body, dict) and body["type"] == "error"
            assert body["error"]["type"] == "authentication_error" and "nope" not in str(body)
        missing = httpx.post(f"{url}/v1/messages", json=message, timeout=30)
        assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"

    with subtests.test("probes, metrics and docs stay open"):
        for path in ("/readyz", "/livez", "/healthz", "/metrics", "/docs.json", "/"):
            assert httpx.get(url + path, timeout=30).status_code == 200, path

    long = {**chat, "max_tokens": 1500, "ignore_eos": True, "stream": True}
    key = {"Authorization": "Bearer k1"}
    http = httpx.Client(base_url=url, headers=key, timeout=60)

    with (
        subtests.test("over TRTLLM_MAX_CONCURRENCY: 429 in OpenAI's shape"),
        held_request(url, "/v1/chat/completions", key),
    ):
        # A request whose body has not all arrived holds its slot for as long as we like, however
        # fast the engine is.
        def refused() -> bool:
            tiny = {"prompt": "Hi", "max_tokens": 1}
            return httpx.post(f"{url}/generate", json=tiny, headers=key, timeout=30).status_code == 429

        assert wait_for(refused, 10), "the held request does not take the one slot"
        with pytest.raises(openai.RateLimitError) as info:
            keyed("k1").chat.completions.create(**chat)
        assert info.value.status_code == 429
        assert_error_shape(info.value.response.json(), type="requests", code="rate_limit_exceeded")
        assert info.value.response.headers["retry-after"] == "1"
        response = httpx.post(
            f"{url}/generate", json={"prompt": "Hi", "max_tokens": 2}, headers=key, timeout=30
        )
        assert response.status_code == 429
        assert httpx.get(f"{url}/readyz", timeout=30).status_code == 200  # probes are not limited
        with pytest.raises(anthropic.RateLimitError) as limited:
            claude("k1").messages.create(**message)
        assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]  # the error body is a dict
        assert limited.value.response.headers["retry-after"] == "1"

    # The held request is closed; the server counts it out when it sees the disconnect.
    assert wait_for(lambda: running(url) == 0, 10), "the closed request still counts as running"

    with subtests.test("Triton dies mid-stream: an error event ends the stream"):
        with http.stream("POST", "/v1/chat/completions", json=long) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            for _ in range(6):
                next(lines)
            for pid in server.tritonserver_pids():
                os.kill(pid, signal.SIGKILL)
            events = [line for line in lines if line.startswith("data: ")]
        assert events, "the stream ended without a final event"
        assert events[-1] != "data: [DONE]"
        assert_error_shape(json.loads(events[-1].removeprefix("data: ")), type="server_error")
    http.close()

    with subtests.test("Triton down: 503 before any chunk, streamed or not"):
        start = time.monotonic()
        for stream in (False, True):
            response = httpx.post(
                f"{url}/v1/chat/completions", json={**chat, "stream": stream}, headers=key, timeout=30
            )
            assert response.status_code == 503, response.text
            assert_error_shape(response.json(), type="server_error", code="service_unavailable")
            assert response.headers.get("retry-after") == "1"
        with pytest.raises(openai.InternalServerError) as err:
            keyed("k2").completions.create(model=model_name, prompt="Hi", max_tokens=2)
        assert err.value.status_code == 503
        # Anthropic's clients know 529 overloaded_error (and retry it after Retry-After), not 503
        with pytest.raises(anthropic.OverloadedError) as overloaded:
            claude("k2").messages.create(**message)
        assert overloaded.value.status_code == 529
        assert overloaded.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]  # the error body is a dict
        assert overloaded.value.response.headers["retry-after"] == "1"
        assert time.monotonic() - start < 20, "answered while Triton is still down (backoff 30 s)"
