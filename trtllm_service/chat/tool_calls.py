"""Tool calling in Llama-3.1's JSON format: the one place that says what a call looks like.

A call is the JSON object ``{"name": <function>, "parameters": {<arguments>}}``; several calls at
once are a JSON array of them. Where the chat template renders tools itself (it uses the ``tools``
variable), it gets them and the conversation in Hugging Face's format. Where it does not, the tools
and the instructions for this format go into the system message, earlier calls are shown as the
assistant's JSON, and tool results as ``ipython`` turns, as Llama 3.1 does.

A forced call (``tool_choice: "required"`` or a named function) is guided decoding on
``call_schema``, so it always parses; in ``auto`` mode the answer is a call when it parses as one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from trtllm_service import jsontext

TOOL_RESULT_ROLE = "ipython"

INSTRUCTIONS = (
    "You have access to the following functions. To call one, respond with only a JSON object of the "
    'form {"name": function name, "parameters": dictionary of argument names and values}; to call '
    "several, respond with a JSON array of such objects. Do not call a function if none is needed: "
    "answer in text then.\n\nFunctions:\n"
)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def call_schema(functions: Sequence[dict[str, Any]], name: str | None = None) -> dict[str, Any]:
    """The JSON schema of one call of `name`, or of any one of `functions`."""
    picked = [f for f in functions if name is None or f["name"] == name]
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "parameters": f.get("parameters") or {"type": "object", "properties": {}},
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for f in picked
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def parse_calls(text: str, functions: Sequence[dict[str, Any]]) -> list[tuple[str, str]] | None:
    """(name, arguments as JSON text) of each call in `text`, or None when it is not only calls."""
    try:
        value = jsontext.loads(text)
    except ValueError:
        return None
    items = value if isinstance(value, list) and value else [value]
    names = {f["name"] for f in functions}
    calls = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in names:
            return None
        arguments = item.get("parameters", item.get("arguments", {}))
        if not isinstance(arguments, dict):
            return None
        calls.append((item["name"], json.dumps(arguments, ensure_ascii=False)))
    return calls


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation in Hugging Face's format, for a template that renders tools itself:
    call arguments as objects."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = {
                **message,
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": c["name"], "arguments": _object(c["arguments"])},
                    }
                    for c in calls
                ],
            }
        out.append(message)
    return out


def fallback_messages(
    messages: list[dict[str, Any]], functions: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The conversation for a template that knows no tools: the tools and this format in the
    system message, calls as the assistant's JSON, results as ipython turns."""
    listing = "\n\n".join(
        json.dumps({"type": "function", "function": f}, ensure_ascii=False, indent=2) for f in functions
    )
    system = INSTRUCTIONS + listing
    out: list[dict[str, Any]] = []
    if messages and messages[0]["role"] == "system":
        system = messages[0]["content"] + "\n\n" + system
        messages = messages[1:]
    out.append({"role": "system", "content": system})
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            shown = [{"name": c["name"], "parameters": _object(c["arguments"])} for c in calls]
            out.append({"role": "assistant", "content": json.dumps(shown[0] if len(shown) == 1 else shown)})
        elif message["role"] == "tool":
            out.append({"role": TOOL_RESULT_ROLE, "content": message["content"]})
        else:
            out.append({k: v for k, v in message.items() if k in ("role", "content", "name")})
    return out


def _object(arguments: Any) -> Any:
    """A call's arguments as the object their JSON text stands for; text that is not JSON as it
    is. JSON nested deeper than a request body may be is a ValueError (a 400 naming the messages)."""
    if isinstance(arguments, str):
        try:
            return jsontext.loads(arguments)
        except ValueError as exc:
            if jsontext.too_deep(exc):
                raise ValueError(
                    f"A tool call's arguments are JSON nested deeper than {jsontext.MAX_DEPTH} levels."
                ) from None
            return arguments
    return arguments
