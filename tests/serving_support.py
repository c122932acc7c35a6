"""A scripted runtime under the /v1 app (no Triton, no model): the real request preparation over word
tokens, an engine that answers token 0, 1, 2, ... through real `EngineStream`s, and the app reached
through httpx's ASGI transport (tests/unit/api/openai/, tests/unit/packing/test_packing.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.support import engine_response
from trtllm_service.api import app
from trtllm_service.chat.reasoning import style_of
from trtllm_service.chat.template import PromptFormatter
from trtllm_service.errors import APIError
from trtllm_service.relay.client import EngineStream
from trtllm_service.relay.flavors import LLMAPIFlavor
from trtllm_service.relay.prompting import ChatPrompt, RequestPreparer
from trtllm_service.relay.readers import TokenIdReader
from trtllm_service.relay.request import EngineLimits, GenerationRequest, SamplingParams
from trtllm_service.runtime import Runtime


class WordDecoder:
    """Token i decodes to " w<i>", tagged with the request's seed when it samples."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def push(self, ids: Any) -> str:
        return "".join(f" w{i}{self.tag}" for i in ids)


class ScriptDecoder:
    """Token i decodes to the i-th piece of a fixed script (what a reasoning model would write)."""

    def __init__(self, script: list[str]) -> None:
        self.script = script

    def push(self, ids: Any) -> str:
        return "".join(self.script[i] for i in ids)


class WordTokenizer:
    """A tokenizer whose tokens are words, and whose chat template tags each role."""

    bos_token = "<s>"
    # "<user> hi there <assistant>": each turn's role tag and text, words apart
    chat_template = (
        "{% for m in messages %}{% if not loop.first %} {% endif %}<{{ m['role'] }}> {{ m['content'] }}"
        "{% endfor %}{% if add_generation_prompt %} <assistant>{% endif %}"
    )

    def __init__(self) -> None:
        self.encoded: list[str] = []

    def get_chat_template(self) -> str:
        return self.chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.encoded.append(text)
        return [len(word) for word in text.split()]

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [f"t{i}" for i in ids]

    def decode(self, ids: list[int], **_: Any) -> str:
        return " ".join(f"t{i}" for i in ids)


class FakeRuntime:
    """The real request preparation over word tokens; the engine answers token 0, 1, 2, ... one per
    response, through real `EngineStream`s (fed the serialized responses Triton would send).

    `fail_at`: the engine sends an error instead of token number `fail_at` (0: before the first).
    `not_ready`: `generate()` raises a 503 as the real runtime does.
    `script`: the answer's text pieces, one per token (a reasoning model's think block, say), instead
    of words; `reasoning`: the model's reasoning parser (pack_model.py --reasoning-parser); `delay`:
    seconds between tokens (`hang`: 0.2); `context`: the max sequence length.
    """

    model_name = "fake-model"

    def __init__(
        self,
        *,
        fail_at: int | None = None,
        not_ready: bool = False,
        hang: bool = False,
        script: list[str] | None = None,
        reasoning: str | None = None,
        delay: float = 0.0,
        context: int = 64,
    ) -> None:
        self.fail_at = fail_at
        self.not_ready = not_ready
        self.hang = hang
        self.delay = 0.2 if hang else delay
        self.max_seq_len = context
        self.script = script
        self.reasoning = style_of(reasoning)
        self.tokenizer = WordTokenizer()
        self.formatter = PromptFormatter(self.tokenizer)
        self.preparer = RequestPreparer(
            self.formatter,
            EngineLimits(max_seq_len=context, max_input_len=context, end_ids=(9,), vocab_size=100),
        )
        self.flavor = LLMAPIFlavor()  # returns what is asked
        self.adapters: dict[str, Any] = {}
        self.requests: list[GenerationRequest] = []
        self.open = 0
        self.closed_early = 0
        self._cancelled: set[int] = set()
        self._next = 1

    async def prepare_chat(
        self,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
        reasoning_effort: str | None = None,
    ) -> GenerationRequest:
        return self.preparer.chat(ChatPrompt(messages, tools, reasoning_effort), params)

    adapter = Runtime.adapter  # the served model's name, or a 404

    async def prepare_prompts(self, prompts: list[str], params: SamplingParams) -> list[GenerationRequest]:
        return self.preparer.prompts(prompts, params)

    async def generate(self, request: GenerationRequest) -> EngineStream:
        if self.not_ready:
            raise APIError.unavailable("not ready", retry_after=1)
        self.requests.append(request)
        tag = f"s{request.seed}" if request.seed is not None else ""  # sampled text shows its seed
        decoder = WordDecoder(tag) if self.script is None else ScriptDecoder(self.script)
        stream = EngineStream(request, TokenIdReader(request, decoder), "id", self._cancelled.add)  # type: ignore[arg-type]  # fake decoders
        stream.stream_id = self._next
        self._next += 1
        asyncio.get_running_loop().create_task(self._engine(stream, request))
        return stream

    async def _engine(self, stream: EngineStream, request: GenerationRequest) -> None:
        self.open += 1
        finished = False
        try:
            for i in range(request.max_tokens if self.script is None else len(self.script)):
                await asyncio.sleep(self.delay)
                if stream.stream_id in self._cancelled or not stream.stream_id:
                    return
                if i == self.fail_at:
                    stream.on_message(engine_response(error="engine exploded"))
                    return
                stream.on_message(engine_response([i]))
            stream.on_message(engine_response([], final=True))
            stream.on_end(0, "")
            finished = True
        finally:
            self.open -= 1
            if not finished:
                self.closed_early += 1


def client_for(runtime: FakeRuntime) -> httpx.AsyncClient:
    app.bind(runtime)  # type: ignore[arg-type]  # a FakeRuntime for the Runtime
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app.v1), base_url="http://test")


def post(runtime: FakeRuntime, path: str, body: dict[str, Any]) -> httpx.Response:
    async def go() -> httpx.Response:
        async with client_for(runtime) as client:
            return await client.post(path, json=body)

    return asyncio.run(go())


def events(response: httpx.Response) -> list[str]:
    return [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
