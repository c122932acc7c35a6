"""The two flavours of a packed model, each one object made once where the runtime is assembled.

- `LLMAPIFlavor` ("llmapi"): TensorRT-LLM's LLM API (PyTorch backend) in one Python model; token ids
  in, text out (it detokenizes in Triton); an adapter travels by name; beams exactly max_beam_width.
- `EnsembleFlavor` ("ensemble", legacy): NVIDIA's C++ `tensorrtllm` backend contract; token ids in
  and out, detokenized here; an adapter travels as a task id, with its weights on first use.

Each owns what differs: the Triton models it needs, its input table and message builder
(relay/request.py's tables), its response readers (relay/readers.py), its LoRA policy and its
capabilities at the pinned TensorRT-LLM (log probs, guides, beam search, early_stopping), which the
API and the doctor ask it. Nothing else compares the flavour's name: `flavor_of` picks the class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from tensorrtllm_backend import pinned
from tensorrtllm_backend.detokenizer import IncrementalDetokenizer
from tensorrtllm_backend.lora import ROWS_CONFIG, ROWS_WEIGHTS
from trtllm_service.errors import APIError
from trtllm_service.packed_model import (
    DEFAULT_TOKENS_PER_BLOCK,
    LORA_DIR,
    PackInfo,
    context_logits_unsupported,
    engine_tokens_per_block,
    guided_decoding_unsupported,
    llm_args,
    top_logprobs_unsupported,
)
from trtllm_service.relay.readers import Reader, TextBeams, TextReader, TokenIdBeams, TokenIdReader
from trtllm_service.relay.request import (
    ENGINE_INPUTS,
    LLMAPI_INPUTS,
    GenerationRequest,
    SamplingParams,
    TensorSpec,
    engine_message,
    llmapi_message,
)


def _positive(value: Any, default: int) -> int:
    return int(value) if isinstance(value, int) and value > 0 else default


def _read_alike(model_path: Path, info: PackInfo, vocab_size: int) -> dict[str, Any]:
    """The capabilities both flavours read from the pack the same way (by its engine, not its flavour)."""
    return {
        "no_top_logprobs": top_logprobs_unsupported(model_path, info),
        "no_prompt_logprobs": context_logits_unsupported(info),
        "no_guides": guided_decoding_unsupported(info),
        "vocab_size": vocab_size,
    }


class Flavor:
    """What one flavour is and can do, for one packed model.

    Args:
        no_top_logprobs, no_prompt_logprobs, no_guides: Why the model cannot return top log probs,
            prompt log probs, or guide its answers (None: it can).
        max_beam_width: The most beams a request may search (`exact_beams`: exactly that many).
        vocab_size: The width of the logits (0: unknown): top log probs cannot exceed it.
        tokens_per_block: Tokens per KV cache block, which the engine counts its reused blocks in.
    """

    name: ClassVar[str]
    models: ClassVar[tuple[str, ...]]
    """The Triton models that must be ready before the service is."""
    llmapi_launch: ClassVar[bool]
    """Whether Triton starts under `trtllm-llmapi-launch` (as NVIDIA's image starts the LLM API)."""
    inputs: ClassVar[Mapping[str, TensorSpec]]
    """GenerationRequest field -> the Triton input it rides in."""
    exact_beams: ClassVar[bool]
    """Whether a beam search must be exactly max_beam_width wide (TensorRT-LLM 1.2.1's PyTorch executor)."""
    early_stopping: ClassVar[bool]
    """Whether early_stopping other than true reaches the engine."""
    legacy: ClassVar[str | None] = None
    """The doctor's warning about the flavour itself (None: none)."""
    reference_means_missing: ClassVar[bool] = False
    """Whether the reference engine answering means tensorrt_llm could not be imported where Triton
    runs (rather than being the engine that was packed)."""
    probe: ClassVar[tuple[str, Mapping[str, object]] | None] = None
    """(model, inputs) of the request the engine's model answers through its own threads without
    the engine, for the supervisor (None: the model answers none, as NVIDIA's C++ backend)."""

    def __init__(
        self,
        *,
        no_top_logprobs: str | None = None,
        no_prompt_logprobs: str | None = None,
        no_guides: str | None = None,
        max_beam_width: int = 1,
        vocab_size: int = 0,
        tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK,
    ) -> None:
        self.no_top_logprobs = no_top_logprobs
        self.no_prompt_logprobs = no_prompt_logprobs
        self.no_guides = no_guides
        self.max_beam_width = max_beam_width
        self.vocab_size = vocab_size
        self.tokens_per_block = tokens_per_block
        # LoRA name -> id, dir (its files), loaded (while serving): set by the runtime
        self.adapters: Mapping[str, Mapping[str, Any]] = {}

    # ---- the wire ----------------------------------------------------------------------------------------

    def message(self, request: GenerationRequest, request_id: str) -> bytes:
        """The serialized ModelInferRequest of `request`."""
        raise NotImplementedError

    def reader(self, request: GenerationRequest) -> Reader:
        """What reads the responses of `request`."""
        raise NotImplementedError

    # ---- LoRA --------------------------------------------------------------------------------------------

    def with_adapter(self, request: GenerationRequest) -> tuple[GenerationRequest, GenerationRequest | None]:
        """(the request to send for its adapter, the one to send instead if the engine does not hold
        the adapter; None: never)."""
        return request, None

    def triton_restarted(self) -> None:
        """A new Triton: it holds none of the adapters sent before."""

    def adapter_entry(self, name: str) -> Mapping[str, Any]:
        """The adapter `name` names now: a 404 when it was unloaded since the request was checked."""
        entry = self.adapters.get(name)
        if entry is None:
            raise APIError.model_not_found(name)
        return entry

    # ---- capabilities ------------------------------------------------------------------------------------

    @property
    def beam_limit(self) -> tuple[int, bool]:
        """(the most beams a request may search, whether it must be exactly that many)."""
        return self.max_beam_width, self.exact_beams

    @property
    def beam_packed(self) -> int | None:
        """The beam width of a beam-packed model (None: not one). TensorRT-LLM 1.2.1's PyTorch
        executor refuses every request whose beam width is not the model's max_beam_width, width 1
        included, so such a model runs every request as a beam search over that width."""
        width = self.max_beam_width
        return width if self.exact_beams and width > 1 else None

    def check_logprobs(self, params: SamplingParams, param: str) -> None:
        """A 400 when the request asks for top log probs this engine cannot return: a C++ engine
        built without generation logits, or more than the vocabulary has (TensorRT-LLM 1.2.1's
        PyTorch backend takes the top N with torch.topk, which fails beyond it: its only limit)."""
        if params.logprobs and self.no_top_logprobs:
            raise APIError.bad_request(self.no_top_logprobs, param=param)
        vocab = self.vocab_size
        for count in (params.logprobs, params.prompt_logprobs):
            if vocab and count is not None and count > vocab:
                raise APIError.bad_request(
                    f"'{param}' asks for {count} top log probs per token; the vocabulary has {vocab}.",
                    param=param,
                )

    def fill_beam_search(self, params: SamplingParams) -> SamplingParams:
        """On a beam-packed model (`beam_packed`), a request that did not ask for beam search becomes
        one over the packed width (its `n` best beams are its choices); a sampling field that
        cannot apply to it is a 400 naming the field. Any other model: `params` as they are."""
        width = self.beam_packed
        if width is None or params.beam_width:
            return params
        for name, neutral in (("temperature", (None, 0, 1)), ("top_p", (None, 1)), ("top_k", (None, 0, -1))):
            if getattr(params, name) not in neutral:
                raise APIError.bad_request(
                    f"'{name}' does not apply: this model runs every request as a beam search over "
                    f"{width} beams (packed with --max-beam-width {width}), which scores the model's own "
                    "log probabilities; leave it unset.",
                    param=name,
                )
        return replace(params, beam_width=width, temperature=None, top_p=None, top_k=None)

    def check_engine_features(
        self,
        params: SamplingParams,
        *,
        stream: bool = False,
        n: int = 1,
        logprobs_param: str = "logprobs",
        guide_param: str = "response_format",
    ) -> None:
        """400s for what this engine cannot do with these parameters: prompt log probs without the
        context logits, beam search beyond the engine's beams, or with what beam search is not
        served with here (streaming several beams, log probs, a guide, prompt log probs; NVIDIA's
        executor itself refuses a guide with beams, its PyTorch sampler more than one log prob).
        One beam of a beam-packed model streams, as one chunk. `logprobs_param` and `guide_param`:
        the fields a 400 about log probs or a guide names."""
        if params.prompt_logprobs is not None and self.no_prompt_logprobs:
            raise APIError.bad_request(self.no_prompt_logprobs, param="echo")
        width = params.beam_width or 1
        if width <= 1:
            return
        limit, exact = self.beam_limit
        if width > limit or (exact and width != limit):
            if limit < 2:
                how = "was packed without beam search (max_beam_width 1)"
            elif exact:
                how = f"searches exactly {limit} beams (the LLM API's max_beam_width)"
            else:
                how = f"searches at most {limit} beams (the engine's max_beam_width)"
            raise APIError.bad_request(
                f"beam search over {width} beams: this model {how}; pack it with the beam width you "
                "need (pack_model.py --max-beam-width)",
                param="use_beam_search",
            )
        if n > width:
            raise APIError.bad_request(f"n ({n}) cannot exceed the beam width ({width})", param="n")
        if params.logprobs is not None and params.logprobs > 1:
            raise APIError.bad_request(
                f"beam search is not served with {params.logprobs} top log probs per token (TensorRT-LLM's "
                'PyTorch sampler: "Beam search does not support multiple logprobs")',
                param=logprobs_param,
            )
        for used, param, what in (
            (stream and not (n == 1 and self.beam_packed), "stream", "streaming of several beams"),
            (params.logprobs is not None, "logprobs", "log probabilities"),
            (params.prompt_logprobs is not None, "echo", "prompt log probabilities"),
            (params.guide is not None, guide_param, "structured output"),
        ):
            if used:
                raise APIError.bad_request(f"beam search is not served with {what}", param=param)
        if not self.early_stopping and params.early_stopping not in (None, True):
            # NVIDIA's backend declares early_stopping BOOL and reads it as int32 (nvidia_backend.
            # MISREAD_INPUTS): only the executor's default (early_stopping true) is sure to hold.
            raise APIError.bad_request(
                "early_stopping other than true is not available with NVIDIA's C++ backend (it misreads "
                "the input); this engine stops a beam search once the beams have finished",
                param="early_stopping",
            )

    def check_guide(self, param: str) -> None:
        """A 400 naming `param` (the field that asked for a guide) when the model cannot guide."""
        if self.no_guides:
            raise APIError.bad_request(f"'{param}' {self.no_guides}", param=param)


class LLMAPIFlavor(Flavor):
    """TensorRT-LLM's LLM API in one Python model: text out, an adapter by name, beams exactly
    model.yaml's max_beam_width."""

    name = "llmapi"
    models = ("tensorrt_llm",)
    llmapi_launch = True
    inputs = LLMAPI_INPUTS
    exact_beams = True
    early_stopping = True
    reference_means_missing = True
    probe = ("tensorrt_llm", {"probe": True})  # ours in production too: model.py is ours

    @classmethod
    def of_pack(cls, model_path: Path, info: PackInfo, *, vocab_size: int, tokenizer: Any) -> LLMAPIFlavor:
        args = llm_args(model_path)  # model.yaml: the LLM's arguments
        return cls(
            **_read_alike(model_path, info, vocab_size),
            max_beam_width=_positive(args.get("max_beam_width"), 1),  # unset: 1, no beam search
            tokens_per_block=engine_tokens_per_block(model_path, info)
            or _positive(
                (args.get("kv_cache_config") or {}).get("tokens_per_block"), DEFAULT_TOKENS_PER_BLOCK
            ),
        )

    def message(self, request: GenerationRequest, request_id: str) -> bytes:
        return llmapi_message(request, request_id)

    def reader(self, request: GenerationRequest) -> Reader:
        if request.beam_width and request.num_return is not None:  # else one beam: one text response
            return TextBeams(request)
        return TextReader(request, request.logprobs is not None or request.prompt_logprobs is not None)

    def with_adapter(self, request: GenerationRequest) -> tuple[GenerationRequest, GenerationRequest | None]:
        """A packed adapter goes by name (model.yaml lists it); a loaded one with its id and files, as
        NVIDIA's model on main takes one (`lora_id`, `lora_path`), which the LLM loads by path."""
        if request.lora_name is None:
            return request, None
        entry = self.adapter_entry(request.lora_name)
        if not entry.get("loaded"):
            return request, None
        return replace(request, lora_id=int(entry["id"]), lora_path=str(entry["dir"])), None


class EnsembleFlavor(Flavor):
    """NVIDIA's C++ `tensorrtllm` backend contract (or a stand-in in its slot): token ids out,
    detokenized here with the model's tokenizer; an adapter as its task id, its weights sent the
    first time this worker uses it with this Triton, and again when the engine no longer holds it.

    Args:
        tokenizer: The model's tokenizer (each request gets an incremental detokenizer over it).
        model_path: The packed model (its adapters' TensorRT-LLM rows, read once each).
        adapters: The packed LoRA adapters: name -> id, rank, ...
    """

    name = "ensemble"
    models = ("tensorrt_llm", "ensemble")
    llmapi_launch = False
    inputs = ENGINE_INPUTS
    exact_beams = False
    early_stopping = False
    legacy = pinned.ENSEMBLE_LEGACY_WARNING
    # Answered where our stand-in fills the engine slot (its config declares `probe`); the
    # supervisor sends it only then. The inputs NVIDIA's contract requires come along.
    probe = ("tensorrt_llm", {"probe": True, "input_lengths": 1, "request_output_len": 1})

    def __init__(
        self,
        tokenizer: Any = None,
        model_path: Path | None = None,
        adapters: Mapping[str, Mapping[str, Any]] | None = None,
        **capabilities: Any,
    ) -> None:
        super().__init__(**capabilities)
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.adapters = dict(adapters or {})
        self._lora_rows: dict[int, tuple[Any, Any]] = {}
        self._lora_sent: set[int] = set()  # task ids whose weights this worker sent to this Triton

    @classmethod
    def of_pack(cls, model_path: Path, info: PackInfo, *, vocab_size: int, tokenizer: Any) -> EnsembleFlavor:
        return cls(
            tokenizer,
            model_path,
            info.loras,
            **_read_alike(model_path, info, vocab_size),
            max_beam_width=max(1, int(info.max_beam_width or 1)),
            # a C++ engine's build's; our stand-ins count in TensorRT-LLM's default
            tokens_per_block=engine_tokens_per_block(model_path, info) or DEFAULT_TOKENS_PER_BLOCK,
        )

    def message(self, request: GenerationRequest, request_id: str) -> bytes:
        return engine_message(request, request_id)

    def reader(self, request: GenerationRequest) -> Reader:
        decoder = IncrementalDetokenizer(self.tokenizer)
        if request.beam_width:
            return TokenIdBeams(request, decoder)
        return TokenIdReader(
            request, decoder, request.logprobs is not None or request.prompt_logprobs is not None
        )

    def with_adapter(self, request: GenerationRequest) -> tuple[GenerationRequest, GenerationRequest | None]:
        if request.lora_name is None:
            return request, None
        entry = self.adapter_entry(request.lora_name)
        task_id = int(entry["id"])
        weights, config = self._lora_weights(request.lora_name, entry)
        with_weights = replace(request, lora_task_id=task_id, lora_weights=weights, lora_config=config)
        if task_id in self._lora_sent:
            return replace(request, lora_task_id=task_id), with_weights
        self._lora_sent.add(task_id)
        return with_weights, None

    def triton_restarted(self) -> None:
        self._lora_sent.clear()

    def _lora_weights(self, name: str, entry: Mapping[str, Any]) -> tuple[Any, Any]:
        """An adapter's TensorRT-LLM rows (lora_weights, lora_config), read once per id (a loaded
        adapter replaced under its name has a new id)."""
        task_id = int(entry["id"])
        rows = self._lora_rows.get(task_id)
        if rows is None:
            import numpy as np

            where = Path(entry.get("dir") or Path(self.model_path or ".") / LORA_DIR / name)
            rows = (np.load(where / ROWS_WEIGHTS), np.load(where / ROWS_CONFIG))
            self._lora_rows[task_id] = rows
        return rows


FLAVORS: Mapping[str, type[LLMAPIFlavor] | type[EnsembleFlavor]] = {
    flavor.name: flavor for flavor in (LLMAPIFlavor, EnsembleFlavor)
}


def flavor_type(info: PackInfo) -> type[LLMAPIFlavor] | type[EnsembleFlavor]:
    """The flavour class of a packed model (pack.json's `flavor`): what Triton needs (its models,
    how it is launched, its probe) is known from it before the tokenizer is read."""
    return FLAVORS[info.flavor]


def flavor_of(model_path: Path, info: PackInfo, *, vocab_size: int, tokenizer: Any) -> Flavor:
    """The flavour object of a packed model (pack.json's `flavor`), its capabilities read from the pack."""
    return flavor_type(info).of_pack(model_path, info, vocab_size=vocab_size, tokenizer=tokenizer)
