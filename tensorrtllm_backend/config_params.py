"""Reading a Triton model's config.pbtxt parameters, as every one of our Python models reads them,
and the tokenizer they name, read without PyTorch.

Copied beside model.py (repository.SHARED_MODULES) for every Python model of the ensemble flavour:
preprocessing, postprocessing, tensorrt_llm_bls and the stand-in in the `tensorrt_llm` slot.
"""

from __future__ import annotations

import os
from typing import Any

WITHOUT_TORCH = {
    "USE_TORCH": "0",
    "USE_TF": "0",
    "USE_FLAX": "0",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",  # else: "None of PyTorch, TensorFlow >= 2.0, or Flax ..."
}
"""What transformers reads once, when first imported, to choose the frameworks it imports: none."""


def param(model_config: dict[str, Any], key: str, default: str = "") -> str:
    """A string parameter of config.pbtxt; unfilled `${var}` placeholders count as unset."""
    value = model_config.get("parameters", {}).get(key, {}).get("string_value", "")
    return default if not value or value.startswith("${") else value


def tokenizer(model_config: dict[str, Any], model: str) -> Any:
    """The tokenizer in the `tokenizer_dir` parameter's folder; TritonModelException naming `model`
    when the parameter is unset."""
    import triton_python_backend_utils as pb_utils

    directory = param(model_config, "tokenizer_dir")
    if not directory:
        raise pb_utils.TritonModelException(f"{model}: parameter tokenizer_dir is not set")
    return auto_tokenizer().from_pretrained(directory)


def auto_tokenizer() -> Any:
    """transformers' AutoTokenizer, transformers imported without PyTorch unless this process
    imported it before. With PyTorch installed (NVIDIA's image), transformers imports it, and
    through its generation utilities scikit-learn, pandas and SciPy: seconds of start and about
    390 MB in a process that only tokenizes. `WITHOUT_TORCH` is in os.environ for that import
    only; a caller with other threads keeps them from starting a process meanwhile."""
    saved = {name: os.environ.get(name) for name in WITHOUT_TORCH}
    os.environ.update(WITHOUT_TORCH)
    try:
        from transformers import AutoTokenizer
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return AutoTokenizer
