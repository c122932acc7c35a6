"""JSON text that arrives inside a request (a schema sent as a string, a tool call's arguments,
a body read before its model is known) or that a model writes, parsed as request bodies are.

`json.loads` recurses in Python: JSON nested a few hundred levels deep raises RecursionError
(not ValueError) once the server's own stack is added, and lone surrogates (`"\\ud800"`) come back as
strings that no UTF-8 encoder takes. pydantic's parser, the one every request body goes through,
refuses both with a ValueError and nests at most `MAX_DEPTH` levels, so a client's JSON is read
by one rule wherever it sits.
"""

from __future__ import annotations

from typing import Any

import pydantic_core

MAX_DEPTH = 200
"""About how deep pydantic's JSON parser nests before it refuses ("recursion limit exceeded")."""

TOO_DEEP = "recursion limit exceeded"
"""What pydantic's parser says of JSON nested deeper than it reads."""


def loads(text: str | bytes) -> Any:
    """The value of JSON `text`.

    Raises:
        ValueError: Not JSON, nested deeper than `MAX_DEPTH`, or holding a lone surrogate.
    """
    return pydantic_core.from_json(text)


def too_deep(error: ValueError) -> bool:
    """Whether `loads` refused JSON for its nesting (not for its syntax)."""
    return TOO_DEEP in str(error)
