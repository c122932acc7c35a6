"""Prompt building and stop-string detection on text.

Chat formatting uses the tokenizer's own Jinja chat template (or a Llama-3 Instruct default), and token
counts use exactly the call the Triton preprocessing model makes, so prompt lengths checked here match
what the engine sees. Stop strings are matched on decoded text because the string -> token-id mapping
is not unique; matching token ids misses stops that the model spells with other tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

LLAMA3_CHAT_TEMPLATE: str = (
    "{{- '<|begin_of_text|>' -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception(\"Unsupported role '\" ~ message['role'] ~ \"': this template accepts system, user and assistant\") -}}"
    "{%- endif -%}"
    "{{- '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\\n\\n' ~ (message['content'] | trim) ~ '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
    "{%- endif -%}"
)
"""Llama-3 Instruct chat format, used when the tokenizer carries no chat template of its own."""


class PromptFormatter:
    """Turns chat messages or a plain prompt into the exact text sent to Triton, and counts its tokens.

    Args:
        tokenizer: A Hugging Face tokenizer (the same files the Triton preprocessing model loads).
        chat_template: A Jinja template that overrides the tokenizer's; when neither exists,
            ``LLAMA3_CHAT_TEMPLATE`` is used.

    Raises:
        ValueError: The template is not valid Jinja (found at startup rather than on the first request).
    """

    def __init__(self, tokenizer: Any, chat_template: str | None = None) -> None:
        self._tokenizer = tokenizer
        if chat_template is not None:
            template = chat_template
        elif getattr(tokenizer, "chat_template", None):
            template = tokenizer.get_chat_template()
        else:
            template = LLAMA3_CHAT_TEMPLATE
        try:
            ImmutableSandboxedEnvironment().parse(template)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"Invalid chat template (line {exc.lineno}): {exc.message}") from exc
        self.chat_template: str = template
        self._bos: str | None = getattr(tokenizer, "bos_token", None) or None

    def render(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
        """Render messages with the chat template (no tokenization).

        Raises:
            ValueError: No messages, or the template rejected them (e.g. an unsupported role).
        """
        if not messages:
            raise ValueError("At least one message is required")
        try:
            text = self._tokenizer.apply_chat_template(
                messages,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
            )
        except jinja2.TemplateError as exc:
            raise ValueError(f"The chat template could not format these messages: {exc}") from exc
        if not isinstance(text, str):  # defensive: tokenize=False must give text
            raise ValueError(f"The chat template produced {type(text).__name__}, expected text")
        return text

    def from_prompt(self, prompt: str, system_prompt: str | None = None) -> str:
        """Wrap a plain prompt (and optional system prompt) as a one-turn chat, ready for generation.

        An empty system prompt is left out: an empty system turn only adds noise tokens.
        """
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": prompt})
        return self.render(messages, add_generation_prompt=True)

    def count_tokens(self, text: str) -> int:
        """Count tokens exactly as the Triton preprocessing model will tokenize ``text``.

        Special tokens (BOS) are added only when the text does not already start with BOS, so a rendered
        chat that begins with ``<|begin_of_text|>`` is not given a second one.
        """
        add_special = not (self._bos is not None and text.startswith(self._bos))
        return len(self._tokenizer.encode(text, add_special_tokens=add_special))


class StopStringMatcher:
    """Streaming stop-string detection on text deltas.

    Text that is, or might become, a stop string is never emitted: the longest suffix of the text seen so
    far that is a prefix of some stop string is held back until it either completes a stop string or
    stops being a possible one. The stream stops at the first position where any stop string is
    complete; when several end there, the longest wins (it starts earliest). This is what a streaming
    engine observes, and it does not depend on how the text is split into deltas.

    Matching runs an Aho-Corasick automaton whose state persists across deltas, so one ``push`` costs
    O(len(delta) + longest stop string), however long the stream already is. The automaton's state is
    exactly the held-back suffix, so no text is ever re-scanned.

    Args:
        stops: Stop strings. Duplicates are harmless.

    Raises:
        ValueError: A stop string is empty (it would match before any text).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        for i, stop in enumerate(stops):
            if not isinstance(stop, str) or not stop:
                raise ValueError(f"Stop strings must be non-empty strings; stop[{i}] is {stop!r}")
        self._active = bool(stops)
        self._pending = ""
        self._state = 0
        self.stopped = False  # a stop string was found: the caller should end the stream
        self.matched: str | None = None  # the stop string that ended the stream
        self._build(stops)

    def _build(self, stops: Sequence[str]) -> None:
        """Build the trie (goto), failure links, state depths and longest-match-ending-here lengths."""
        goto: list[dict[str, int]] = [{}]
        depth = [0]
        terminal = [False]
        for stop in stops:
            state = 0
            for ch in stop:
                nxt = goto[state].get(ch)
                if nxt is None:
                    nxt = len(goto)
                    goto[state][ch] = nxt
                    goto.append({})
                    depth.append(depth[state] + 1)
                    terminal.append(False)
                state = nxt
            terminal[state] = True
        fail = [0] * len(goto)
        # match_len[s]: length of the longest stop string that is a suffix of state s's text (0 if none).
        match_len = [depth[s] if terminal[s] else 0 for s in range(len(goto))]
        queue = list(goto[0].values())
        for state in queue:  # breadth-first: parents before children, so fail[] is ready when read
            for ch, child in goto[state].items():
                f = fail[state]
                while f and ch not in goto[f]:
                    f = fail[f]
                fail[child] = goto[f].get(ch, 0)  # f is shallower than state, so never child itself
                if not terminal[child]:
                    match_len[child] = match_len[fail[child]]
                queue.append(child)
        self._goto, self._fail, self._depth, self._match_len = goto, fail, depth, match_len

    def push(self, delta: str) -> tuple[str, bool]:
        """Feed the next text delta.

        Returns:
            ``(text safe to emit now, stopped)``. When ``stopped`` is True the text is everything before
            the stop string, and later calls return ``("", True)``.
        """
        if not self._active:
            return delta, False
        if self.stopped:
            return "", True
        goto, fail, match_len = self._goto, self._fail, self._match_len
        text = self._pending + delta
        base = len(self._pending)
        state = self._state
        for i, ch in enumerate(delta):
            while state and ch not in goto[state]:
                state = fail[state]
            state = goto[state].get(ch, 0)
            length = match_len[state]
            if length:
                end = base + i + 1
                self.stopped = True
                self.matched = text[end - length : end]
                self._pending = ""
                return text[: end - length], True
        self._state = state
        hold = self._depth[state]
        cut = len(text) - hold
        self._pending = text[cut:]
        return text[:cut], False

    def flush(self) -> str:
        """Return the held-back text at the end of the stream (empty after a stop)."""
        text, self._pending = self._pending, ""
        self._state = 0
        return "" if self.stopped else text
