"""A stand-in of TensorRT-LLM 1.2.1's LLM API, over our engines: the surface llm_engine.py uses.

Where `tensorrt_llm` cannot be imported (or model.yaml picks `engine: reference | synthetic`), the
llmapi model still serves through llm_engine.py, the production path, with this module in place of
`tensorrt_llm`: `LLM(**llm_args)` validates its arguments as TorchLlmArgs does (strict pydantic models
from nvidia_llmapi's tables: an unknown key fails with pydantic's "Extra inputs are not permitted")
and runs a token source (reference or synthetic) in our engine loop (text_engine.py);
`update_llm_args_with_extra_dict`, `SamplingParams` (the 1.2.1 fields, kw_only: an unknown keyword
is a TypeError; its refusals word for word), `GuidedDecodingParams` and `LoRARequest` are replicas;
`generate_async` returns a `RequestOutput` that is an async iterable of itself, one step per engine
response, whose `outputs[0]` is a `CompletionOutput` (cumulative text and token_ids, logprobs as
list[dict[token id, Logprob(logprob, rank)]], cumulative_logprob, finish_reason, stop_reason) and
whose `abort()` cancels the request (its last step then says "cancelled").

Beam search (`use_beam_search`, `best_of` beams, `n` returned: `outputs` holds them best first, each
decoded whole), `prompt_logprobs` (the top N of each context position, as 1.2's compute_logprobs
makes them: without the prompt's own tokens), `return_context_logits` (`RequestOutput.context_logits`,
[prompt, vocab]), `embedding_bias` and `return_perf_metrics` (`request_perf_metrics`: KV cache blocks
and times; blocks of a repeated prompt prefix are reused with kv_cache_config.enable_block_reuse,
see prefix_cache.py) and `get_stats` / `get_stats_async` (the iteration stats of 1.2.1, with
enable_iter_perf_stats: engine_stats.py) are modelled. model.yaml's `speculative_config` with
`decoding_type: NGram` (NGramDecodingConfig's fields) drafts by prompt lookup in the reference
engine (ngram.py, reference.py), and the perf metrics' `speculative_decoding` counts its draft tokens;
another decoding type fails the LLM's construction (a draft model is not served by the stand-in). What the real LLM API serves and our
engines cannot (several sampled sequences, generation logits, ...) is refused as ours
(shared_contract.RequestError), never ignored. Differences that
remain: stop strings are matched on the decoded text (TensorRT-LLM matches their token ids, so a
stop string that tokenizes differently in context is missed there); an adapter is loaded on the
asyncio loop the first time it is used.

The PyTorch executor's rules at 1.2.1 are kept (nvidia_llmapi names each message and where it comes
from; where the stored sources differ, the variant more likely at 1.2.1 is modelled, unconfirmed at
the tag): every request's beam width (best_of with use_beam_search, else 1) must equal the LLM's
max_beam_width, width-1 requests included; beam search refuses logprobs > 1; a top-logprobs count
above the vocabulary fails as torch.topk does. These reach the caller as the executor delivers them:
a request error (`ExecutorRequestError`, tensorrt_llm.executor.RequestError's stand-in) raised while
iterating the result. generate_async itself refuses, synchronously, a prompt longer than
max_num_tokens without enable_chunked_prefill (ValueError, LLM._check_arguments). max_tokens beyond
what max_seq_len leaves is clamped with a warning, not refused. With kv_cache_config.max_tokens set
the stand-in has a KV cache of that many tokens: each request reserves its prompt + max_tokens (the
capacity scheduler's guaranteed-no-evict); requests that do not fit wait in the queue, first come
first served, and one that cannot fit even alone fails with the executor's "fail to schedule any
pending request" (upstream: an assertion in the executor loop).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import nvidia_llmapi as nv
from contract import EngineRequest
from grammars import as_read_by
from shared_contract import RequestError
from text_engine import TextEngineLoop, Update

if TYPE_CHECKING:
    import torch  # imported where a request keeps its context logits

VERSION = f"{nv.TAG.lstrip('v')} (stand-in)"

NOT_MODELLED = (
    "bad",
    "include_stop_str_in_output",
    "logits_processor",
    "apply_batched_logits_processor",
    "top_p_min",
    "top_p_reset_ids",
    "top_p_decay",
    "beam_search_diversity_rate",
    "prompt_ignore_length",
    "no_repeat_ngram_size",
    "min_p",
    "beam_width_array",
    "return_generation_logits",
    "exclude_input_from_output",
    "return_encoder_output",
    "additional_model_outputs",
    "lookahead_config",
    "truncate_prompt_tokens",
    "detokenize",
    "skip_special_tokens",
    "spaces_between_special_tokens",
)
"""SamplingParams fields our engines do not honour: a value other than the default is refused."""


# ---- the replicas -----------------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None


@dataclasses.dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] = dataclasses.field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob]] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    generation_logits: Any = None
    disaggregated_params: Any = None
    request_perf_metrics: Any = None
    _last_text_len: int = 0
    _last_token_ids_len: int = 0
    _last_logprobs_len: int = 0

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len :]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]

    @property
    def logprobs_diff(self) -> list[dict[int, Logprob]]:
        return self.logprobs[self._last_logprobs_len :]


def _guided_validate(self: Any) -> None:
    count = sum(bool(getattr(self, name)) for name, _ in nv.GUIDED_DECODING_FIELDS)
    if count > 1:
        raise ValueError(nv.ONE_GUIDE.format(count=count))


GuidedDecodingParams = dataclasses.make_dataclass(
    "GuidedDecodingParams",
    [(name, Any, dataclasses.field(default=default)) for name, default in nv.GUIDED_DECODING_FIELDS],
    kw_only=True,
    slots=True,
    namespace={"_validate": _guided_validate, "__module__": __name__},
)


def _sampling_post_init(self: Any) -> None:
    if self.pad_id is None:
        self.pad_id = self.end_id
    self.best_of = self.best_of or self.n
    error = nv.sampling_errors(self)
    if error is not None:
        raise ValueError(error)
    if self.guided_decoding is not None:
        self.guided_decoding._validate()
    self.logprobs = self.logprobs and int(self.logprobs)
    self.prompt_logprobs = self.prompt_logprobs and int(self.prompt_logprobs)


# Any: its fields are made at run time (nv.SAMPLING_PARAMS), which mypy cannot see.
SamplingParams: Any = dataclasses.make_dataclass(
    "SamplingParams",
    [(name, Any, dataclasses.field(default=default)) for name, default in nv.SAMPLING_PARAMS],
    kw_only=True,
    slots=True,
    namespace={
        "__post_init__": _sampling_post_init,
        "_greedy_decoding": property(
            lambda self: not self.use_beam_search and nv.greedy(self.temperature, self.top_p, self.top_k)
        ),
        "__module__": __name__,
    },
)


@dataclasses.dataclass(slots=True)
class LoRARequest:
    """LoRARequest(lora_name, lora_int_id, lora_path, lora_ckpt_source); its checks are estimated."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_ckpt_source: str = "hf"

    def __post_init__(self) -> None:
        if self.lora_path and not Path(self.lora_path).exists():
            raise ValueError(f"lora_dir {self.lora_path} does not exist")
        if self.lora_ckpt_source not in ("hf", "nemo"):
            raise ValueError(f"lora_ckpt_source must be 'hf' or 'nemo', got '{self.lora_ckpt_source}'")


