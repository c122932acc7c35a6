"""The synthetic token source: tokens as fast as Triton relays them, for load tests and benchmarks.

No model runs: each step appends one token per active request at once (or after `step_delay_ms`,
the iteration time of an engine this stands in for), behind the same tensor contract as the C++
backend. The tokens are a deterministic function of the prompt (and of the seed when sampling), so a
request's output can be checked against the same request run alone; concurrency cannot change it.

Only tokens that decode on their own to printable text are emitted, so any concatenation of them is
valid UTF-8 and the output text is exact. The end id is never emitted: a request ends at `max_new`,
at a token stop word, or when it is stopped or cancelled.
"""

from __future__ import annotations

import secrets
import zlib
from array import array

from engine import Sequence

_MULTIPLIER = 6364136223846793005  # Knuth's MMIX linear congruential generator
_INCREMENT = 1442695040888963407
_MASK = (1 << 64) - 1


def printable_tokens(tokenizer_dir: str) -> list[int]:
    """Ids of the tokens that decode alone to non-empty printable text (special tokens excluded)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    special = set(tokenizer.all_special_ids)
    words = []
    for token_id in range(len(tokenizer)):
        if token_id in special:
            continue
        text = tokenizer.decode([token_id], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if text and "\ufffd" not in text and text.replace(" ", "").isprintable():
            words.append(token_id)
    if not words:
        raise ValueError(f"the tokenizer in {tokenizer_dir} has no printable tokens")
    return words


class SyntheticSource:
    """Token source that needs no model: see the module docstring."""

    capacity = None  # no model, no batch slots: every request runs at once

    def __init__(self, words: list[int]) -> None:
        self.words = words

    def describe(self) -> str:
        return f"synthetic token source ({len(self.words)} printable tokens)"

    def start(self, seq: Sequence) -> None:
        request = seq.request
        if request.beam_width > 1:
            raise ValueError("the synthetic engine does not search beams (it has no model to score them)")
        state = zlib.crc32(array("i", request.input_ids).tobytes())
        if not request.greedy:
            seed = request.seed if request.seed is not None else secrets.randbits(63)
            state ^= (seed * _MULTIPLIER) & _MASK
        seq.state = state

    def release(self, seq: Sequence) -> None:
        seq.state = None

    def step(self, seqs: list[Sequence]) -> list[tuple[int, float] | BaseException]:
        words = self.words
        count = len(words)
        out: list[tuple[int, float] | BaseException] = []
        for seq in seqs:
            state = (seq.state * _MULTIPLIER + _INCREMENT) & _MASK
            seq.state = state
            out.append((words[(state >> 33) % count], 0.0))
        return out
