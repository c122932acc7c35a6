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


def load_tokenizer(path: Path) -> Any:
    """The tokenizer saved under `path` (transformers' AutoTokenizer)."""
    with ENVIRON_LOCK:
        tokenizer_class = auto_tokenizer()
    return tokenizer_class.from_pretrained(str(path))
