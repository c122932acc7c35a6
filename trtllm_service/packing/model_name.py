"""The BentoML model's name: the one asked for (--name), checked, or one made from the source."""

from __future__ import annotations

import re

from trtllm_service.packed_model import PackError
from trtllm_service.packing.sources import ModelSource

_TAG_NAME = re.compile(r"^[a-z0-9]([-._a-z0-9]*[a-z0-9])?$")
_TAG_MAX_LENGTH = 63


def validate_name(name: str) -> str:
    """Returns ``name`` if it is a valid BentoML model name (no version), else raises PackError."""
    if len(name) > _TAG_MAX_LENGTH or not _TAG_NAME.match(name):
        raise PackError(
            f"--name {name!r} is not a valid BentoML model name: use at most {_TAG_MAX_LENGTH} lowercase "
            "letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        )
    return name


def default_name(source: ModelSource) -> str:
    """``trtllm-demo``, or ``trtllm-<source dir name>`` made into a valid model name."""
    if source.mode == "demo":
        return "trtllm-demo"
    stem = re.sub(r"[^a-z0-9._-]+", "-", source.directory.name.lower())
    name = f"trtllm-{stem}"[:_TAG_MAX_LENGTH]
    name = re.sub(r"[^a-z0-9]+$", "", name)
    return name if _TAG_NAME.match(name) else "trtllm-model"
