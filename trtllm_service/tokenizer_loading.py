"""The service's tokenizer, read without PyTorch (tensorrtllm_backend/config_params.py says why).

transformers decides which frameworks to import from os.environ, once, when first imported: the
variables that keep PyTorch out are there for that import only. Triton starts meanwhile, and its
stand-in engines need PyTorch: `ENVIRON_LOCK` is held for the import, and whoever copies os.environ
for a child process holds it too (triton/process.py).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tensorrtllm_backend.config_params import auto_tokenizer

ENVIRON_LOCK = threading.Lock()
"""Held while os.environ may carry config_params.WITHOUT_TORCH: hold it to copy os.environ for a child."""


def tokenizer_class() -> Any:
    """transformers' AutoTokenizer, transformers imported without PyTorch (pack time reads the
    tokenizer with it too: as the Triton models and the worker read it, and seconds sooner)."""
    with ENVIRON_LOCK:
        return auto_tokenizer()


def load_tokenizer(path: Path) -> Any:
    """The tokenizer saved under `path` (transformers' AutoTokenizer)."""
    return tokenizer_class().from_pretrained(str(path))
