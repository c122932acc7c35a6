"""`X-Request-Id` on every response: the client's id when usable, else a fresh one.

The outermost of the service's middlewares, so refusals at the door (401, 413, 429) carry it too.
While the request is served its id is `request_ids.REQUEST_ID`: the relay sends it to Triton as the
engine request's id and the log lines written meanwhile start with it.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trtllm_service.request_ids import ANTHROPIC_HEADER, HEADER, REQUEST_ID, new_request_id, valid_request_id

_HEADER = HEADER.encode("ascii")
_ANTHROPIC_HEADER = ANTHROPIC_HEADER.encode("ascii")


def _none(path: str) -> bool:
    return False


class RequestIdMiddleware:
    """Sets the request's id for its duration and echoes it in the `X-Request-Id` response header,
    and also in `request-id` on the paths `anthropic_paths` picks (api.error_shape.is_anthropic)."""

    def __init__(self, app: ASGIApp, anthropic_paths: Callable[[str], bool] = _none) -> None:
        self.app = app
        self.anthropic_paths = anthropic_paths

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
            if self.anthropic_paths(scope["path"])
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
