"""Telling Triton's own server from another on its port: the busy-port error and the /v2 name."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trtllm_service.triton.process import busy_port, server_name

# Triton 2.51's lines, as it printed them here with each of its ports held by another socket.
GRPC_BUSY = (
    'E1130 03:04:33.249835 4041 main.cc:245] "failed to start GRPC service: Unavailable - Socket '
    "'127.0.0.1:34281' already in use \""
)
HTTP_BUSY = (
    'E1130 03:04:36.298639 4055 main.cc:257] "failed to start HTTP service: Unavailable - Socket '
    "'127.0.0.1:40205' already in use \""
)
METRICS_BUSY = (
    'E1130 03:04:39.292486 4081 main.cc:293] "failed to start Metrics service: Unavailable - Socket '
    "'127.0.0.1:42475' already in use \""
)


def test_the_busy_port_and_its_service_come_from_tritons_error_line() -> None:
    assert busy_port([GRPC_BUSY]) == ("GRPC", 34281)
    assert busy_port(['E1130 server.cc:241] "CudaDriverHelper has not been initialized."', HTTP_BUSY]) == (
        "HTTP",
        40205,
    )
    assert busy_port([METRICS_BUSY.replace("127.0.0.1", "::1")]) == ("Metrics", 42475)


def test_other_start_up_failures_name_no_busy_port() -> None:
    assert busy_port([]) is None
    assert busy_port(["E1130 model_lifecycle.cc:654] \"failed to load 'preprocessing' version 1\""]) is None


class _Answers(BaseHTTPRequestHandler):
    """One canned answer to every GET: (status, body)."""

    answer: tuple[int, bytes] = (200, b"{}")

    def do_GET(self) -> None:
        status, body = self.answer
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        # headers and body in two writes, as a server may: the whole body is read
        self.wfile.flush()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metadata_server() -> Iterator[tuple[type[_Answers], int]]:
    """A server on a free port metadata_server as its handler's `answer` says; the handler and the port."""
    handler = type("Handler", (_Answers,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler, int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _name(port: int) -> str | None:
    return asyncio.run(server_name("127.0.0.1", port, timeout_s=5))


def test_the_server_name_is_get_v2s_name(metadata_server: tuple[type[_Answers], int]) -> None:
    handler, port = metadata_server
    metadata = {"name": "trtllm-service-1-ab12", "version": "2.51.0", "extensions": ["x" * 20_000]}
    handler.answer = (200, json.dumps(metadata).encode())
    assert _name(port) == "trtllm-service-1-ab12"


@pytest.mark.parametrize(
    "answer",
    [(404, b'{"name": "x"}'), (200, b"not json"), (200, b'["x"]'), (200, b'{"name": 3}'), (200, b"{}")],
    ids=["not-found", "not-json", "a-list", "not-a-string", "no-name"],
)
def test_an_answer_that_is_not_tritons_metadata_has_no_name(
    metadata_server: tuple[type[_Answers], int], answer: tuple[int, bytes]
) -> None:
    handler, port = metadata_server
    handler.answer = answer
    assert _name(port) is None


def test_nothing_listening_has_no_name() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert _name(port) is None
