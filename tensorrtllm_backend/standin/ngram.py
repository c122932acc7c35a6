"""NGram speculative decoding (prompt lookup) as TensorRT-LLM 1.2.1's PyTorch backend configures it.

model.yaml's `speculative_config: {decoding_type: NGram, max_draft_len, max_matching_ngram_size,
is_keep_all, is_use_oldest, is_public_pool}` (the LLM API's NGramDecodingConfig) turns it on.
`NGramConfig.read` takes that block as a mapping or as an object with those attributes (the
validated pydantic model), so the engine does not care which one it got.

The drafter keeps a pool of pattern -> continuations, as NVIDIA's NGram pool manager does: a
pattern is 1 .. max_matching_ngram_size consecutive tokens of a sequence (prompt + generated), a
continuation the up to max_draft_len tokens that followed it. Each step it adds what the sequence
gained since its last step (a window reaching back max_draft_len + max_matching_ngram_size - 1
tokens, so the continuations cut short last time are seen whole), then looks up the sequence's
longest suffix (longest pattern first) and proposes that pattern's continuation (the oldest one with
is_use_oldest, else the newest), cut to what the request may still generate minus the token the
verification adds anyway. With is_keep_all a pattern keeps several continuations (a longer one
replaces the shorter ones), else only one (replaced by a longer one). With is_public_pool (the
default) one pool serves every request: a continuation learned from one request's text drafts for
another's (as upstream, the public pool is never pruned); otherwise each request has its own, freed
with the request.

Drafting only proposes: the engine verifies the drafts in one forward pass and keeps the longest
prefix its own decoding agrees with (see reference.py), so the output never depends on the pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NGRAM = "NGram"


@dataclass(frozen=True, slots=True)
class NGramConfig:
    """NGramDecodingConfig's fields (1.2: max_matching_ngram_size defaults to 2, the flags to True)."""

    max_draft_len: int
    max_matching_ngram_size: int = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True

    @classmethod
    def read(cls, config: Any) -> NGramConfig | None:
        """The NGram settings of a speculative_config (a mapping or an object with attributes); None
        when there is none. Any other decoding type is a ValueError: our engines draft only NGram."""
        if config is None:
            return None

        def get(name: str, default: Any = None) -> Any:
            if isinstance(config, Mapping):
                return config.get(name, default)
            return getattr(config, name, default)

        kind = get("decoding_type")
        if kind != NGRAM:
            raise ValueError(
                f"speculative_config: decoding_type {kind!r} is not served by the stand-in engine "
                f"(it drafts with {NGRAM!r} only: prompt lookup needs no draft model)"
            )
        draft = get("max_draft_len")
        if draft is None or int(draft) < 1:
            raise ValueError("max_draft_len must be > 0 for NGram")  # NGramDecodingConfig's words
        ngram = int(get("max_matching_ngram_size", 2) or 0)
        if ngram < 1:
            raise ValueError(f"speculative_config: max_matching_ngram_size must be >= 1, got {ngram}")
        return cls(
            max_draft_len=int(draft),
            max_matching_ngram_size=ngram,
            is_keep_all=bool(get("is_keep_all", True)),
            is_use_oldest=bool(get("is_use_oldest", True)),
            is_public_pool=bool(get("is_public_pool", True)),
        )


Pool = dict[tuple[int, ...], list[tuple[int, ...]]]


class NGramDrafter:
    """The pattern pool and the lookup (see the module docstring); one per engine, engine thread only."""

    def __init__(self, config: NGramConfig) -> None:
        self.config = config
        self._public: Pool = {}
        self._own: dict[Any, Pool] = {}  # request key -> its pool (is_public_pool false)
        self._start: dict[Any, int] = {}  # request key -> where its next pool update begins

    def release(self, key: Any) -> None:
        """Forgets a finished request (its private pool, where it has one)."""
        self._own.pop(key, None)
        self._start.pop(key, None)

    def pool_size(self) -> int:
        return len(self._public) + sum(len(pool) for pool in self._own.values())

    def draft(self, key: Any, tokens: list[int], room: int) -> list[int]:
        """Up to `room` draft tokens to follow `tokens` (the request's prompt + generated tokens)."""
        config = self.config
        length = len(tokens)
        if room <= 0:
            return []
        start = self._start.get(key)
        if start is None:
            start = 0
            if not config.is_public_pool:
                self._own[key] = {}
        pool = self._public if config.is_public_pool else self._own[key]
        longest = min(config.max_matching_ngram_size, length - 1)
        window = tokens[start:]
        self._learn(pool, window, longest)
        proposal: list[int] = []
        for size in range(longest, 0, -1):
            found = pool.get(tuple(tokens[-size:]))
            if found:
                proposal = list(found[0 if config.is_use_oldest else -1][:room])
                break
        self._start[key] = max(0, length - (config.max_draft_len + config.max_matching_ngram_size - 1))
        return proposal

    def _learn(self, pool: Pool, window: list[int], longest: int) -> None:
        keep_all, reach = self.config.is_keep_all, self.config.max_draft_len
        for size in range(longest, 0, -1):
            for left in range(len(window) - size):
                cut = left + size
                pattern = tuple(window[left:cut])
                follow = tuple(window[cut : min(cut + reach, len(window))])
                known = pool.get(pattern)
                if known is None or (not keep_all and len(follow) > len(known[0])):
                    pool[pattern] = [follow]
                elif follow not in known:
                    # a longer continuation drops the shorter ones it was found with
                    known[:] = [match for match in known if len(match) >= len(follow)]
                    known.append(follow)
