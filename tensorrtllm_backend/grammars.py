"""Guided decoding: TensorRT-LLM's guide types, turned into llguidance grammars.

A request's guide is a pair (`guided_decoding_guide_type`, `guided_decoding_guide`), the names of
the C++ backend's inputs and of the LLM API's `GuidedDecodingParams`:

  json          any JSON object (OpenAI's `json_object` response format); the guide text is unused
  json_schema   JSON that validates against the JSON Schema in the guide text
  regex         text matching the regular expression in the guide text
  ebnf_grammar  text of the GBNF grammar (llama.cpp's EBNF dialect, root rule `root`) in the guide

The service checks a guide before sending it (a bad one is a 400 naming the field); the reference
engine compiles it into an llguidance matcher that masks every step's logits. This file is copied
beside the Triton models that use it (one copy in this tree); llguidance is imported on use.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # llguidance is imported where used
    from llguidance._lib import JsonCompileOptions

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")

ANY_JSON_OBJECT = {"type": "object"}
JSON_LAYOUT: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
"""JSON is written on one line, one space after `,` and `:`: a grammar that allows free whitespace
lets a model pad forever (a random-weights model does), and the output never ends."""


GRAMMAR_BACKENDS = ("xgrammar", "llguidance")
"""TensorRT-LLM's grammar backends (`guided_decoding_backend`); NVIDIA's C++ backend has xgrammar only."""


class GuideError(ValueError):
    """A guide that cannot be compiled; the message says why (llguidance's words)."""


def grammar(guide_type: str, guide: str) -> str:
    """The llguidance grammar of one guide. Raises GuideError for an unknown type or bad text
    (only JSON parsing is checked here; `check` compiles the grammar)."""
    from llguidance import LLMatcher

    if guide_type == "json":
        return LLMatcher.grammar_from_json_schema(ANY_JSON_OBJECT, overrides=JSON_LAYOUT)
    if guide_type == "json_schema":
        try:
            schema = json.loads(guide)
        except ValueError as exc:
            raise GuideError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, (dict, bool)):
            raise GuideError("a JSON schema must be an object (or true/false)")
        try:
            return LLMatcher.grammar_from_json_schema(schema, overrides=JSON_LAYOUT)  # type: ignore[arg-type]  # a bool schema too (its stub: str | dict)
        except ValueError as exc:  # llguidance refuses what it cannot read (an integer past 64 bits)
            raise GuideError(str(exc)) from None
    if guide_type == "regex":
        return LLMatcher.grammar_from_regex(guide)
    if guide_type == "ebnf_grammar":
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            return LLMatcher.grammar_from_lark(gbnf_to_lark(guide))
        except Exception as exc:  # the converter raises plain exceptions on bad input
            raise GuideError(f"the grammar is not valid GBNF: {exc}") from None
    raise GuideError(f"unknown guided decoding type {guide_type!r} (one of {', '.join(GUIDE_TYPES)})")


def as_read_by(backend: str, guide_type: str, guide: str) -> str:
    """The guide text, stated so that llguidance (our engines' grammar compiler) allows exactly what
    TensorRT-LLM's `backend` would.

    TensorRT-LLM 1.2.1 compiles a `json_schema` guide with xgrammar's `compile_json_schema(guide)`
    (PyTorch backend: _torch/pyexecutor/grammar_matcher.py; C++ backend: `CompileJSONSchema`), whose
    defaults are `strict_mode=True` and `any_whitespace=True`. Strict mode allows no property an
    object's `properties` do not name and no item after an array's `prefixItems`, unless the schema
    says otherwise (`additionalProperties`, `unevaluatedProperties`, `items`, `unevaluatedItems`);
    an object without `properties` and an array without `prefixItems` stay open. Those defaults are
    written into the schema here (`xgrammar_strict`). Its llguidance backend passes the schema to
    `grammar_from_json_schema` as it is: JSON Schema's own defaults, which allow any other property.
    Whitespace is JSON_LAYOUT's for both: one line, a subset of what either allows."""
    if backend != "xgrammar" or guide_type != "json_schema":
        return guide
    try:
        schema = json.loads(guide)
    except ValueError:
        return guide  # `grammar` refuses it with its reason
    return json.dumps(xgrammar_strict(schema))


