"""Triton's side of /metrics: its restarts (counted by the owner), its own exposition appended to the
service's, and the engine its `tensorrt_llm` model reports."""

from __future__ import annotations

import logging
import re

import httpx
from prometheus_client import Counter

logger = logging.getLogger("trtllm_service.metrics")

TRITON_RESTARTS = Counter(
    "trtllm:triton_restarts",
    "Times the supervisor restarted Triton after it died or hung.",
    ["model_name"],
)


async def append_triton_metrics(text: str, metrics_url: str | None, timeout_s: float = 2.0) -> str:
    """`text` followed by Triton's exposition, or `text` alone when Triton does not answer."""
    if not metrics_url:
        return text
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.get(metrics_url)
            response.raise_for_status()
    except httpx.HTTPError as exc:
        logger.debug("Triton metrics unavailable: %s", exc)
        return text
    separator = "" if not text or text.endswith("\n") else "\n"
    return f"{text}{separator}{response.text}"


_ENGINE_INFO = re.compile(r'^trtllm_engine_info\{[^}]*engine="([^"]+)"[^}]*\}\s+1(\.0)?\s*$', re.MULTILINE)


async def served_engine(metrics_url: str | None, timeout_s: float = 2.0) -> str | None:
    """The engine Triton's `tensorrt_llm` model says it runs (its trtllm_engine_info gauge), if any."""
    if not metrics_url:
        return None
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.get(metrics_url)
            response.raise_for_status()
    except httpx.HTTPError:
        return None
    match = _ENGINE_INFO.search(response.text)
    return match.group(1) if match else None
