"""Reasoning models: the answer's think block (`<think> ... </think>`) apart from its content.

The parser is chosen when the model is packed (`pack_model.py --reasoning-parser`), by how the
model's chat template and the model itself write the block:

* ``deepseek-r1``: the chat template opens the block in the prompt, so the answer starts inside it:
  everything before ``</think>`` is reasoning, even without a ``<think>`` (one that the model
  writes anyway at the very start is dropped). No ``</think>`` at all: the whole answer is
  reasoning (cut off while thinking).
* ``qwen3``: only text inside a ``<think> ... </think>`` that the model writes is reasoning; text
  before ``<think>``, or an answer without one, is content. A block left open (cut off by
  ``max_tokens``) is reasoning to the end.

After ``</think>`` everything is content (a later ``<think>`` too). The tags themselves are in
neither part. A streamed answer is split as it comes (`ReasoningSplitter`): text that may be the
beginning of the awaited tag (``</thi`` at the end of a chunk) is held back until the next chunk
says, so tags split across chunks are found, and the streamed parts concatenate exactly to the
parts of the same answer split whole (`split`).
"""

from __future__ import annotations

from dataclasses import dataclass

START_TAG = "<think>"
END_TAG = "</think>"


@dataclass(frozen=True, slots=True)
class ReasoningStyle:
    """How a model writes its reasoning: the tags, and whether the prompt already opened the block."""

    name: str
    opened_by_template: bool
    start: str = START_TAG
    end: str = END_TAG


STYLES: dict[str, ReasoningStyle] = {
    "deepseek-r1": ReasoningStyle("deepseek-r1", opened_by_template=True),
    "qwen3": ReasoningStyle("qwen3", opened_by_template=False),
}
REASONING_PARSERS = tuple(STYLES)
"""The names `pack_model.py --reasoning-parser` takes."""

_OPENING, _BEFORE, _INSIDE, _AFTER = range(4)


class ReasoningSplitter:
    """Splits one answer, pushed chunk by chunk, into (reasoning, content) deltas.

    Args:
        style: The model's way of writing its reasoning.
    """

    __slots__ = ("_held", "_state", "style")

    def __init__(self, style: ReasoningStyle) -> None:
        self.style = style
        self._state = _OPENING if style.opened_by_template else _BEFORE
        self._held = ""

    def push(self, text: str) -> tuple[str, str]:
        """The (reasoning, content) that `text` adds, as far as it is known now."""
        if self._state == _AFTER:
            return "", text
        reasoning: list[str] = []
        content: list[str] = []
        text = self._held + text
        self._held = ""
        while text:
            state = self._state
            if state == _AFTER:
                content.append(text)
                break
            if state == _OPENING:  # deepseek-r1: a <think> at the very start is dropped
                start = self.style.start
                if text.startswith(start):
                    text = text[len(start) :]
                elif start.startswith(text):
                    self._held = text  # maybe the start of <think>: the next chunk says
                    break
                self._state = _INSIDE
                continue
            tag = self.style.start if state == _BEFORE else self.style.end
            out = content if state == _BEFORE else reasoning
            found = text.find(tag)
            if found < 0:
                keep = _partial_tag(text, tag)
                out.append(text[: len(text) - keep])
                self._held = text[len(text) - keep :]
                break
            out.append(text[:found])
            text = text[found + len(tag) :]
            self._state = _INSIDE if state == _BEFORE else _AFTER
        return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        """The (reasoning, content) held back at the end of the answer (a tag that never completed)."""
        held, self._held = self._held, ""
        return ("", held) if self._state in (_BEFORE, _AFTER) else (held, "")


def _partial_tag(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a beginning of `tag` (to hold back)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def split(style: ReasoningStyle, text: str) -> tuple[str | None, str | None]:
    """A whole answer's (reasoning, content): reasoning None when the answer has none (or an empty
    block); content None when there is reasoning and nothing after it."""
    splitter = ReasoningSplitter(style)
    reasoning, content = splitter.push(text)
    rest_reasoning, rest_content = splitter.flush()
    reasoning += rest_reasoning
    content += rest_content
    if not reasoning:  # no think block, or an empty one
        return None, content
    return reasoning, content or None


def style_of(name: str | None) -> ReasoningStyle | None:
    """The style `pack_model.py --reasoning-parser NAME` chose (None: the model does not reason).

    Raises:
        ValueError: An unknown name.
    """
    if name is None:
        return None
    try:
        return STYLES[name]
    except KeyError:
        raise ValueError(
            f"unknown reasoning parser {name!r}: one of {', '.join(REASONING_PARSERS)}"
        ) from None