def update_llm_args_with_extra_dict(
    llm_args: Mapping[str, Any], llm_args_dict: Mapping[str, Any], extra_llm_api_options: str | None = None
) -> dict[str, Any]:
    """The merge upstream's model applies to model.yaml: the mapped configs must be mappings (the real
    one builds `Cls(**value)`); keys are checked by LLM(), as TorchLlmArgs checks them."""
    for name, cls in nv.EXTRA_DICT_CLASSES.items():
        value = llm_args_dict.get(name)
        if name in llm_args_dict and not isinstance(value, Mapping):
            raise TypeError(f"{cls}() argument after ** must be a mapping, not {type(value).__name__}")
    return {**llm_args, **llm_args_dict}


class ExecutorRequestError(RuntimeError):
    """tensorrt_llm.executor.RequestError's stand-in: a request the executor failed, raised when its
    result is iterated (upstream's model sends it as nv.GENERATE_ERROR + the text)."""


@dataclasses.dataclass(slots=True)
class KvCacheMetrics:
    num_total_allocated_blocks: int = 0
    num_new_allocated_blocks: int = 0
    num_reused_blocks: int = 0
    num_missed_blocks: int = 0
    kv_cache_hit_rate: float = 0.0


@dataclasses.dataclass(slots=True)
class TimingMetrics:
    arrival_time: datetime.timedelta = datetime.timedelta(0)
    first_scheduled_time: datetime.timedelta = datetime.timedelta(0)
    first_token_time: datetime.timedelta = datetime.timedelta(0)
    last_token_time: datetime.timedelta = datetime.timedelta(0)


