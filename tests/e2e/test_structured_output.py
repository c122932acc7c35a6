"""Structured output through `bentoml serve .` with the official `openai` client, on both flavours.

The demo model has random weights: left alone it never writes JSON, so every answer that parses and
validates here does so because the engine's grammar (llguidance, in the reference engine) allowed
nothing else.
"""

from __future__ import annotations

import json
import queue
import re
import threading
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import openai
import pydantic
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

MESSAGES = [{"role": "user", "content": "Describe a person."}]
MAX_TOKENS = 400

_S = {"type": "string", "maxLength": 12}
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": _S}, "required": ["name"], "additionalProperties": False},
    {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]},
    {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 9}},
        "required": ["n"],
    },
    {
        "type": "object",
        "properties": {"x": {"type": "number", "minimum": -1.5, "maximum": 2.5}},
        "required": ["x"],
    },
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"v": {"const": "fixed"}}, "required": ["v"]},
    {"type": "object", "properties": {"nothing": {"type": "null"}}, "required": ["nothing"]},
    {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": _S, "minItems": 2, "maxItems": 4}},
        "required": ["tags"],
    },
    {
        "type": "object",
        "properties": {"ids": {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 3}},
        "required": ["ids"],
    },
    {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {
                    "first": _S,
                    "last": _S,
                    "age": {"type": "integer", "minimum": 0, "maximum": 130},
                },
                "required": ["first", "last", "age"],
                "additionalProperties": False,
            }
        },
        "required": ["person"],
    },
    {
        "type": "object",
        "properties": {"id": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 8}]}},
        "required": ["id"],
    },
    {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["code"],
    },
    {
        "type": "object",
        "properties": {"required_one": _S, "optional_one": {"type": "integer"}},
        "required": ["required_one"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 5}, "minItems": 1, "maxItems": 5},
    {
        "type": "object",
        "properties": {
            "matrix": {
                "type": "array",
                "items": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
                "minItems": 2,
                "maxItems": 2,
            }
        },
        "required": ["matrix"],
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": _S, "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
                "minItems": 1,
                "maxItems": 2,
            }
        },
        "required": ["items"],
    },
    {
        "type": "object",
        "properties": {"date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}},
        "required": ["date"],
    },
    {
        "type": "object",
        "properties": {"level": {"type": "integer", "enum": [1, 2, 3]}, "label": {"enum": ["low", "high"]}},
        "required": ["level", "label"],
    },
    {
        "type": "object",
        "properties": {"ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}},
        "required": ["ratio"],
    },
    {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
            }
        },
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
        "required": ["a", "b"],
    },
    {
        "type": "object",
        "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 5}},
        "required": ["word"],
    },
]


def closed(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on every object, as OpenAI's strict mode
    requires: an open object lets a random model add keys without end."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) for key, value in schema.items()}
    if out.get("type") == "object":
        out.setdefault("additionalProperties", False)
    return out


SCHEMAS = [closed(schema) for schema in SCHEMAS]


def schema_format(schema: dict[str, Any], name: str = "answer") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def streamed_text(stream: Any) -> tuple[str, str | None]:
    text, finish = "", None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish


@pytest.mark.box
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_every_answer_validates_against_its_schema(
    client: openai.OpenAI, model_name: str, stream: bool
) -> None:
    assert len(SCHEMAS) >= 20
    for i, schema in enumerate(SCHEMAS):
        params = {
            "model": model_name,
            "messages": MESSAGES,
            "max_tokens": MAX_TOKENS,
            "seed": i,
            "response_format": schema_format(schema),
        }
        if stream:
            text, finish = streamed_text(client.chat.completions.create(stream=True, **params))
        else:
            choice = client.chat.completions.create(**params).choices[0]
            text, finish = choice.message.content or "", choice.finish_reason
        assert finish == "stop", f"schema {i}: {finish} after {text!r}"
        jsonschema.validate(json.loads(text), schema)


def test_without_a_grammar_the_model_writes_no_json(client: openai.OpenAI, model_name: str) -> None:
    """The control: the same request unguided does not parse (the model's weights are random)."""
    answer = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=60, seed=0)
    with pytest.raises(ValueError):
        json.loads(answer.choices[0].message.content or "")


