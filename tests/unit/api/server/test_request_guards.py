"""What the door refuses (body size, media type), the SIGTERM drain, text checks and number ranges,
without servers: Starlette apps through httpx's ASGI transport and the real signal machinery."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from trtllm_service.api.server.limits import BodyLimitMiddleware, ConcurrencyLimitMiddleware
from trtllm_service.api.server.openapi30 import openapi30
from trtllm_service.api.server.shutdown import Drain
from trtllm_service.chat.template import PromptFormatter
from trtllm_service.errors import APIError
from trtllm_service.relay.prompting import ChatPrompt, RequestPreparer
from trtllm_service.relay.request import EngineLimits, SamplingParams, settle

pytestmark = pytest.mark.unit


async def _echo(request: Request) -> PlainTextResponse:
    return PlainTextResponse(str(len(await request.body())))


def _guarded(max_bytes: int) -> BodyLimitMiddleware:
    return BodyLimitMiddleware(Starlette(routes=[Route("/generate", _echo, methods=["POST"])]), max_bytes)


async def _chunks(total: int, size: int = 1000) -> AsyncIterator[bytes]:
    for start in range(0, total, size):
        yield b"x" * min(size, total - start)


def test_bodies_over_the_cap_are_413_whether_sized_or_chunked() -> None:
    async def scenario() -> None:
        transport = httpx.ASGITransport(app=_guarded(4096))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.post("/generate", content=b"x" * 4096)).text == "4096"
            sized = await client.post("/generate", content=b"x" * 4097)
            assert sized.status_code == 413 and sized.json()["error"]["code"] == "request_too_large"
            chunked = await client.post("/generate", content=_chunks(5000))
            assert chunked.status_code == 413
            whole = await client.post("/generate", content=_chunks(3500))  # read, then handed on whole
            assert whole.status_code == 200 and whole.text == "3500"
            lying = await client.post("/generate", content=b"{}", headers={"Content-Length": "-1"})
            assert lying.status_code == 413

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        (None, 200),
        ("application/json", 200),
        ("application/json; charset=utf-8", 200),
        ("application/merge-patch+json", 200),
        ("application/x-www-form-urlencoded", 200),  # curl -d's default: read as JSON
        ("multipart/form-data; boundary=x", 415),
        ("text/plain", 415),
        ("application/xml", 415),
        ("image/png", 415),
    ],
)
def test_only_json_gets_in(content_type: str | None, status: int) -> None:
    async def scenario() -> httpx.Response:
        transport = httpx.ASGITransport(app=_guarded(4096))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            headers = {"Content-Type": content_type} if content_type else {}
            return await client.post("/generate", content=b"{}", headers=headers)

    response = asyncio.run(scenario())
    assert response.status_code == status
    if status == 415:
        assert response.json()["error"]["code"] == "unsupported_media_type"


def test_curls_default_form_type_is_read_as_json() -> None:
    """`curl -d '{"prompt": ...}'` declares a form: the app behind (BentoML's /generate, which
    would read a form and find no prompt in it) sees a JSON body, and the body unchanged."""
    seen: list[str | None] = []

    async def content_type(request: Request) -> PlainTextResponse:
        seen.append(request.headers.get("content-type"))
        return PlainTextResponse((await request.body()).decode())

    async def scenario() -> httpx.Response:
        app = BodyLimitMiddleware(
            Starlette(routes=[Route("/generate", content_type, methods=["POST"])]), 4096
        )
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as client:
            form = {"Content-Type": "application/x-www-form-urlencoded"}
            return await client.post("/generate", content=b'{"prompt": "a=b&c"}', headers=form)

    response = asyncio.run(scenario())
    assert response.status_code == 200 and response.text == '{"prompt": "a=b&c"}'
    assert seen == ["application/json"]


@contextlib.asynccontextmanager
async def _draining(
    handler: Callable[[Request], Awaitable[PlainTextResponse]], drain: Drain
) -> AsyncIterator[tuple[ConcurrencyLimitMiddleware, httpx.AsyncClient, list[int]]]:
    """(app, client, SIGTERMs handed over): `handler` behind the concurrency limit with `drain`
    installed, and SIGTERM's previous handler replaced by a recorder for the scenario's length."""
    app = ConcurrencyLimitMiddleware(
        Starlette(routes=[Route("/generate", handler, methods=["POST"])]), limit=8, drain=drain
    )
    handed_over: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: handed_over.append(signum))
    try:
        drain.install()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield app, client, handed_over
    finally:
        signal.signal(signal.SIGTERM, previous)


async def _handed_over(handed_over: list[int]) -> None:
    """Waits up to 2.5 s for the drain to hand SIGTERM over."""
    for _ in range(50):
        if handed_over:
            return
        await asyncio.sleep(0.05)


def test_sigterm_drains_then_hands_over_and_a_second_one_is_at_once() -> None:
    """The real SIGTERM, delivered to this process: new requests get 503 while the one in flight
    finishes; then the previous handler runs."""

    async def scenario() -> None:
        release = asyncio.Event()

        async def slow(_request: Request) -> PlainTextResponse:
            await release.wait()
            return PlainTextResponse("done")

        drain = Drain(grace_s=30)
        async with _draining(slow, drain) as (app, client, handed_over):
            first = asyncio.create_task(client.post("/generate"))
            while app.in_flight == 0:
                await asyncio.sleep(0.01)
            os.kill(os.getpid(), signal.SIGTERM)
            while not drain.draining:
                await asyncio.sleep(0.01)
            refused = await client.post("/generate")
            assert refused.status_code == 503 and refused.headers["connection"] == "close"
            assert "shutting down" in refused.json()["error"]["message"]
            await asyncio.sleep(0.3)
            assert handed_over == [], "handed over with a request in flight"
            release.set()
            assert (await first).text == "done"
            await _handed_over(handed_over)
            assert handed_over == [signal.SIGTERM]
            os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM: straight to the server
            await asyncio.sleep(0.05)
            assert handed_over == [signal.SIGTERM, signal.SIGTERM]

    asyncio.run(scenario())


def test_sigterm_past_the_grace_ends_what_runs_then_hands_over() -> None:
    """A request still running when the grace is up is ended through `cut_by` (here it waits for
    its error, as a relayed stream does) before the previous handler runs."""

    async def scenario() -> None:
        ended: asyncio.Future[APIError] = asyncio.get_running_loop().create_future()

        async def endless(_request: Request) -> PlainTextResponse:
            error = await ended
            return PlainTextResponse(error.message, status_code=error.status)

        drain = Drain(grace_s=0.3)

        def cut(error: APIError) -> int:
            ended.set_result(error)
            return 1

        drain.cut_by(cut)
        async with _draining(endless, drain) as (app, client, handed_over):
            running = asyncio.create_task(client.post("/generate"))
            while app.in_flight == 0:
                await asyncio.sleep(0.01)
            signalled = time.monotonic()
            os.kill(os.getpid(), signal.SIGTERM)
            response = await asyncio.wait_for(running, 5)
            assert 0.3 <= time.monotonic() - signalled < 2
            assert response.status_code == 503 and "shutdown grace ran out" in response.text
            await _handed_over(handed_over)
            assert handed_over == [signal.SIGTERM]

    asyncio.run(scenario())


class _Tokenizer:
    """A tokenizer of single characters, longest vocabulary entry 5 characters."""

    bos_token = None
    chat_template = None

    def get_vocab(self) -> dict[str, int]:
        return {"a": 0, "b": 1, "hello": 2}


def _preparer(max_input_len: int = 100) -> RequestPreparer:
    formatter = PromptFormatter(_Tokenizer(), chat_template="{{ messages }}")
    return RequestPreparer(
        formatter, EngineLimits(max_seq_len=max_input_len + 10, max_input_len=max_input_len)
    )


def test_text_longer_than_any_tokenization_of_the_context_is_refused_untokenized() -> None:
    preparer = _preparer(100)
    preparer.check_text([("prompt", "x" * 1000)], param="prompt")  # at least 100 tokens: may fit
    with pytest.raises(APIError) as refused:
        preparer.check_text([("prompt", "x" * 1010)], param="prompt")  # at least 101
    assert refused.value.code == "context_length_exceeded" and refused.value.param == "prompt"
    assert "at least 101 tokens" in refused.value.message


def test_nul_characters_are_refused_naming_where() -> None:
    messages = [
        {"role": "user", "content": "fine"},
        {"role": "user", "content": [{"type": "text", "text": "a\x00"}]},
    ]
    with pytest.raises(APIError) as refused:
        _preparer().chat(ChatPrompt(messages), SamplingParams())
    assert "'messages[1].content[0].text' contains a NUL character" in refused.value.message


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (SamplingParams(temperature=1, top_k=2**31), "top_k"),
        (SamplingParams(temperature=1, seed=2**64), "seed"),
        (SamplingParams(repetition_penalty=1e39), "repetition_penalty"),
        (SamplingParams(presence_penalty=float("-inf")), "presence_penalty"),
        (SamplingParams(min_tokens=2**31), "min_tokens"),
    ],
)
def test_numbers_the_engine_tensors_cannot_carry_are_400s(params: SamplingParams, field: str) -> None:
    with pytest.raises(APIError) as refused:
        settle([1, 2, 3], params, EngineLimits(max_seq_len=100, max_input_len=50))
    assert refused.value.status == 400 and refused.value.param == field


def test_numbers_at_the_edges_of_the_tensors_pass() -> None:
    request = settle(
        [1],
        SamplingParams(temperature=1, top_k=2**31 - 1, seed=2**64 - 1, repetition_penalty=3.4e38),
        EngineLimits(max_seq_len=100, max_input_len=50),
    )
    assert (request.top_k, request.seed) == (2**31 - 1, 2**64 - 1)


def test_json_schema_nodes_said_the_openapi_3_0_way() -> None:
    node: dict[str, Any] = {
        "anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}],
        "default": None,
    }
    converted = openapi30({**node, "anyOf": [openapi30(dict(b)) for b in node["anyOf"]]})
    assert converted == {
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
        "nullable": True,
        "default": None,
    }
    assert openapi30({"const": "auto"}) == {"enum": ["auto"]}
    union = openapi30({"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]})
    assert union == {"anyOf": [{"type": "string"}, {"type": "integer"}], "nullable": True}


def test_a_stop_string_ends_the_token_count_where_it_completes() -> None:
    """Five tokens arrive at once (the reader was behind) and the stop string completes with the
    second: the answer and the count stop there, and the engine request is cancelled."""
    from array import array

    from tests.support import engine_response
    from trtllm_service.relay.client import EngineStream
    from trtllm_service.relay.readers import TokenIdReader
    from trtllm_service.relay.request import GenerationRequest

    class Words:
        def push(self, ids: Any) -> str:
            return "".join(f" w{i}" for i in ids)

    async def scenario() -> None:
        cancelled: list[int] = []
        request = GenerationRequest(prompt_ids=array("i", [1]), max_tokens=10, stop=("w1 w",))
        stream = EngineStream(request, TokenIdReader(request, Words()), "id", cancelled.append)  # type: ignore[arg-type]  # Words: a fake decoder
        stream.stream_id = 7
        stream.on_message(engine_response([0, 1, 2, 3, 4]))
        assert await stream.read() == " w0 "
        assert (stream.finish_reason, stream.completion_tokens, cancelled) == ("stop", 3, [7])

    asyncio.run(scenario())
