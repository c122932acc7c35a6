"""The answers of ``POST /v1/messages`` as Anthropic sends them: a ``message`` object, or its stream
of server-sent events; and ``count_tokens``' body.

A message's content is a ``thinking`` block when the model reasons (``pack_model.py
--reasoning-parser``), then a ``text`` block, or (tools in play and the answer is calls) one
``tool_use`` block per call. A block is sent only when it has something: an answer that says nothing
has no content blocks (as Anthropic's can). Thinking blocks carry an empty ``signature``
(`THINKING_SIGNATURE`): nothing signs them here, and thinking sent back is left out of the prompt
unchecked.

``stop_reason`` (`stop_reason`): ``tool_use`` when the answer is calls, else ``max_tokens`` when
max_tokens ran out, ``stop_sequence`` when one of the request's stop sequences ended it (then
``stop_sequence`` says which), else ``end_turn``. The relay matches stop strings on the decoded text
and keeps the one that matched (`stop_sequence_of` reads it from the engine stream): it cannot be
found from the answer, whose text ends before it, nor told from an end-of-sequence token by the
finish reason alone ("stop" for both).

``usage`` is Anthropic's: ``input_tokens`` are the prompt tokens not found in the KV cache,
``cache_read_input_tokens`` those found (their sum is the prompt), ``cache_creation_input_tokens``
is 0 (nothing is written on request). A stream's ``message_start`` cannot know the cached tokens
yet: it counts the whole prompt as ``input_tokens``, and ``message_delta`` carries the final counts
(cumulative: clients overwrite, as the anthropic SDK does).

A stream is, in Anthropic's order: ``message_start`` (the message, content empty) and a ``ping``;
per block ``content_block_start``, ``content_block_delta`` (``thinking_delta``, ``text_delta``,
``input_json_delta``), a thinking block's ``signature_delta``, ``content_block_stop``; then
``message_delta`` (stop reason, usage) and ``message_stop``. Text deltas are written from
pre-encoded heads: one JSON string encoding per write, no pydantic. Calls are known when the answer
is complete, so their blocks come whole (`MessageBuilder.whole`), their input as one
``input_json_delta``. A failure after the stream started is an ``error`` event, and the stream ends.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from trtllm_service.api.anthropic.errors import error_event
from trtllm_service.errors import APIError

if TYPE_CHECKING:
    from trtllm_service.api.anthropic.protocol import MessagesRequest

THINKING_SIGNATURE = ""
"""The `signature` of our thinking blocks: nothing signs them (see the module docstring)."""
PING = 'event: ping\ndata: {"type":"ping"}\n\n'
MESSAGE_STOP = 'event: message_stop\ndata: {"type":"message_stop"}\n\n'

Block = dict[str, Any]
Call = tuple[str, str]  # (name, arguments as JSON text), as `ToolUse.calls_in` gives them

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_THINKING, _TEXT = "thinking", "text"  # the kinds of block streamed as text deltas


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def new_tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def stop_reason(
    finish_reason: str, calls: bool = False, stop_sequence: str | None = None
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of an answer: our finish reason ("stop", "length"), whether the
    answer is calls, and the stop string that ended it (None: none did)."""
    if calls:
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if stop_sequence is not None:
        return "stop_sequence", stop_sequence
    return "end_turn", None


def stop_sequence_of(stream: object) -> str | None:
    """The stop string that ended an engine stream (None: none did). The relay's stop-string
    matcher records it (`StopStringMatcher.matched`); a stream that says it itself
    (`stop_string`) is read first."""
    said = getattr(stream, "stop_string", None)
    if said is not None:
        return str(said)
    matcher = getattr(stream, "_matcher", None)
    matched = getattr(matcher, "matched", None)
    return matched if isinstance(matched, str) else None


SERVICE_TIER = "standard"
"""The message's `usage.service_tier`: Anthropic's tiers (`auto`, `standard_only`) are both the
service's default tier (docs/api.md: Priority), which Anthropic calls standard."""


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> dict[str, int]:
    """Anthropic's usage of an answer (see the module docstring)."""
    cached = min(max(cached_tokens, 0), prompt_tokens)
    return {
        "input_tokens": prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output_tokens,
    }


def count_tokens_body(input_tokens: int) -> dict[str, int]:
    """The answer of ``POST /v1/messages/count_tokens``."""
    return {"input_tokens": input_tokens}


def _event(kind: str, data: dict[str, Any]) -> str:
    """One SSE event (not for the per-token path: `MessageBuilder.write` makes those)."""
    return f"event: {kind}\ndata: {_encode(data)}\n\n"


