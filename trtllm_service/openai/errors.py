"""OpenAI-shaped API errors: one exception type carrying its HTTP status and its JSON body.

Errors are values with a status: routes raise ``APIError`` (or let pydantic raise and convert with
``from_validation_error``), and one exception handler turns it into
``{"error": {"message", "type", "param", "code"}}`` with the right status code, the shape the
``openai`` client parses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from trtllm_service.stream import GenerationError

PARAM_LOC_KEY = "param_loc"
"""Context key of a validator error that names a sub-location below the validated object."""

_TYPE_ERROR_SUFFIXES = ("_type", "_parsing")
_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
_MAX_MESSAGES = 5


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

        ``param`` is ``messages`` for chat and ``prompt`` for completions; the message names the same.
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
    def invalid_api_key(cls) -> APIError:
        """401: missing or wrong API key (OpenAI answers with this type and code)."""
        return cls(401, "Incorrect API key provided.", code="invalid_api_key")

    @classmethod
    def model_not_found(cls, model: str) -> APIError:
        """404: the requested model is not served here."""
        return cls(404, f"The model '{model}' does not exist.", param="model", code="model_not_found")

    @classmethod
    def rate_limited(
        cls,
        message: str = "Too many concurrent requests; please retry shortly.",
        *,
        retry_after: float | None = None,
    ) -> APIError:
        """429: over the concurrency or queue limit. Type and code are OpenAI's (``requests``/``rate_limit_exceeded``)."""
        return cls(429, message, type="requests", code="rate_limit_exceeded", retry_after=retry_after)

    @classmethod
    def unavailable(
        cls,
        message: str = "The inference server is not ready; please retry shortly.",
        *,
        retry_after: float | None = None,
    ) -> APIError:
        """503: the backend is starting, restarting or overloaded."""
        return cls(503, message, type="server_error", code="service_unavailable", retry_after=retry_after)

    @classmethod
    def internal(cls, message: str = "The server had an error while processing your request.") -> APIError:
        """500: a failure on our side; the message must not leak internals."""
        return cls(500, message, type="server_error")


def request_error(code: str, message: str, *loc: str | int) -> PydanticCustomError:
    """An error for validators to raise that names a location below the object being validated.

    Pydantic reports a validator's error at the validated object; ``loc`` (e.g. ``"content", 1, "type"``)
    says which part of it is at fault, and ``code`` becomes the OpenAI error code. ``from_validation_error``
    joins both into the ``param`` path.
    """
    return PydanticCustomError(code, message, {PARAM_LOC_KEY: loc})


def from_validation_error(exc: ValidationError | Sequence[Mapping[str, Any]]) -> APIError:
    """A 400 for a failed request validation, whose ``param`` names the first offending field.

    Accepts a pydantic ``ValidationError`` or its ``errors()`` list (FastAPI's ``RequestValidationError.errors()``
    works too: its leading ``body`` location is dropped). ``param`` uses OpenAI's path style,
    ``messages[0].content[1].type``; the message lists up to five problems.
    """
    errors = exc.errors() if isinstance(exc, ValidationError) else list(exc)
    if not errors:
        return APIError.bad_request("Invalid request.")
    parts = [_describe(err) for err in errors[:_MAX_MESSAGES]]
    if len(errors) > _MAX_MESSAGES:
        parts.append(f"and {len(errors) - _MAX_MESSAGES} more problems")
    first = errors[0]
    return APIError.bad_request("; ".join(parts), param=_param_of(first), code=_code_of(first))


def _param_of(err: Mapping[str, Any]) -> str | None:
    loc = list(err.get("loc", ()))
    if loc and loc[0] == "body":
        loc = loc[1:]
    ctx = err.get("ctx") or {}
    loc += list(ctx.get(PARAM_LOC_KEY, ()))
    path = ""
    for item in loc:
        if isinstance(item, int):
            path += f"[{item}]"
        elif item in _UNION_TAGS or "[" in item:
            continue  # pydantic's name for a union member, not a field
        else:
            path += f".{item}" if path else item
    return path or None


def _code_of(err: Mapping[str, Any]) -> str | None:
    kind = str(err.get("type", ""))
    if _is_ours(err):
        return kind  # raised through request_error(): already an OpenAI code
    if kind == "missing":
        return "missing_required_parameter"
    if kind == "extra_forbidden":
        return "unknown_parameter"
    if kind.startswith("json_"):
        return None
    if kind.endswith(_TYPE_ERROR_SUFFIXES):
        return "invalid_type"
    return "invalid_value"


def _is_ours(err: Mapping[str, Any]) -> bool:
    return PARAM_LOC_KEY in (err.get("ctx") or {})


def _describe(err: Mapping[str, Any]) -> str:
    kind = str(err.get("type", ""))
    param = _param_of(err)
    msg = str(err.get("msg", "invalid value"))
    if kind == "missing":
        return f"Missing required parameter: '{param}'."
    if kind == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}"
    if kind.startswith("json_"):
        return f"We could not parse the JSON body of your request: {msg}"
    if kind in ("model_type", "model_attributes_type") and param is None:
        return "The request body must be a JSON object."
    if _is_ours(err):
        return msg  # our validators write complete messages
    msg = msg.removeprefix("Value error, ")
    value = err.get("input")
    got = f" (got {value!r})" if isinstance(value, (int, float, str, bool)) and len(repr(value)) <= 40 else ""
    return f"Invalid '{param}': {msg}{got}" if param else f"{msg}{got}"


def from_generation_error(exc: GenerationError, *, param: str | None = None) -> APIError:
    """The API error for a failure of the runtime or of Triton."""
    if exc.status == 503:
        return APIError.unavailable(exc.message, retry_after=1)
    if exc.status >= 500:
        return APIError(exc.status, exc.message, type="server_error", code=exc.code)
    if exc.code == "context_length_exceeded":
        param = param or "max_tokens"
    return APIError(exc.status, exc.message, param=param, code=exc.code)
