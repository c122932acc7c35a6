"""`X-Request-Id` on every response: the client's id when usable, else a fresh one.

The outermost of the service's middlewares, so refusals at the door (401, 413, 429) carry it too.
While the request is served its id is `request_ids.REQUEST_ID`: the relay sends it to Triton as the
engine request's id and the log lines written meanwhile start with it.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trtllm_service.api.error_shape import is_anthropic
from trtllm_service.request_ids import HEADER, REQUEST_ID, new_request_id, valid_request_id

_HEADER = HEADER.encode("ascii")
_ANTHROPIC_HEADER = b"request-id"


class RequestIdMiddleware:
    """Sets the request's id for its duration and echoes it in the `X-Request-Id` response header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((value for name, value in scope["headers"] if name.lower() == _HEADER), None)
        request_id = valid_request_id(given) or new_request_id()
        encoded = request_id.encode("ascii")
        # Anthropic's clients read the id from `request-id` (the SDK's `_request_id`)
        ids = (
            [(_HEADER, encoded), (_ANTHROPIC_HEADER, encoded)]
            if is_anthropic(scope["path"])
            else [(_HEADER, encoded)]
        )
        names = {name for name, _ in ids}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in names]
                message = {**message, "headers": [*headers, *ids]}
            await send(message)

        token = REQUEST_ID.set(request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
