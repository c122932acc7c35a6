"""Triton Python model of the LLM API flavour: one `tensorrt_llm` model, configured by model.yaml.

model.yaml holds the `tensorrt_llm.LLM` arguments and a `triton_config` block (upstream's
`decoupled` / `max_batch_size` / `cancellation_check_period_ms`, and ours: `engine` plus the stand-in
engines' settings). As upstream's model does, everything but `triton_config` goes through
`update_llm_args_with_extra_dict({}, ...)` and then `LLM(**args)` (a `null` value is left out: the LLM
API's default). Every engine serves through llm_engine.py: `engine: tensorrt_llm` with TensorRT-LLM's
LLM API and, where `tensorrt_llm` cannot be imported, with the stand-in LLM API over our reference
engine (llm_standin.py, which validates model.yaml exactly as TorchLlmArgs does), saying so once in
the log and in the `trtllm_engine_info` metric (the service shows it in /v1/models). The stand-ins
(tensorrtllm_backend/standin/, copied beside this file) are imported only then, in `_standin`.
TRTLLM_REQUIRE_TENSORRT_LLM=1 (set in the production image) makes that fallback a start-up error.
`engine: reference` or `synthetic` picks a stand-in outright.

The service starts Triton as NVIDIA does, `trtllm-llmapi-launch tritonserver ...`: the script clears
the MPI job's variables for the server and the LLM reaches its workers through the script's leader
node (TLLM_SPAWN_PROXY_PROCESS). Under a plain mpirun (world_size > 1 seen here) rank 0 serves: with
TensorRT-LLM it hands the LLM an MpiCommSession over COMM_WORLD, whose other ranks wait in
MPICommExecutor as the LLM's workers (upstream 1.2.1's model); with a stand-in the other ranks idle.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import nvidia_llmapi as nv
import triton_python_backend_utils as pb_utils
import yaml
from llm_engine import LLMEngine, TensorRTLLM
from llmapi_contract import LlmApiError, TextLimits, is_stop_request, parse_text_request
from shared_contract import INVALID_REQUEST, RequestError
from triton_adapter import EngineModel, Responder, brief

REQUIRE_ENV = "TRTLLM_REQUIRE_TENSORRT_LLM"
ENGINES = ("tensorrt_llm", "reference", "synthetic")


def read_model_yaml(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the LLM arguments, nulls left out; triton_config) from model.yaml."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise pb_utils.TritonModelException(f"tensorrt_llm: cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("triton_config"), dict):
        raise pb_utils.TritonModelException(f"tensorrt_llm: {path} has no triton_config block")
    triton_config = data.pop("triton_config")
    return nv.drop_nulls(data), triton_config


def mpi_world_size() -> int:
    """The number of ranks mpirun started (1 without MPI)."""
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 1


def _end_ids(raw: str) -> tuple[int, ...]:
    return tuple(int(part) for part in raw.split(",") if part.strip())


class LlmApiResponder(Responder):
    """Responses of the LLM API model: NVIDIA's errors as upstream sends them, ours as INVALID_ARG."""

    def invalid(self, message: str) -> Any:
        error = pb_utils.TritonError(brief(f"{INVALID_REQUEST}{message}"), pb_utils.TritonError.INVALID_ARG)
        return pb_utils.InferenceResponse(error=error)

    @staticmethod
    def cancelled(message: str = nv.CANCELLED) -> Any:
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.CANCELLED))