def test_json_object_mode_answers_a_json_object(client: openai.OpenAI, model_name: str) -> None:
    finished = 0
    for seed in range(6):
        choice = client.chat.completions.create(
            model=model_name,
            messages=MESSAGES,
            max_tokens=MAX_TOKENS,
            seed=seed,
            response_format={"type": "json_object"},
        ).choices[0]
        text = choice.message.content or ""
        assert text.startswith("{"), text
        if choice.finish_reason == "stop":  # a cut-off answer cannot be whole JSON
            assert isinstance(json.loads(text), dict), text
            finished += 1
    assert finished >= 1, "no JSON object finished within the token budget"


def test_vllm_style_guides_on_completions(client: openai.OpenAI, model_name: str) -> None:
    base = {"model": model_name, "prompt": "The answer is", "max_tokens": 60, "seed": 3}
    regex = r"(yes|no): [0-9]{2,4}"
    text = client.completions.create(**base, extra_body={"guided_regex": regex}).choices[0].text
    assert re.fullmatch(regex, text), text

    choices = ["alpha beta", "gamma", 'quote "this"']
    for seed in range(4):
        text = client.completions.create(**{**base, "seed": seed}, extra_body={"guided_choice": choices})
        assert text.choices[0].text in choices, text.choices[0].text

    grammar = 'root ::= "(" [a-c]{1,3} ("," [a-c]{1,3}){0,2} ")"'
    text = client.completions.create(**base, extra_body={"guided_grammar": grammar}).choices[0].text
    assert re.fullmatch(r"\([a-c]{1,3}(,[a-c]{1,3}){0,2}\)", text), text

    schema = SCHEMAS[10]
    text = client.completions.create(**{**base, "max_tokens": MAX_TOKENS}, extra_body={"guided_json": schema})
    jsonschema.validate(json.loads(text.choices[0].text), schema)


def test_generate_takes_a_json_schema(service: Any) -> None:
    schema = SCHEMAS[16]
    body = {
        "prompt": "List an order.",
        "max_tokens": MAX_TOKENS,
        "seed": 1,
        "temperature": 1.0,
        "json_schema": schema,
    }
    response = httpx.post(f"{service.url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    jsonschema.validate(json.loads(response.text), schema)


def test_concurrent_requests_keep_their_own_grammar(service: Any, model_name: str) -> None:
    """16 streams at once, each with another schema: every answer validates against its own."""
    picked = [SCHEMAS[i % len(SCHEMAS)] for i in range(16)]
    results: list[tuple[str, str | None] | BaseException | None] = [None] * 16
    client = openai.OpenAI(base_url=f"{service.url}/v1", api_key="x", max_retries=0, timeout=300)

    def worker(i: int) -> None:
        try:
            stream = client.chat.completions.create(
                model=model_name,
                messages=MESSAGES,
                max_tokens=MAX_TOKENS,
                seed=100 + i,
                stream=True,
                response_format=schema_format(picked[i]),
            )
            results[i] = streamed_text(stream)
        except BaseException as exc:  # reported below
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for i, result in enumerate(results):
        assert isinstance(result, tuple), f"stream {i}: {result!r}"
        text, finish = result
        assert finish == "stop", f"stream {i}: {finish} after {text!r}"
        jsonschema.validate(json.loads(text), picked[i])


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        (
            {"response_format": schema_format({"type": "nonsense"})},
            "response_format.json_schema.schema",
            "nonsense",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "required"),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "json_schema"),
        ({"guided_regex": "(unclosed"}, "guided_regex", "regex"),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"guided_choice": []}, "guided_choice", "non-empty"),
        ({"guided_grammar": "root ::= ( "}, "guided_grammar", "GBNF"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex", "Only one of"),
    ],
)
def test_a_bad_guide_is_a_400_naming_the_field(
    client: openai.OpenAI, model_name: str, extra: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=5, extra_body=extra)
    error = info.value.response.json()["error"]
    assert error["param"] == param, error
    assert says in error["message"], error


