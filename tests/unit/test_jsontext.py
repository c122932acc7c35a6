"""JSON inside requests (and from the model) is read by the request body's rule: nesting and lone
surrogates are ValueErrors, never a RecursionError that would be a 500."""

from __future__ import annotations

import pytest

from trtllm_service import jsontext
from trtllm_service.chat import tool_calls


@pytest.mark.parametrize("text", ["[" * 100_000, '{"a":' * 2000 + "1" + "}" * 2000])
def test_deep_json_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError) as info:
        jsontext.loads(text)
    assert jsontext.too_deep(info.value)


def test_a_lone_surrogate_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        jsontext.loads('{"prompt": "ab\\ud800cd"}')
    assert jsontext.loads('{"a": [1, 2.5, "\\u00e9", null]}') == {"a": [1, 2.5, "é", None]}


def test_deep_tool_call_arguments_are_refused_and_other_text_kept() -> None:
    calls = [{"id": "c1", "name": "f", "arguments": "[" * 100_000}]
    messages = [{"role": "assistant", "content": "", "tool_calls": calls}]
    with pytest.raises(ValueError, match="arguments are JSON nested deeper"):
        tool_calls.template_messages(messages)
    kept = tool_calls.template_messages(
        [{**messages[0], "tool_calls": [{**calls[0], "arguments": "{not json"}]}]
    )
    assert kept[0]["tool_calls"][0]["function"]["arguments"] == "{not json"
    assert tool_calls.parse_calls("[" * 100_000, [{"name": "f"}]) is None  # a model's deep output: not a call
