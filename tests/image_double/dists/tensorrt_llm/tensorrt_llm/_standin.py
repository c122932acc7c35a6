"""Where the double finds the stand-in LLM API: the llmapi Triton model's own modules (llm_standin,
sources: tensorrtllm_backend/standin/, copied beside its model.py), on sys.path inside that model's
Python backend stub only."""

from typing import Any


def standin_attr(name: str) -> Any:
    try:
        import llm_standin
    except ImportError as exc:
        raise ImportError(
            "the image double's tensorrt_llm serves through the llmapi model's llm_standin.py, "
            "importable only inside that Triton model"
        ) from exc
    return getattr(llm_standin, name)
