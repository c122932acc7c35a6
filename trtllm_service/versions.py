"""What is installed where the service runs: the service's own version, TensorRT-LLM's and the
running Triton's.

Read cheaply (package metadata, pyproject.toml, Triton's `GET /v2`), for the start-up log and check
(runtime.py), the OpenAPI document, pack.json and the doctor.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import urllib.request
from functools import lru_cache
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


@lru_cache(maxsize=1)
def service_version() -> str:
    """This service's version: its installed package's, else pyproject.toml's beside the package (a
    checkout or a Bento, which carries the file); "unknown" without either."""
    try:
        return importlib.metadata.version("trtllm-service")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        match = re.search(r'^version\s*=\s*"([^"]+)"', PYPROJECT.read_text(), re.MULTILINE)
    except OSError:
        match = None
    return match.group(1) if match else "unknown"


REQUIRE_TENSORRT_LLM = "TRTLLM_REQUIRE_TENSORRT_LLM"
"""Set (1) in the production image: never serve without TensorRT-LLM (the llmapi model's load fails,
the service will not start Triton without trtllm-llmapi-launch)."""


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