@dataclasses.dataclass(slots=True)
class SpeculativeDecodingMetrics:
    acceptance_rate: float = 0.0
    total_accepted_draft_tokens: int = 0
    total_draft_tokens: int = 0


@dataclasses.dataclass(slots=True)
class RequestPerfMetrics:
    """CompletionOutput.request_perf_metrics: the fields upstream's llmapi model reads of it."""

    timing_metrics: TimingMetrics
    kv_cache_metrics: KvCacheMetrics
    speculative_decoding: SpeculativeDecodingMetrics


def _perf_metrics(perf: Any) -> RequestPerfMetrics:
    def since_epoch(ns: int) -> datetime.timedelta:
        return datetime.timedelta(microseconds=ns / 1000)

    blocks = perf.kv_cache_alloc_total_blocks
    return RequestPerfMetrics(
        TimingMetrics(
            since_epoch(perf.arrival_time_ns),
            since_epoch(perf.first_scheduled_time_ns),
            since_epoch(perf.first_token_time_ns),
            since_epoch(perf.last_token_time_ns),
        ),
        KvCacheMetrics(
            num_total_allocated_blocks=blocks,
            num_new_allocated_blocks=perf.kv_cache_alloc_new_blocks,
            num_reused_blocks=perf.kv_cache_reused_blocks,
            num_missed_blocks=blocks - perf.kv_cache_reused_blocks,
            kv_cache_hit_rate=perf.kv_cache_reused_blocks / blocks if blocks else 0.0,
        ),
        SpeculativeDecodingMetrics(
            acceptance_rate=perf.acceptance_rate,
            total_accepted_draft_tokens=perf.total_accepted_draft_tokens,
            total_draft_tokens=perf.total_draft_tokens,
        ),
    )


def _prompt_logprobs(context_logits: Any, top: int) -> list[dict[int, Logprob]]:
    """1.2's compute_logprobs for the prompt: the `top` most likely tokens of each context position
    (ranked), without the prompt's own tokens."""
    import torch

    log_probs = torch.log_softmax(torch.as_tensor(context_logits, dtype=torch.float32), -1)
    values, indices = torch.topk(log_probs, min(top, log_probs.shape[-1]), -1)
    return [
        {int(i): Logprob(float(v), rank) for rank, (v, i) in enumerate(zip(row_v, row_i, strict=True), 1)}
        for row_v, row_i in zip(values.tolist(), indices.tolist(), strict=True)
    ]


# ---- results --------------------------------------------------------------------------------------------


