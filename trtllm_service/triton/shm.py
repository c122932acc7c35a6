"""The shared memory of a stopped Triton's Python backend, removed.

Each Python-backend model instance talks to its stub process through a POSIX shared-memory region,
`/dev/shm/<prefix><pid>_<uuid>` (the prefix is the `shm-region-prefix-name` on tritonserver's
command line: the launcher makes it one per service worker and rank). A Triton that is killed (a
crash, a stall, a stop past its timeout) never unlinks its regions: 1-3 MB each, kept until the
machine restarts, one more with every restart. Once a run has stopped, its owner removes what is
left under that run's own prefixes, and nothing else.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger("trtllm_service.triton")

SHM_DIR = Path("/dev/shm")
PREFIX_OPTION = "shm-region-prefix-name="


def region_prefixes(command: Sequence[str]) -> list[str]:
    """The Python backend's shared-memory prefixes a Triton command line sets (one per rank)."""
    found = []
    for arg in command:
        if PREFIX_OPTION in arg:
            prefix = arg.split(PREFIX_OPTION, 1)[1].split(",", 1)[0]
            if prefix and "/" not in prefix:
                found.append(prefix)
    return found


def remove_regions(command: Sequence[str], shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlinks the shared-memory regions left by the stopped Triton that `command` started; the
    names removed. A process that still maps one keeps its memory until it exits."""
    removed = []
    for prefix in region_prefixes(command):
        for region in shm_dir.glob(f"{prefix}*"):
            with contextlib.suppress(OSError):
                region.unlink()
                removed.append(region.name)
    if removed:
        logger.debug("removed %d shared-memory regions of a stopped Triton: %s", len(removed), removed)
    return removed
