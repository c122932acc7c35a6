"""Reading a Triton model's config.pbtxt parameters, as every one of our Python models reads them,
and the tokenizer they name.

Copied beside model.py (repository.SHARED_MODULES) for every Python model of the ensemble flavour:
preprocessing, postprocessing, tensorrt_llm_bls and the stand-in in the `tensorrt_llm` slot.
"""

from __future__ import annotations

from typing import Any


def param(model_config: dict[str, Any], key: str, default: str = "") -> str:
    """A string parameter of config.pbtxt; unfilled `${var}` placeholders count as unset."""
    value = model_config.get("parameters", {}).get(key, {}).get("string_value", "")
    return default if not value or value.startswith("${") else value


def tokenizer(model_config: dict[str, Any], model: str) -> Any:
    """The tokenizer in the `tokenizer_dir` parameter's folder; TritonModelException naming `model`
    when the parameter is unset."""
    import triton_python_backend_utils as pb_utils
    from transformers import AutoTokenizer

    directory = param(model_config, "tokenizer_dir")
    if not directory:
        raise pb_utils.TritonModelException(f"{model}: parameter tokenizer_dir is not set")
    return AutoTokenizer.from_pretrained(directory)
