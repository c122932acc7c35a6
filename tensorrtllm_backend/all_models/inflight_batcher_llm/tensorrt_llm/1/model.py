"""Reference engine for the `tensorrt_llm` slot (Triton Python backend).

Serves a Hugging Face causal LM with PyTorch (CPU, or CUDA when present) behind exactly the
tensor contract of NVIDIA's C++ TensorRT-LLM backend, so preprocessing, postprocessing, the
ensemble and every client cannot tell which engine answers. Production replaces it by filling
the same config.pbtxt with `triton_backend:tensorrtllm`.

One worker thread owns the model. It admits requests as they arrive and advances every active
request by one token per round (in-flight batching by interleaving), so no request waits for
another to finish. Cancellation is checked before every step of every request.
"""

from __future__ import annotations

import json
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModelForCausalLM, DynamicCache

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
STOP_TTL_S = 30.0


class RequestError(ValueError):
    """A request the engine refuses; the message goes back to the client.

    Such messages start with "invalid request: ": in-stream gRPC errors carry no status code, so
    this prefix is how clients (our service included) tell a bad request from a server fault.
    """


def _param(model_config: dict[str, Any], key: str, default: str = "") -> str:
    """A string parameter of config.pbtxt; unfilled `${var}` placeholders count as unset."""
    value = model_config.get("parameters", {}).get(key, {}).get("string_value", "")
    return default if not value or value.startswith("${") else value


def _scalar(request: Any, name: str, default: Any) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    array = tensor.as_numpy()
    if array.size == 0:
        return default
    return array.reshape(-1)[0].item()


