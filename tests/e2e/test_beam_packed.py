"""A model packed with --max-beam-width (issue 34, item 4): TensorRT-LLM 1.2.1's PyTorch executor
refuses every request whose beam width is not max_beam_width, so the service runs every request to
such a model as a beam search over the packed width, and answers what beam search cannot serve with
a 400 naming the field (README: beam search)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import BentoService, pack_demo, serving


@pytest.fixture(scope="module")
def beams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BentoService]:
    home = pack_demo(tmp_path_factory.mktemp("bentoml_home_beams"), "llmapi", "--max-beam-width", "2")
    with serving(home, tmp_path_factory.mktemp("serve_beams")) as server:
        yield server


@pytest.fixture(scope="module")
def http(beams: BentoService) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=beams.url, timeout=120) as client:
        yield client


def _chat(http: httpx.Client, **fields: Any) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "Tell me about the sea."}], "max_tokens": 8, **fields}
    return http.post("/v1/chat/completions", json=body)


@pytest.mark.box
def test_every_request_is_a_beam_search_over_the_packed_width(http: httpx.Client) -> None:
    plain = _chat(http)
    assert plain.status_code == 200, plain.text
    searched = _chat(http, use_beam_search=True, best_of=2)
    assert searched.status_code == 200, searched.text
    text = plain.json()["choices"][0]["message"]["content"]
    assert text and text == searched.json()["choices"][0]["message"]["content"]
    two = _chat(http, n=2)
    assert two.status_code == 200 and [c["index"] for c in two.json()["choices"]] == [0, 1]
    assert two.json()["choices"][0]["message"]["content"] == text  # the best beam first


def test_one_beam_streams_as_one_chunk(http: httpx.Client, beams: BentoService) -> None:
    whole = _chat(http).json()["choices"][0]["message"]["content"]
    with http.stream("POST", "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Tell me about the sea."}], "max_tokens": 8, "stream": True,
    }) as response:  # fmt: skip
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    deltas = [
        json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1] if json.loads(e)["choices"]
    ]
    assert "".join(d for d in deltas if d) == whole and events[-1] == "[DONE]"
    generated = http.post("/generate", json={"prompt": "Tell me about the sea.", "max_tokens": 8})
    assert generated.status_code == 200 and generated.text


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 0.7}, "temperature"),
        ({"top_p": 0.5}, "top_p"),
        ({"n": 3}, "n"),
        ({"logprobs": True, "top_logprobs": 2}, "top_logprobs"),
        ({"n": 2, "stream": True}, "stream"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_what_beam_search_cannot_serve_is_a_400_naming_the_field(
    http: httpx.Client, fields: dict[str, Any], param: str
) -> None:
    response = _chat(http, **fields)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
