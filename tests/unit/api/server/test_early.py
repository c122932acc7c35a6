"""api/server/early.py: what the port answers between its bind and the first worker's start, on real sockets."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from circus.sockets import CircusSocket

from trtllm_service.api.anthropic.errors import DIALECT
from trtllm_service.api.server import early
from trtllm_service.errors import STARTING, APIError
from trtllm_service.request_ids import valid_request_id


@pytest.fixture
def answering(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """EarlyAnswers on a listening socket of its own; (its URL, its stop flag)."""
    listener = socket.create_server(("127.0.0.1", 0))
    flag = tmp_path / early.STOP_FLAG
    answers = early.EarlyAnswers(listener.fileno(), flag, dialects=(DIALECT,)).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", flag
    finally:
        answers.stop()
        listener.close()


def test_answers_as_the_starting_service(answering: tuple[str, Path]) -> None:
    url, _ = answering
    livez = httpx.get(f"{url}/livez")
    assert livez.status_code == 200 and livez.headers["connection"] == "close"
    assert valid_request_id(livez.headers["x-request-id"])
    readyz = httpx.get(f"{url}/readyz?verbose=1")
    assert readyz.status_code == 503 and "retry-after" not in readyz.headers
    assert readyz.json()["error"]["code"] == "service_unavailable"
    body = {"prompt": "x" * 1_000_000}  # a large body, answered without reading it first: no reset
    generate = httpx.post(f"{url}/generate", json=body, headers={"X-Request-Id": "req-1"})
    assert generate.status_code == 503 and generate.headers["retry-after"] == "1"
    assert generate.json() == APIError.unavailable(STARTING).body()
    assert generate.headers["x-request-id"] == "req-1"
    bad_id = httpx.get(f"{url}/v1/models", headers={"X-Request-Id": "no spaces"})
    assert bad_id.headers["x-request-id"] != "no spaces" and valid_request_id(bad_id.headers["x-request-id"])
    messages = httpx.post(f"{url}/v1/messages", json={}, headers={"X-Request-Id": "req-2"})
    assert messages.status_code == 529 and messages.headers["request-id"] == "req-2"
    assert messages.json() == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": STARTING},
        "request_id": "req-2",
    }
    assert httpx.head(f"{url}/livez").content == b""


def test_stops_when_a_worker_serves(answering: tuple[str, Path]) -> None:
    url, flag = answering
    assert httpx.get(f"{url}/livez").status_code == 200
    early.serving(flag)
    time.sleep(0.3)
    with pytest.raises(httpx.TimeoutException):  # nobody accepts now: a worker's uvicorn would
        httpx.get(f"{url}/livez", timeout=0.5)


def test_the_process_that_binds_the_api_socket_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bentoml serve`'s circus binds the API server's socket; the wrapped bind answers on it at
    once (a stale flag from an earlier run of the run dir is removed first); other sockets not."""
    monkeypatch.setattr(CircusSocket, "bind_and_listen", CircusSocket.bind_and_listen)
    flag = tmp_path / early.STOP_FLAG
    flag.touch()
    early.answer_from_bind(lambda: flag)
    sockets = []
    for name in (early.API_SOCKET, "_bento_runner"):
        server = CircusSocket(name=name, host="127.0.0.1", port=0)
        server.bind_and_listen()
        sockets.append(server)
    try:
        api, other = (f"http://127.0.0.1:{s.getsockname()[1]}" for s in sockets)
        assert httpx.get(f"{api}/livez", timeout=5).status_code == 200
        assert not flag.exists()
        with pytest.raises(httpx.TimeoutException):
            httpx.get(f"{other}/livez", timeout=0.5)
        early.serving(flag)
    finally:
        for server in sockets:
            server.close()
