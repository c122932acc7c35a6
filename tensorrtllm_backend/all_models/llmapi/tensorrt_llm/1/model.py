"""Triton Python model of the LLM API flavour: one `tensorrt_llm` model, configured by model.yaml.

model.yaml holds the `tensorrt_llm.LLM` arguments and a `triton_config` block (ours: `engine`,
plus the stand-in engines' settings). `engine: tensorrt_llm` serves the checkpoint with TensorRT-LLM's
LLM API (llm_engine.py) and, where `tensorrt_llm` cannot be imported, falls back to our reference
engine, saying so once in the log and in the `trtllm_engine_info` metric (the service shows it in
/v1/models). TRTLLM_REQUIRE_TENSORRT_LLM=1 (set in the production image) makes that fallback a
start-up error. `engine: reference` or `synthetic` picks a stand-in outright.

Under mpirun (world_size > 1) only rank 0 serves; the other ranks' copies of this model stay idle
(with TensorRT-LLM the LLM API drives its own workers).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml
from contract import INVALID_REQUEST, EngineLimits, RequestError
from llmapi_contract import TextLimits, parse_text_request
from lora import LoraCache, LoraError, read_peft
from triton_adapter import Collector, Counters, EngineInfo, Responder, Sender, make_source, mpi_rank

REQUIRE_ENV = "TRTLLM_REQUIRE_TENSORRT_LLM"
ENGINES = ("tensorrt_llm", "reference", "synthetic")


def read_model_yaml(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(LLM arguments without unset values, triton_config) from model.yaml."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise pb_utils.TritonModelException(f"tensorrt_llm: cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("triton_config"), dict):
        raise pb_utils.TritonModelException(f"tensorrt_llm: {path} has no triton_config block")
    triton_config = data.pop("triton_config")
    return {key: value for key, value in data.items() if value is not None}, triton_config


def _end_ids(raw: str) -> tuple[int, ...]:
    return tuple(int(part) for part in raw.split(",") if part.strip())


class TritonPythonModel:
    """Parses LLM API requests and hands them to the engine model.yaml picks."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.model_name = args.get("model_name", "tensorrt_llm")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.engine: Any = None
        self.rank = mpi_rank()
        version_dir = Path(args.get("model_repository", "")) / args.get("model_version", "1")
        llm_args, triton_config = read_model_yaml(version_dir / "model.yaml")
        kind = str(triton_config.get("engine", "tensorrt_llm"))
        if self.rank > 0:
            self._follow(kind)
            return
        if kind not in ENGINES:
            raise pb_utils.TritonModelException(
                f"tensorrt_llm: triton_config.engine must be one of {', '.join(ENGINES)}, got {kind!r}"
            )
        from transformers import AutoTokenizer

        tokenizer_dir = str(llm_args.get("tokenizer") or llm_args["model"])
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        cancel_check_s = int(triton_config.get("cancellation_check_period_ms", 100)) / 1000.0
        if kind == "tensorrt_llm":
            kind = self._tensorrt_llm_or_fallback()
        self.counters = Counters(self.model_name, kind)
        self.info = EngineInfo(self.model_name, kind)
        max_seq_len = int(llm_args.get("max_seq_len") or 0)
        self.adapters: dict[str, Any] = dict(triton_config.get("loras") or {})
        self.loras = LoraCache(int(triton_config.get("lora_cache_adapters") or 8))
        self.llm_args: dict[str, Any] | None = None
        config_path = Path(str(llm_args["model"])) / "config.json"
        self.base_config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        if kind == "tensorrt_llm":
            from llm_engine import LLMEngine

            self.llm_args = llm_args
            self.engine = LLMEngine(llm_args, Responder(), self.counters, cancel_check_s=cancel_check_s)
            vocab = len(self.tokenizer)
            max_seq_len = max_seq_len or int(getattr(self.engine.llm.args, "max_seq_len", 0) or 0) or 1 << 20
        else:
            from text_engine import TextEngineLoop

            source, vocab, own_limit = make_source(
                kind,
                str(llm_args["model"]),
                tokenizer_dir,
                device=str(triton_config.get("reference_device", "auto")),
                dtype=str(triton_config.get("reference_dtype", llm_args.get("dtype", "auto"))),
                slots=int(llm_args.get("max_batch_size") or 0),
                max_seq_len=max_seq_len,
            )
            max_seq_len = max_seq_len or own_limit
            self.engine = TextEngineLoop(
                source,
                Responder(),
                self.counters,
                self.tokenizer,
                cancel_check_s=cancel_check_s,
                step_delay_s=float(triton_config.get("synthetic_step_delay_ms", 0)) / 1000.0,
                name=kind,
            )
        self.limits = TextLimits(
            engine=EngineLimits(vocab_size=vocab, max_seq_len=max_seq_len, streaming_allowed=self.decoupled),
            end_ids=_end_ids(str(triton_config.get("end_ids", ""))),
        )
        pb_utils.Logger.log_info(f"{self.model_name}: {self.engine_description()}, max_seq_len {max_seq_len}")

    def _follow(self, kind: str) -> None:
        """A rank > 0: TensorRT-LLM's LLM API on rank 0 drives this rank through MPI; a stand-in idles."""
        try:
            import tensorrt_llm  # noqa: F401
        except ImportError:
            kind = "reference"
        if kind != "tensorrt_llm":
            pb_utils.Logger.log_info(f"{self.model_name}: rank {self.rank} idles; rank 0 serves")
            return
        from mpi4py import MPI
        from mpi4py.futures import MPICommExecutor

        pb_utils.Logger.log_info(f"{self.model_name}: rank {self.rank} works for rank 0's LLM")
        with MPICommExecutor(MPI.COMM_WORLD) as executor:  # returns when rank 0 shuts the LLM down
            if executor is not None:
                raise pb_utils.TritonModelException(f"rank {self.rank} must not lead the MPI world")

    def engine_description(self) -> str:
        describe = getattr(self.engine, "describe", None) or self.engine.source.describe
        return describe()

    def _tensorrt_llm_or_fallback(self) -> str:
        try:
            import tensorrt_llm  # noqa: F401
        except ImportError as exc:
            if os.environ.get(REQUIRE_ENV, "").lower() in ("1", "true", "yes"):
                raise pb_utils.TritonModelException(
                    f"tensorrt_llm: the tensorrt_llm package cannot be imported ({exc}) and "
                    f"{REQUIRE_ENV} is set: refusing to fall back to the reference engine"
                ) from exc
            pb_utils.Logger.log_warn(
                f"{self.model_name}: tensorrt_llm cannot be imported ({exc}); serving with the reference "
                f"engine (PyTorch) instead. Set {REQUIRE_ENV}=1 to make this an error."
            )
            return "reference"
        return "tensorrt_llm"

    def _adapter(self, request: Any) -> None:
        """Attaches the named packed adapter: the LLM API's LoRA request, or (reference engine) its
        factors, loaded from its PEFT files and kept in a cache of `lora_cache_adapters`."""
        name = request.lora_name
        entry = self.adapters.get(name)
        if entry is None:
            known = ", ".join(sorted(self.adapters)) or "none packed"
            raise RequestError(f"unknown LoRA adapter {name!r} ({known})")
        if self.llm_args is not None:  # tensorrt_llm: the LLM API loads and caches it
            request.lora = (name, int(entry["id"]), str(entry["path"]))
            return
        prepare = getattr(self.engine.source, "prepare_lora", None)
        if prepare is not None:
            request.engine.lora = self.loras.get(
                name, lambda: prepare(read_peft(entry["path"], self.base_config).factors)
            )

    def _tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True)

    def _detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        collectors = []
        for request in requests:
            sink: Any = Sender(request.get_response_sender()) if self.decoupled else Collector()
            collectors.append(sink)
            if self.engine is None:
                sink.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError("rank > 0 does not serve")), True
                )
                continue
            inputs = {tensor.name(): tensor for tensor in request.inputs()}

            def get(name: str, inputs: dict[str, Any] = inputs) -> np.ndarray | None:
                tensor = inputs.get(name)
                return None if tensor is None else tensor.as_numpy()

            try:
                parsed = parse_text_request(
                    get, request.request_id(), self.limits, self._tokenize, self._detokenize
                )
            except RequestError as exc:
                self.counters.finished("error")
                error = pb_utils.TritonError(f"{INVALID_REQUEST}{exc}", pb_utils.TritonError.INVALID_ARG)
                sink.send(pb_utils.InferenceResponse(error=error), True)
                continue
            if parsed.lora_name is not None:
                try:
                    self._adapter(parsed)
                except (RequestError, LoraError) as exc:
                    self.counters.finished("error")
                    error = pb_utils.TritonError(f"{INVALID_REQUEST}{exc}", pb_utils.TritonError.INVALID_ARG)
                    sink.send(pb_utils.InferenceResponse(error=error), True)
                    continue
            self.engine.submit_text(parsed, sink)
        if self.decoupled:
            return None
        for sink in collectors:
            sink.done.wait()
        return [sink.response for sink in collectors]

    def finalize(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
