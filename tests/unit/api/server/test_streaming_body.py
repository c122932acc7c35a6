"""StreamBody's fast path: body chunks go to the server's own `send`, the start and the end through
the middlewares (which act on those alone), and BentoML's app is wrapped so the scope carries it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from trtllm_service.api.server.streaming import SERVER_SEND, ServerSendApp, StreamBody


async def _chunks() -> AsyncGenerator[bytes, None]:
    for chunk in (b"a", b"b", b"c"):
        yield chunk


async def _never_disconnects() -> dict[str, Any]:
    await asyncio.sleep(3600)
    return {"type": "http.disconnect"}


def _serve(scope: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    through_chain: list[dict[str, Any]] = []
    to_server: list[dict[str, Any]] = []

    async def chain_send(message: dict[str, Any]) -> None:
        through_chain.append(message)

    async def server_send(message: dict[str, Any]) -> None:
        to_server.append(message)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await StreamBody(_chunks(), "text/plain")(scope, receive, chain_send)

    asyncio.run(ServerSendApp(app)(scope, _never_disconnects, server_send))
    return through_chain, to_server


def test_body_chunks_skip_the_middlewares_start_and_end_do_not() -> None:
    through_chain, to_server = _serve({"type": "http"})
    assert [m["type"] for m in through_chain] == ["http.response.start", "http.response.body"]
    assert through_chain[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert [(m["body"], m["more_body"]) for m in to_server] == [(b"a", True), (b"b", True), (b"c", True)]


def test_without_the_servers_send_everything_goes_through_the_chain() -> None:
    through_chain: list[dict[str, Any]] = []

    async def chain_send(message: dict[str, Any]) -> None:
        through_chain.append(message)

    async def run() -> None:
        await StreamBody(_chunks(), "text/plain")({"type": "http"}, _never_disconnects, chain_send)

    asyncio.run(run())
    assert [m.get("body") for m in through_chain] == [None, b"a", b"b", b"c", b""]


def test_the_server_send_is_recorded_for_http_only() -> None:
    seen: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.update(scope)

    async def send(message: dict[str, Any]) -> None:
        pass

    asyncio.run(ServerSendApp(app)({"type": "lifespan"}, _never_disconnects, send))
    assert SERVER_SEND not in seen
    asyncio.run(ServerSendApp(app)({"type": "http"}, _never_disconnects, send))
    assert seen[SERVER_SEND] is send


def test_bentomls_app_is_wrapped_once() -> None:
    from _bentoml_sdk.service.factory import Service

    from trtllm_service.api.server.bentoml_patches import expose_server_send

    expose_server_send()
    wrapped = Service.to_asgi
    expose_server_send()
    assert Service.to_asgi is wrapped
    assert getattr(Service, "_exposes_server_send", False)
