"""The port's answers from the moment it is bound: `/livez` 200, the rest 503 "starting".

`bentoml serve` binds the port, then starts each worker, which imports BentoML's server and then
service.py (FastAPI, the protocol models) before uvicorn serves a single request: about 2.5 s on two
idle cores, 11 s seen on a loaded machine, during which a connection was accepted by the kernel and
left without an answer (a 5-second probe timed out). `bentoml serve`'s own process imports service.py
before it binds, so `answer_from_bind` wraps circus's bind of the API server's socket there: the
moment the socket listens, a thread of that process answers on it what the service itself answers
while it starts (api/server/startup.py), in the same shapes: `/livez` and `/healthz` 200, `/readyz` 503,
every other path 503 with `Retry-After` (in the shape of an API that answers errors its own way, the
`dialects` it is given: Anthropic's 529 `overloaded_error` under `/v1/messages`), each with an `X-Request-Id`, and `Connection: close`. The first worker's start-up hook writes the
flag file that stops it (`serving`); the worker answers the same until it is ready, so a request
that one of them answers while the other takes over gets the same answer. A worker that never
starts is not covered up: the answers stop after `MAX_EARLY_S`.

Standard library only (and the service's error and request-id modules): it runs in BentoML's process
manager, beside circus.
"""

from __future__ import annotations

import json
import os
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_service.errors import STARTING, APIError
from trtllm_service.request_ids import new_request_id, valid_request_id

if TYPE_CHECKING:
    from trtllm_service.api.server.error_shape import ErrorDialect

STARTING_RETRY_S = 1.0
"""Retry-After of a request that comes while the service starts (here and in api/server/startup.py)."""

ALIVE_PATHS = ("/livez", "/healthz")
READY_PATH = "/readyz"
NOT_READY = "Service is not ready because .__is_ready__() returns False."
"""What `/readyz` says until the service is ready (BentoML's words, in the service's error shape)."""
REASONS = {503: "Service Unavailable", 529: "Overloaded"}
"""The reason phrases of the statuses answered here (529: Anthropic's "overloaded", which HTTP's own
table lacks)."""

MAX_HEAD = 64 * 1024
"""A request head longer than this is answered without reading the rest."""
READ_TIMEOUT_S = 2.0
_REQUEST_ID = re.compile(rb"^x-request-id:[ \t]*(\S*)[ \t]*\r?$", re.IGNORECASE | re.MULTILINE)
MAX_EARLY_S = 120.0
"""How long the answers may stand in for a worker that has not started (its import failing, say)."""
STOP_FLAG = "http-serving"
"""The file, in the run dir, whose existence stops the early answers (`serving`)."""
API_SOCKET = "_bento_api_server"
"""The name BentoML gives circus's socket of the HTTP port (_bentoml_impl/server/serving.py)."""


