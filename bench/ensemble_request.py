"""A request straight to Triton's `ensemble` (text in, streamed text out), as upstream's clients send
it: bench/loadgen.py's `direct` target, the baseline the service is measured against. Bench only:
the service never sends one (it talks to the `tensorrt_llm` model: trtllm_service.relay.request).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields

from trtllm_service.relay.request import GenerationRequest, TensorSpec, _message

ENSEMBLE_INPUTS: Mapping[str, TensorSpec] = {
    "max_tokens": TensorSpec("max_tokens", "INT32"),
    "temperature": TensorSpec("temperature", "FP32"),
    "top_k": TensorSpec("top_k", "INT32"),
    "top_p": TensorSpec("top_p", "FP32"),
    "repetition_penalty": TensorSpec("repetition_penalty", "FP32"),
    "presence_penalty": TensorSpec("presence_penalty", "FP32"),
    "frequency_penalty": TensorSpec("frequency_penalty", "FP32"),
    "min_tokens": TensorSpec("min_tokens", "INT32"),
    "seed": TensorSpec("seed", "UINT64"),
    "end_id": TensorSpec("end_id", "INT32"),
    "guide_type": TensorSpec("guided_decoding_guide_type", "BYTES"),
    "guide": TensorSpec("guided_decoding_guide", "BYTES"),
}
"""GenerationRequest field -> input of the upstream-compatible `ensemble` (text in, `text_input`)."""
assert set(ENSEMBLE_INPUTS) <= {field.name for field in fields(GenerationRequest)}

ENSEMBLE_FIXED: Mapping[str, tuple[TensorSpec, object]] = {"stream": (TensorSpec("stream", "BOOL"), True)}


def ensemble_message(prompt: str, request: GenerationRequest, request_id: str) -> bytes:
    """The serialized ModelInferRequest of a text prompt for the `ensemble` (streamed text out)."""
    text = (TensorSpec("text_input", "BYTES"), prompt)
    return _message(
        "ensemble", request_id, request, ENSEMBLE_INPUTS, ENSEMBLE_FIXED, ("text_output",), (text,)
    )
