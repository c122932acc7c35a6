"""uvicorn with the bounded httptools protocol (api/server/http_limits.py), on loopback with a tiny ASGI
app: requests within the limits are served as before, on kept-alive connections too, whatever
their body's size; a head over the limits is a 431, a stalled body a 408."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tests.support import free_port
from trtllm_service.api.server.http_limits import ConnectionLimits, bounded_protocol

LIMITS = ConnectionLimits(header_timeout_s=1.0, body_timeout_s=1.0, max_header_bytes=8192, max_headers=20)


async def echo_length(scope: Any, receive: Any, send: Any) -> None:
    """Answers the length of the request's body."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": str(size).encode()})


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(
        echo_length,
        host="127.0.0.1",
        port=port,
        http=bounded_protocol(HttpToolsProtocol, LIMITS),
        log_level="error",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_large_bodies_on_a_kept_alive_connection_are_served(url: str) -> None:
    with httpx.Client(base_url=url, timeout=10) as client:
        for size in (0, 100_000, 3_000_000, 70_000, 10):
            answer = client.post("/", content=b"x" * size, headers={"X-Pad": "p" * 4000})
            assert answer.status_code == 200 and answer.text == str(size)


def test_a_head_over_the_limits_is_a_431(url: str) -> None:
    with httpx.Client(base_url=url, timeout=10) as client:
        assert client.get("/", headers={"X-Big": "a" * 9000}).status_code == 431
        many = {f"X-H{i}": "v" for i in range(25)}
        answer = client.get("/", headers=many)
        assert (
            answer.status_code == 431 and answer.json()["error"]["code"] == "request_header_fields_too_large"
        )


def test_a_stalled_body_is_a_408_and_a_silent_connection_is_closed(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    with (
        socket.create_connection((host, int(port)), timeout=5) as stalled,
        socket.create_connection((host, int(port)), timeout=5) as silent,
    ):
        stalled.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        started = time.monotonic()
        assert stalled.recv(100).startswith(b"HTTP/1.1 408 ")
        assert silent.recv(100).startswith(b"HTTP/1.1 408 ")
        assert time.monotonic() - started < 3
