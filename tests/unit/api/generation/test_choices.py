"""start_choices: a client that leaves before its first texts ends its engine requests at once.

A fake engine stream whose first text never comes, a fault the synthetic engine cannot produce (it
runs every request at once, so a first token always follows within a step): the e2e tests
(test_priority) run the same way through `bentoml serve` on a real Triton.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest

from trtllm_service.api.generation.choices import collect_all, start_choices
from trtllm_service.errors import APIError
from trtllm_service.relay.request import GenerationRequest, SamplingParams


@dataclass
class SilentStream:
    """An engine request that was sent and has not produced anything yet."""

    closed: bool = False
    read_cancelled: bool = False
    first: asyncio.Event = field(default_factory=asyncio.Event)
    failure: Exception | None = None  # what its next read raises, once `first` is set again
    finish_reason: str | None = None
    completion_tokens: int = 0

    async def read(self) -> str:
        try:
            await self.first.wait()
        except asyncio.CancelledError:
            self.read_cancelled = True
            raise
        self.first.clear()  # the next text is held back until `first` is set again
        if self.failure is not None:
            raise self.failure
        return "first"

    def take_logprobs(self) -> list[Any]:
        return []

    def close(self) -> None:
        self.closed = True

    def when_settled(self, callback: Any) -> None:
        pass


class Runtime:
    flavor = SimpleNamespace(beam_packed=False)

    def __init__(self) -> None:
        self.streams: list[SilentStream] = []

    async def generate(self, request: GenerationRequest) -> SilentStream:
        self.streams.append(SilentStream())
        return self.streams[-1]


class Client:
    """starlette's Request as start_choices reads it: `receive`, which says when the client left."""

    def __init__(self) -> None:
        self.left = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.left.wait()
        return {"type": "http.disconnect"}


def _start(runtime: Runtime, client: Client, n: int) -> Any:
    """start_choices of one prompt, `n` choices, with the fakes standing in for what it reads."""
    prepared = [GenerationRequest(prompt_ids=[1, 2, 3], max_tokens=8)]
    return start_choices(
        cast(Any, runtime), prepared, SamplingParams(temperature=0), n, http_request=cast(Any, client)
    )


@pytest.mark.parametrize("n", [1, 2])
def test_a_client_that_leaves_before_the_first_texts_ends_its_engine_requests(n: int) -> None:
    async def scenario() -> None:
        runtime, client = Runtime(), Client()
        started = asyncio.ensure_future(_start(runtime, client, n))
        await asyncio.sleep(0.05)
        assert len(runtime.streams) == n and not started.done()
        client.left.set()
        with pytest.raises(APIError) as raised:
            await asyncio.wait_for(started, 1)
        assert raised.value.status == 499
        assert all(s.closed and s.read_cancelled for s in runtime.streams)

    asyncio.run(scenario())


def test_first_texts_that_come_are_the_choices_and_the_watch_ends() -> None:
    async def scenario() -> None:
        runtime, client = Runtime(), Client()
        started = asyncio.ensure_future(_start(runtime, client, 2))
        await asyncio.sleep(0.05)
        for stream in runtime.streams:
            stream.first.set()
        choices = await asyncio.wait_for(started, 1)
        assert [c.first for c in choices] == ["first", "first"]
        assert not any(s.closed for s in runtime.streams)
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert not pending, pending  # the disconnect watch was cancelled, not left behind

    asyncio.run(scenario())


def _started(runtime: Runtime, client: Client) -> Any:
    """Two choices whose first texts came; their next texts are held back."""

    async def start() -> Any:
        started = asyncio.ensure_future(_start(runtime, client, 2))
        await asyncio.sleep(0.05)
        for stream in runtime.streams:
            stream.first.set()
        return await asyncio.wait_for(started, 1)

    return start()


def test_reading_the_answers_ends_when_the_client_leaves() -> None:
    async def scenario() -> None:
        runtime, client = Runtime(), Client()
        choices = await _started(runtime, client)
        reading = asyncio.ensure_future(collect_all(choices, cast(Any, client)))
        await asyncio.sleep(0.05)
        client.left.set()
        assert await asyncio.wait_for(reading, 1) is None
        assert all(s.closed and s.read_cancelled for s in runtime.streams)

    asyncio.run(scenario())


def test_reading_the_answers_raises_the_first_failure_and_closes_every_stream() -> None:
    async def scenario() -> None:
        runtime, client = Runtime(), Client()
        choices = await _started(runtime, client)
        reading = asyncio.ensure_future(collect_all(choices, cast(Any, client)))
        await asyncio.sleep(0.05)
        failing = runtime.streams[1]
        failing.failure = RuntimeError("the engine failed")
        failing.first.set()
        with pytest.raises(APIError) as raised:
            await asyncio.wait_for(reading, 1)
        assert raised.value.status == 500
        assert all(s.closed for s in runtime.streams) and runtime.streams[0].read_cancelled

    asyncio.run(scenario())