class RequestOutput:
    """What generate_async returns: an async iterable of itself, one step per engine response."""

    def __init__(
        self,
        request_id: int,
        prompt_token_ids: list[int],
        engine: TextEngineLoop,
        logprobs: int,
        prompt_logprobs: int = 0,
        context_logits: bool = False,
    ) -> None:
        self.request_id = request_id
        self.prompt: str | None = None
        self.prompt_token_ids = prompt_token_ids
        self.outputs = [CompletionOutput(0)]
        self.context_logits: torch.Tensor | None = None
        self.finished = False
        self._logprobs = logprobs
        self._prompt_logprobs = prompt_logprobs
        self._keep_context_logits = context_logits
        self._engine = engine
        assert engine.loop is not None  # generate_async binds the engine to its loop first
        self._loop = engine.loop
        self._pending: collections.deque[Update] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._aborted = False
        self._done = False
        self._failure: str | None = None  # an executor error for this request (see `_fail`)
        self._on_final: Callable[[], None] | None = None  # the LLM's KV bookkeeping

    def _fail(self, message: str) -> None:
        """Ends the request with an executor error (raised as ExecutorRequestError when iterated);
        on the loop. The engine never saw it: nothing to count as taken."""
        self._failure = message
        self._final()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _final(self) -> None:
        hook, self._on_final = self._on_final, None
        if hook is not None:
            hook()

    def abort(self) -> None:
        """Cancels the request: the engine drops it at its next round; the last step says so."""
        self._aborted = True
        self._engine.took(len(self._pending))  # a reader that aborts may read no further

    def aborted(self) -> bool:
        return self._aborted

    # the engine loop's side (Sink): `_push` runs on the loop, `is_cancelled` on the engine thread
    def _push(self, update: Update) -> None:
        if self._aborted:
            self._engine.took()
        self._pending.append(update)
        if update.final:
            self._final()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def is_cancelled(self) -> bool:
        return self._aborted

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        pending = self._pending
        while not pending:
            if self._failure is not None:
                self._done = self.finished = True
                raise ExecutorRequestError(self._failure)
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self._engine.took()
        self._apply(pending.popleft())
        return self

    def _apply(self, update: Update) -> None:
        if update.error is not None:
            self._done = self.finished = True
            raise ExecutorRequestError(update.error)
        if update.beams is not None:  # a beam search: its one step, every output at once
            self._done = self.finished = True
            self.outputs = [
                CompletionOutput(i, text, list(ids), cum if self._logprobs else None, finish_reason=reason)
                for i, (text, ids, cum, reason) in enumerate(update.beams)
            ]
            if update.perf is not None:
                for out in self.outputs:
                    out.request_perf_metrics = _perf_metrics(update.perf)
            return
        out = self.outputs[0]
        if update.context_logits is not None:
            if self._prompt_logprobs:
                out.prompt_logprobs = _prompt_logprobs(update.context_logits, self._prompt_logprobs)
            if self._keep_context_logits:
                import torch

                self.context_logits = torch.from_numpy(update.context_logits)
        if update.perf is not None:
            out.request_perf_metrics = _perf_metrics(update.perf)
        out._last_text_len = len(out.text)
        out._last_token_ids_len = len(out.token_ids)
        out._last_logprobs_len = len(out.logprobs)
        if update.text:
            out.text += update.text
        if update.ids:
            out.token_ids.extend(update.ids)
            if update.log_probs is not None:
                out.logprobs.extend(_entries(update, self._logprobs))
        if update.log_probs is not None:
            out.cumulative_logprob = update.cumulative_logprob
        if update.final:
            self._done = self.finished = True
            out.finish_reason = update.finish_reason
            out.stop_reason = stop = update.stop_reason
            # STOP_WORDS: the stop token is cut from token_ids (include_stop_str_in_output is refused)
            if isinstance(stop, int) and out.token_ids and out.token_ids[-1] == stop:
                del out.token_ids[-1]
                if len(out.logprobs) > len(out.token_ids):
                    del out.logprobs[-1]


def _entries(update: Update, wanted: int) -> list[dict[int, Logprob]]:
    """Per token: the sampled token's Logprob (its rank when it is among the top), then the `wanted`
    most likely tokens with ranks 1..wanted (what the source computed of them)."""
    tops = update.top or ()
    out = []
    for i, (token, log_prob) in enumerate(zip(update.ids, update.log_probs or (), strict=False)):
        top_ids, top_values = tops[i] if i < len(tops) else ((), ())
        ranked = list(zip(top_ids[:wanted], top_values[:wanted], strict=False))
        rank = next((r for r, (t, _) in enumerate(ranked, 1) if t == token), None)
        entry = {token: Logprob(log_prob, rank)}
        for r, (t, v) in enumerate(ranked, 1):
            entry.setdefault(t, Logprob(v, r))
        out.append(entry)
    return out


