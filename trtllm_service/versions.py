"""What is installed where the service runs: TensorRT-LLM's version and the running Triton's.

Read cheaply (package metadata, Triton's `GET /v2`), for the start-up log and check (runtime.py) and
for the doctor.
"""

from __future__ import annotations

import importlib.metadata
import json
import urllib.request


def installed_tensorrt_llm() -> str | None:
    """The installed TensorRT-LLM's version, without importing it (None: not installed)."""
    try:
        return importlib.metadata.version("tensorrt_llm")
    except importlib.metadata.PackageNotFoundError:
        return None


def triton_version(http_url: str | None) -> str | None:
    """The version Triton reports in its server metadata (None when it cannot be asked)."""
    if http_url is None:
        return None
    try:
        with urllib.request.urlopen(f"{http_url}/v2", timeout=5) as response:
            return str(json.loads(response.read()).get("version") or "") or None
    except (OSError, ValueError):
        return None