_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems", "not")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def xgrammar_strict(schema: Any) -> Any:
    """`schema` with xgrammar's strict mode written out (see `as_read_by`), at every depth."""
    if not isinstance(schema, dict):
        return schema
    strict = dict(schema)
    for key in _SCHEMA_LISTS:
        if isinstance(strict.get(key), list):
            strict[key] = [xgrammar_strict(item) for item in strict[key]]
    for key in _SCHEMA_VALUES:
        if isinstance(strict.get(key), dict):
            strict[key] = xgrammar_strict(strict[key])
    for key in _SCHEMA_MAPS:
        if isinstance(strict.get(key), dict):
            strict[key] = {name: xgrammar_strict(value) for name, value in strict[key].items()}
    if (
        isinstance(strict.get("properties"), dict)
        and "additionalProperties" not in strict
        and "unevaluatedProperties" not in strict
    ):
        strict["additionalProperties"] = False
    if (
        isinstance(strict.get("prefixItems"), list)
        and "items" not in strict
        and "unevaluatedItems" not in strict
    ):
        strict["items"] = False
    return strict


MAX_ERROR_CHARS = 300
"""The most of llguidance's message an error keeps: it appends its parser's state, and quotes the
grammar, hundreds of kilobytes for a large one."""


def brief(message: str) -> str:
    """llguidance's message without its parser state, at most MAX_ERROR_CHARS characters."""
    message = message.split("\n<state>", 1)[0].strip()
    return message if len(message) <= MAX_ERROR_CHARS else message[: MAX_ERROR_CHARS - 3] + "..."


def llguidance_tokenizer(hf_tokenizer: Any, vocab_size: int) -> Any:
    """The model's tokenizer as llguidance reads it (a Hugging Face fast tokenizer; the engine's
    vocabulary size, which may pad the tokenizer's), for `matcher`."""
    from llguidance.hf import from_tokenizer

    return from_tokenizer(hf_tokenizer, n_vocab=vocab_size)


def matcher(tokenizer: Any, guide_type: str, guide: str) -> Any:
    """The llguidance matcher of a guide, as the engine makes it: over the model's tokenizer
    (`llguidance.hf.from_tokenizer`), with llguidance's default limits (those of TensorRT-LLM's
    llguidance backend: 2,000 parser items per row, the lexer's fuel, ...). GuideError when the
    grammar is refused."""
    from llguidance import LLMatcher

    made = LLMatcher(tokenizer, grammar(guide_type, guide), log_level=0)
    if made.is_error():
        raise GuideError(brief(made.get_error()))
    return made


def first_steps(made: Any, probes: Sequence[int]) -> None:
    """Runs a new matcher through what an engine's first steps can meet: the tokens the grammar
    forces, then (each on a copy) every token of `probes` the grammar allows next (the one-byte
    tokens: the prefix shared by the most alternatives). GuideError with the engine's error where
    one of them breaks a limit a compiled grammar does not show: a row of more than 2,000 items (a
    choice among that many strings), a lexer out of fuel (`(x{1000}){1000}`)."""

    def advance(step: Any, token: int | None = None) -> None:
        if token is not None:
            step.consume_token(token)
        if not step.is_error():
            forced = step.compute_ff_tokens()
            if forced:
                step.consume_tokens(forced)
        if step.is_error():
            raise GuideError(brief(step.get_error()))

    advance(made)
    allowed = made.compute_logit_bias()
    if made.is_error():
        raise GuideError(brief(made.get_error()))
    for token in probes:
        if token < len(allowed) and allowed[token]:
            advance(made.deep_copy(), token)


def check(guide_type: str, guide: str, tokenizer: Any = None, probes: Sequence[int] = ()) -> None:
    """GuideError (llguidance's message, brief) for a guide the engine would refuse: compiled
    alone, or with the model's llguidance `tokenizer` as the engine makes it and through its
    first steps (`first_steps` over `probes`)."""
    from llguidance import LLMatcher

    if tokenizer is None:
        error = LLMatcher.validate_grammar(grammar(guide_type, guide), None)
        if error and not error.startswith("WARNING"):
            raise GuideError(brief(error))
        return
    first_steps(matcher(tokenizer, guide_type, guide), probes)


def one_byte_tokens(tokenizer: Any) -> list[int]:
    """The ids of an llguidance tokenizer's tokens that stand for one byte (special ones excluded)."""
    return [
        token
        for token in range(tokenizer.vocab_size)
        if not tokenizer.is_special_token(token) and len(tokenizer.decode_bytes([token])) == 1
    ]
