"""Requests to the llmapi flavour's `tensorrt_llm` model over gRPC, as upstream's clients send them
to NVIDIA's llmapi model (`text_input` or `input_ids`, `sampling_param_*`, scalars of shape [1]):
tests/integration/test_llmapi.py and test_speculative.py."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from tests.support import Streamer, StreamResult, TritonServer

MODEL = "tensorrt_llm"
OUTPUTS = ("text_output", "finish_reason", "stop_reason", "cumulative_logprob")
OUTPUTS += ("num_input_tokens", "num_output_tokens")
PROMPT = "The quick brown fox jumps over the lazy dog."

DTYPES: dict[str, Any] = {
    "streaming": np.bool_,
    "sampling_param_temperature": np.float32,
    "sampling_param_top_k": np.int32,
    "sampling_param_top_p": np.float32,
    "sampling_param_frequency_penalty": np.float32,
    "sampling_param_presence_penalty": np.float32,
    "sampling_param_repetition_penalty": np.float32,
    "sampling_param_max_tokens": np.int32,
    "sampling_param_min_tokens": np.int32,
    "sampling_param_seed": np.uint64,
    "sampling_param_end_id": np.int32,
    "sampling_param_best_of": np.int32,
    "sampling_param_exclude_input_from_output": np.bool_,
    "sampling_param_logprobs": np.int32,
    "sampling_param_n": np.int32,
}


def llmapi_input(name: str, value: Any) -> grpcclient.InferInput:
    """As upstream's clients send them to a model with max_batch_size 0: scalars are shape [1]."""
    if name in ("text_input", "sampling_param_stop"):
        array = np.array([v.encode() for v in ([value] if isinstance(value, str) else value)], np.object_)
    elif name in ("input_ids", "sampling_param_stop_token_ids"):
        array = np.array(value, dtype=np.int32).reshape(-1)
    else:
        array = np.array([value], dtype=DTYPES.get(name, np.bool_))
    infer_input = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    infer_input.set_data_from_numpy(array)
    return infer_input


def run(
    server: TritonServer,
    prompt: str | list[int] | None = PROMPT,
    outputs: tuple[str, ...] = OUTPUTS,
    **params: Any,
) -> StreamResult:
    """One request; `prompt` goes in text_input (str) or input_ids (list); params by input name."""
    with Streamer(server.grpc_url) as streamer:
        send(streamer, prompt, outputs=outputs, **params)
        return streamer.collect()


def send(
    streamer: Streamer,
    prompt: str | list[int] | None = PROMPT,
    request_id: str = "",
    outputs: tuple[str, ...] = OUTPUTS,
    **params: Any,
) -> None:
    """Sends one request on `streamer`, as `run` does (its answer is for the caller to collect)."""
    inputs = []
    if isinstance(prompt, str):
        inputs.append(llmapi_input("text_input", prompt))
    elif prompt is not None:
        inputs.append(llmapi_input("input_ids", prompt))
    for name, value in params.items():
        inputs.append(llmapi_input(name, value))
    streamer.client.async_stream_infer(
        MODEL,
        inputs,
        outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
        request_id=request_id or uuid.uuid4().hex,
        enable_empty_final_response=True,
    )


def final(result: StreamResult, name: str) -> str | int | float:
    """Output `name` of the last response, as a str, int or float."""
    value = result.last(name).reshape(-1)[0]
    if isinstance(value, bytes):
        return value.decode()
    return float(value) if isinstance(value, np.floating) else int(value)


GREEDY = {"sampling_param_temperature": 0.0}
"""Greedy sampling, in the llmapi model's input names."""
