"""A concurrency limit for the generation routes, answered with OpenAI's 429 shape.

BentoML's own `max_concurrency` answers `{"error": "Too many requests"}` before any of our code
runs; this middleware counts requests in flight on `/generate` and `/v1/*` (a streamed response
counts until its last byte) and refuses the excess with a 429 that OpenAI clients understand.
Each HTTP worker process counts its own requests, so the limit is split evenly between workers.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from trtllm_service.auth import is_open
from trtllm_service.errors import APIError
from trtllm_service.metrics import count_rejected


class ConcurrencyLimitMiddleware:
    """Lets at most `limit` generation requests run at once; the rest get 429 with Retry-After.

    Args:
        limit: Requests in flight for the whole service.
        workers: HTTP worker processes; each lets in ceil(limit / workers).
        model_name: For the rejected-requests metric.
    """

    def __init__(self, app: ASGIApp, limit: int, workers: int = 1, model_name: str = "") -> None:
        if limit < 1 or workers < 1:
            raise ValueError("the concurrency limit and the number of workers must be at least 1")
        self.app = app
        self.limit = -(-limit // workers)
        self.model_name = model_name
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            error = APIError.rate_limited(
                f"More than {self.limit} requests are in flight; please retry shortly.", retry_after=1
            )
            count_rejected(self.model_name, scope["path"], 429)
            await JSONResponse(error.body(), status_code=429, headers=error.headers())(scope, receive, send)
            return
        self.in_flight += 1  # one event loop per worker: no lock needed between awaits
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
