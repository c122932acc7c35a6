"""The image double's `tensorrt_llm` 1.2.1: NVIDIA's package surface that the llmapi model uses, served
by our stand-in LLM API (llm_standin.py, importable inside the llmapi Triton model) over the synthetic
engine, with the two load-time rules of the real package that no stand-in elsewhere models:

- loading a model imports `tensorrt_llm.serve`, which needs an openai with `PartReasoningText`;
- the LLM spawns its executor worker only in a process started by `trtllm-llmapi-launch`.

Everything else (argument validation, sampling, streaming) is the stand-in's, as strict as 1.2.1.
"""

import torch  # noqa: F401  (the real package imports torch first)

__version__ = "1.2.1"

_STANDIN = {"SamplingParams": "SamplingParams"}


def __getattr__(name: str):
    if name == "LLM":
        from tensorrt_llm.llmapi import LLM

        return LLM
    if name in _STANDIN:
        from tensorrt_llm._standin import standin_attr

        return standin_attr(_STANDIN[name])
    raise AttributeError(f"module 'tensorrt_llm' (the image double) has no attribute {name!r}")
