"""tensorrtllm_backend/grammars.py: a JSON schema as TensorRT-LLM's grammar backends read it.

Every row of ACCEPTS was checked against xgrammar 0.1.32 itself (TensorRT-LLM 1.2.1's pin), with
`xgrammar.Grammar.from_json_schema(schema)` at its defaults (strict_mode and any_whitespace on, as
TensorRT-LLM's `compile_json_schema(guide)` calls it) and `xgrammar.testing._is_grammar_accept_string`;
xgrammar is not installed here (it is TensorRT-LLM's, in the image), so the table stands in for it.
The llguidance column is JSON Schema's own reading (TensorRT-LLM's llguidance backend passes the
schema as it is). Strings are in the stand-in's one-line layout, which both backends accept.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance
import pydantic
import pytest
from llguidance import LLMatcher

from tensorrtllm_backend.grammars import as_read_by, grammar


class Person(pydantic.BaseModel):
    name: str
    age: int


class Team(pydantic.BaseModel):
    lead: Person
    members: list[Person]
    tags: tuple[str, int]


TEAM = '{"lead": {"name": "a", "age": 1}, "members": [%s], "tags": ["x", 1%s]%s}'
ACCEPTS: list[tuple[Any, str, bool, bool]] = [  # schema, answer, xgrammar, llguidance
    (Person.model_json_schema(), '{"name": "a", "age": 1}', True, True),
    (Person.model_json_schema(), '{"name": "a", "age": 1, "description": "x"}', False, True),
    (Team.model_json_schema(), TEAM % ("", "", ""), True, True),
    (Team.model_json_schema(), TEAM % ('{"name": "b", "age": 2, "z": 1}', "", ""), False, True),
    (Team.model_json_schema(), TEAM % ("", ", 2", ""), False, False),  # pydantic bounds the tuple
    (Team.model_json_schema(), TEAM % ("", "", ', "more": 1'), False, True),
    ({"type": "object"}, '{"a": 1}', True, True),  # no properties named: open
    ({"type": "object", "properties": {}}, '{"a": 1}', False, True),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True}, '{"a": 1, "b": 2}', True, True),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}}, '{"a": 1, "b": "x"}', True, True),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}}, '{"a": 1, "b": 2}', False, False),
    ({"type": "array"}, '[1, "x"]', True, True),  # no items named: open
    ({"type": "array", "prefixItems": [{"type": "integer"}]}, "[1, 2]", False, True),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "integer"}}, "[1, 2]", True, True),
    ({"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"type": "string"}]}, '{"a": 1, "b": 2}', False, True),
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}, '{"a": {"x": 1}}', False, True),
]  # fmt: skip


def accepts(backend: str, schema: Any, answer: str) -> bool:
    tokenizer = llguidance.LLTokenizer("byte")
    guide = as_read_by(backend, "json_schema", json.dumps(schema))
    matcher = LLMatcher(tokenizer, grammar("json_schema", guide), log_level=0)
    tokens = list(tokenizer.tokenize_bytes(answer.encode()))
    return matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()


@pytest.mark.parametrize(("schema", "answer", "xgrammar", "llguidance"), ACCEPTS)
def test_each_backend_allows_what_it_would(
    schema: Any, answer: str, xgrammar: bool, llguidance: bool
) -> None:
    assert accepts("xgrammar", schema, answer) is xgrammar
    assert accepts("llguidance", schema, answer) is llguidance


def test_only_json_schemas_for_xgrammar_change() -> None:
    for backend, kind in (("llguidance", "json_schema"), ("xgrammar", "regex"), ("xgrammar", "ebnf_grammar")):
        assert as_read_by(backend, kind, '{"type": "object", "properties": {}}') == (
            '{"type": "object", "properties": {}}'
        )
    assert as_read_by("xgrammar", "json_schema", "not json") == "not json"  # refused later, with why