def answer(method: str, path: str, request_id: str, dialects: Sequence[ErrorDialect] = ()) -> bytes:
    """The whole HTTP/1.1 response to one request made while the service starts (in the shape of
    the one of `dialects` whose path it is, if any)."""
    path = path.split("?", 1)[0]
    headers = {"x-request-id": request_id}
    if path in ALIVE_PATHS:
        status, reason, body, kind = 200, "OK", b"\n", "text/plain; charset=utf-8"
    else:
        error = APIError.unavailable(
            NOT_READY if path == READY_PATH else STARTING,
            retry_after=None if path == READY_PATH else STARTING_RETRY_S,
        )
        headers.update(error.headers())
        kind, status = "application/json", error.status
        dialect = next((d for d in dialects if d.paths(path)), None)
        if dialect is not None:
            status = dialect.status_of(error)
            headers.update(dialect.request_id_headers(request_id))
            payload = dialect.error_body(error, request_id)
        else:
            payload = error.body()
        reason = REASONS.get(status, "Error")
        body = json.dumps(payload).encode()
    head = [f"HTTP/1.1 {status} {reason}", f"content-type: {kind}", f"content-length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    head.append("connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (b"" if method == "HEAD" else body)


class EarlyAnswers:
    """Answers connections on a listening socket (a duplicate of `fd`) in a thread, until the file
    `stop_flag` exists or `limit_s` has passed (`dialects`: see `answer`)."""

    def __init__(
        self, fd: int, stop_flag: Path, limit_s: float = MAX_EARLY_S, dialects: Sequence[ErrorDialect] = ()
    ) -> None:
        self.dialects = tuple(dialects)
        self._listener = socket.socket(fileno=os.dup(fd))
        self._listener.setblocking(False)  # uvicorn's asyncio makes it so anyway
        self.stop_flag = stop_flag
        self._until = time.monotonic() + limit_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="trtllm-early-answers", daemon=True)

    def start(self) -> EarlyAnswers:
        self._thread.start()
        return self

    def stop(self) -> None:
        """No connection is accepted after this returns; those accepted are answered on their own."""
        self._stopping.set()
        self._thread.join(timeout=2.0)

    def _done(self) -> bool:
        return self._stopping.is_set() or time.monotonic() > self._until or self.stop_flag.exists()

    def _accept(self) -> None:
        try:
            while not self._done():
                readable, _, _ = select.select([self._listener], [], [], 0.05)
                if not readable or self._done():
                    continue
                try:
                    connection, _ = self._listener.accept()
                except (BlockingIOError, InterruptedError):
                    continue  # a worker took it
                threading.Thread(target=_serve_one, args=(connection, self.dialects), daemon=True).start()
        finally:
            self._listener.close()  # the duplicate only: the socket itself stays open


def _serve_one(connection: socket.socket, dialects: Sequence[ErrorDialect] = ()) -> None:
    """Reads one request head, answers it, and closes without resetting the client: the rest of a
    body it sent is read (briefly) after the answer."""
    with connection:
        connection.setblocking(True)
        connection.settimeout(READ_TIMEOUT_S)
        head = b""
        try:
            while b"\r\n\r\n" not in head and len(head) < MAX_HEAD:
                chunk = connection.recv(8192)
                if not chunk:
                    return
                head += chunk
        except OSError:
            return
        line = head.split(b"\r\n", 1)[0].split()
        method = line[0].decode("latin-1") if line else "GET"
        path = line[1].decode("latin-1") if len(line) > 1 else "/"
        given = _REQUEST_ID.search(head.split(b"\r\n\r\n", 1)[0])
        request_id = (valid_request_id(given.group(1)) if given else None) or new_request_id()
        try:
            connection.sendall(answer(method, path, request_id, dialects))
            connection.shutdown(socket.SHUT_WR)
            connection.settimeout(0.5)
            while connection.recv(65536):
                pass
        except OSError:
            return


def answer_from_bind(stop_flag: Callable[[], Path], dialects: Sequence[ErrorDialect] = ()) -> None:
    """Makes the process that binds the API server's socket (`bentoml serve`'s) answer on it at
    once, until the file `stop_flag()` names exists (`serving`), in the shape of `dialects` on
    their paths. A no-op in every other process: only that one binds the socket."""
    from circus.sockets import CircusSocket

    if getattr(CircusSocket.bind_and_listen, "_answers_early", False):
        return
    bind_and_listen = CircusSocket.bind_and_listen

    def bind_and_answer(self: CircusSocket) -> None:
        bind_and_listen(self)
        if self.name == API_SOCKET and not getattr(self, "is_unix", False):
            flag = stop_flag()
            flag.unlink(missing_ok=True)  # a flag left by an earlier run of the same run dir
            EarlyAnswers(self.fileno(), flag, dialects=dialects).start()

    bind_and_answer._answers_early = True  # type: ignore[attr-defined]  # our mark: CircusSocket is patched once
    CircusSocket.bind_and_listen = bind_and_answer


def serving(stop_flag: Path) -> None:
    """Called by a worker once its server takes the socket over: the early answers stop."""
    stop_flag.parent.mkdir(parents=True, exist_ok=True)
    stop_flag.touch()
