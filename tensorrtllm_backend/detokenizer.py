"""Incremental detokenization: the text of newly generated ids, exact when the pieces are joined.

Decoding each streamed response on its own loses leading spaces and turns characters split across
byte tokens into U+FFFD (upstream's best-known streaming bugs). This keeps per-stream state instead.
Each push decodes a short window, `ids[prefix:]`, and compares it with `ids[prefix:read]`, so a step
costs O(window) rather than O(text), and windows start where earlier text was complete, so the
pieces concatenate to the text of all ids decoded at once.

Text that ends in U+FFFD is held back, since more bytes of that character may follow: a push emits
up to the last token boundary that ends on a whole character. The hold-back is bounded: a character
is at most 4 bytes, so after LOOK_BACK tokens without one the bytes are emitted as U+FFFD, as a
full decode shows them (a model with random weights can emit long runs of stray byte tokens; an
unbounded hold-back, as in `tokenizers`' DecodeStream, would then hold an answer back for good).
A trailing incomplete character at the very end is never emitted.

One module for both sides: the service imports it, and the model repository carries a copy beside
postprocessing's model.py. A fast tokenizer is decoded through its Rust tokenizer directly (about
1 us per window), skipping the transformers wrapper.
"""

from __future__ import annotations

import time
from typing import Any

LOOK_BACK = 16
TRIM_AFTER = 512
REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Emits the stable new suffix of the decoded text as ids arrive (one instance per stream)."""

    __slots__ = ("_decode", "ids", "last_used", "prefix", "read")

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        rust = getattr(tokenizer, "backend_tokenizer", None)
        if rust is not None:

            def decode(ids: list[int]) -> str:
                return rust.decode(ids, skip_special_tokens=skip_special_tokens)

        else:

            def decode(ids: list[int]) -> str:
                return tokenizer.decode(
                    ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
                )

        self._decode = decode
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0
        self.last_used = time.monotonic()

    def decode(self, ids: Any) -> str:
        """The text of `ids` decoded whole (this stream's state untouched): a beam, say."""
        return self._decode(list(ids))

    def push(self, new_ids: Any) -> str:
        """The text that `new_ids` complete ("" while they end inside a character)."""
        self.last_used = time.monotonic()
        if not len(new_ids):
            return ""
        ids = self.ids
        ids.extend(new_ids)
        decode = self._decode
        before = decode(ids[self.prefix : self.read]) if self.read > self.prefix else ""
        end = len(ids)
        after = decode(ids[self.prefix : end])
        while after.endswith(REPLACEMENT) and end > self.read + 1 and len(ids) - end < LOOK_BACK:
            end -= 1
            after = decode(ids[self.prefix : end])
        if after.endswith(REPLACEMENT):
            if len(ids) - end < LOOK_BACK:
                return ""  # no complete character among the new tokens yet
            end = len(ids)  # a long run of stray bytes: emit it, as U+FFFD, like a full decode
            after = decode(ids[self.prefix : end])
        if len(after) <= len(before):
            return ""
        self.prefix, self.read = self.read, end
        if self.prefix > TRIM_AFTER:
            del ids[: self.prefix]
            self.read -= self.prefix
            self.prefix = 0
        return after[len(before) :]