def _array(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def parse_word_list(array: np.ndarray | None) -> list[list[int]]:
    """TRT-LLM word lists: [1, 2, N], flat ids then cumulative end offsets padded with -1."""
    if array is None or array.size == 0:
        return []
    rows = array.reshape(-1, 2, array.shape[-1])[0]
    words, start = [], 0
    for end in rows[1].tolist():
        if end < 0:
            break
        if end > start:
            words.append(rows[0, start:end].tolist())
        start = end
    return words


class Sink:
    """Where responses of one request go: a decoupled response sender, or a collector."""

    def __init__(self, sender: Any | None) -> None:
        self.sender = sender
        self.done = threading.Event()
        self.response: Any = None

    def send(self, response: Any | None, final: bool) -> None:
        if self.sender is not None:
            if response is None:
                self.sender.send(flags=FINAL)
            else:
                self.sender.send(response, flags=FINAL if final else 0)
        elif final:
            self.response = response
            self.done.set()

    def is_cancelled(self) -> bool:
        return self.sender is not None and self.sender.is_cancelled()


@dataclass(eq=False)
class Sequence:
    """One request in flight: its parameters and its decoding state."""

    request_id: str
    sink: Sink
    input_ids: list[int]
    max_new: int
    end_id: int
    streaming: bool
    exclude_input: bool
    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    min_length: int
    generator: torch.Generator | None
    stop_words: list[list[int]]
    bad_words: list[list[int]]
    embedding_bias: torch.Tensor | None
    return_log_probs: bool
    return_context_logits: bool
    return_generation_logits: bool
    generated: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    cache: Any = None
    counts: torch.Tensor | None = None
    prompt_mask: torch.Tensor | None = None
    context_logits: np.ndarray | None = None
    generation_logits: list[np.ndarray] = field(default_factory=list)
    unsent: int = 0
    stop_requested: bool = False


class TritonPythonModel:
    """The reference engine."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.model_name = args.get("model_name", "tensorrt_llm")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        model_dir = _param(config, "gpt_model_path")
        if not model_dir:
            raise pb_utils.TritonModelException(
                "tensorrt_llm (reference): parameter gpt_model_path is not set"
            )
        device = _param(config, "reference_device", "auto")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype_name = _param(config, "reference_dtype", "auto")
        if dtype_name == "auto":
            dtype_name = "bfloat16" if device.startswith("cuda") else "float32"
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype_name))
        self.model.to(self.device).eval()
        self.vocab_size = int(self.model.config.vocab_size)
        self.max_seq_len = int(_param(config, "max_seq_len", "0")) or int(
            getattr(self.model.config, "max_position_embeddings", 2048)
        )
        self.exclude_input_default = _param(config, "exclude_input_in_output", "true").lower() == "true"
        self.max_beam_width = int(_param(config, "max_beam_width", "1"))

        self.requests_metric = pb_utils.MetricFamily(
            name="trtllm_reference_requests_total",
            description="Requests finished by the reference engine, by outcome",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.outcomes = {
            outcome: self.requests_metric.Metric(labels={"model": self.model_name, "outcome": outcome})
            for outcome in ("completed", "cancelled", "stopped", "error")
        }
        # Families must outlive their metrics: keep both on the model.
        self.tokens_family = pb_utils.MetricFamily(
            name="trtllm_reference_generated_tokens_total",
            description="Tokens generated by the reference engine",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.tokens_metric = self.tokens_family.Metric(labels={"model": self.model_name})

        self.inbox: queue.Queue[Sequence | None] = queue.Queue()
        self.stop_ids: dict[str, float] = {}  # request id -> when its `stop` request arrived
        self.stop_lock = threading.Lock()
        self.worker = threading.Thread(target=self._run, name="reference-engine", daemon=True)
        self.worker.start()
        pb_utils.Logger.log_info(
            f"reference engine: {model_dir} on {self.device} ({dtype_name}), max_seq_len {self.max_seq_len}"
        )

    # ---- admission -------------------------------------------------------------------------

    def execute(self, requests: list[Any]) -> list[Any] | None:
        sinks = []
        for request in requests:
            sink = Sink(request.get_response_sender() if self.decoupled else None)
            sinks.append(sink)
            if _scalar(request, "stop", False):
                with self.stop_lock:
                    self.stop_ids[request.request_id()] = time.monotonic()
                sink.send(pb_utils.InferenceResponse(output_tensors=[]) if not self.decoupled else None, True)
                continue
            try:
                self.inbox.put(self._parse(request, sink))
            except RequestError as exc:
                self.outcomes["error"].increment(1)
                error = pb_utils.TritonError(f"invalid request: {exc}", pb_utils.TritonError.INVALID_ARG)
                sink.send(pb_utils.InferenceResponse(error=error), True)
        if self.decoupled:
            return None
        for sink in sinks:
            sink.done.wait()
        return [sink.response for sink in sinks]

    def _parse(self, request: Any, sink: Sink) -> Sequence:
        ids = _array(request, "input_ids")
        if ids is None or ids.size == 0:
            raise RequestError("input_ids is empty")
        if ids.shape[0] != 1:
            raise RequestError(
                f"the reference engine takes one sequence per request, got a batch of {ids.shape[0]}"
            )
        length = int(_scalar(request, "input_lengths", ids.shape[-1]))
        input_ids = ids.reshape(-1)[:length].tolist()
        if not input_ids:
            raise RequestError("input_lengths is 0")
        if min(input_ids) < 0 or max(input_ids) >= self.vocab_size:
            raise RequestError(f"input_ids contains an id outside the vocabulary [0, {self.vocab_size})")
        max_new = int(_scalar(request, "request_output_len", 0))
        if max_new <= 0:
            raise RequestError(f"request_output_len (max_tokens) must be positive, got {max_new}")
        if len(input_ids) + max_new > self.max_seq_len:
            raise RequestError(
                f"prompt ({len(input_ids)} tokens) + max_tokens ({max_new}) exceeds the engine's "
                f"max_seq_len of {self.max_seq_len} tokens"
            )
        beam_width = int(_scalar(request, "beam_width", 1))
        if beam_width != 1:
            raise RequestError(f"beam_width {beam_width} is not supported by the reference engine (only 1)")
        streaming = bool(_scalar(request, "streaming", False))
        if streaming and not self.decoupled:
            raise RequestError("streaming requires the model to use decoupled mode")

        temperature = float(_scalar(request, "temperature", 1.0))
        top_k = int(_scalar(request, "runtime_top_k", 0))
        top_p = float(_scalar(request, "runtime_top_p", 0.0))
        if temperature < 0 or top_k < 0 or top_p < 0 or top_p > 1:
            raise RequestError("temperature and top_k must be >= 0 and top_p within [0, 1]")
        # TRT-LLM semantics: top_k 0 and top_p 0 mean "unset", and with neither set it decodes greedily.
        greedy = temperature == 0.0 or top_k == 1 or (top_k == 0 and top_p == 0.0)
        generator = None
        if not greedy:
            seed = _scalar(request, "random_seed", None)
            generator = torch.Generator(device=self.device)
            generator.manual_seed(int(seed) if seed is not None else secrets.randbits(63))

        bias = _array(request, "embedding_bias")
        embedding_bias = None
        if bias is not None and bias.size > 0:
            flat = bias.reshape(-1)[: self.vocab_size]
            embedding_bias = torch.zeros(self.vocab_size, dtype=torch.float32, device=self.device)
            embedding_bias[: flat.shape[0]] = torch.from_numpy(flat.astype(np.float32))

        return Sequence(
            request_id=request.request_id(),
            sink=sink,
            input_ids=input_ids,
            max_new=max_new,
            end_id=int(_scalar(request, "end_id", -1)),
            streaming=streaming,
            exclude_input=bool(_scalar(request, "exclude_input_in_output", self.exclude_input_default)),
            greedy=greedy,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=float(_scalar(request, "repetition_penalty", 1.0)),
            presence_penalty=float(_scalar(request, "presence_penalty", 0.0)),
            frequency_penalty=float(_scalar(request, "frequency_penalty", 0.0)),
            min_length=int(_scalar(request, "min_length", 0)),
            generator=generator,
            stop_words=parse_word_list(_array(request, "stop_words_list")),
            bad_words=parse_word_list(_array(request, "bad_words_list")),
            embedding_bias=embedding_bias,
            return_log_probs=bool(_scalar(request, "return_log_probs", False)),
            return_context_logits=bool(_scalar(request, "return_context_logits", False)),
            return_generation_logits=bool(_scalar(request, "return_generation_logits", False)),
        )

    # ---- the decoding loop -----------------------------------------------------------------

    def _run(self) -> None:
        active: list[Sequence] = []
        while True:
            try:
                while True:
                    item = self.inbox.get(block=not active, timeout=None)
                    if item is None:
                        self._abort_all(active)
                        return
                    active.append(item)
                    if self.inbox.empty():
                        break
            except queue.Empty:
                pass
            for seq in list(active):
                try:
                    finished = self._advance(seq)
                except Exception as exc:  # a failure of one request must not stop the engine
                    pb_utils.Logger.log_error(f"reference engine: request {seq.request_id!r} failed: {exc}")
                    self.outcomes["error"].increment(1)
                    seq.sink.send(
                        pb_utils.InferenceResponse(error=pb_utils.TritonError(f"engine error: {exc}")), True
                    )
                    finished = True
                if finished:
                    active.remove(seq)
                    seq.cache = None

    def _abort_all(self, active: list[Sequence]) -> None:
        for seq in active:
            seq.sink.send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError("the engine is shutting down")), True
            )

    def _stop_requested(self, seq: Sequence) -> bool:
        """Whether a `stop` request named this request's id (TRT-LLM's early-stop protocol)."""
        if not seq.request_id or not self.stop_ids:
            return False
        with self.stop_lock:
            now = time.monotonic()
            for request_id, since in list(self.stop_ids.items()):
                if now - since > STOP_TTL_S:  # a stop for a request that never came
                    del self.stop_ids[request_id]
            return self.stop_ids.pop(seq.request_id, None) is not None

    def _advance(self, seq: Sequence) -> bool:
        """Generates one token of `seq`; returns True when the request is finished."""
        if seq.sink.is_cancelled():
            self.outcomes["cancelled"].increment(1)
            pb_utils.Logger.log_info(
                f"reference engine: request {seq.request_id!r} cancelled after {len(seq.generated)} tokens"
            )
            seq.sink.send(self._response(seq, []), True)
            return True
        if self._stop_requested(seq):
            return self._finish(seq, outcome="stopped")

        logits = self._forward(seq)
        token, log_prob = self._sample(seq, logits)
        self.tokens_metric.increment(1)
        if token == seq.end_id:
            return self._finish(seq)
        seq.generated.append(token)
        seq.log_probs.append(log_prob)
        seq.unsent += 1
        stopped = any(seq.generated[-len(word) :] == word for word in seq.stop_words)
        if stopped or len(seq.generated) >= seq.max_new:
            return self._finish(seq)
        if seq.streaming:
            self._send_new(seq, final=False)
        return False

    def _finish(self, seq: Sequence, outcome: str = "completed") -> bool:
        if seq.streaming:
            if seq.unsent:
                self._send_new(seq, final=False)
            # The last response of a stream carries no new tokens: postprocessing drops its state then.
            seq.sink.send(self._response(seq, []), True)
        else:
            ids = seq.generated if seq.exclude_input else seq.input_ids + seq.generated
            seq.sink.send(self._response(seq, ids, log_probs=seq.log_probs, all_logits=True), True)
        self.outcomes[outcome].increment(1)
        return True

    def _send_new(self, seq: Sequence, final: bool) -> None:
        new = seq.generated[len(seq.generated) - seq.unsent :]
        new_log_probs = seq.log_probs[len(seq.log_probs) - seq.unsent :]
        first = len(seq.generated) == seq.unsent
        ids = seq.input_ids + new if first and not seq.exclude_input else new
        seq.unsent = 0
        seq.sink.send(self._response(seq, ids, log_probs=new_log_probs, all_logits=first), final)

    def _response(
        self, seq: Sequence, ids: list[int], log_probs: list[float] | None = None, all_logits: bool = False
    ) -> Any:
        log_probs = log_probs or []
        padded_log_probs = [0.0] * (len(ids) - len(log_probs)) + log_probs
        tensors = [
            pb_utils.Tensor("output_ids", np.array([[ids]], dtype=np.int32).reshape(1, 1, len(ids))),
            pb_utils.Tensor("sequence_length", np.array([[len(ids)]], dtype=np.int32)),
            pb_utils.Tensor("cum_log_probs", np.array([[sum(seq.log_probs)]], dtype=np.float32)),
            pb_utils.Tensor(
                "output_log_probs",
                np.array(padded_log_probs if seq.return_log_probs else [0.0] * len(ids), np.float32).reshape(
                    1, 1, len(ids)
                ),
            ),
        ]
        if seq.return_context_logits and all_logits and seq.context_logits is not None:
            context = seq.context_logits[None]
        else:
            context = np.zeros((1, 1, 1), np.float32)
        tensors.append(pb_utils.Tensor("context_logits", context))
        if seq.return_generation_logits and seq.generation_logits:
            generation = np.stack(seq.generation_logits)[None, None]
            seq.generation_logits = []
        else:
            generation = np.zeros((1, 1, 1, 1), np.float32)
        tensors.append(pb_utils.Tensor("generation_logits", generation))
        tensors.append(pb_utils.Tensor("num_input_tokens", np.array([[len(seq.input_ids)]], np.int32)))
        tensors.append(pb_utils.Tensor("num_output_tokens", np.array([[len(seq.generated)]], np.int32)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    @torch.inference_mode()
    def _forward(self, seq: Sequence) -> torch.Tensor:
        if seq.cache is None:
            seq.cache = DynamicCache(config=self.model.config)
            ids = torch.tensor([seq.input_ids], device=self.device)
            prompt_counts = torch.bincount(ids[0], minlength=self.vocab_size)[: self.vocab_size]
            seq.counts = torch.zeros(self.vocab_size, dtype=torch.int64, device=self.device)
            seq.prompt_mask = prompt_counts > 0
        else:
            ids = torch.tensor([[seq.generated[-1]]], device=self.device)
        out = self.model(input_ids=ids, past_key_values=seq.cache, use_cache=True)
        seq.cache = out.past_key_values
        if seq.return_context_logits and seq.context_logits is None:
            seq.context_logits = out.logits[0].float().cpu().numpy()
        return out.logits[0, -1].float()

    @torch.inference_mode()
    def _sample(self, seq: Sequence, logits: torch.Tensor) -> tuple[int, float]:
        logits = logits[: self.vocab_size].clone()
        if seq.embedding_bias is not None:
            logits += seq.embedding_bias
        if seq.repetition_penalty != 1.0:
            seen = seq.prompt_mask | (seq.counts > 0)
            penalized = torch.where(
                logits > 0, logits / seq.repetition_penalty, logits * seq.repetition_penalty
            )
            logits = torch.where(seen, penalized, logits)
        if seq.presence_penalty or seq.frequency_penalty:
            counts = seq.counts.to(logits.dtype)
            logits -= seq.presence_penalty * (counts > 0).to(logits.dtype) + seq.frequency_penalty * counts
        for word in seq.bad_words:
            if len(word) == 1 or seq.generated[-(len(word) - 1) :] == word[:-1]:
                logits[word[-1]] = -float("inf")
        if 0 <= seq.end_id < self.vocab_size and len(seq.generated) < seq.min_length:
            logits[seq.end_id] = -float("inf")
        if seq.return_generation_logits:
            seq.generation_logits.append(logits.cpu().numpy())

        if seq.greedy:
            token = int(torch.argmax(logits))
            log_prob = float(torch.log_softmax(logits, -1)[token]) if seq.return_log_probs else 0.0
        else:
            scaled = logits / seq.temperature
            if seq.top_k > 0:
                kth = torch.topk(scaled, min(seq.top_k, scaled.shape[-1])).values[-1]
                scaled = scaled.masked_fill(scaled < kth, -float("inf"))
            if 0.0 < seq.top_p < 1.0:
                sorted_logits, order = torch.sort(scaled, descending=True)
                cumulative = torch.softmax(sorted_logits, -1).cumsum(-1)
                drop = cumulative - torch.softmax(sorted_logits, -1) >= seq.top_p
                scaled = scaled.scatter(0, order, sorted_logits.masked_fill(drop, -float("inf")))
            log_probs = torch.log_softmax(scaled, -1)
            token = int(torch.multinomial(log_probs.exp(), 1, generator=seq.generator))
            log_prob = float(log_probs[token])
        seq.counts[token] += 1
        return token, log_prob

    def finalize(self) -> None:
        self.inbox.put(None)
        self.worker.join(timeout=30)