class TritonPythonModel(EngineModel):
    """Parses LLM API requests and hands them to the LLM model.yaml picks."""

    def initialize(self, args: dict[str, str]) -> None:
        self._start(args)
        version_dir = Path(args.get("model_repository", "")) / args.get("model_version", "1")
        llm_yaml, triton_config = read_model_yaml(version_dir / "model.yaml")
        kind = str(triton_config.get("engine", "tensorrt_llm"))
        if self.rank > 0:
            self._follow(kind)
            return
        if kind not in ENGINES:
            raise pb_utils.TritonModelException(
                f"tensorrt_llm: triton_config.engine must be one of {', '.join(ENGINES)}, got {kind!r}"
            )
        from transformers import AutoTokenizer

        model_dir = str(llm_yaml.get("model", ""))
        self.tokenizer = AutoTokenizer.from_pretrained(str(llm_yaml.get("tokenizer") or model_dir))
        api = self._api(kind, triton_config)
        kind = "tensorrt_llm" if isinstance(api, TensorRTLLM) else api.kind
        counters = self._register_metrics(kind)
        try:
            self._start_engine(api, kind, llm_yaml, triton_config, counters, model_dir)
        except BaseException:
            self.finalize()  # a failed load is never finalized: its metric families must go now
            raise

    def _start_engine(
        self,
        api: Any,
        kind: str,
        llm_yaml: dict[str, Any],
        triton_config: dict[str, Any],
        counters: Any,
        model_dir: str,
    ) -> None:
        """initialize()'s second half: the LLM, the limits its requests are checked against, and the
        metrics thread."""
        cancel_ms = int(triton_config.get("cancellation_check_period_ms", nv.CANCELLATION_CHECK_PERIOD_MS))
        self.adapters: dict[str, Any] = dict(triton_config.get("loras") or {})
        try:
            llm_args = api.update_llm_args_with_extra_dict({}, llm_yaml)
            if kind == "tensorrt_llm" and mpi_world_size() > 1:
                llm_args["_mpi_session"] = api.mpi_session()
            self.engine = LLMEngine(
                api, llm_args, LlmApiResponder(), counters, cancel_check_s=cancel_ms / 1000.0
            )
        except Exception as exc:
            pb_utils.Logger.log_error(brief(f"{self.model_name}: failed to start the LLM: {exc}"))
            raise pb_utils.TritonModelException(f"tensorrt_llm: failed to start the LLM: {exc}") from exc
        max_seq_len = int(getattr(self.engine.llm.args, "max_seq_len", 0) or 0) or 1 << 20
        config_path = Path(model_dir) / "config.json"
        vocab = json.loads(config_path.read_text()).get("vocab_size") if config_path.is_file() else None
        self.limits = TextLimits(
            vocab_size=int(vocab or len(self.tokenizer)),
            max_seq_len=max_seq_len,
            streaming_allowed=self.decoupled,
            end_ids=_end_ids(str(triton_config.get("end_ids", ""))),
        )
        self._publish(kind, self._stats_poll())
        pb_utils.Logger.log_info(f"{self.model_name}: {self.engine.describe()}, max_seq_len {max_seq_len}")

    def _stats_poll(self) -> Any:
        """The LLM's iteration stats (`get_stats`, with enable_iter_perf_stats in model.yaml), for
        trtllm-serve's metrics (engine_metrics.py), polled every second; None without them."""
        llm = self.engine.llm
        if not getattr(llm.args, "enable_iter_perf_stats", False) or not hasattr(llm, "get_stats"):
            return None
        return lambda: llm.get_stats(timeout=0.5)

    def _api(self, kind: str, triton_config: dict[str, Any]) -> Any:
        """TensorRT-LLM's LLM API, or the stand-in over the `kind` (or fallback) engine (`_standin`)."""
        if kind == "tensorrt_llm":
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
                kind = "reference"
            else:  # installed: a missing piece of its LLM API is a load error, never a fallback
                return TensorRTLLM()
        return self._standin(kind, triton_config)

    def _standin(self, kind: str, triton_config: dict[str, Any]) -> Any:
        """The stand-in LLM API over our `kind` engine. Its modules (tensorrtllm_backend/standin/) are
        imported here and nowhere else in this model: the repository builder copies them beside
        this file because a stand-in may serve it (repository.py says when)."""
        from llm_standin import StandIn
        from sources import make_source

        return StandIn(
            kind,
            self.tokenizer,
            make_source,
            log=pb_utils.Logger.log_info,
            step_delay_s=float(triton_config.get("synthetic_step_delay_ms", 0)) / 1000.0,
            device=str(triton_config.get("reference_device", "auto")),
            dtype=triton_config.get("reference_dtype"),
        )

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

    def _adapter(self, request: Any) -> None:
        """The LoRARequest arguments of the named adapter (the LLM loads and caches it): as sent
        (`lora_id` and `lora_path`, an adapter loaded while serving), else the packed one's."""
        name = request.lora_name
        if request.lora_path is not None or request.lora_id is not None:
            if request.lora_path is None or request.lora_id is None:
                raise RequestError("lora_name, lora_id and lora_path go together")
            request.lora = (name, int(request.lora_id), str(request.lora_path))
            return
        entry = self.adapters.get(name)
        if entry is None:
            known = ", ".join(sorted(self.adapters)) or "none packed"
            raise RequestError(f"unknown LoRA adapter {name!r} ({known})")
        request.lora = (name, int(entry["id"]), str(entry["path"]))

    def _tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True)

    def _detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _stop(self, request: Any, sink: Any) -> None:
        """Upstream's `stop`: ends the requests with this id; the stop request itself is answered
        "cancelled" (an error without a request id)."""
        request_id = request.request_id()
        if not request_id:
            sink.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(nv.STOP_WITHOUT_ID)), True)
            return
        self.engine.stop(request_id)
        sink.send(LlmApiResponder.cancelled(), True)

    def _probe(self, sink: Any) -> None:
        """The supervisor's probe, answered through the LLM's loop and a sender lane (see LLMEngine.probe)."""
        if self.engine is None:
            super()._probe(sink)
        else:
            self.engine.probe(sink)

    def _serve(self, request: Any, get: Any, sink: Any) -> None:
        if self.engine is None:
            sink.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("rank > 0 does not serve")), True)
            return
        try:
            if is_stop_request(get):
                self._stop(request, sink)
                return
            parsed = parse_text_request(
                get,
                request.request_id(),
                self.limits,
                self._tokenize,
                self._detokenize,
                request.requested_output_names(),
            )
            if parsed.lora_name is not None:
                self._adapter(parsed)
        except LlmApiError as exc:  # upstream's refusal, as upstream sends it
            self._refused()
            error = pb_utils.TritonError(brief(f"{nv.GENERATE_ERROR}{exc}"))
            sink.send(pb_utils.InferenceResponse(error=error), True)
            return
        except RequestError as exc:
            self._refused()
            sink.send(LlmApiResponder().invalid(str(exc)), True)
            return
        self.engine.submit_text(parsed, sink)
