"""The plain `generate` API end to end: `bentoml serve .` on the demo model, real clients.

Greedy output is compared with `transformers` run on the checkpoint and tokenizer that pack_model.py
put into the model store, with the chat prompt built by the tokenizer's own `apply_chat_template`;
none of the service's code takes part in the reference. Engine-side effects (stopped, cancelled,
tokens generated) are read from the reference engine's Prometheus counters on Triton's metrics port.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import bentoml
import httpx
import pytest

from tests.e2e.conftest import BentoService
from tests.support import stable_text, wait_for

SYSTEM_PROMPT = "You are a terse assistant."
PROMPT = "Tell me a story about a fox."
# Greedy decoding of this prompt runs to well over 1500 tokens without an end token, so requests
# for it only end early when the service ends them.
LONG_PROMPT = "Tell me a very long story."

REQUESTS_METRIC = "trtllm_reference_requests_total"
TOKENS_METRIC = "trtllm_reference_generated_tokens_total"
OUTCOMES = ("completed", "cancelled", "stopped", "error")


class GreedyReference:
    """Greedy decoding with `transformers` on the packed checkpoint."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir / "tokenizer"))
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir / "engine"), dtype=torch.float32)
        self.model.eval()
        # The service stops on <|eot_id|> (the engine's end id) and <|end_of_text|>.
        self.end_ids = [self.tokenizer.convert_tokens_to_ids(t) for t in ("<|eot_id|>", "<|end_of_text|>")]
        assert self.end_ids == [1033, 1025], self.end_ids

    def chat_ids(self, prompt: str, system_prompt: str | None = None) -> list[int]:
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": prompt})
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def greedy_ids(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        """The generated ids, without the end token that stopped generation (if one did)."""
        torch = self.torch
        with torch.inference_mode():
            out = self.model.generate(
                torch.tensor([prompt_ids]),
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=self.end_ids,
                pad_token_id=self.end_ids[0],
            )
        ids = out[0, len(prompt_ids) :].tolist()
        return ids[:-1] if ids and ids[-1] in self.end_ids else ids

    def text(self, ids: list[int]) -> str:
        return stable_text(self.tokenizer, ids)


@pytest.fixture(scope="module")
def reference(packed_model_dir: Path) -> GreedyReference:
    return GreedyReference(packed_model_dir)


def engine_counts(service: BentoService) -> dict[str, float]:
    counts = {outcome: service.metric(REQUESTS_METRIC, outcome=outcome) for outcome in OUTCOMES}
    counts["tokens"] = service.metric(TOKENS_METRIC)
    return counts


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in before}


def wait_engine_idle(service: BentoService, quiet: float = 0.5, timeout: float = 60.0) -> dict[str, float]:
    """Waits until the engine generated no token for `quiet` s (earlier tests may still be
    winding down) and returns its counters."""
    deadline = time.monotonic() + timeout
    last = engine_counts(service)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = engine_counts(service)
        if now == last:
            return now
        last = now
    pytest.fail(f"the engine did not become idle in {timeout} s: {last}")


def post_generate(service: BentoService, body: dict[str, Any]) -> tuple[httpx.Response, str]:
    """POSTs `body` to /generate; returns the response and its whole body as text."""
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", f"{service.url}/generate", json=body) as response,
    ):
        text = b"".join(response.iter_raw()).decode("utf-8")
    return response, text


# ---- streaming ----------------------------------------------------------------------------------


def test_sync_client_streams_the_greedy_reference(service: BentoService, reference: GreedyReference) -> None:
    """BentoML's own client streams `generate`, and greedy text equals `transformers` greedy."""
    generated = reference.greedy_ids(reference.chat_ids(PROMPT, SYSTEM_PROMPT), 40)
    expected = reference.text(generated)
    assert len(expected) > 20, f"the reference is too short to tell anything: {expected!r}"

    with bentoml.SyncHTTPClient(service.url, timeout=120) as client:
        result = client.generate(prompt=PROMPT, system_prompt=SYSTEM_PROMPT, max_tokens=40, temperature=0)
        output_schema = client.endpoints["generate"].output
        chunks = [result] if isinstance(result, str) else list(result)
        # In chunks: 256 tokens, not 40, which the tiny model can make in one of the worker's reads
        # while the machine is busy: they then go out as one chunk.
        long = client.generate(prompt=PROMPT, max_tokens=256, ignore_eos=True, temperature=0)
        long_chunks = [long] if isinstance(long, str) else list(long)

    assert "".join(chunks) == expected
    assert not isinstance(result, str), (
        "bentoml.SyncHTTPClient got generate's answer as one string, not as a stream: the service's "
        f"schema does not mark the output as a stream ({output_schema})"
    )
    assert len(long_chunks) > 1, f"the answer arrived in one chunk: {long_chunks!r}"


