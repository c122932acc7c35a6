"""Log probabilities: the engine's per-token numbers -> OpenAI's `logprobs` objects.

What every engine returns is the same: the model's own distribution, the log-softmax of its raw
logits, before temperature, penalties, logit bias, grammar masks and top-k/top-p (the reference
engines compute it so, the LLM API is asked for `raw_logprobs`, the C++ engine's generation logits
are raw). A token's entry is `TokenLogprob`: its id, its log prob, and the N most likely ids of
that step with theirs, most likely first.

On the C++ contract the top N come from the generation logits (one vocabulary-sized row per token,
reduced here once: a partial sort and one log-sum-exp). Token texts and bytes come from the
tokenizer's vocabulary, cached per id: `bytes` is exact even where a token is part of a character.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np


class TokenLogprob(NamedTuple):
    """One token: its id and log prob, and the most likely tokens of its step (a prompt's first
    token has none: nothing predicts it)."""

    token: int
    logprob: float | None
    top_ids: Sequence[int] = ()
    top_logprobs: Sequence[float] = ()


def top_from_logits(logits: np.ndarray, n: int) -> list[tuple[list[int], list[float]]]:
    """The `n` most likely (ids, log probs) of each row of raw logits, most likely first."""
    rows = logits.astype(np.float32, copy=False)
    if rows.ndim == 1:
        rows = rows[None]
    n = min(n, rows.shape[-1])
    peak = rows.max(axis=-1, keepdims=True)
    log_norm = peak + np.log(np.exp(rows - peak).sum(axis=-1, keepdims=True))
    part = np.argpartition(-rows, n - 1, axis=-1)[:, :n]
    values = np.take_along_axis(rows, part, axis=-1)
    order = np.lexsort((part, -values), axis=-1)  # most likely first; ties by id
    ids = np.take_along_axis(part, order, axis=-1)
    logprobs = np.take_along_axis(values, order, axis=-1) - log_norm
    return [(i.tolist(), v.tolist()) for i, v in zip(ids, logprobs, strict=True)]


def prompt_from_logits(logits: np.ndarray, prompt: Sequence[int], n: int) -> list[TokenLogprob]:
    """Each prompt token's log prob and the `n` most likely tokens at its position, from the raw
    context logits [prompt, vocab] (row i predicts token i + 1); the first token gets None."""
    rows = np.asarray(logits, dtype=np.float32)[: len(prompt) - 1]
    if not len(prompt):
        return []
    out = [TokenLogprob(int(prompt[0]), None)]
    if not len(rows):
        return out
    peak = rows.max(axis=-1, keepdims=True)
    log_norm = peak + np.log(np.exp(rows - peak).sum(axis=-1, keepdims=True))
    values = rows[np.arange(len(rows)), np.asarray(prompt[1 : len(rows) + 1])] - log_norm[:, 0]
    tops = top_from_logits(rows, n) if n else [((), ())] * len(rows)
    out += [
        TokenLogprob(int(t), float(v), *top)
        for t, v, top in zip(prompt[1 : len(rows) + 1], values.tolist(), tops, strict=True)
    ]
    return out


def _byte_decoder() -> dict[str, int]:
    """The inverse of byte-level BPE's byte -> printable character map (GPT-2's scheme)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


class TokenTexts:
    """Each token id's text and exact bytes, from the tokenizer's vocabulary (cached)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self._byte_level = "ByteLevel" in type(decoder).__name__ or "ByteLevel" in repr(decoder)
        self._bytes_of = _byte_decoder() if self._byte_level else {}
        self._special = set(getattr(tokenizer, "all_special_ids", ()) or ())

    @functools.lru_cache(maxsize=1 << 17)  # noqa: B019 - one table per served model, for its lifetime
    def token_bytes(self, token: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(int(token))
        if piece is None:
            return b""
        if token in self._special:
            return piece.encode()
        if self._byte_level and all(ch in self._bytes_of for ch in piece):
            return bytes(self._bytes_of[ch] for ch in piece)
        if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:  # SentencePiece byte
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode()

    def text(self, token: int) -> str:
        """The token's text; a token that is part of a character shows its bytes as U+FFFD."""
        return self.token_bytes(token).decode("utf-8", errors="replace")

    def entry(self, token: int, logprob: float | None) -> dict[str, Any]:
        """OpenAI's {token, logprob, bytes} of one token."""
        return {"token": self.text(token), "logprob": logprob, "bytes": list(self.token_bytes(token))}


def chat_logprobs(entries: Sequence[TokenLogprob], texts: TokenTexts, top: int) -> dict[str, Any]:
    """A chat choice's (or chunk's) `logprobs`: {"content": [...], "refusal": None}."""
    content = []
    for item in entries:
        entry = texts.entry(item.token, item.logprob)
        entry["top_logprobs"] = [
            texts.entry(i, v) for i, v in zip(item.top_ids[:top], item.top_logprobs[:top], strict=False)
        ]
        content.append(entry)
    return {"content": content, "refusal": None}


def completion_logprobs(
    entries: Sequence[TokenLogprob],
    texts: TokenTexts,
    top: int,
    offset: int,
    prompt: Sequence[TokenLogprob] | None = None,
) -> tuple[dict[str, Any], int]:
    """A completion choice's (or chunk's) `logprobs`, and the text offset after its tokens.

    `offset` is where the first token's text starts in the choice's text (after an echoed prompt).
    `prompt` (echo with logprobs): the prompt's tokens come first, from offset 0; the first has
    None for its log prob and top log probs (nothing predicts it).
    """
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    if prompt:
        body, _ = completion_logprobs(prompt, texts, top, 0)
        tokens, values, offsets = body["tokens"], body["token_logprobs"], body["text_offset"]
        tops = body["top_logprobs"] or []
    for item in entries:
        text = texts.text(item.token)
        tokens.append(text)
        values.append(item.logprob)
        offsets.append(offset)
        offset += len(text)
        if top:
            if item.logprob is None:
                tops.append(None)
                continue
            alternatives: dict[str, float] = {}
            for i, v in zip(item.top_ids[:top], item.top_logprobs[:top], strict=False):
                alternatives.setdefault(texts.text(i), v)
            tops.append(alternatives)
    body = {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops if top else None,
        "text_offset": offsets,
    }
    return body, offset
