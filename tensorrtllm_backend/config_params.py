"""Reading a Triton model's config.pbtxt parameters, as every one of our Python models reads them.

Copied beside model.py (repository.SHARED_MODULES) for every Python model of the ensemble flavour:
preprocessing, postprocessing, tensorrt_llm_bls and the stand-in in the `tensorrt_llm` slot.
"""

from __future__ import annotations

from typing import Any


def param(model_config: dict[str, Any], key: str, default: str = "") -> str:
    """A string parameter of config.pbtxt; unfilled `${var}` placeholders count as unset."""
    value = model_config.get("parameters", {}).get(key, {}).get("string_value", "")
    return default if not value or value.startswith("${") else value
