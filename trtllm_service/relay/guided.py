"""Structured output: what a request asks its answer to look like, as the engine's guide.

OpenAI's `response_format` (`json_object`, `json_schema`) and vLLM's `guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar` all become one guide: a pair of TensorRT-LLM's
guided-decoding type and text (`tensorrtllm_backend.grammars`). The request's models read it
(cheap: its JSON, its shape); `GuideChecker` then compiles it as the engine will, over the model's
tokenizer with the engine's limits and through its first steps, so that a schema or grammar the
engine would refuse, at once or on its first token, is a short 400 naming the field before anything
reaches Triton. That takes up to seconds for a large grammar: it runs in threads of its own.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tensorrtllm_backend import grammars
from tensorrtllm_backend.grammars import GuideError
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


class GuideChecker:
    """Checks guides as the engine will use them (`grammars.matcher`, `grammars.first_steps`),
    off the event loop: llguidance releases the GIL while it compiles, and a grammar of half a
    megabyte takes seconds.

    Args:
        tokenizer: The model's Hugging Face tokenizer.
        vocab_size: The engine's vocabulary size.
        threads: Guides checked at once; more wait (a flood of large grammars takes these threads,
            not the event loop nor the threads that tokenize long prompts).
    """

    REMEMBERED = 256
    """Guides recently found good, and as many found bad, not checked again (an application sends
    the same schema; a client that repeats a refused guide costs a lookup, not seconds of a thread)."""
    REMEMBERED_CHARS = 64 * 1024
    """Guides longer than this are checked every time (they are not worth the memory)."""

    def __init__(self, tokenizer: Any, vocab_size: int, *, threads: int = 2) -> None:
        self._hf_tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._made: tuple[Any, list[int]] | None = None  # llguidance's tokenizer, its one-byte tokens
        self._making = threading.Lock()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="guide-check")
        self._good: OrderedDict[Guide, None] = OrderedDict()
        self._refused: OrderedDict[Guide, str] = OrderedDict()  # -> llguidance's message, brief

    def _tokenizer(self) -> tuple[Any, list[int]]:
        with self._making:
            if self._made is None:
                made = grammars.llguidance_tokenizer(self._hf_tokenizer, self._vocab_size)
                self._made = made, grammars.one_byte_tokens(made)
            return self._made

    def check_now(self, guide: Guide, param: str) -> None:
        """Checks `guide` in the calling thread; GuideRequestError blaming `param` (the request
        field it came from) with llguidance's message, brief. llguidance's verdict depends only on
        the guide (its limits are fixed), so both verdicts are remembered."""
        if guide in self._good:
            return
        refused = self._refused.get(guide)
        if refused is None:
            tokenizer, probes = self._tokenizer()
            try:
                grammars.check(*guide, tokenizer=tokenizer, probes=probes)
            except GuideError as exc:
                refused = str(exc)
                self._remember(self._refused, guide, refused)
            else:
                self._remember(self._good, guide, None)
                return
        raise _refusal(refused, param)

    def _remember(self, verdicts: OrderedDict[Guide, Any], guide: Guide, verdict: Any) -> None:
        if len(guide[1]) <= self.REMEMBERED_CHARS:
            verdicts[guide] = verdict
            while len(verdicts) > self.REMEMBERED:
                verdicts.popitem(last=False)

    async def check(self, guide: Guide, param: str) -> None:
        """`check_now` in one of the checker's threads (a remembered verdict at once)."""
        if guide in self._good:
            return
        refused = self._refused.get(guide)
        if refused is not None:
            raise _refusal(refused, param)
        await asyncio.get_running_loop().run_in_executor(self._pool, self.check_now, guide, param)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _refusal(message: str, param: str) -> GuideRequestError:
    return GuideRequestError(f"'{param}' cannot be used for guided decoding: {message}", param)


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
