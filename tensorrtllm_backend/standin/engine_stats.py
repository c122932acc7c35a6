"""The engine's statistics as TensorRT-LLM states them, and as the metrics each flavour publishes.

Iteration stats are the dicts TensorRT-LLM's LLM API returns from `llm.get_stats(timeout)` (1.2.1,
with `enable_iter_perf_stats: true`; one dict per executor iteration since the last call):
`iter`, `iterLatencyMS`, `numActiveRequests`, `numQueuedRequests`, `maxNumActiveRequests`,
`kvCacheStats` {maxNumBlocks, freeNumBlocks, usedNumBlocks, tokensPerBlock, allocTotalBlocks,
allocNewBlocks, reusedBlocks, missedBlocks, cacheHitRate} (the block counts cumulative, as the block
manager keeps them) and, with speculative decoding, `specDecodingStats` {numDraftTokens,
numAcceptedTokens, numRequestsWithDraftTokens, acceptanceLength, iterLatencyMS, draftOverhead} (this
iteration's). Our stand-in engines make the same dicts from their own state (`snapshot`).

What is published from them:
- llmapi flavour: trtllm-serve's names (tensorrt_llm/metrics/collector.py) as Triton custom
  metrics, `trtllm_kv_cache_utilization`, `trtllm_kv_cache_hit_rate`, `trtllm_kv_cache_*_blocks`,
  `trtllm_num_requests_running|waiting`, `trtllm_spec_decode_*` (`llmapi_metrics`).
- ensemble flavour: the C++ backend's own families (inflight_batcher_llm custom_metrics_reporter),
  `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type}`, `nv_trt_llm_request_metrics{request_type}`,
  `nv_trt_llm_inflight_batcher_metrics{...}`, `nv_trt_llm_general_metrics{general_type}`, all gauges
  (`cpp_backend_metrics`), so the service reads one set of names whether the real backend or our
  stand-in serves.

No Triton import: triton_adapter.StatsPublisher puts the values into Triton's metric families.
"""

from __future__ import annotations

import time
from typing import Any

SPEC_COUNTERS = {
    "draft_tokens": "numDraftTokens",
    "accepted_draft_tokens": "numAcceptedTokens",
    "verify_passes": "numRequestsWithDraftTokens",
}
"""A speculating engine's counters (its token source's `speculative_counters()`, cumulative since it
started: draft tokens proposed, of them accepted, and verification passes, one per sequence with
drafts per step, vLLM's `num_drafts`) -> the specDecodingStats key. A snapshot turns them into the
counts since the last one, as TensorRT-LLM's per-iteration specDecodingStats are; an engine without
them (or without drafts yet) reports no specDecodingStats."""

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

CPP_FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "nv_trt_llm_request_metrics": (
        "TRT LLM request metrics",
        "request_type",
        ("active", "max", "scheduled", "context", "waiting"),
    ),
    "nv_trt_llm_kv_cache_block_metrics": (
        "TRT LLM KV cache block metrics",
        "kv_cache_block_type",
        ("max", "free", "used", "tokens_per", "reused", "fraction"),
    ),
    "nv_trt_llm_inflight_batcher_metrics": (
        "TRT LLM inflight_batcher-specific metrics",
        "inflight_batcher_specific_metric",
        ("total_context_tokens", "generation_requests", "micro_batch_id", "paused_requests"),
    ),
    "nv_trt_llm_general_metrics": (
        "General TRT LLM metrics",
        "general_type",
        ("timestamp", "iteration_counter"),
    ),
}
"""ensemble flavour: the C++ backend's gauge families: name -> (description, label, label values)."""


