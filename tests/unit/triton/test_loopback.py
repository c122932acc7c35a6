"""Clients for Triton's loopback HTTP ports (triton/loopback.py): a proxy set in the environment
(as behind a corporate proxy) must not carry a probe of 127.0.0.1 away. A real HTTP server on a
free port answers; the proxy named is a closed port, so a request sent through it fails."""

from __future__ import annotations

import asyncio
import http.server
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from trtllm_service.triton.loopback import loopback_client


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def ready_endpoint() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v2/health/ready"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def dead_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{closed}")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


async def _get(client: httpx.AsyncClient, url: str) -> int:
    async with client:
        return (await client.get(url)).status_code


def test_a_proxy_in_the_environment_is_not_used_for_triton(ready_endpoint: str, dead_proxy: None) -> None:
    assert asyncio.run(_get(loopback_client(2.0), ready_endpoint)) == 200


def test_the_environment_proxy_would_have_been_used_by_a_default_client(
    ready_endpoint: str, dead_proxy: None
) -> None:
    """The premise of the test above: httpx's default client sends 127.0.0.1 to the proxy."""
    with pytest.raises(httpx.HTTPError):
        asyncio.run(_get(httpx.AsyncClient(timeout=2.0), ready_endpoint))
