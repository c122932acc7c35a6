"""The concurrency limit, on a real Starlette app through httpx's ASGI transport."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from trtllm_service.limits import ConcurrencyLimitMiddleware


def _app(release: asyncio.Event) -> Starlette:
    async def slow(_request: object) -> PlainTextResponse:
        await release.wait()
        return PlainTextResponse("done")

    async def ready(_request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/generate", slow, methods=["POST"]), Route("/readyz", ready)])


def test_excess_requests_get_openai_429_and_slots_are_released() -> None:
    async def scenario() -> None:
        release = asyncio.Event()
        limited = ConcurrencyLimitMiddleware(_app(release), limit=1)
        transport = httpx.ASGITransport(app=limited)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            first = asyncio.create_task(client.post("/generate"))
            while limited.in_flight == 0:
                await asyncio.sleep(0.01)
            refused = await client.post("/generate")
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "1"
            error = refused.json()["error"]
            assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
            assert (await client.get("/readyz")).status_code == 200  # probes are never limited
            release.set()
            assert (await first).text == "done"
            assert limited.in_flight == 0
            assert (await client.post("/generate")).status_code == 200

    asyncio.run(scenario())


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ConcurrencyLimitMiddleware(_app(asyncio.Event()), limit=0)
