"""Triton Python-backend adapter for our stand-in engines in the `tensorrt_llm` slot.

A stand-in itself: production fills this slot with NVIDIA's C++ backend (the same config.pbtxt with
`triton_backend:tensorrtllm`) and no model.py. It serves the exact tensor contract of that backend
(contract.py), so preprocessing, postprocessing, the ensemble and every client cannot tell which
engine answers. Everything but the Triton glue is in tensorrtllm_backend/standin/ (copied beside
this file by the repository builder, as the production modules it stands on are).

The `python_engine` parameter picks the token source (sources.py):
  reference  a Hugging Face checkpoint run with PyTorch (reference.py);
  synthetic  tokens as fast as Triton relays them, no model (synthetic.py), for load tests and
             benchmarks of everything around the engine.
The loop that runs either one (admission, end ids, stop words, streaming, cancellation, TRT-LLM's
`stop` request) is engine.py.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import nvidia_backend as nv
import triton_python_backend_utils as pb_utils
from config_params import param
from contract import BackendError, EngineLimits, is_stop_request, parse_request
from engine import EngineLoop
from engine_stats import CppBackendStats, snapshot
from lora import CACHE_MISS, LoraCache, LoraError, from_rows
from shared_contract import INVALID_REQUEST, RequestError
from sources import make_source
from triton_adapter import EngineModel, Responder

NUMPY_TYPES = {"TYPE_FP32": np.float32, "TYPE_FP16": np.float16}


def check_parameters(config: dict[str, Any]) -> None:
    """What makes NVIDIA's model instance fail to load, with its messages (model_instance_state.cc)."""
    parameters = config.get("parameters")
    if not parameters:
        raise pb_utils.TritonModelException("Model config doesn't have a parameters section")
    for name in nv.REQUIRED_PARAMETERS:
        if name not in parameters:
            raise pb_utils.TritonModelException(nv.MISSING_PARAMETER.format(name=name))
    if param(config, "gpt_model_type") not in nv.GPT_MODEL_TYPES:
        raise pb_utils.TritonModelException(nv.BAD_MODEL_TYPE)
    backend, info = param(config, "guided_decoding_backend"), param(config, "xgrammar_tokenizer_info_path")
    if backend and info:
        if not Path(info).is_file():
            raise pb_utils.TritonModelException(
                nv.ASSERTION + f"Xgrammar's tokenizer info path at {info} does not exist."
            )
        if backend not in nv.GUIDED_DECODING_BACKENDS:
            raise pb_utils.TritonModelException(nv.BAD_GUIDED_BACKEND)


def _error(exc: Exception, executor_id: int) -> Any:
    """The error response of a refused request: NVIDIA's (INTERNAL, its message) or ours (INVALID_ARG)."""
    if isinstance(exc, BackendError):
        return pb_utils.TritonError(exc.message(executor_id), pb_utils.TritonError.INTERNAL)
    if isinstance(exc, LoraError) and CACHE_MISS in str(exc):  # the executor's expected LoRA error
        return pb_utils.TritonError(
            nv.EXECUTOR_ERROR.format(id=executor_id) + str(exc), pb_utils.TritonError.INTERNAL
        )
    return pb_utils.TritonError(f"{INVALID_REQUEST}{exc}", pb_utils.TritonError.INVALID_ARG)


class TritonPythonModel(EngineModel):
    """The stand-in engine: parses requests, hands them to the engine loop."""

    def initialize(self, args: dict[str, str]) -> None:
        config = self._start(args)
        if self.rank > 0:  # under mpirun only rank 0 serves; a stand-in has no shard to host
            pb_utils.Logger.log_info(f"{self.model_name}: rank {self.rank} idles; rank 0 serves")
            return
        check_parameters(config)
        model_dir = param(config, "gpt_model_path")
        if not model_dir:
            raise pb_utils.TritonModelException("tensorrt_llm: parameter gpt_model_path is not set")
        kind = param(config, "python_engine", "reference")
        source, vocab_size, own_limit = make_source(
            kind,
            model_dir,
            param(config, "tokenizer_dir"),
            device=param(config, "reference_device", "auto"),
            dtype=param(config, "reference_dtype", "auto"),
            slots=int(config.get("max_batch_size") or 0),
            max_seq_len=int(param(config, "max_seq_len", "0")),
            block_reuse=param(config, "enable_kv_cache_reuse", "false").lower() in ("true", "1"),
        )
        max_seq_len = int(param(config, "max_seq_len", "0")) or own_limit
        self.source = source
        self.loras = LoraCache(int(param(config, "lora_cache_adapters", "") or 8))
        config_path = Path(model_dir) / "config.json"
        self.base_config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.limits = EngineLimits(
            vocab_size=vocab_size,
            max_seq_len=max_seq_len,
            # NVIDIA's default when the parameter is unset: false, the prompt echoed
            exclude_input_default=param(config, "exclude_input_in_output", "false").lower() in ("true", "1"),
            streaming_allowed=self.decoupled,
            guided_decoding=bool(
                param(config, "guided_decoding_backend") and param(config, "xgrammar_tokenizer_info_path")
            ),
            # the beams the engine was "built" for (packing fills it; our engines could search more)
            max_beam_width=int(param(config, "max_beam_width", "1") or 1),
        )
        self.executor_ids = itertools.count(1)  # the executor's request ids, in its error messages
        outputs = {output["name"]: output["data_type"] for output in config.get("output", [])}
        logits_dtype = NUMPY_TYPES.get(outputs.get("generation_logits", "TYPE_FP32"), np.float32)
        counters = self._register_metrics(kind)
        self.engine = EngineLoop(
            source,
            Responder(),
            counters,
            cancel_check_s=int(param(config, "cancellation_check_period_ms", "100")) / 1000.0,
            step_delay_s=float(param(config, "synthetic_step_delay_ms", "0")) / 1000.0,
            name=kind,
            logits_dtype=logits_dtype,
        )
        last_spec: dict[str, int] = {}
        self._publish(kind, lambda: [snapshot(self.engine, source, last_spec)], CppBackendStats())
        pb_utils.Logger.log_info(f"{self.model_name}: {source.describe()}, max_seq_len {max_seq_len}")

    def _serve(self, request: Any, get: Any, sink: Any) -> None:
        try:
            if is_stop_request(get):
                if not request.request_id():
                    raise BackendError(nv.STOP_WITHOUT_ID)
                self.engine.stop(request.request_id())
                self._acknowledge_stop(sink)
                return
            parsed = parse_request(get, request.request_id(), self.limits, request.requested_output_names())
            if parsed.lora_task_id is not None:
                parsed.lora = self._adapter(parsed)
        except (BackendError, RequestError, LoraError) as exc:
            self._refused()
            sink.send(pb_utils.InferenceResponse(error=_error(exc, next(self.executor_ids))), True)
            return
        self.engine.submit(parsed, sink)

    def _adapter(self, request: Any) -> Any:
        """The request's LoRA adapter: its weights when sent (cached under its task id), else the
        cached adapter of its task id (LoraError with CACHE_MISS when not held: the client resends)."""
        prepare = getattr(self.source, "prepare_lora", None)
        if prepare is None:
            return None  # the synthetic engine has no weights to adapt
        if request.lora_weights is None:
            return self.loras.get(request.lora_task_id)
        factors = from_rows(request.lora_weights, request.lora_config, self.base_config)
        return self.loras.put(request.lora_task_id, prepare(factors))

    def _acknowledge_stop(self, sink: Any) -> None:
        """A `stop` request itself is answered at once with an empty final response."""
        sink.send(None if self.decoupled else pb_utils.InferenceResponse(output_tensors=[]), True)
