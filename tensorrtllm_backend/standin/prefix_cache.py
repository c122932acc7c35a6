"""KV block reuse for the reference engine: prompts that share a prefix share its keys and values.

TensorRT-LLM's block manager keeps the KV blocks of finished prompts (`enable_kv_cache_reuse`,
the LLM API's `kv_cache_config.enable_block_reuse`) and lets a later prompt that starts with the same
tokens, block by block, take them instead of computing them again. Here the same, kept small: the
prefilled keys and values of the last few prompts, found by a hash chain over their full blocks of
`tokens_per_block` tokens. A prompt takes the longest run of whole blocks it shares with one of
them, less its last token (the model must compute at least one position to give the next token's
logits), and computes only the rest.

The block counts are TensorRT-LLM's KvCacheStats: `reused` (blocks taken from the store), `missed`
(prompt blocks computed), `alloc_total` / `alloc_new` (blocks a request held, and those that were
not reused). Prompts of different adapters never share: the adapter is part of the hash.
"""

from __future__ import annotations

import collections
from typing import Any

DEFAULT_TOKENS_PER_BLOCK = 32
"""TensorRT-LLM's default KV cache block (kv_cache_config.tokens_per_block, the C++ engine's plugin)."""


def blocks(tokens: int, tokens_per_block: int) -> int:
    """Blocks that hold `tokens` positions."""
    return -(-tokens // tokens_per_block)


class PrefixStore:
    """The prefilled prompts kept for reuse (least recently used goes first) and the block counts.

    `layers` is whatever the engine keeps per prompt (its per-layer keys and values); the store
    only hands back what it was given. Used from the engine's one worker thread; the counts are
    plain integers other threads may read.
    """

    def __init__(
        self, tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK, entries: int = 8, enabled: bool = True
    ):
        self.tokens_per_block = tokens_per_block
        self.enabled = enabled
        self._entries = max(1, entries)
        self._prompts: collections.OrderedDict[int, tuple[tuple[int, ...], Any]] = collections.OrderedDict()
        self._blocks: dict[int, tuple[int, int]] = {}  # chain hash of a block run -> (prompt key, tokens)
        self._next = 0
        self.reused = 0
        self.missed = 0
        self.alloc_total = 0
        self.alloc_new = 0

    def _chain(self, ids: list[int], salt: Any) -> list[int]:
        """The hash of each run of whole blocks from the start: [hash(block 0), hash(blocks 0-1), ...]."""
        size, chain, running = self.tokens_per_block, [], hash(("prefix", salt))
        for end in range(size, len(ids) + 1, size):
            running = hash((running, tuple(ids[end - size : end])))
            chain.append(running)
        return chain

    def lookup(self, ids: list[int], salt: Any = None) -> tuple[int, Any]:
        """(tokens reused, the stored layers they come from) for a prompt; (0, None) without a match.
        The match leaves at least the prompt's last token to compute."""
        if not self.enabled:
            return 0, None
        chain = self._chain(ids[:-1], salt)
        for index in range(len(chain) - 1, -1, -1):
            found = self._blocks.get(chain[index])
            if found is None:
                continue
            key, tokens = found
            stored_ids, layers = self._prompts[key]
            if stored_ids[:tokens] == tuple(ids[:tokens]):  # a hash collision is a miss
                self._prompts.move_to_end(key)
                return tokens, layers
        return 0, None

    def count_prompt(self, prompt_tokens: int, reused_tokens: int) -> None:
        """Counts one prefill: its reused blocks and the blocks it computed."""
        size = self.tokens_per_block
        reused, total = reused_tokens // size, blocks(prompt_tokens, size)
        self.reused += reused
        self.missed += total - reused
        self.alloc_total += total
        self.alloc_new += total - reused

    def count_generated(self, new_blocks: int) -> None:
        """Blocks a sequence allocated while it generated (never reused)."""
        self.alloc_total += new_blocks
        self.alloc_new += new_blocks

    def keep(self, ids: list[int], layers: Any, salt: Any = None) -> None:
        """Keeps a prefilled prompt's keys and values for later prompts (its whole blocks only)."""
        if not self.enabled or len(ids) < self.tokens_per_block:
            return
        key, self._next = self._next, self._next + 1
        self._prompts[key] = (tuple(ids), layers)
        for index, chained in enumerate(self._chain(ids, salt)):
            self._blocks[chained] = (key, (index + 1) * self.tokens_per_block)
        while len(self._prompts) > self._entries:
            old, _ = self._prompts.popitem(last=False)
            self._blocks = {chained: found for chained, found in self._blocks.items() if found[0] != old}

    @property
    def hit_rate(self) -> float:
        looked_up = self.reused + self.missed
        return self.reused / looked_up if looked_up else 0.0
