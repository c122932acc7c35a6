"""The service's tokenizer, read without PyTorch (tensorrtllm_backend/config_params.py says why).

transformers decides which frameworks to import from os.environ, once, when first imported: the
variables that keep PyTorch out are in os.environ for that import only. Triton starts meanwhile, and
its engines (NVIDIA's and the stand-ins) need PyTorch: a child process gets its environment from
`environ_for_children()`, os.environ as it was before the import changed it. Only the snapshot's
taking and reading are under `_SNAPSHOT_LOCK`, so Triton's start does not wait for the import (1-2 s
on 2 cores) and the event loop that starts it is not held.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from tensorrtllm_backend.config_params import auto_tokenizer

_SNAPSHOT_LOCK = threading.Lock()
"""Guards `_environ_before_import`: taken, cleared and read under it, never held for the import."""
_environ_before_import: dict[str, str] | None = None
"""os.environ as it was when transformers' import began, until the import has put it back."""
_IMPORT_LOCK = threading.Lock()
"""Held for `tokenizer_class()`'s whole call."""


def environ_for_children() -> dict[str, str]:
    """A copy of os.environ for a child process: without config_params.WITHOUT_TORCH while the
    tokenizer's import has it there."""
    with _SNAPSHOT_LOCK:
        return dict(_environ_before_import if _environ_before_import is not None else os.environ)


def tokenizer_class() -> Any:
    """transformers' AutoTokenizer, transformers imported without PyTorch (pack time reads the
    tokenizer with it too: as the Triton models and the worker read it, and seconds sooner)."""
    global _environ_before_import
    with _IMPORT_LOCK:  # one import at a time: each saves and puts back os.environ
        with _SNAPSHOT_LOCK:
            _environ_before_import = dict(os.environ)
        try:
            return auto_tokenizer()  # puts os.environ back before it returns or raises
        finally:
            with _SNAPSHOT_LOCK:
                _environ_before_import = None


def load_tokenizer(path: Path) -> Any:
    """The tokenizer saved under `path` (transformers' AutoTokenizer)."""
    return tokenizer_class().from_pretrained(str(path))