class Person(pydantic.BaseModel):
    """What instructor's JSON_SCHEMA mode sends: a pydantic model's schema, no additionalProperties."""

    name: str = pydantic.Field(max_length=3)
    age: int = pydantic.Field(ge=0, le=120)


@pytest.mark.box
def test_a_pydantic_schema_allows_only_the_properties_it_names(
    client: openai.OpenAI, model_name: str, service: Any
) -> None:
    """TensorRT-LLM compiles a json_schema guide with xgrammar's strict defaults on both flavours:
    no property the schema does not name (issue 44: our guide allowed them, and the demo added a
    "description" key until it ran out of tokens). A bias towards `,` (where another key would
    start) over `}` shows which one the guide allows after the last property."""
    schema = Person.model_json_schema()
    assert "additionalProperties" not in schema
    ids = {
        text: httpx.post(
            f"{service.url}/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=30
        ).json()["tokens"]
        for text in (",", "}")
    }
    assert all(len(found) == 1 for found in ids.values()), ids
    answer = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Invent a person."}],
        temperature=0,
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
        logit_bias={str(ids[","][0]): 100, str(ids["}"][0]): 50},
    )
    content = answer.choices[0].message.content or ""
    assert answer.choices[0].finish_reason == "stop", content
    assert set(json.loads(content)) == {"name", "age"}, content
    Person.model_validate_json(content)


@pytest.mark.box
@pytest.mark.flavors("llmapi")  # the llmapi model's own threads; sent past the service, straight to Triton
def test_an_engine_error_that_echoes_a_huge_grammar_freezes_nothing(service: Any, model_name: str) -> None:
    """A 50,000-alternative grammar fails in the engine (llguidance: "max is 2000"), whose error
    echoes the whole grammar. Logged whole, the 600 KB line stopped the service's copy of Triton's
    output; Triton then blocked on its next log write inside the stub's log request, and a metric
    call holding the GIL froze every thread of the model: every request waited 120 s for a 503,
    2 runs in 2, until the stub was killed by hand. Sent to Triton directly, so that no check of the
    service's stops it first."""
    grammar = "root ::= " + " | ".join(f'"w{i}"' for i in range(50_000))

    def tensor(name: str, value: np.ndarray) -> grpcclient.InferInput:
        item = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        item.set_data_from_numpy(value)
        return item

    inputs = [
        tensor("text_input", np.array([b"Say a word"], dtype=np.object_)),
        tensor("sampling_param_max_tokens", np.array([4], dtype=np.int32)),
        tensor("guided_decoding_guide_type", np.array([b"ebnf_grammar"], dtype=np.object_)),
        tensor("guided_decoding_guide", np.array([grammar.encode()], dtype=np.object_)),
    ]
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{service.triton_grpc_port}")
    try:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        client.async_stream_infer(
            "tensorrt_llm", inputs, outputs=[grpcclient.InferRequestedOutput("text_output")]
        )
        error = answers.get(timeout=60)
    finally:
        client.stop_stream()
        client.close()
    assert isinstance(error, InferenceServerException), error
    assert len(str(error)) < 2000, str(error)[:300]
    # Then the service and its model answer as before, at once. Greedy and past the end token: the
    # random tiny model sampled may end at once or pick tokens that decode to nothing (an empty 200
    # came once in the box suite's runs).
    body = {"prompt": "Hi", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    for _ in range(3):
        answer = httpx.post(f"{service.url}/generate", json=body, timeout=20)
        assert answer.status_code == 200 and answer.text, (answer.status_code, answer.text[:300])
    triton_log = (Path(service.env["TRTLLM_RUN_DIR"]) / "triton.log").read_text(errors="replace")
    assert max(len(line) for line in triton_log.splitlines()) < 20_000
