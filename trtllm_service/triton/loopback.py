"""HTTP clients for Triton's own ports on this machine (probes, metrics, model configs).

Plain HTTP to 127.0.0.1: no TLS context, so no CA bundle read (httpx's default context loads it:
about 20 ms of CPU on the event loop per client, once a second for the probes), and no proxy from
the environment (HTTP_PROXY would otherwise carry a loopback request off the machine).
"""

from __future__ import annotations

import httpx


def loopback_client(timeout_s: float) -> httpx.AsyncClient:
    """An httpx client for Triton's HTTP ports; use it in `async with`."""
    return httpx.AsyncClient(timeout=timeout_s, verify=False, trust_env=False)
