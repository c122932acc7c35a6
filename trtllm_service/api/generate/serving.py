"""`/generate` over the shared generation path: its body is the generated text, UTF-8, as it comes."""

from __future__ import annotations

from trtllm_service.api.server.metrics import RequestMetrics
from trtllm_service.errors import APIError
from trtllm_service.relay.client import EngineStream


class TextFraming:
    """The body of `/generate`: the generated text, UTF-8, as it comes; a failure after the start
    aborts the connection (plain text has no way to report it)."""

    __slots__ = ("first", "metrics", "prompt_tokens", "stream")

    def __init__(self, stream: EngineStream, first: str, metrics: RequestMetrics, prompt_tokens: int) -> None:
        self.stream = stream
        self.first = first
        self.metrics = metrics
        self.prompt_tokens = prompt_tokens

    def opening(self) -> bytes:
        return self.first.encode()

    def frame(self, text: str) -> bytes:
        return text.encode()

    def closing(self) -> bytes:
        return b""

    def failure(self, error: Exception) -> tuple[int, bytes | None]:
        return (error.status if isinstance(error, APIError) else 500), None

    def done(self, status: int) -> None:
        stream = self.stream
        stream.close()
        self.metrics.done(status, stream.finish_reason, self.prompt_tokens, stream.completion_tokens)


async def first_text(stream: EngineStream, metrics: RequestMetrics) -> str:
    """Waits for the first text (or the end) of a stream, so that errors come before the response."""
    try:
        text = await stream.read()
    except BaseException:
        stream.close()
        raise
    metrics.first_token()
    return text