# ---- the LLM ------------------------------------------------------------------------------------------


def _check_lora_modules(config: Any) -> None:
    """The PyTorch executor's LoRA set-up (create_py_executor_instance, _torch/pyexecutor/_util.py):
    one lora_dir lets it infer lora_target_modules from that adapter (none there: ValueError); with
    none or several it asserts that lora_target_modules names at least one. LoraConfig itself takes
    an empty lora_dir."""
    if config.lora_target_modules:
        return
    if len(config.lora_dir) != 1:
        raise AssertionError("Expecting at least one lora target module")
    adapter = Path(config.lora_dir[0]) / "adapter_config.json"
    if not adapter.is_file() or not json.loads(adapter.read_text()).get("target_modules"):
        raise ValueError(
            "lora_target_modules is empty. Please specify lora_target_modules or provide lora_dir to "
            "infer lora_target_modules."
        )


class StandInLLM:
    """`tensorrt_llm.LLM` over a stand-in token source (built by StandIn.LLM)."""

    def __init__(self, standin: StandIn, **kwargs: Any) -> None:
        self.args = nv.validate_llm_args(kwargs)  # pydantic's ValidationError, as TorchLlmArgs
        args = self.args
        model_dir = str(args.model)
        tokenizer_dir = args.tokenizer if isinstance(args.tokenizer, (str, Path)) else model_dir
        self.tokenizer = standin.tokenizer
        self.source, self.vocab_size, own_limit = standin.make_source(
            standin.kind,
            model_dir,
            str(tokenizer_dir),
            device=standin.device,
            dtype=standin.dtype or args.dtype,
            slots=int(args.max_batch_size or 0),
            max_seq_len=int(args.max_seq_len or 0),
            block_reuse=bool(getattr(args.kv_cache_config, "enable_block_reuse", False)),
            tokens_per_block=int(getattr(args.kv_cache_config, "tokens_per_block", 0) or 0),
        )
        if args.max_seq_len is None:
            args.max_seq_len = own_limit
        self._speculate(args.speculative_config, standin.log)
        self._loras = None
        self._base_config: dict[str, Any] = {}
        if args.lora_config is not None:
            from lora import LoraCache

            _check_lora_modules(args.lora_config)
            self._loras = LoraCache(int(args.lora_config.max_loras or 8))
            config = Path(model_dir) / "config.json"
            self._base_config = json.loads(config.read_text()) if config.is_file() else {}
        self._next_id = 0
        self._last_spec: dict[str, int] = {}  # the speculative counts get_stats last saw
        kv_tokens = getattr(args.kv_cache_config, "max_tokens", None)
        self._kv_capacity = int(kv_tokens) if kv_tokens else None  # None: room for every request
        self._kv_used = 0
        self._kv_queue: collections.deque[tuple[int, EngineRequest, tuple[str, ...], RequestOutput]] = (
            collections.deque()
        )
        self._log = standin.log
        self._engine = TextEngineLoop(
            self.source, self.tokenizer, log=standin.log, step_delay_s=standin.step_delay_s, name=standin.kind
        )

    def _speculate(self, config: Any, log: Callable[[str], None]) -> None:
        """speculative_config: NGram drafts in the reference engine (reference.py); another decoding
        type fails the LLM's construction (ValueError); the synthetic engine serves without drafts."""
        if config is None:
            return
        speculate = getattr(self.source, "speculate", None)
        why = "the synthetic engine does not draft" if speculate is None else speculate(config)
        if why is not None:
            log(f"speculative_config: {why}; serving without speculative decoding")
        elif not self.args.disable_overlap_scheduler:  # the PyTorch executor's warning (NGram: no overlap)
            log("Disable overlap scheduler for speculation mode NGRAM")

    def speculative_counters(self) -> dict[str, int | float] | None:
        """The engine's speculative decoding counters since start (draft_tokens, accepted_draft_tokens,
        verify_passes, decode_steps, acceptance_rate); None where the engine keeps none."""
        counters = getattr(self.source, "speculative_counters", None)
        return counters() if counters is not None else None

    def describe(self) -> str:
        describe = getattr(self.source, "describe", None)
        return describe() if describe is not None else type(self.source).__name__

    def generate_async(
        self,
        inputs: Any,
        sampling_params: Any = None,
        lora_request: Any = None,
        prompt_adapter_request: Any = None,
        streaming: bool = False,
        kv_cache_retention_config: Any = None,
        disaggregated_params: Any = None,
        _postproc_params: Any = None,
        scheduling_params: Any = None,
        cache_salt: Any = None,
    ) -> RequestOutput:
        """LLM.generate_async: `inputs` is a prompt or its token ids; must run on the asyncio loop
        that iterates the result."""
        loop = asyncio.get_running_loop()
        engine = self._engine
        if engine.loop is None:
            engine.loop = loop
        elif engine.loop is not loop:
            raise RuntimeError("generate_async must be called on one event loop")
        params = SamplingParams() if sampling_params is None else sampling_params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        if lora_request is not None and not isinstance(lora_request, LoRARequest):
            raise TypeError(f"lora_request must be a LoRARequest, got {type(lora_request).__name__}")
        if not isinstance(streaming, bool):
            raise TypeError(f"streaming must be a bool, got {type(streaming).__name__}")
        for name, value in (
            ("prompt_adapter_request", prompt_adapter_request),
            ("kv_cache_retention_config", kv_cache_retention_config),
            ("disaggregated_params", disaggregated_params),
            ("scheduling_params", scheduling_params),
            ("cache_salt", cache_salt),
        ):
            if value is not None:
                raise RequestError(f"{name} is not modelled by the stand-in engine")
        if isinstance(inputs, str):
            ids = self.tokenizer.encode(inputs, add_special_tokens=params.add_special_tokens)
        else:
            ids = [int(i) for i in inputs]
        if not ids:
            raise ValueError("The inputs must not be empty")
        self._check_arguments(ids)
        self._next_id += 1
        request, stops, failure = self._engine_request(ids, params, streaming, lora_request)
        result = RequestOutput(
            self._next_id,
            ids,
            engine,
            int(params.logprobs or 0),
            int(params.prompt_logprobs or 0),
            bool(params.return_context_logits),
        )
        if isinstance(inputs, str):
            result.prompt = inputs
        if failure is not None:  # the executor's refusal: a request error, as the real one delivers it
            loop.call_soon(result._fail, failure)
        else:
            self._admit(request, stops, result)
        return result

    def _check_arguments(self, ids: list[int]) -> None:
        """LLM._check_arguments, PyTorch backend (1.2-era: ValueError): without chunked prefill a
        prompt must fit max_num_tokens (one forward pass)."""
        args = self.args
        if args.enable_chunked_prefill or not args.max_num_tokens:
            return
        prompt_len = len(ids) / int(args.context_parallel_size or 1)
        if prompt_len > args.max_num_tokens:
            raise ValueError(
                nv.PROMPT_OVER_MAX_NUM_TOKENS.format(
                    prompt_len=prompt_len, query_len=0, max_num_tokens=args.max_num_tokens
                )
            )

    def _admit(self, request: EngineRequest, stops: tuple[str, ...], result: RequestOutput) -> None:
        """Into the engine when its KV reservation fits, else into the queue (see the docstring)."""
        if self._kv_capacity is None:
            self._engine.submit_text(request, stops, result)
            return
        need = len(request.input_ids) + request.max_new
        self._kv_queue.append((need, request, stops, result))
        self._schedule()

    def _schedule(self) -> None:
        """Admits queued requests, first come first served, while their reservations fit (the loop)."""
        queue, capacity = self._kv_queue, self._kv_capacity
        assert capacity is not None
        while queue:
            need, request, stops, result = queue[0]
            if result.aborted():  # cancelled while waiting: never reached the engine
                queue.popleft()
                continue
            if self._kv_used + need <= capacity:
                queue.popleft()
                self._kv_used += need
                result._on_final = lambda need=need: self._release(need)
                self._engine.submit_text(request, stops, result)
                continue
            if self._kv_used == 0:  # it cannot fit even alone: the executor gives up on it
                queue.popleft()
                result._fail(nv.NOTHING_SCHEDULABLE)
                continue
            return

    def _release(self, need: int) -> None:
        self._kv_used -= need
        self._schedule()

    def _engine_request(
        self, ids: list[int], params: Any, streaming: bool, lora_request: LoRARequest | None
    ) -> tuple[EngineRequest, tuple[str, ...], str | None]:
        """The engine request, its stop strings, and the executor's refusal of it (None: served)."""
        for name in NOT_MODELLED:
            if getattr(params, name) != nv.SAMPLING_DEFAULTS[name]:
                raise RequestError(f"SamplingParams.{name} is not modelled by the stand-in engine")
        # SamplingParams._get_sampling_config: beam search searches best_of beams, else width 1.
        width = int(params.best_of) if params.use_beam_search else 1
        max_width = int(self.args.max_beam_width or 1)
        failure = None
        if width != max_width:  # the executor's check of every request, width 1 included
            failure = nv.BEAM_WIDTH_NOT_MAX.format(bw=width, mbw=max_width)
        elif width > 1 and int(params.logprobs or 0) > 1:
            failure = nv.BEAM_MULTIPLE_LOGPROBS
        elif max(int(params.logprobs or 0), int(params.prompt_logprobs or 0)) > self.vocab_size:
            failure = nv.TOPK_OUT_OF_RANGE
        if params.use_beam_search:
            if streaming:
                raise RequestError("streaming beam search is not served by the stand-in engine")
        elif params.best_of != 1 or params.n != 1:
            raise RequestError(
                f"best_of {params.best_of}, n {params.n}: the stand-in engine samples one sequence"
            )
        max_new = int(params.max_tokens)
        room = int(self.args.max_seq_len or 0) - len(ids)
        if self.args.max_seq_len and max_new > room:  # BaseWorker._deduce_max_tokens: clamped, warned
            if room <= 0:
                raise RequestError(
                    f"the prompt ({len(ids)} tokens) leaves no room within max_seq_len "
                    f"{self.args.max_seq_len} (the stand-in's refusal; the LLM API's is unconfirmed)"
                )
            self._log(nv.MAX_TOKENS_CLAMPED.format(max_tokens=max_new, default_max_tokens=room))
            max_new = room
        guide = None
        if params.guided_decoding is not None:
            if self.args.guided_decoding_backend is None:
                raise ValueError("guided decoding needs the LLM's guided_decoding_backend set")
            guide = _guide(params.guided_decoding, self.args.guided_decoding_backend)
        end_id = params.end_id if params.end_id is not None else self.tokenizer.eos_token_id
        bias = None
        if params.embedding_bias is not None:  # SamplingParams made it a float32 tensor [vocab_size]
            bias = np.asarray(params.embedding_bias, dtype=np.float32).reshape(-1)
            if bias.shape[0] != self.vocab_size:
                raise RequestError(
                    f"SamplingParams.embedding_bias has {bias.shape[0]} values; the vocabulary has "
                    f"{self.vocab_size} (the sampler adds it to every step's logits)"
                )
        stops = params.stop
        request = EngineRequest(
            request_id=str(self._next_id),
            input_ids=ids,
            max_new=max_new,
            end_id=-1 if params.ignore_eos or end_id is None else int(end_id),
            streaming=streaming,
            exclude_input=True,
            greedy=params._greedy_decoding,
            temperature=1.0 if params.temperature is None else float(params.temperature),
            top_k=int(params.top_k or 0),
            top_p=float(params.top_p or 0.0),
            repetition_penalty=1.0 if params.repetition_penalty is None else float(params.repetition_penalty),
            presence_penalty=float(params.presence_penalty or 0.0),
            frequency_penalty=float(params.frequency_penalty or 0.0),
            min_tokens=int(params.min_tokens or 0),
            seed=None if params.seed is None else int(params.seed),
            stop_words=[[int(t)] for t in params.stop_token_ids or ()],
            bad_words=[[int(t)] for t in params.bad_token_ids or ()],
            embedding_bias=bias,
            return_log_probs=bool(params.logprobs),
            return_context_logits=bool(params.return_context_logits or params.prompt_logprobs),
            return_generation_logits=False,
            outputs=frozenset(),
            guide=guide,
            top_logprobs=int(params.logprobs or 0),
            return_perf_metrics=bool(params.return_perf_metrics),
            beam_width=width,
            num_return=int(params.n) if width > 1 else 1,
            # None: the C++ runtime's defaults (SamplingParams' docstring: 0.f and 1)
            length_penalty=0.0 if params.length_penalty is None else float(params.length_penalty),
            early_stopping=1 if params.early_stopping is None else int(params.early_stopping),
        )
        if width > 1 and failure is None:
            from contract import _check_beam_request

            _check_beam_request(request)
        if lora_request is not None:
            request.lora = self._adapter(lora_request)
        return request, tuple(dict.fromkeys([stops] if isinstance(stops, str) else stops or ())), failure

    def _adapter(self, lora: LoRARequest) -> Any:
        """The adapter's factors in the form the source applies (loaded once, cached by id)."""
        if self._loras is None:
            raise ValueError("a lora_request needs the LLM's lora_config")
        prepare = getattr(self.source, "prepare_lora", None)
        if prepare is None:  # the synthetic source has no weights to adapt
            return None
        from lora import read_peft

        return self._loras.get(
            lora.lora_int_id, lambda: prepare(read_peft(lora.lora_path, self._base_config).factors)
        )

    def get_stats(self, timeout: float | None = 2) -> list[dict[str, Any]]:
        """LLM.get_stats: the iteration stats since the last call, here one snapshot of the engine
        (engine_stats.snapshot); none without `enable_iter_perf_stats`, as upstream."""
        if not getattr(self.args, "enable_iter_perf_stats", False):
            return []
        from engine_stats import snapshot

        return [snapshot(self._engine, self.source, self._last_spec)]

    async def get_stats_async(self, timeout: float | None = 2) -> Any:
        """LLM.get_stats_async: the same, as an async iterable."""
        for stats in self.get_stats(timeout):
            yield stats

    def busy(self) -> bool:
        """Whether the engine is inside a step now (ours: the supervisor's probe tells a long
        prefill from a stuck engine by it; TensorRT-LLM's LLM has no such call)."""
        return self._engine.in_step

    def shutdown(self) -> None:
        self._engine.shutdown()