class MessageBuilder:
    """One answer of ``/v1/messages``: its constant fields (said once), its content blocks, and the
    events of its stream (`opening`, `write` per chunk, `finish`; or `whole`).

    Args:
        request: The request answered (its thinking display).
        model: The model id the answer names.
        prompt_tokens: The prompt's tokens (all of them, cached or not).
    """

    __slots__ = ("_head", "_index", "_omit", "_open", "id", "model", "prompt_tokens")

    def __init__(self, request: MessagesRequest, model: str, prompt_tokens: int) -> None:
        self.id = new_message_id()
        self.model = model
        self.prompt_tokens = prompt_tokens
        self._omit = request.omits_thinking
        self._index = 0  # the index of the next block
        self._open: str | None = None  # the kind of the block being streamed
        self._head = ""  # the open block's content_block_delta event, up to its text

    # ---- a whole message

    def blocks(self, thought: str | None, text: str | None, calls: list[Call] | None) -> list[Block]:
        """The content blocks of a whole answer: its thinking, then its calls or its text."""
        out: list[Block] = []
        if thought:
            out.append(self._thinking_block("" if self._omit else thought))
        if calls:
            out += [_tool_use_block(name, arguments) for name, arguments in calls]
        elif text:
            out.append({"type": "text", "text": text})
        return out

    def message(
        self,
        thought: str | None,
        text: str | None,
        calls: list[Call] | None,
        finish_reason: str,
        output_tokens: int,
        *,
        cached_tokens: int = 0,
        stop_sequence: str | None = None,
    ) -> dict[str, Any]:
        """The non-streamed ``message`` body of a finished answer."""
        reason, sequence = stop_reason(finish_reason, bool(calls), stop_sequence)
        return self._message(
            self.blocks(thought, text, calls),
            reason,
            sequence,
            usage(self.prompt_tokens, output_tokens, cached_tokens),
        )

    def _message(
        self, content: list[Block], reason: str | None, sequence: str | None, counts: dict[str, int]
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": {**counts, "service_tier": SERVICE_TIER},
        }

    @staticmethod
    def _thinking_block(thinking: str) -> Block:
        return {"type": "thinking", "thinking": thinking, "signature": THINKING_SIGNATURE}

    # ---- events

    def opening(self) -> str:
        """message_start (the message, its content empty, the whole prompt as input tokens) and a ping."""
        start = self._message([], None, None, usage(self.prompt_tokens, 0))
        return _event("message_start", {"type": "message_start", "message": start}) + PING

    def write(self, thought: str, text: str) -> str:
        """The events of new thinking and answer text (a block starts when its text starts)."""
        frames = ""
        if thought:
            if self._open != _THINKING:
                frames = self._start(_THINKING)
            if not self._omit:
                frames += f"{self._head}{_encode(thought)}}}}}\n\n"
        if text:
            if self._open != _TEXT:
                frames += self._start(_TEXT)
            frames += f"{self._head}{_encode(text)}}}}}\n\n"
        return frames

    def _start(self, kind: str) -> str:
        """Closes the open block and starts one of `kind` at the next index."""
        frames = self._close()
        index = self._index
        self._index += 1
        self._open = kind
        self._head = (
            f'event: content_block_delta\ndata: {{"type":"content_block_delta","index":{index},'
            f'"delta":{{"type":"{kind}_delta","{kind}":'
        )
        block = self._thinking_block("") if kind == _THINKING else {"type": "text", "text": ""}
        return frames + _event(
            "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
        )

    def _close(self) -> str:
        """The open block's end (a thinking block's signature first); "" when none is open."""
        kind, self._open = self._open, None
        if kind is None:
            return ""
        index = self._index - 1
        frames = ""
        if kind == _THINKING:
            delta = {"type": "signature_delta", "signature": THINKING_SIGNATURE}
            frames = _event(
                "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
            )
        return frames + _event("content_block_stop", {"type": "content_block_stop", "index": index})

    def finish(
        self,
        finish_reason: str,
        output_tokens: int,
        *,
        cached_tokens: int = 0,
        stop_sequence: str | None = None,
    ) -> str:
        """The end of a streamed text answer: the open block closed, message_delta, message_stop."""
        reason, sequence = stop_reason(finish_reason, False, stop_sequence)
        counts = usage(self.prompt_tokens, output_tokens, cached_tokens)
        return self._close() + self._ending(reason, sequence, counts)

    @staticmethod
    def _ending(reason: str | None, sequence: str | None, counts: dict[str, int]) -> str:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": counts,
        }
        return _event("message_delta", delta) + MESSAGE_STOP

    def whole(self, message: dict[str, Any]) -> str:
        """The events of an answer sent when complete (one that may be calls), after `opening`:
        the blocks of its `message` body, each started, given whole and stopped, then the end."""
        frames = [self._close()]
        for block in message["content"]:
            index = self._index
            self._index += 1
            kind = block["type"]
            value: dict[str, Any] | str
            if kind == "tool_use":
                field, value = "input", {}
                delta = {"type": "input_json_delta", "partial_json": _encode(block["input"])}
            else:
                field, value = kind, ""  # a thinking or text block: its text in one delta
                delta = {"type": f"{kind}_delta", kind: block[kind]}
            started = {**block, field: value}
            frames.append(
                _event(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": started},
                )
            )
            if block[field]:
                frames.append(
                    _event(
                        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
                    )
                )
            if kind == _THINKING:
                signature = {"type": "signature_delta", "signature": block["signature"]}
                frames.append(
                    _event(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": signature},
                    )
                )
            frames.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
        counts = {key: value for key, value in message["usage"].items() if key != "service_tier"}
        frames.append(self._ending(message["stop_reason"], message["stop_sequence"], counts))
        return "".join(frames)

    def ping(self) -> str:
        """A ping event (keeps a quiet stream's connection alive)."""
        return PING

    def failure(self, error: APIError) -> str:
        """An error event: the stream then ends (no message_stop)."""
        return error_event(error)


def _tool_use_block(name: str, arguments: str) -> Block:
    """A call as a tool_use block: its arguments (JSON text) as the input object."""
    return {"type": "tool_use", "id": new_tool_use_id(), "name": name, "input": json.loads(arguments)}
