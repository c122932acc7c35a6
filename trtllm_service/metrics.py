"""Triton's Prometheus metrics, appended to the service's own `/metrics`.

One scrape then covers both: BentoML's request metrics and Triton's (queue and compute times,
`nv_inference_*`, the engine's counters). Triton being down must not break `/metrics`.
"""

from __future__ import annotations

import logging

import httpx

logger = logging.getLogger("trtllm_service.metrics")


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