def _guide(params: Any, backend: str) -> tuple[str, str]:
    """The (guide type, guide) our engines take for a GuidedDecodingParams, as the LLM's grammar
    `backend` reads it (xgrammar's strict JSON schemas: grammars.as_read_by)."""
    if params.structural_tag is not None:
        raise RequestError("GuidedDecodingParams.structural_tag is not modelled by the stand-in engine")
    if params.json_object:
        return "json", ""
    if params.json is not None:
        schema = params.json
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return "json_schema", as_read_by(backend, "json_schema", text)
    if params.regex is not None:
        return "regex", params.regex
    if params.grammar is not None:
        return "ebnf_grammar", params.grammar
    raise RequestError("GuidedDecodingParams without a guide")


@dataclasses.dataclass
class StandIn:
    """The stand-in `tensorrt_llm` surface for one model: `kind` (reference | synthetic), the tokenizer
    the model loaded, and how to build the source (sources.make_source in Triton)."""

    kind: str
    tokenizer: Any
    make_source: Callable[..., tuple[Any, int, int]]
    log: Callable[[str], None] = print
    step_delay_s: float = 0.0
    device: str = "auto"
    dtype: str | None = None

    SamplingParams = SamplingParams
    GuidedDecodingParams = GuidedDecodingParams
    LoRARequest = LoRARequest
    update_llm_args_with_extra_dict = staticmethod(update_llm_args_with_extra_dict)
    version = VERSION

    def LLM(self, **kwargs: Any) -> StandInLLM:  # tensorrt_llm's name
        return StandInLLM(self, **kwargs)

    def describe(self, llm: StandInLLM) -> str:
        return f"TensorRT-LLM {nv.TAG} LLM API stand-in over the {self.kind} engine ({llm.describe()})"
