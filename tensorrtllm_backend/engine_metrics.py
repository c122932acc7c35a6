"""The LLM API's iteration stats as the llmapi model publishes them: trtllm-serve's metric names.

Iteration stats are the dicts TensorRT-LLM's LLM API returns from `llm.get_stats(timeout)` (1.2.1,
with `enable_iter_perf_stats: true`; one dict per executor iteration since the last call):
`iter`, `iterLatencyMS`, `numActiveRequests`, `numQueuedRequests`, `maxNumActiveRequests`,
`kvCacheStats` {maxNumBlocks, freeNumBlocks, usedNumBlocks, tokensPerBlock, allocTotalBlocks,
allocNewBlocks, reusedBlocks, missedBlocks, cacheHitRate} (the block counts cumulative, as the block
manager keeps them) and, with speculative decoding, `specDecodingStats` {numDraftTokens,
numAcceptedTokens, numRequestsWithDraftTokens, acceptanceLength, iterLatencyMS, draftOverhead} (this
iteration's). Our stand-in engines make the same dicts from their own state (standin/engine_stats.py,
which also maps them to the C++ backend's families for the ensemble's stand-in).

The llmapi model publishes them under trtllm-serve's names (tensorrt_llm/metrics/collector.py) as
Triton custom metrics: `trtllm_kv_cache_utilization`, `trtllm_kv_cache_hit_rate`,
`trtllm_kv_cache_*_blocks`, `trtllm_num_requests_running|waiting`, `trtllm_spec_decode_*`
(`LlmApiStats`), whether TensorRT-LLM or a stand-in serves.

No Triton import: triton_adapter.MetricsPublisher puts the values into Triton's metric families,
row by row as `metrics()` gives them: (family, kind, description, extra label or None, value).
"""

from __future__ import annotations

from typing import Any

GAUGE, COUNTER = "gauge", "counter"

LLMAPI_FAMILIES: dict[str, tuple[str, str]] = {
    "trtllm_kv_cache_utilization": (GAUGE, "KV cache utilization (used / max blocks)"),
    "trtllm_kv_cache_hit_rate": (GAUGE, "KV cache hit rate (reused / (reused + missed) blocks)"),
    "trtllm_kv_cache_max_blocks": (GAUGE, "KV cache blocks in all"),
    "trtllm_kv_cache_free_blocks": (GAUGE, "KV cache blocks free"),
    "trtllm_kv_cache_used_blocks": (GAUGE, "KV cache blocks in use"),
    "trtllm_kv_cache_tokens_per_block": (GAUGE, "Tokens per KV cache block"),
    "trtllm_kv_cache_reused_blocks_total": (COUNTER, "KV cache blocks reused (prefix cache hits)"),
    "trtllm_kv_cache_missed_blocks_total": (COUNTER, "KV cache blocks missed (prompt blocks computed)"),
    "trtllm_num_requests_running": (GAUGE, "Requests the executor runs"),
    "trtllm_num_requests_waiting": (GAUGE, "Requests queued in the executor"),
    "trtllm_iteration_latency_seconds": (GAUGE, "The last executor iteration's latency"),
    "trtllm_spec_decode_num_drafts_total": (
        COUNTER,
        "Draft proposals (requests with draft tokens, per iteration)",
    ),
    "trtllm_spec_decode_num_draft_tokens_total": (COUNTER, "Draft tokens proposed"),
    "trtllm_spec_decode_num_accepted_tokens_total": (COUNTER, "Draft tokens accepted"),
    "trtllm_spec_decode_acceptance_length": (
        GAUGE,
        "Tokens per step of the requests with drafts, last iteration",
    ),
}
"""llmapi flavour: family name -> (kind, description). trtllm-serve's names (TensorRT-LLM main's
collector.py) except `trtllm_spec_decode_num_drafts_total`, ours, for vLLM's `num_drafts`."""


