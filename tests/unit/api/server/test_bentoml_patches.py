"""bentoml_patches: BentoML's TimeoutMiddleware as the service patches it (`cancel_request_timers`):
its timer is cancelled with the request, and an app that returns without answering (a request whose
client left before its first token) does not leave the request waiting for the timer."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bentoml._internal.server.http.traffic import TimeoutMiddleware

from trtllm_service.api.server.bentoml_patches import cancel_request_timers

cancel_request_timers()


async def _receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


def serve(app: Any, timeout: float) -> tuple[list[Any], float]:
    """The messages `app` behind the middleware sent, and the seconds the request took."""
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def scenario() -> float:
        started = time.monotonic()
        await asyncio.wait_for(TimeoutMiddleware(app, timeout=timeout)({"type": "http"}, _receive, send), 10)
        return time.monotonic() - started

    return sent, asyncio.run(scenario())


def test_an_app_that_returns_without_answering_ends_the_request_at_once() -> None:
    async def silent(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(0.01)

    sent, took = serve(silent, timeout=30)
    assert took < 5, "returned with the app, not after the 30 s timer"
    assert sent == []


def test_an_app_that_answers_too_late_gets_the_504() -> None:
    async def slow(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(30)

    sent, _ = serve(slow, timeout=0.05)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 504
