"""The reference token source: a Hugging Face causal LM run with PyTorch (CPU, or CUDA when present).

It samples as TensorRT-LLM does (embedding bias, repetition / presence / frequency penalties, bad
words, min_length, then temperature, top-k, top-p), one forward pass per sequence and step with a
per-request KV cache. Greedy output equals `transformers` generate token for token.
"""

from __future__ import annotations

import secrets
from typing import Any

import torch
from engine import Sequence
from transformers import AutoModelForCausalLM, DynamicCache


class ReferenceSource:
    """Token source over a Hugging Face checkpoint directory."""

    def __init__(self, model_dir: str, device: str = "auto", dtype: str = "auto") -> None:
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        self.device = torch.device(device)
        self.dtype_name = dtype
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        self.model.to(self.device).eval()
        self.vocab_size = int(self.model.config.vocab_size)
        self.max_position_embeddings = int(getattr(self.model.config, "max_position_embeddings", 2048))

    def describe(self) -> str:
        return f"reference engine on {self.device} ({self.dtype_name})"

    def start(self, seq: Sequence) -> None:
        request = seq.request
        state = _State()
        if not request.greedy:
            state.generator = torch.Generator(device=self.device)
            seed = request.seed if request.seed is not None else secrets.randbits(63)
            state.generator.manual_seed(int(seed))
        if request.embedding_bias is not None:
            state.bias = torch.from_numpy(request.embedding_bias).to(self.device)
        seq.state = state

    def release(self, seq: Sequence) -> None:
        seq.state = None

    def step(self, seqs: list[Sequence]) -> list[tuple[int, float] | BaseException]:
        results: list[tuple[int, float] | BaseException] = []
        for seq in seqs:
            try:
                results.append(self._sample(seq, self._forward(seq)))
            except Exception as exc:  # a failure of one request must not stop the others
                results.append(exc)
        return results

    @torch.inference_mode()
    def _forward(self, seq: Sequence) -> torch.Tensor:
        state: _State = seq.state
        request = seq.request
        if state.cache is None:
            state.cache = DynamicCache(config=self.model.config)
            ids = torch.tensor([request.input_ids], device=self.device)
            prompt_counts = torch.bincount(ids[0], minlength=self.vocab_size)[: self.vocab_size]
            state.counts = torch.zeros(self.vocab_size, dtype=torch.int64, device=self.device)
            state.prompt_mask = prompt_counts > 0
        else:
            ids = torch.tensor([[seq.generated[-1]]], device=self.device)
        out = self.model(input_ids=ids, past_key_values=state.cache, use_cache=True)
        state.cache = out.past_key_values
        if request.return_context_logits and seq.context_logits is None:
            seq.context_logits = out.logits[0].float().cpu().numpy()
        return out.logits[0, -1].float()

    @torch.inference_mode()
    def _sample(self, seq: Sequence, logits: torch.Tensor) -> tuple[int, float]:
        state: _State = seq.state
        request = seq.request
        logits = logits[: self.vocab_size].clone()
        if state.bias is not None:
            logits += state.bias
        if request.repetition_penalty != 1.0:
            seen = state.prompt_mask | (state.counts > 0)
            penalized = torch.where(
                logits > 0, logits / request.repetition_penalty, logits * request.repetition_penalty
            )
            logits = torch.where(seen, penalized, logits)
        if request.presence_penalty or request.frequency_penalty:
            counts = state.counts.to(logits.dtype)
            logits -= (
                request.presence_penalty * (counts > 0).to(logits.dtype) + request.frequency_penalty * counts
            )
        for word in request.bad_words:
            if len(word) == 1 or seq.generated[-(len(word) - 1) :] == word[:-1]:
                logits[word[-1]] = -float("inf")
        if 0 <= request.end_id < self.vocab_size and len(seq.generated) < request.min_length:
            logits[request.end_id] = -float("inf")
        if request.return_generation_logits:
            seq.generation_logits.append(logits.cpu().numpy())

        if request.greedy:
            token = int(torch.argmax(logits))
            log_prob = float(torch.log_softmax(logits, -1)[token]) if request.return_log_probs else 0.0
        else:
            scaled = logits / request.temperature
            if request.top_k > 0:
                kth = torch.topk(scaled, min(request.top_k, scaled.shape[-1])).values[-1]
                scaled = scaled.masked_fill(scaled < kth, -float("inf"))
            if 0.0 < request.top_p < 1.0:
                sorted_logits, order = torch.sort(scaled, descending=True)
                probs = torch.softmax(sorted_logits, -1)
                drop = probs.cumsum(-1) - probs >= request.top_p
                scaled = scaled.scatter(0, order, sorted_logits.masked_fill(drop, -float("inf")))
            log_probs = torch.log_softmax(scaled, -1)
            token = int(torch.multinomial(log_probs.exp(), 1, generator=state.generator))
            log_prob = float(log_probs[token])
        state.counts[token] += 1
        return token, log_prob


class _State:
    """Per-request tensors of the reference source."""

    __slots__ = ("bias", "cache", "counts", "generator", "prompt_mask")

    def __init__(self) -> None:
        self.cache: Any = None
        self.counts: torch.Tensor | None = None
        self.prompt_mask: torch.Tensor | None = None
        self.generator: torch.Generator | None = None
        self.bias: torch.Tensor | None = None
