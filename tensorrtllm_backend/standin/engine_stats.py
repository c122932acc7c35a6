"""Our stand-in engines' statistics, as TensorRT-LLM states them, and the C++ backend's metrics.

`snapshot` makes one iteration-stats dict of a stand-in engine, the dict TensorRT-LLM's LLM API
returns from `llm.get_stats` (engine_metrics.py describes it; the llmapi model publishes it under
trtllm-serve's names, whichever engine serves). The ensemble's stand-in publishes it under the C++
backend's own families instead (inflight_batcher_llm custom_metrics_reporter),
`nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type}`, `nv_trt_llm_request_metrics{request_type}`,
`nv_trt_llm_inflight_batcher_metrics{...}`, `nv_trt_llm_general_metrics{general_type}`, all gauges
(`cpp_backend_metrics`, `CppBackendStats`), so the service reads one set of names whether NVIDIA's
backend or our stand-in serves.

No Triton import: triton_adapter.MetricsPublisher puts the values into Triton's metric families.
"""

from __future__ import annotations

import time
from typing import Any

from engine_metrics import GAUGE, number

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
        step: dict[str, float] = {key: value - last_spec.get(key, 0) for key, value in now.items()}
        last_spec.update(now)
        drafts = step["numRequestsWithDraftTokens"]
        step["acceptanceLength"] = 1.0 + step["numAcceptedTokens"] / drafts if drafts else 0.0
        stats["specDecodingStats"] = step
    return stats


def cpp_backend_metrics(stats: dict[str, Any]) -> dict[tuple[str, str], float]:
    """One iteration's stats -> {(family, label value): value} of the C++ backend's gauge families,
    each as its reporter fills it (`fraction` = used / max; `reused` the cumulative reused blocks)."""
    values: dict[tuple[str, str], float] = {}
    active = number(stats.get("numActiveRequests")) or 0.0
    values[("nv_trt_llm_request_metrics", "active")] = active
    values[("nv_trt_llm_request_metrics", "max")] = number(stats.get("maxNumActiveRequests")) or 0.0
    values[("nv_trt_llm_request_metrics", "scheduled")] = active
    values[("nv_trt_llm_request_metrics", "context")] = 0.0  # prompts are prefilled within a step
    values[("nv_trt_llm_request_metrics", "waiting")] = number(stats.get("numQueuedRequests")) or 0.0
    kv = stats.get("kvCacheStats")
    if isinstance(kv, dict):
        total = number(kv.get("maxNumBlocks")) or 0.0
        used = number(kv.get("usedNumBlocks")) or 0.0
        family = "nv_trt_llm_kv_cache_block_metrics"
        values[(family, "max")] = total
        values[(family, "free")] = number(kv.get("freeNumBlocks")) or 0.0
        values[(family, "used")] = used
        values[(family, "tokens_per")] = number(kv.get("tokensPerBlock")) or 0.0
        values[(family, "reused")] = number(kv.get("reusedBlocks")) or 0.0
        values[(family, "fraction")] = used / total if total else 0.0
    family = "nv_trt_llm_inflight_batcher_metrics"
    values[(family, "total_context_tokens")] = 0.0
    values[(family, "generation_requests")] = active
    values[(family, "micro_batch_id")] = 0.0
    values[(family, "paused_requests")] = 0.0
    values[("nv_trt_llm_general_metrics", "iteration_counter")] = number(stats.get("iter")) or 0.0
    values[("nv_trt_llm_general_metrics", "timestamp")] = time.time() * 1e6  # microseconds, as the backend
    return values


class CppBackendStats:
    """The ensemble stand-in's iteration stats as triton_adapter.MetricsPublisher publishes them: the
    C++ backend's gauge families of the newest iteration, labelled as its reporter labels them."""

    @staticmethod
    def labels(model_name: str, engine: str) -> dict[str, str]:
        return {"model": model_name, "version": "1"}

    def metrics(self, iterations: list[dict[str, Any]]) -> list[tuple[str, str, str, Any, float]]:
        """(family, kind, description, (label, label value), value) rows."""
        rows = []
        for (name, value_label), value in cpp_backend_metrics(iterations[-1]).items():
            description, label, _ = CPP_FAMILIES[name]
            rows.append((name, GAUGE, description, (label, value_label), value))
        return rows