@pytest.mark.box
def test_prompt_and_max_tokens_only(service: BentoService) -> None:
    """The upstream example's request shape: only `prompt` and `max_tokens` (sampling defaults)."""
    before = wait_engine_idle(service)
    response, text = post_generate(service, {"prompt": "What is the capital of France?", "max_tokens": 16})
    assert response.status_code == 200, text
    assert response.headers["content-type"].startswith("text/plain")
    assert wait_for(lambda: engine_counts(service)["completed"] == before["completed"] + 1, timeout=15)
    change = delta(engine_counts(service), before)
    # The engine ran this one request, to at most max_tokens (it may sample an end token sooner).
    assert 1 <= change["tokens"] <= 16, change
    assert change["completed"] == 1 and change["cancelled"] == change["stopped"] == change["error"] == 0
    if change["tokens"] > 4:  # more than an end token and a few byte pieces of one character
        assert text, "tokens were generated but no text came back"


# ---- stop strings -------------------------------------------------------------------------------


def straddling_stop(reference: GreedyReference, ids: list[int]) -> tuple[str, str]:
    """A 4-character stop string across a token boundary in the greedy text, whose first occurrence
    is well inside the text; returns it and the text before that occurrence."""
    text = reference.text(ids)
    ends = [len(reference.text(ids[:k])) for k in range(len(ids) + 1)]
    for k in range(6, len(ids) // 2):
        boundary = ends[k]
        if not ends[k - 1] < boundary < ends[k + 1]:  # tokens k-1 and k both have text
            continue
        stop = text[boundary - 2 : boundary + 2]
        first = text.find(stop)
        before = text[:first]
        if (
            "\ufffd" not in stop
            and stop.strip()
            and first > 0
            # what comes before must not end in a prefix of the stop string, so that "nothing of
            # the stop string is emitted" is a check of its own
            and not any(before.endswith(stop[:n]) for n in range(1, len(stop)))
        ):
            return stop, before
    raise AssertionError(f"no usable stop string in {text!r}")


def test_stop_string_ends_stream_and_engine_request(
    service: BentoService, reference: GreedyReference
) -> None:
    """The text stops right before the stop string (nothing of it is sent), and the engine request
    is stopped instead of running on to max_tokens."""
    generated = reference.greedy_ids(reference.chat_ids(LONG_PROMPT), 48)
    assert len(generated) == 48, "the greedy reference ended early; LONG_PROMPT no longer fits this test"
    stop, expected = straddling_stop(reference, generated)
    max_tokens = 600

    before = wait_engine_idle(service)
    response, streamed = post_generate(
        service, {"prompt": LONG_PROMPT, "max_tokens": max_tokens, "temperature": 0, "stop": [stop]}
    )
    assert response.status_code == 200, streamed

    assert streamed == expected, f"stop={stop!r}"
    assert stop not in streamed
    assert not any(streamed.endswith(stop[:n]) for n in range(1, len(stop))), (
        f"part of the stop string {stop!r} was sent: {streamed[-8:]!r}"
    )

    # The relay cancels the engine request (its gRPC stream) at once; typically well under a second,
    # generous because CI machines can be very busy.
    def ended_early() -> float:
        counts = delta(engine_counts(service), before)
        return counts["stopped"] + counts["cancelled"]

    assert wait_for(lambda: ended_early() >= 1, timeout=10), (
        f"the engine did not end the request early: {delta(engine_counts(service), before)}"
    )
    wait_engine_idle(service)
    change = delta(engine_counts(service), before)
    assert ended_early() == 1 and change["completed"] == 0, change
    assert change["tokens"] < max_tokens / 2, f"the engine ran on after the stop string: {change}"


# ---- bad requests -------------------------------------------------------------------------------

BAD_REQUESTS = {
    "max_tokens_not_an_int": ({"prompt": "Hi", "max_tokens": "abc"}, "max_tokens", None),
    "max_tokens_zero": ({"prompt": "Hi", "max_tokens": 0}, "max_tokens", None),
    "temperature_too_high": ({"prompt": "Hi", "temperature": 5}, "temperature", None),
    "beyond_context": ({"prompt": "Hi", "max_tokens": 5000}, "max_tokens", "context_length_exceeded"),
    "empty_stop_string": ({"prompt": "Hi", "max_tokens": 5, "stop": [""]}, "stop", None),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_request_is_a_json_400(service: BentoService, case: str) -> None:
    """A bad request gets a 400 with a JSON body that names the field, never text, and never
    reaches the engine; the service serves on."""
    body, field, code = BAD_REQUESTS[case]
    before = wait_engine_idle(service)
    request_id = f"bad-{case}-{time.monotonic_ns()}"
    response = httpx.post(
        f"{service.url}/generate", json=body, headers={"X-Request-Id": request_id}, timeout=60
    )

    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/json"), response.text
    payload = response.json()  # the whole body is one JSON document: no text chunk came first
    error = assert_error_shape(payload)  # BentoML's own validation included, not pydantic's shape
    assert error["param"] == field, payload
    assert error["type"] == "invalid_request_error", payload
    assert error["message"], payload
    if code is not None:
        assert error["code"] == code, payload
        assert "2048" in error["message"], payload

    assert engine_counts(service) == before, "a rejected request reached the engine"
    ok = httpx.post(
        f"{service.url}/generate", json={"prompt": "Hi", "max_tokens": 3, "temperature": 0}, timeout=60
    )
    assert ok.status_code == 200, ok.text
    # The client's fault is at most one WARNING line in the log (and BentoML's access line), never
    # an ERROR with pydantic's traceback.
    marked = f"[request_id={request_id}]"
    assert wait_for(lambda: "status=400" in service.log().split(marked, 1)[-1], timeout=10)
    after = service.log().split(marked, 1)[1]
    lines = [line for line in service.log().splitlines() if marked in line]
    assert "Traceback" not in after and not [line for line in lines if "[ERROR]" in line], lines
    warnings = [line for line in lines if "[WARNING]" in line]
    assert len(warnings) <= 1 and all(field in line for line in warnings), warnings


def assert_error_shape(payload: Any) -> dict[str, Any]:
    """The one error shape of every route (README): `{"error": {"message", "type", "param", "code"}}`."""
    assert isinstance(payload, dict) and set(payload) == {"error"}, payload
    error = payload["error"]
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, payload
    assert isinstance(error["message"], str) and error["message"], payload
    return error


# What a newcomer sends first: none of it may be answered with the Swagger example's prompt.
NO_PROMPT = {
    "no prompt": (b'{"max_tokens": 5}', {"Content-Type": "application/json"}, "missing_required_parameter"),
    "empty JSON object": (b"{}", {"Content-Type": "application/json"}, "missing_required_parameter"),
    "empty body": (b"", {"Content-Type": "application/json"}, "missing_required_parameter"),
    "empty body, no content type": (b"", {}, "missing_required_parameter"),
    "curl -d with a form": (b"prompt=hi", {"Content-Type": "application/x-www-form-urlencoded"}, None),
    "a misspelt field": (b'{"prompt": "Hi", "max_new_tokens": 5}', {"Content-Type": "application/json"}, "unknown_parameter"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(NO_PROMPT))
def test_no_prompt_is_a_400_not_an_answer(service: BentoService, case: str) -> None:
    """Issue 35: no prompt, an empty body, or curl's default form content type got 200 and up to
    1,024 tokens about superconductors (the signature's default prompt). Now a 400 in the one
    error shape, naming what is wrong, and nothing reaches the engine."""
    body, headers, code = NO_PROMPT[case]
    before = wait_engine_idle(service)
    response = httpx.post(f"{service.url}/generate", content=body, headers=headers, timeout=60)
    assert response.status_code == 400, response.text[:300]
    error = assert_error_shape(response.json())
    assert error["type"] == "invalid_request_error" and error["code"] == code, error
    if code == "missing_required_parameter":
        assert error["param"] == "prompt" and "'prompt'" in error["message"], error
    elif code == "unknown_parameter":
        assert error["param"] == "max_new_tokens", error
    else:  # a form body is not JSON
        assert "could not parse the JSON body" in error["message"], error
    assert engine_counts(service) == before, "a refused request reached the engine"


def test_curls_default_content_type_with_a_json_body_is_served(service: BentoService) -> None:
    """`curl -d '{"prompt": ...}'` without `-H content-type: application/json` declares a form:
    the body is read as JSON (as on /v1), and the answer is to that prompt."""
    body = b'{"prompt": "Hello!", "max_tokens": 8, "temperature": 0}'
    form = httpx.post(
        f"{service.url}/generate",
        content=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        timeout=60,
    )
    as_json = httpx.post(
        f"{service.url}/generate", content=body, headers={"Content-Type": "application/json"}, timeout=60
    )
    assert form.status_code == as_json.status_code == 200, form.text[:300]
    assert form.text == as_json.text and form.text


@pytest.mark.parametrize(
    ("content", "headers", "status", "code"),
    [
        (b"--x\r\nContent-Disposition: form-data; name=prompt\r\n\r\nhi\r\n--x--\r\n", {"Content-Type": "multipart/form-data; boundary=x"}, 415, "unsupported_media_type"),
        (b"prompt: hi", {"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
        (b'{"prompt": "hi",', {"Content-Type": "application/json"}, 400, None),
        (b'"hi"', {"Content-Type": "application/json"}, 400, "invalid_type"),
    ],
    ids=["multipart form", "text", "malformed JSON", "a JSON string"],
)  # fmt: skip
def test_a_body_that_is_not_json_is_a_415_or_400(
    service: BentoService, content: bytes, headers: dict[str, str], status: int, code: str | None
) -> None:
    response = httpx.post(f"{service.url}/generate", content=content, headers=headers, timeout=60)
    assert response.status_code == status, response.text[:300]
    error = assert_error_shape(response.json())
    assert error["code"] == code and error["type"] == "invalid_request_error", error


def test_every_route_answers_errors_in_one_shape(service: BentoService) -> None:
    """BentoML's and Starlette's own answers too: an unknown path, a wrong method, a body of the
    wrong type on /tokenize."""
    cases = [
        ("GET", "/generate", None, 405, "method_not_allowed"),
        ("GET", "/no-such-route", None, 404, "unknown_url"),
        ("GET", "/tokenize", None, 405, "method_not_allowed"),
        ("POST", "/generate", {"prompt": ["not", "text"]}, 400, "invalid_type"),
        ("POST", "/tokenize", {"prompt": 1}, 400, "invalid_type"),
        ("POST", "/v1/chat/completions", {"messages": "hi"}, 400, "invalid_type"),
    ]
    for method, path, body, status, code in cases:
        response = httpx.request(method, f"{service.url}{path}", json=body, timeout=60)
        assert response.status_code == status, (method, path, response.text[:300])
        assert response.headers["content-type"].startswith("application/json"), (method, path)
        assert assert_error_shape(response.json())["code"] == code, (method, path, response.text[:300])


# ---- client disconnect --------------------------------------------------------------------------


@pytest.mark.box
def test_client_disconnect_stops_generation(service: BentoService) -> None:
    """Closing the connection mid-stream ends the engine request within seconds."""
    max_tokens = 1500
    # Sampled with this seed, the prompt runs to max_tokens (about 10 s on the demo engine) unless
    # the request is ended early.
    body = {"prompt": LONG_PROMPT, "max_tokens": max_tokens, "temperature": 1, "seed": 15, "stop": []}
    before = wait_engine_idle(service)

    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{service.url}/generate", json=body) as response,
    ):
        assert response.status_code == 200
        received = []
        for chunk in response.iter_raw():
            received.append(chunk)
            if len(received) == 3:
                break
    # Leaving both blocks closed the half-read response and its connection.
    assert len(received) == 3

    def ended() -> float:
        counts = engine_counts(service)
        return counts["cancelled"] + counts["stopped"] - before["cancelled"] - before["stopped"]

    # Typically well under a second; generous because CI machines can be very busy.
    assert wait_for(lambda: ended() >= 1, timeout=10), (
        f"the engine did not end the request within 10 s: {delta(engine_counts(service), before)}"
    )
    tokens = service.metric(TOKENS_METRIC)
    time.sleep(1.0)
    assert service.metric(TOKENS_METRIC) == tokens, "the engine is still generating"
    change = delta(engine_counts(service), before)
    assert ended() == 1 and change["completed"] == 0 and change["error"] == 0, change
    assert change["tokens"] < max_tokens / 2, change
