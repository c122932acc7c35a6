"""Triton's side of /metrics: its restarts (counted by the owner), its own exposition appended to the
service's, the engine its `tensorrt_llm` model reports, and the engine's statistics under vLLM's names.

The engine's statistics reach Triton's exposition from the `tensorrt_llm` model (tensorrtllm_backend's
engine_metrics.py and standin/engine_stats.py): the llmapi model publishes trtllm-serve's names (`trtllm_kv_cache_utilization`,
`trtllm_kv_cache_reused_blocks_total`, ...), the C++ backend (real, or our stand-in in its slot) its
`nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type}` and `nv_trt_llm_request_metrics{request_type}`
gauges. `engine_metrics` restates them once, per scrape, as the names dashboards made for vLLM read
(`vllm:kv_cache_usage_perc` -> `trtllm:kv_cache_usage_perc`, prefix-cache hits and queries in tokens,
speculative drafts and tokens), labelled `model_name` as the service's own metrics are.
"""

from __future__ import annotations

import logging
import re

import httpx
from prometheus_client import Counter

from trtllm_service.triton.loopback import loopback_client

logger = logging.getLogger("trtllm_service.metrics")

TRITON_RESTARTS = Counter(
    "trtllm:triton_restarts",
    "Times the supervisor restarted Triton after it died or hung.",
    ["model_name"],
)


async def scrape_triton(metrics_url: str | None, timeout_s: float = 2.0) -> str | None:
    """Triton's Prometheus exposition, or None where there is no URL or Triton does not answer."""
    if not metrics_url:
        return None
    try:
        async with loopback_client(timeout_s) as client:
            response = await client.get(metrics_url)
            response.raise_for_status()
    except httpx.HTTPError as exc:
        logger.debug("Triton metrics unavailable: %s", exc)
        return None
    return response.text


async def append_triton_metrics(
    text: str,
    metrics_url: str | None,
    timeout_s: float = 2.0,
    model_name: str | None = None,
    waiting: int | None = None,
) -> str:
    """`text` followed by Triton's exposition (and, given the served `model_name`, the engine's
    statistics under vLLM's names: `engine_metrics`, with `waiting` requests of the service's own
    queue added to the engine's), or `text` alone when Triton does not answer."""
    triton = await scrape_triton(metrics_url, timeout_s)
    if triton is None:
        return text
    parts = [text, triton]
    if model_name is not None:
        parts.append(engine_metrics(triton, model_name, waiting))
    return "".join(part if not part or part.endswith("\n") else f"{part}\n" for part in parts if part)


# The engine's statistics as Triton exposes them: family, then the one label that tells the series
# apart where the family has one (the C++ backend's), then the value.
_ENGINE_SAMPLE = re.compile(
    r"^(trtllm_(?:kv_cache_\w+|num_requests_waiting|spec_decode_\w+)|nv_trt_llm_(?:kv_cache_block|request)_metrics)"
    r"(?:\{[^}]*?(?:kv_cache_block_type|request_type)=\"(\w+)\"[^}]*\}|\{[^}]*\})?\s+(\S+)\s*$",
    re.MULTILINE,
)

# vLLM's name (with our trtllm: prefix) -> (type, help).
ENGINE_METRICS: dict[str, tuple[str, str]] = {
    "trtllm:kv_cache_usage_perc": ("gauge", "KV-cache usage. 1 means 100 percent usage."),
    "trtllm:prefix_cache_queries": ("counter", "Prefix cache queries, in tokens (prompt blocks looked up)."),
    "trtllm:prefix_cache_hits": ("counter", "Prefix cache hits, in tokens (prompt blocks reused)."),
    "trtllm:num_requests_waiting": ("gauge", "Requests waiting: in the service's queue and the engine's."),
    "trtllm:spec_decode_num_drafts": ("counter", "Speculative decoding draft proposals."),
    "trtllm:spec_decode_num_draft_tokens": ("counter", "Speculative decoding draft tokens."),
    "trtllm:spec_decode_num_accepted_tokens": ("counter", "Speculative decoding accepted draft tokens."),
}


def engine_values(triton_text: str) -> dict[str, float]:
    """The engine's statistics in Triton's exposition, restated under ENGINE_METRICS' names (what
    the engine does not report is left out: the C++ backend counts no missed blocks, so no queries)."""
    found: dict[str, float] = {}
    for match in _ENGINE_SAMPLE.finditer(triton_text):
        family, label, raw = match.groups()
        try:
            value = float(raw)
        except ValueError:
            continue
        key = f"{family}:{label}" if label else family
        found[key] = found.get(key, 0.0) + value
    values: dict[str, float] = {}
    if "trtllm_kv_cache_utilization" in found:  # the llmapi model (trtllm-serve's names)
        values["trtllm:kv_cache_usage_perc"] = found["trtllm_kv_cache_utilization"]
    elif "nv_trt_llm_kv_cache_block_metrics:fraction" in found:  # the C++ backend's
        values["trtllm:kv_cache_usage_perc"] = found["nv_trt_llm_kv_cache_block_metrics:fraction"]
    per_block = found.get(
        "trtllm_kv_cache_tokens_per_block", found.get("nv_trt_llm_kv_cache_block_metrics:tokens_per")
    )
    reused = found.get(
        "trtllm_kv_cache_reused_blocks_total", found.get("nv_trt_llm_kv_cache_block_metrics:reused")
    )
    missed = found.get("trtllm_kv_cache_missed_blocks_total")
    if per_block and reused is not None:
        values["trtllm:prefix_cache_hits"] = reused * per_block
        if missed is not None:
            values["trtllm:prefix_cache_queries"] = (reused + missed) * per_block
    waiting = found.get("trtllm_num_requests_waiting", found.get("nv_trt_llm_request_metrics:waiting"))
    if waiting is not None:
        values["trtllm:num_requests_waiting"] = waiting
    for suffix in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        count = found.get(f"trtllm_spec_decode_{suffix}_total")
        if count is not None:
            values[f"trtllm:spec_decode_{suffix}"] = count
    return values


def engine_metrics(triton_text: str, model_name: str, waiting: int | None = None) -> str:
    """ENGINE_METRICS in Prometheus' text format, from Triton's exposition ("" when it has none);
    `waiting`: the requests in the service's queue (None: it has none), counted in
    `trtllm:num_requests_waiting` with the engine's."""
    label = model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    lines = []
    values = engine_values(triton_text)
    if waiting is not None:
        values["trtllm:num_requests_waiting"] = values.get("trtllm:num_requests_waiting", 0.0) + waiting
    for name, value in values.items():
        kind, help_text = ENGINE_METRICS[name]
        sample = f"{name}_total" if kind == "counter" else name
        lines += [
            f"# HELP {sample} {help_text}",  # as prometheus_client writes a counter: `_total` here too
            f"# TYPE {sample} {kind}",
            f'{sample}{{model_name="{label}"}} {value}',
        ]
    return "\n".join(lines) + "\n" if lines else ""


_ENGINE_INFO = re.compile(r'^trtllm_engine_info\{[^}]*engine="([^"]+)"[^}]*\}\s+1(\.0)?\s*$', re.MULTILINE)


async def served_engine(metrics_url: str | None, timeout_s: float = 2.0) -> str | None:
    """The engine Triton's `tensorrt_llm` model says it runs (its trtllm_engine_info gauge), if any."""
    triton = await scrape_triton(metrics_url, timeout_s)
    match = _ENGINE_INFO.search(triton) if triton is not None else None
    return match.group(1) if match else None
