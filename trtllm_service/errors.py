"""The service's one error type: a status, a message, and OpenAI's error body.

Errors are values with a status. Every layer raises `APIError` (validation, auth, limits, the relay
to Triton), and every route answers it the same way: `{"error": {"message", "type", "param",
"code"}}` with its HTTP status, the shape the `openai` client parses, never text in a 200 stream.
"""

from __future__ import annotations

from typing import Any

BUSY = "Too many concurrent requests; please retry shortly."
NOT_READY = "The inference server is not ready; please retry shortly."
STARTING = "The service is starting; please retry shortly."


class APIError(Exception):
    """An error answered as an OpenAI error body with an HTTP status.

    Args:
        status: HTTP status code.
        message: Human-readable explanation, shown to the API user.
        type: OpenAI error type, e.g. ``invalid_request_error``.
        param: The request parameter at fault (a path such as ``messages[0].role``), if any.
        code: Machine-readable code, e.g. ``context_length_exceeded``, if any.
        retry_after: Seconds after which a retry may succeed (sent as a ``Retry-After`` header).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        """The JSON response body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        """Extra response headers (``Retry-After`` for 429/503 when known)."""
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after)))}

    def __repr__(self) -> str:
        return f"APIError({self.status}, {self.message!r}, type={self.type!r}, param={self.param!r}, code={self.code!r})"

    @classmethod
    def bad_request(cls, message: str, *, param: str | None = None, code: str | None = None) -> APIError:
        """400: the request is malformed or asks for something invalid."""
        return cls(400, message, param=param, code=code)

    @classmethod
    def unsupported_parameter(cls, param: str, message: str | None = None) -> APIError:
        """400: the request sets a parameter this server cannot honour (never silently ignored)."""
        return cls(
            400,
            message or f"Unsupported parameter: '{param}' is not supported by this server.",
            param=param,
            code="unsupported_parameter",
        )

    @classmethod
    def context_length_exceeded(
        cls, max_model_len: int, prompt_tokens: int, completion_tokens: int, *, param: str = "messages"
    ) -> APIError:
        """400: prompt plus requested completion do not fit the model's context (OpenAI's wording).

        ``param`` is ``messages`` for chat and ``prompt`` for completions (or ``max_tokens`` when the
        completion is what does not fit); the message speaks of the messages or the prompt.
        """
        where = "messages" if param == "messages" else "prompt"
        total = prompt_tokens + completion_tokens
        message = (
            f"This model's maximum context length is {max_model_len} tokens. However, you requested {total} "
            f"tokens ({prompt_tokens} in the {where}, {completion_tokens} in the completion). "
            f"Please reduce the length of the {where} or completion."
        )
        return cls(400, message, param=param, code="context_length_exceeded")

    @classmethod
    def prompt_too_long(cls, max_model_len: int, at_least: int, chars: int, *, param: str) -> APIError:
        """400 context_length_exceeded for a prompt known too long from its length alone (not tokenized)."""
        where = "messages" if param == "messages" else "prompt"
        message = (
            f"This model's maximum context length is {max_model_len} tokens. However, the {where} "
            f"({chars} characters) would be at least {at_least} tokens. Please reduce the length of the {where}."
        )
        return cls(400, message, param=param, code="context_length_exceeded")

    @classmethod
    def invalid_api_key(cls) -> APIError:
        """401: missing or wrong API key (OpenAI answers with this type and code)."""
        return cls(401, "Incorrect API key provided.", code="invalid_api_key")

    @classmethod
    def model_not_found(cls, model: str) -> APIError:
        """404: the requested model is not served here."""
        return cls(404, f"The model '{model}' does not exist.", param="model", code="model_not_found")

    @classmethod
    def rate_limited(cls, message: str = BUSY, *, retry_after: float | None = None) -> APIError:
        """429: over the concurrency or queue limit. Type and code are OpenAI's (``requests``/``rate_limit_exceeded``)."""
        return cls(429, message, type="requests", code="rate_limit_exceeded", retry_after=retry_after)

    @classmethod
    def unavailable(cls, message: str = NOT_READY, *, retry_after: float | None = None) -> APIError:
        """503: the backend is starting, restarting or overloaded."""
        return cls(503, message, type="server_error", code="service_unavailable", retry_after=retry_after)

    @classmethod
    def internal(cls, message: str = "The server had an error while processing your request.") -> APIError:
        """500: a failure on our side; the message must not leak internals."""
        return cls(500, message, type="server_error")

    @classmethod
    def server_error(cls, message: str) -> APIError:
        """500 from the inference server, with its message (an engine failure, not ours)."""
        return cls(500, message, type="server_error", code="server_error")

    @classmethod
    def timeout(cls, message: str = "The inference server did not answer in time.") -> APIError:
        """504: the inference server took longer than the configured limit."""
        return cls(504, message, type="server_error", code="timeout")
