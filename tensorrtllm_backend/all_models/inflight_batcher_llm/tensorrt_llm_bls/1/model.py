"""Triton `tensorrt_llm_bls` model: the ensemble's pipeline written as one Python model (BLS).

It calls preprocessing, streams from the engine and runs postprocessing on each response itself,
which lets it stop the engine request when its own client goes away (with a TRT-LLM `stop`
request: this Python backend cannot cancel a BLS stream) and, with `accumulate_tokens`, answer
every streamed response with the whole text so far.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from config_params import param  # tensorrtllm_backend/config_params.py, copied beside

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

PREPROCESSING_INPUTS = {
    "text_input": "QUERY",
    "max_tokens": "REQUEST_OUTPUT_LEN",
    "bad_words": "BAD_WORDS_DICT",
    "stop_words": "STOP_WORDS_DICT",
    "embedding_bias_words": "EMBEDDING_BIAS_WORDS",
    "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS",
    "end_id": "END_ID",
    "pad_id": "PAD_ID",
}
ENGINE_FROM_CLIENT = {
    "max_tokens": "request_output_len",
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "temperature": "temperature",
    "length_penalty": "len_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "return_log_probs": "return_log_probs",
    "return_context_logits": "return_context_logits",
    "return_generation_logits": "return_generation_logits",
    "exclude_input_in_output": "exclude_input_in_output",
    "beam_width": "beam_width",
    "stream": "streaming",
    "return_num_input_tokens": "return_num_input_tokens",
    "return_num_output_tokens": "return_num_output_tokens",
    "guided_decoding_guide_type": "guided_decoding_guide_type",
    "guided_decoding_guide": "guided_decoding_guide",
}
ENGINE_FROM_PREPROCESSING = {
    "INPUT_ID": "input_ids",
    "REQUEST_INPUT_LEN": "input_lengths",
    "BAD_WORDS_IDS": "bad_words_list",
    "STOP_WORDS_IDS": "stop_words_list",
    "EMBEDDING_BIAS": "embedding_bias",
    "OUT_END_ID": "end_id",
    "OUT_PAD_ID": "pad_id",
}
POSTPROCESSING_FROM_ENGINE = {
    "output_ids": "TOKENS_BATCH",
    "sequence_length": "SEQUENCE_LENGTH",
    "cum_log_probs": "CUM_LOG_PROBS",
    "output_log_probs": "OUTPUT_LOG_PROBS",
    "context_logits": "CONTEXT_LOGITS",
    "generation_logits": "GENERATION_LOGITS",
    "num_input_tokens": "NUM_INPUT_TOKENS",
    "num_output_tokens": "NUM_OUTPUT_TOKENS",
}
CLIENT_OUTPUTS = {
    "OUTPUT": "text_output",
    "OUT_CUM_LOG_PROBS": "cum_log_probs",
    "OUT_OUTPUT_LOG_PROBS": "output_log_probs",
    "OUT_CONTEXT_LOGITS": "context_logits",
    "OUT_GENERATION_LOGITS": "generation_logits",
    "OUT_NUM_INPUT_TOKENS": "num_input_tokens",
    "OUT_NUM_OUTPUT_TOKENS": "num_output_tokens",
}


class BlsError(RuntimeError):
    """A step of the pipeline failed; its message goes back to the client."""


def _renamed(tensors: dict[str, Any], mapping: dict[str, str]) -> list[Any]:
    return [pb_utils.Tensor(new, tensors[old].as_numpy()) for old, new in mapping.items() if old in tensors]


def _inputs(request: Any, names: list[str]) -> dict[str, Any]:
    found = {}
    for name in names:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is not None:
            found[name] = tensor
    return found


def _outputs(response: Any) -> dict[str, Any]:
    if response.has_error():
        raise BlsError(response.error().message())
    return {tensor.name(): tensor for tensor in response.output_tensors()}


class TritonPythonModel:
    """Preprocessing -> engine -> postprocessing, driven from Python."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.accumulate = param(config, "accumulate_tokens", "false").lower() in {"1", "true", "yes"}
        self.engine = param(config, "tensorrt_llm_model_name", "tensorrt_llm")
        self.threads: set[threading.Thread] = set()

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if not self.decoupled:
            return [self._serve_unary(request) for request in requests]
        for request in requests:
            thread = threading.Thread(target=self._serve_stream, args=(request,), daemon=True)
            self.threads.add(thread)
            thread.start()
        return None

    def _serve_unary(self, request: Any) -> Any:
        try:
            responses = list(self._pipeline(request, lambda: False))
        except BlsError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        return responses[-1] if responses else pb_utils.InferenceResponse(output_tensors=[])

    def _serve_stream(self, request: Any) -> None:
        sender = request.get_response_sender()
        pipeline = self._pipeline(request, sender.is_cancelled)
        try:
            for response in pipeline:
                try:
                    sender.send(response)
                except Exception as exc:  # the client went away between two checks: stop, quietly
                    pb_utils.Logger.log_info(f"tensorrt_llm_bls: response not delivered ({exc}); stopping")
                    pipeline.close()  # its `finally` stops the engine request
                    return
            sender.send(flags=FINAL)
        except BlsError as exc:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=FINAL)
        finally:
            self.threads.discard(threading.current_thread())

    def _pipeline(self, request: Any, cancelled: Any) -> Any:
        client = _inputs(request, list({**PREPROCESSING_INPUTS, **ENGINE_FROM_CLIENT}))
        pre = _outputs(
            pb_utils.InferenceRequest(
                model_name="preprocessing",
                requested_output_names=list(ENGINE_FROM_PREPROCESSING),
                inputs=_renamed(client, PREPROCESSING_INPUTS),
            ).exec()
        )
        streaming = "stream" in client and bool(client["stream"].as_numpy().reshape(-1)[0])
        # One id for the engine request (so it can be stopped) and postprocessing's decoder state.
        request_id = uuid.uuid4().hex
        stream = pb_utils.InferenceRequest(
            model_name=self.engine,
            requested_output_names=list(POSTPROCESSING_FROM_ENGINE),
            inputs=_renamed(pre, ENGINE_FROM_PREPROCESSING) + _renamed(client, ENGINE_FROM_CLIENT),
            request_id=request_id,
        ).exec(decoupled=True)
        text_so_far = ""
        finished = False
        try:
            for response in stream:
                if cancelled():
                    return
                engine_out = _outputs(response)
                if "output_ids" not in engine_out:
                    continue
                post = _outputs(
                    pb_utils.InferenceRequest(
                        model_name="postprocessing",
                        requested_output_names=list(CLIENT_OUTPUTS),
                        inputs=_renamed(engine_out, POSTPROCESSING_FROM_ENGINE),
                        request_id=request_id,
                    ).exec()
                )
                tensors = _renamed(post, CLIENT_OUTPUTS)
                if self.accumulate and streaming:
                    text_so_far += post["OUTPUT"].as_numpy().reshape(-1)[0].decode("utf-8")
                    tensors[0] = pb_utils.Tensor(
                        "text_output", np.array([text_so_far.encode("utf-8")], np.object_)
                    )
                yield pb_utils.InferenceResponse(output_tensors=tensors)
            finished = True
        finally:
            if not finished:  # cancelled, failed, or closed by the caller: end the engine request too
                self._stop_engine(request_id)

    def _stop_engine(self, request_id: str) -> None:
        """TRT-LLM's way to end a request early: a `stop` request with the same request id."""
        stop = pb_utils.InferenceRequest(
            model_name=self.engine,
            requested_output_names=[],
            inputs=[
                pb_utils.Tensor("input_ids", np.zeros((1, 1), np.int32)),
                pb_utils.Tensor("input_lengths", np.ones((1, 1), np.int32)),
                pb_utils.Tensor("request_output_len", np.ones((1, 1), np.int32)),
                pb_utils.Tensor("stop", np.ones((1, 1), bool)),
            ],
            request_id=request_id,
        )
        for _ in stop.exec(decoupled=True):
            pass

    def finalize(self) -> None:
        for thread in list(self.threads):
            thread.join(timeout=5)