def snapshot(loop: Any, source: Any, last_spec: dict[str, int]) -> dict[str, Any]:
    """One iteration-stats dict of a stand-in engine: the loop's counts (`iterations`, `num_active`,
    `num_waiting`, `iteration_s`), the source's `capacity` and `kv_cache_stats()`, and the
    speculative counts since the last snapshot (SPEC_COUNTERS; `last_spec` keeps the previous
    ones). What the source does not have is left out."""
    stats: dict[str, Any] = {
        "iter": int(getattr(loop, "iterations", 0)),
        "iterLatencyMS": float(getattr(loop, "iteration_s", 0.0)) * 1000.0,
        "numActiveRequests": int(getattr(loop, "num_active", 0)),
        "numQueuedRequests": int(getattr(loop, "num_waiting", 0)),
        "maxNumActiveRequests": int(getattr(source, "capacity", None) or 0),
        "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
    }
    kv = getattr(source, "kv_cache_stats", None)
    if kv is not None:
        stats["kvCacheStats"] = kv()
    spec = getattr(source, "speculative_counters", None)
    counts = spec() if spec is not None else None
    if counts and counts.get("draft_tokens"):
        now = {key: int(counts.get(name, 0)) for name, key in SPEC_COUNTERS.items()}
        step = {key: value - last_spec.get(key, 0) for key, value in now.items()}
        last_spec.update(now)
        drafts = step["numRequestsWithDraftTokens"]
        step["acceptanceLength"] = 1.0 + step["numAcceptedTokens"] / drafts if drafts else 0.0
        stats["specDecodingStats"] = step
    return stats


def _number(value: Any) -> float | None:
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
            value = _number(last.get(key))
            if value is not None:
                gauges[name] = value
        latency = _number(last.get("iterLatencyMS"))
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
                counters[name] = counters.get(name, 0.0) + (_number(spec.get(key)) or 0.0)
            if (_number(spec.get("numRequestsWithDraftTokens")) or 0) > 0:
                length = _number(spec.get("acceptanceLength"))
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
            value = _number(kv.get(key))
            if value is not None:
                gauges[name] = value
        total, used = _number(kv.get("maxNumBlocks")), _number(kv.get("usedNumBlocks"))
        if total and used is not None:
            gauges["trtllm_kv_cache_utilization"] = used / total
        for key, name, counter in (
            ("reusedBlocks", "trtllm_kv_cache_reused_blocks_total", self._reused),
            ("missedBlocks", "trtllm_kv_cache_missed_blocks_total", self._missed),
        ):
            value = _number(kv.get(key))
            if value is not None:
                counters[name] = counter.step(value)


def cpp_backend_metrics(stats: dict[str, Any]) -> dict[tuple[str, str], float]:
    """One iteration's stats -> {(family, label value): value} of the C++ backend's gauge families,
    each as its reporter fills it (`fraction` = used / max; `reused` the cumulative reused blocks)."""
    values: dict[tuple[str, str], float] = {}
    active = _number(stats.get("numActiveRequests")) or 0.0
    values[("nv_trt_llm_request_metrics", "active")] = active
    values[("nv_trt_llm_request_metrics", "max")] = _number(stats.get("maxNumActiveRequests")) or 0.0
    values[("nv_trt_llm_request_metrics", "scheduled")] = active
    values[("nv_trt_llm_request_metrics", "context")] = 0.0  # prompts are prefilled within a step
    values[("nv_trt_llm_request_metrics", "waiting")] = _number(stats.get("numQueuedRequests")) or 0.0
    kv = stats.get("kvCacheStats")
    if isinstance(kv, dict):
        total = _number(kv.get("maxNumBlocks")) or 0.0
        used = _number(kv.get("usedNumBlocks")) or 0.0
        family = "nv_trt_llm_kv_cache_block_metrics"
        values[(family, "max")] = total
        values[(family, "free")] = _number(kv.get("freeNumBlocks")) or 0.0
        values[(family, "used")] = used
        values[(family, "tokens_per")] = _number(kv.get("tokensPerBlock")) or 0.0
        values[(family, "reused")] = _number(kv.get("reusedBlocks")) or 0.0
        values[(family, "fraction")] = used / total if total else 0.0
    family = "nv_trt_llm_inflight_batcher_metrics"
    values[(family, "total_context_tokens")] = 0.0
    values[(family, "generation_requests")] = active
    values[(family, "micro_batch_id")] = 0.0
    values[(family, "paused_requests")] = 0.0
    values[("nv_trt_llm_general_metrics", "iteration_counter")] = _number(stats.get("iter")) or 0.0
    values[("nv_trt_llm_general_metrics", "timestamp")] = time.time() * 1e6  # microseconds, as the backend
    return values
