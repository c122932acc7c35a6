"""Request validation errors in OpenAI's shape: pydantic's errors -> one `APIError` naming the param.

Validators raise `request_error` to name a location below the field they validate;
`from_validation_error` turns pydantic's error list into a 400 whose `param` is a path such as
``messages[1].content[0].type``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from trtllm_service.errors import APIError

PARAM_LOC_KEY = "param_loc"
"""Context key of a validator error that names a sub-location below the validated object."""

_TYPE_ERROR_SUFFIXES = ("_type", "_parsing")
_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
_MAX_MESSAGES = 5


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
