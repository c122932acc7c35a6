"""Structured output: what a request asks its answer to look like, as the engine's guide.

OpenAI's `response_format` (`json_object`, `json_schema`) and vLLM's `guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar` all become one guide: a pair of TensorRT-LLM's
guided-decoding type and text (`tensorrtllm_backend.grammars`), compiled here once with
llguidance so that a schema or grammar the engine would refuse is a 400 naming the field, before
anything reaches Triton.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tensorrtllm_backend.grammars import GuideError, check
from trtllm_service import jsontext

Guide = tuple[str, str]
"""(guided_decoding_guide_type, guided_decoding_guide)."""

GUIDE_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
"""The OpenAI request fields that ask for structured output (at most one per request)."""


class GuideRequestError(ValueError):
    """A guide that cannot be used; `param` names the request field, the message says why."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def json_schema_guide(schema: Any, param: str) -> Guide:
    """A JSON Schema (an object, or its JSON text) as a guide."""
    if isinstance(schema, str):
        try:
            schema = jsontext.loads(schema)
        except ValueError as exc:
            raise GuideRequestError(f"The JSON schema is not valid JSON: {exc}.", param) from None
    if not isinstance(schema, (dict, bool)):
        raise GuideRequestError("A JSON schema must be an object.", param)
    return "json_schema", json.dumps(schema)


def choice_guide(choices: Sequence[str], param: str) -> Guide:
    """Exactly one of `choices`, as a GBNF grammar (TensorRT-LLM's `ebnf_grammar`)."""
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise GuideRequestError("guided_choice must be a non-empty list of non-empty strings.", param)
    return "ebnf_grammar", "root ::= " + " | ".join(json.dumps(choice) for choice in dict.fromkeys(choices))


def checked(guide: Guide, param: str) -> Guide:
    """`guide`, once llguidance compiles it; GuideRequestError blaming `param` (the request field
    it came from) with llguidance's message otherwise."""
    try:
        check(*guide)
    except GuideError as exc:
        raise GuideRequestError(f"'{param}' cannot be used for guided decoding: {exc}", param) from None
    return guide


def guide_field(request: Any) -> str:
    """The field of an OpenAI request that asked for its guide, for an error that names it: a forced
    tool call's `tool_choice`, else the structured-output field that is set."""
    if getattr(request, "tool_mode", None) == "forced":
        return "tool_choice"
    for name in GUIDE_FIELDS:
        value = getattr(request, name, None)
        if value is not None and not (name == "response_format" and getattr(value, "type", None) == "text"):
            return name
    return "response_format"
