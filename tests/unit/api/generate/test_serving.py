"""/generate over the shared generation path (api/generate/): its request holds exactly the fields
of service.py's signature, and it goes through `GenerationServing` like every other route, the
engine's feature checks included (no Triton, no model: a scripted runtime)."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
from typing import Any

import pytest
from starlette.responses import Response

from tests.support import REPO_ROOT
from trtllm_service.api.generate.protocol import GenerateRequest
from trtllm_service.api.generate.serving import serve_generate
from trtllm_service.api.generation.bodies import bind_serving
from trtllm_service.api.generation.serving import GenerationServing
from trtllm_service.chat.template import PromptFormatter
from trtllm_service.errors import STARTING, APIError
from trtllm_service.relay.flavors import LLMAPIFlavor
from trtllm_service.relay.request import GenerationRequest, SamplingParams
from trtllm_service.runtime import Runtime

SERVICE = REPO_ROOT / "service.py"


def signature_of_generate() -> list[tuple[str, str, Any]]:
    """(name, annotation, default) of each argument of service.py's `generate` (read, not imported:
    importing service.py needs a packed model)."""
    tree = ast.parse(SERVICE.read_text())
    found = [n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "generate"]
    assert len(found) == 1
    args = found[0].args.args[1:]  # self
    defaults = [None] * (len(args) - len(found[0].args.defaults)) + list(found[0].args.defaults)
    return [
        (a.arg, ast.unparse(a.annotation), dataclasses.MISSING if d is None else ast.literal_eval(d))
        for a, d in zip(args, defaults, strict=True)
    ]


def test_the_request_holds_the_fields_of_the_routes_signature() -> None:
    fields = [(f.name, f.type, f.default) for f in dataclasses.fields(GenerateRequest)]
    assert fields == signature_of_generate()
    request = GenerateRequest.of({"self": object(), "prompt": "hi", "seed": -1, "top_k": 0})
    assert (request.prompt, request.seed) == ("hi", -1)
    params = request.sampling_params()
    assert (params.seed, params.top_k, params.stop, params.lora) == ((1 << 64) - 1, None, (), None)


class Startup:
    """The service's start-up, as /generate asks it: the runtime, or the 503 of a start under way."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime

    def serving(self) -> Any:
        if self.runtime is None:
            raise APIError.unavailable(STARTING, retry_after=1)
        return self.runtime


class ScriptedRuntime:
    """What the shared path reads of a runtime; the engine refuses every request it gets (a 503),
    after recording it."""

    model_name = "fake-model"
    adapter = Runtime.adapter
    settings = type("Settings", (), {"default_max_tokens": 77})()

    def __init__(self, flavor: LLMAPIFlavor) -> None:
        self.flavor = flavor
        self.adapters: dict[str, Any] = {}
        self.formatter = PromptFormatter
        self.prepared: list[tuple[list[dict[str, str]], SamplingParams, dict[str, Any]]] = []
        self.started: list[GenerationRequest] = []
        self.guides: list[tuple[Any, str]] = []

    async def check_guide(self, guide: Any, param: str) -> None:
        self.guides.append((guide, param))

    async def prepare_chat(
        self, messages: list[dict[str, str]], params: SamplingParams, **options: Any
    ) -> GenerationRequest:
        self.prepared.append((messages, params, options))
        return GenerationRequest(
            prompt_ids=[1, 2, 3],
            max_tokens=params.max_tokens or 77,
            seed=params.seed,
            beam_width=params.beam_width,
        )

    async def generate(self, request: GenerationRequest) -> Any:
        self.started.append(request)
        raise APIError.unavailable("the engine is restarting", retry_after=2)


def generate(runtime: ScriptedRuntime | None, **fields: Any) -> tuple[Response, dict[str, Any]]:
    if runtime is not None:
        bind_serving(GenerationServing(runtime))  # type: ignore[arg-type]  # a ScriptedRuntime for the Runtime
    request = GenerateRequest(**fields)
    response = asyncio.run(serve_generate(request, Startup(runtime), "fake-model"))  # type: ignore[arg-type]  # a ScriptedRuntime for the Runtime
    return response, json.loads(bytes(response.body))


def test_a_request_is_settled_by_the_shared_path() -> None:
    runtime = ScriptedRuntime(LLMAPIFlavor())
    schema = {"type": "object"}
    response, body = generate(
        runtime, prompt="Hi", system_prompt="Be brief.", top_k=-1, stop=["x", "x"], json_schema=schema
    )
    assert response.status_code == 503 and response.headers["retry-after"] == "2"
    assert body["error"]["message"] == "the engine is restarting"
    [(messages, params, options)] = runtime.prepared
    assert messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert (params.top_k, params.stop, params.guide is not None) == (None, ("x",), True)
    assert options == {"default_max_tokens": 77, "param": "prompt", "budget_param": "max_tokens"}
    assert runtime.guides == [(params.guide, "json_schema")]
    assert len(runtime.started) == 1 and runtime.started[0].seed is None  # unseeded, as asked


def test_check_engine_features_refuses_what_the_engine_cannot_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """A beam-packed model searches beams for every request; structured output is not served with
    beam search: the engine's feature check (every route's) refuses it, naming `json_schema`."""
    flavor = LLMAPIFlavor(max_beam_width=2)
    checked: list[dict[str, Any]] = []
    check = flavor.check_engine_features

    def spy(params: SamplingParams, **options: Any) -> None:
        checked.append({"beam_width": params.beam_width, **options})
        check(params, **options)

    monkeypatch.setattr(flavor, "check_engine_features", spy)
    runtime = ScriptedRuntime(flavor)
    response, body = generate(runtime, prompt="Hi", json_schema={"type": "object"})
    assert response.status_code == 400
    assert body["error"]["param"] == "json_schema"
    assert body["error"]["message"] == "beam search is not served with structured output"
    assert checked == [
        {"beam_width": 2, "stream": True, "n": 1, "logprobs_param": "logprobs", "guide_param": "json_schema"}
    ]
    assert not runtime.prepared and not runtime.started
    response, _ = generate(runtime, prompt="Hi")  # one beam of a beam-packed model streams
    assert response.status_code == 503 and runtime.started[0].beam_width == 2


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"lora": "nope"}, "lora", "unknown LoRA adapter 'nope' (none packed)"),
        ({"stop": [""]}, "stop", "Stop strings must not be empty."),
        ({"stop": [""], "json_schema": {"type": 5}}, "stop", "Stop strings must not be empty."),
        ({"temperature": 0.5}, "temperature", None),  # a beam-packed model: no sampling fields
    ],
)
def test_refusals_name_the_field(fields: dict[str, Any], param: str, message: str | None) -> None:
    response, body = generate(ScriptedRuntime(LLMAPIFlavor(max_beam_width=2)), prompt="Hi", **fields)
    assert response.status_code == 400 and body["error"]["param"] == param
    assert message is None or body["error"]["message"] == message


def test_while_the_service_starts_the_answer_is_a_503() -> None:
    response, body = generate(None, prompt="Hi")
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert body == APIError.unavailable(STARTING).body()