def number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class CumulativeCounter:
    """Turns a cumulative count (the block manager's) into the increments a Triton counter takes;
    a count that went down (the executor restarted) starts over from it."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: float | None = None

    def step(self, value: float) -> float:
        last, self.last = self.last, value
        if last is None or value < last:
            return value
        return value - last


class LlmApiStats:
    """Iteration stats -> (gauges to set, counters to increment) under LLMAPI_FAMILIES' names.
    Gauges come from the newest iteration; per-iteration speculative counts are summed; keys an
    iteration lacks publish nothing (no KV stats from the synthetic engine, no speculation)."""

    def __init__(self) -> None:
        self._reused = CumulativeCounter()
        self._missed = CumulativeCounter()

    def values(self, iterations: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
        gauges: dict[str, float] = {}
        counters: dict[str, float] = {}
        if not iterations:
            return gauges, counters
        last = iterations[-1]
        for key, name in (
            ("numActiveRequests", "trtllm_num_requests_running"),
            ("numQueuedRequests", "trtllm_num_requests_waiting"),
        ):
            value = number(last.get(key))
            if value is not None:
                gauges[name] = value
        latency = number(last.get("iterLatencyMS"))
        if latency is not None:
            gauges["trtllm_iteration_latency_seconds"] = latency / 1000.0
        kv = last.get("kvCacheStats")
        if isinstance(kv, dict):
            self._kv(kv, gauges, counters)
        for stats in iterations:
            spec = stats.get("specDecodingStats")
            if not isinstance(spec, dict):
                continue
            for key, name in (
                ("numRequestsWithDraftTokens", "trtllm_spec_decode_num_drafts_total"),
                ("numDraftTokens", "trtllm_spec_decode_num_draft_tokens_total"),
                ("numAcceptedTokens", "trtllm_spec_decode_num_accepted_tokens_total"),
            ):
                counters[name] = counters.get(name, 0.0) + (number(spec.get(key)) or 0.0)
            if (number(spec.get("numRequestsWithDraftTokens")) or 0) > 0:
                length = number(spec.get("acceptanceLength"))
                if length is not None:
                    gauges["trtllm_spec_decode_acceptance_length"] = length
        return gauges, counters

    def _kv(self, kv: dict[str, Any], gauges: dict[str, float], counters: dict[str, float]) -> None:
        for key, name in (
            ("maxNumBlocks", "trtllm_kv_cache_max_blocks"),
            ("freeNumBlocks", "trtllm_kv_cache_free_blocks"),
            ("usedNumBlocks", "trtllm_kv_cache_used_blocks"),
            ("tokensPerBlock", "trtllm_kv_cache_tokens_per_block"),
            ("cacheHitRate", "trtllm_kv_cache_hit_rate"),
        ):
            value = number(kv.get(key))
            if value is not None:
                gauges[name] = value
        total, used = number(kv.get("maxNumBlocks")), number(kv.get("usedNumBlocks"))
        if total and used is not None:
            gauges["trtllm_kv_cache_utilization"] = used / total
        for key, name, counter in (
            ("reusedBlocks", "trtllm_kv_cache_reused_blocks_total", self._reused),
            ("missedBlocks", "trtllm_kv_cache_missed_blocks_total", self._missed),
        ):
            value = number(kv.get(key))
            if value is not None:
                counters[name] = counter.step(value)

    @staticmethod
    def labels(model_name: str, engine: str) -> dict[str, str]:
        """The labels of every family: the model and the engine that serves it."""
        return {"model": model_name, "engine": engine}

    def metrics(self, iterations: list[dict[str, Any]]) -> list[tuple[str, str, str, Any, float]]:
        """(family, kind, description, None, value) rows of `values`: the gauges, then the counters."""
        gauges, counters = self.values(iterations)
        rows = [(name, GAUGE, LLMAPI_FAMILIES[name][1], None, value) for name, value in gauges.items()]
        rows += [(name, COUNTER, LLMAPI_FAMILIES[name][1], None, value) for name, value in counters.items()]
        return rows
