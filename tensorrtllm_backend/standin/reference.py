"""The reference token source: a Hugging Face causal LM run with PyTorch (CPU, or CUDA when present).

It samples as TensorRT-LLM does (embedding bias, repetition / presence / frequency penalties, bad
words, min_tokens, then temperature, top-k, top-p). Greedy output equals `transformers` generate
token for token; beam search (`beam_width` > 1) is transformers' beam search step for step (its
candidates, length penalty and early-stopping rules), so its beams equal `generate(num_beams=...)`.

Batching: a prompt is prefilled alone; then every sequence in generation advances in one forward
pass per step over a fixed number of batch slots (`slots`), each with its own rows in a static KV
cache of `max_len` positions and its own position and attention mask. The shapes never change,
whoever else is in the batch, so a request's logits do not depend on its neighbours: the same
kernels reduce the same numbers in the same order, and greedy output under load equals the solo
run bit for bit (a batch sized to its contents would pick other GEMM kernels and drift in bf16).
Models whose attention is not full causal attention everywhere (sliding windows, hybrid layers)
decode one sequence per forward with a per-request cache instead.

Speculative decoding (`speculate`, NGram: ngram.py): in a round where the drafter has draft tokens
for any sequence, the batched step runs 1 + max_draft_len positions per slot instead of one: each
sequence's last token and its drafts (padding after fewer), every query position attending to the
cache and the positions before it, giving the logits after each. They are decoded in order exactly
as one-token steps would decode them (greedy: argmax; otherwise the request's whole sampling,
penalties and grammar included, one position after another, each seeing the tokens before it), and a
draft is kept while it equals the token decoded at its position, as TensorRT-LLM's sampler keeps
NGram drafts (they have no draft probabilities, so no rejection sampling there either): the accepted
drafts and the token decoded after them come out of one pass. Keys and values past a sequence's new
length (rejected drafts, padding) stay in its slot, masked until overwritten. Sampled output follows
the same distribution as without drafts (each token is drawn from the model's distribution given the
ones before it); greedy output is the same tokens, up to the last bits of the logits (a pass computes
several positions per slot; tests/unit/backend/standin/test_reference_speculation.py and
tests/integration/test_speculative.py assert the same tokens on the demo models, alone and under
load; with drafts a round's shape depends on whether any sequence drafted, so the bit-for-bit
independence from neighbours above holds for tokens there, not for every last bit of a log prob).
Models without the
slot cache and beam searches decode without drafts.
"""

from __future__ import annotations

import contextlib
import re
import secrets
from typing import Any

import torch
from engine import BEAM_STEP, Accepted, BeamResult, Sequence
from ngram import NGramConfig, NGramDrafter
from prefix_cache import DEFAULT_TOKENS_PER_BLOCK, PrefixStore, blocks
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface, AutoModelForCausalLM, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

DEFAULT_SLOTS = 8
SPAN_BLOCK = 512
"""Attention covers the cache up to the next multiple of this past the longest sequence. Positions
past a sequence's own are masked, so they add exact zeros to its softmax and output; the block
keeps the attention kernels' own tiling the same whatever the span (checked by the tests, solo vs
loaded, across block boundaries)."""


SLOT_ATTENTION = "trtllm_reference_slots"
"""The attention implementation the model runs with when the slot cache serves it (registered with
transformers' AttentionInterface): `slot_attention` for the batched decode, SDPA for the rest."""


def slot_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of one new token per slot over the slot cache, grouped-query without copies.

    SDPA with a mask repeats every key/value head for its query heads (a copy of the whole span,
    per layer and step) and, on CPU, runs its math kernel, which scales and copies the keys again:
    for SmolLM2 that was most of a decode step. Here each key/value head meets its group of query
    heads in one batched matmul over views of the cache; the math is transformers' eager attention
    (scores in the model's dtype, softmax in float32). Prefill, one-sequence decode and anything
    unusual (soft-capping, attention sinks) go to SDPA as before. A verification pass (speculative
    decoding: `_verifying` set) attends the same way with several queries per slot.
    """
    width = query.shape[2]
    if (
        (width != 1 and not _verifying[0])
        or attention_mask is None
        or attention_mask.dtype != torch.bool
        or dropout
        or kwargs.get("softcap") is not None
        or kwargs.get("s_aux") is not None
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    batch, heads, _, head_dim = query.shape
    groups = key.shape[1]  # key/value heads; query head h reads key/value head h // (heads // groups)
    scale = scaling if scaling is not None else head_dim**-0.5
    if width != 1:  # [batch, groups, heads per group x queries, head_dim]; the mask per query
        per_group = heads // groups
        grouped = query.reshape(batch, groups, per_group * width, head_dim)
        scores = torch.matmul(grouped, key.transpose(2, 3)) * scale
        span = key.shape[2]
        visible = attention_mask[:, :, None, :, :span]  # [batch, 1, 1, queries, span]
        scores = scores.view(batch, groups, per_group, width, span).masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
        out = torch.matmul(probs.view(batch, groups, per_group * width, span), value)
        return out.view(batch, heads, width, head_dim).transpose(1, 2).contiguous(), None
    grouped = query.reshape(batch, groups, heads // groups, head_dim)
    scores = torch.matmul(grouped, key.transpose(2, 3)) * scale
    scores = scores.masked_fill(~attention_mask[:, :, :, : key.shape[2]], float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    return torch.matmul(probs, value).reshape(batch, 1, heads, head_dim), None


_verifying = [False]
"""Set while a verification pass runs (engine thread): slot_attention then takes its several queries."""


AttentionInterface.register(SLOT_ATTENTION, slot_attention)
AttentionMaskInterface.register(SLOT_ATTENTION, sdpa_mask)  # the prefill's masks stay SDPA's


class SlotCache:
    """A static KV cache with one row per batch slot, in the shape transformers' attention
    layers call: `update(keys, values, layer)` stores this step's keys and values at each slot's
    own position and returns every position (the mask hides those not yet written)."""

    def __init__(
        self,
        config: Any,
        slots: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
        scratch: int = 1,
    ) -> None:
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (slots, heads, max_len + scratch, head_dim)  # + scratch positions for idle slots
        layers = config.num_hidden_layers
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.rows = torch.arange(slots, device=device)
        self.positions = torch.zeros(slots, dtype=torch.long, device=device)
        self.span = max_len  # positions attended this step (a multiple of SPAN_BLOCK)
        self.width = 1  # tokens per slot this step: 1, or 1 + max_draft_len in a verification pass
        self.offsets = torch.arange(scratch, device=device)

    def update(
        self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *_: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.width > 1:  # each slot's tokens at consecutive positions from its own
            index = self.positions[:, None] + self.offsets[None, : self.width]
            self.keys[layer_idx][self.rows[:, None], :, index] = keys.transpose(1, 2)
            self.values[layer_idx][self.rows[:, None], :, index] = values.transpose(1, 2)
            return self.keys[layer_idx][:, :, : self.span], self.values[layer_idx][:, :, : self.span]
        self.keys[layer_idx][self.rows, :, self.positions] = keys[:, :, 0]
        self.values[layer_idx][self.rows, :, self.positions] = values[:, :, 0]
        return self.keys[layer_idx][:, :, : self.span], self.values[layer_idx][:, :, : self.span]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions are passed explicitly; nothing may infer them from the cache

    def store(self, slot: int, prefilled: Any) -> None:
        """Copies a prompt's keys and values (a DynamicCache of batch 1) into `slot`."""
        for layer, (keys, values) in enumerate(_layers(prefilled)):
            length = keys.shape[2]
            self.keys[layer][slot, :, :length] = keys[0]
            self.values[layer][slot, :, :length] = values[0]


def _layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def full_attention_only(config: Any) -> bool:
    """Whether every layer attends to every earlier position (what the slot cache's mask does)."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(kind != "full_attention" for kind in layer_types):
        return False
    window = getattr(config, "sliding_window", None)
    return not (window and getattr(config, "use_sliding_window", True))


class ReferenceSource:
    """Token source over a Hugging Face checkpoint directory."""

    def __init__(
        self,
        model_dir: str,
        device: str = "auto",
        dtype: str = "auto",
        *,
        slots: int = DEFAULT_SLOTS,
        max_len: int = 0,
        tokenizer_dir: str = "",
        block_reuse: bool = False,
        tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK,
    ) -> None:
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        if slots < 1:
            raise ValueError(f"the reference engine needs at least one batch slot, got {slots}")
        self.device = torch.device(device)
        # Where the batched decode falls back to SDPA (see slot_attention), on CPU it attends with
        # the math kernel: the flash kernel's sums for a row depend on the row's index in the batch
        # (torch 2.13 with transformers 4.57's repeat_kv layout), so a request's log probs would
        # move in the last bit with the slot it gets.
        self._batch_kernels = (
            (lambda: sdpa_kernel(SDPBackend.MATH)) if self.device.type == "cpu" else contextlib.nullcontext
        )
        self.dtype_name = dtype
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        self.model.to(self.device).eval()  # type: ignore[arg-type]  # to() is functools.wraps'd: typeshed's _Wrapped binds no self
        config = self.model.config
        self.vocab_size = int(config.vocab_size)
        self.max_position_embeddings = int(getattr(config, "max_position_embeddings", 2048))
        self.max_len = max_len or self.max_position_embeddings
        self.tokenizer_dir = tokenizer_dir or model_dir
        self._guide_tokenizer: Any = None  # llguidance's view of the tokenizer, made on first use
        self._guide_ends: frozenset[int] = frozenset()  # the ids it takes as the end of text
        self.slots = slots
        self.prefixes = PrefixStore(tokens_per_block, entries=slots, enabled=block_reuse)
        self._states: set[_State] = set()  # the admitted sequences' states (their KV blocks)
        self.cache: SlotCache | None = None
        self.capacity: int | None = None
        self.drafter: NGramDrafter | None = None
        self._drafted = 0  # requests given a drafter key so far
        # Speculative decoding, engine-wide (engine thread; read them anywhere, see `speculative_counters`)
        self.draft_tokens = 0
        """Draft tokens proposed by the drafter and verified."""
        self.accepted_draft_tokens = 0
        """Of them, the ones the verification accepted."""
        self.verify_passes = 0
        """Forward passes that verified drafts (one per engine round in which any sequence had some)."""
        self.decode_steps = 0
        """Rounds of the engine that decoded at least one sequence (with or without drafts)."""
        # Every projection is hooked once, here (hooking later could race a forward on the engine
        # thread); with no adapter in the batch a hook returns at once.
        self._lora_groups: list[tuple[Any, Any]] = []
        pattern = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+_proj)$")
        for name, module in self.model.named_modules():
            match = pattern.search(name)
            if match:
                module.register_forward_hook(self._lora_hook((int(match.group(1)), match.group(2))))
        if full_attention_only(config):
            if self.model.config._attn_implementation == "sdpa":
                self.model.set_attn_implementation(SLOT_ATTENTION)
            self.cache = SlotCache(config, slots, self.max_len, self.model.dtype, self.device)
            self.capacity = slots
            self._free = list(range(slots - 1, -1, -1))
            self._ids = torch.zeros((slots, 1), dtype=torch.long)
            self._positions = torch.zeros(slots, dtype=torch.long)
            self._arange = torch.arange(self.max_len, device=self.device)

    # ---- LoRA: what an adapter adds to a module's output, per batch row ----------------------------

    def prepare_lora(self, factors: dict[tuple[int, str], tuple[Any, Any]]) -> dict[tuple[int, str], Any]:
        """An adapter's factors as tensors on the model's device, transposed for the hooks."""
        dtype, device = self.model.dtype, self.device
        return {
            key: (
                torch.from_numpy(a).to(device, dtype).T.contiguous(),
                torch.from_numpy(b).to(device, dtype).T.contiguous(),
            )
            for key, (a, b) in factors.items()
        }

    def _lora_hook(self, key: tuple[int, str]) -> Any:
        def hook(_module: Any, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor | None:
            groups = self._lora_groups
            if not groups:
                return None
            x = args[0]
            for factors, rows in groups:
                pair = factors.get(key)
                if pair is None:
                    continue
                a_t, b_t = pair
                if rows is None:
                    out = out + (x @ a_t) @ b_t
                else:
                    out[rows] += (x[rows] @ a_t) @ b_t
            return out

        return hook

    def _lora_rows(self, seqs: list[Sequence], batched: bool) -> list[tuple[Any, Any]]:
        """(factors, the batch rows they apply to) of the adapters among `seqs`."""
        groups: dict[int, tuple[Any, list[int]]] = {}
        for seq in seqs:
            lora = seq.request.lora
            if lora is not None:
                groups.setdefault(id(lora), (lora, []))[1].append(seq.state.slot if batched else 0)
        if not batched:
            return [(lora, None) for lora, _ in groups.values()]
        return [(lora, torch.tensor(rows, device=self.device)) for lora, rows in groups.values()]

    def describe(self) -> str:
        if self.cache is None:
            batching = "one sequence per forward (not full attention)"
        else:
            batching = f"{self.capacity} batch slots x {self.max_len} positions"
        if self.drafter is not None:
            ngram = self.drafter.config
            batching += (
                f", NGram speculative decoding (max_draft_len {ngram.max_draft_len}, "
                f"max_matching_ngram_size {ngram.max_matching_ngram_size})"
            )
        return f"reference engine on {self.device} ({self.dtype_name}), {batching}"

    # ---- speculative decoding ---------------------------------------------------------------------

    def speculate(self, config: Any) -> str | None:
        """Turns on NGram speculative decoding for a model.yaml `speculative_config` (a mapping or the
        validated config object; None: off). Returns why it stays off, or None. ValueError for a
        configuration the engine does not serve (another decoding type, no max_draft_len). Call it
        before serving (it sizes a new slot cache): the LLM stand-in calls it while it is built.

        The ensemble flavour never calls it: NVIDIA's C++ backend has no NGram setting at 1.2.1 (an
        engine built for external drafts takes a draft model's tokens in `draft_input_ids`, which
        our contract refuses as served by NVIDIA only)."""
        ngram = NGramConfig.read(config)
        if ngram is None:
            self.drafter = None
            return None
        if self.cache is None:
            return "speculative decoding needs the slot cache (a model with full attention in every layer)"
        # room past the longest sequence for an idle slot's throwaway token and a verified draft run
        self.cache = SlotCache(
            self.model.config,
            self.capacity or 1,
            self.max_len,
            self.model.dtype,
            self.device,
            scratch=1 + ngram.max_draft_len,
        )
        self.drafter = NGramDrafter(ngram)
        return None

    def speculative_counters(self) -> dict[str, int | float]:
        """Engine-wide speculative decoding counters since start: draft tokens proposed and accepted,
        verification passes, decoding rounds, and the acceptance rate (accepted / proposed)."""
        drafted = self.draft_tokens
        return {
            "draft_tokens": drafted,
            "accepted_draft_tokens": self.accepted_draft_tokens,
            "verify_passes": self.verify_passes,
            "decode_steps": self.decode_steps,
            "acceptance_rate": self.accepted_draft_tokens / drafted if drafted else 0.0,
        }

    def start(self, seq: Sequence) -> None:
        request = seq.request
        state = _State()
        if not request.greedy:
            state.generator = torch.Generator(device=self.device)
            seed = request.seed if request.seed is not None else secrets.randbits(63)
            state.generator.manual_seed(int(seed))
        if request.embedding_bias is not None:
            state.bias = torch.from_numpy(request.embedding_bias).to(self.device)
        if request.guide is not None:
            state.guide = self._guide(*request.guide)
        state.plain = (
            state.guide is None
            and request.greedy
            and state.bias is None
            and request.repetition_penalty == 1.0
            and not request.presence_penalty
            and not request.frequency_penalty
            and not request.bad_words
            and not request.return_log_probs
            and not request.return_generation_logits
            and not request.top_logprobs
            and request.lora is None
        )
        if request.beam_width > 1:
            state.plain = False
            state.beam = _Beams(request, self._end_ids(request), self.device)
        if self.drafter is not None and state.beam is None:
            self._drafted += 1
            state.draft_key = self._drafted
        if self.cache is not None:  # a beam search holds a slot too: the loop counts it as one
            if not self._free:
                raise RuntimeError("no free batch slot (the engine loop admitted too many requests)")
            state.slot = self._free.pop()
        seq.state = state
        self._states.add(state)

    @staticmethod
    def _end_ids(request: Any) -> list[int]:
        """What ends a beam: the end id and the one-token stop words (the model's other end ids)."""
        ends = [request.end_id] if request.end_id >= 0 else []
        return ends + [word[0] for word in request.stop_words if len(word) == 1 and word[0] not in ends]

    def _guide(self, guide_type: str, guide: str) -> Any:
        """An llguidance matcher for one request's guide (GuideError when it does not compile)."""
        from grammars import llguidance_tokenizer, matcher

        if self._guide_tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)
            self._guide_tokenizer = llguidance_tokenizer(tokenizer, self.vocab_size)
            # One id, the tokenizer's eos_token_id (llguidance 0.7.29 has no `eos_tokens` list)
            self._guide_ends = frozenset([self._guide_tokenizer.eos_token])
        return matcher(self._guide_tokenizer, guide_type, guide)

    def _allowed(self, matcher: Any) -> torch.Tensor:
        """The tokens the grammar allows next, as a boolean vector over the model's vocabulary.
        (Not llguidance.torch: importing it runs torch.compile, which needs a UTF-8 locale that
        Triton's Python stub does not set, and a compiler.)"""
        allowed = torch.frombuffer(bytearray(matcher.compute_logit_bias()), dtype=torch.uint8) > 0
        if allowed.numel() < self.vocab_size:  # ids past the tokenizer's vocabulary: never allowed
            allowed = torch.cat([allowed, allowed.new_zeros(self.vocab_size - allowed.numel())])
        return allowed[: self.vocab_size]

    def release(self, seq: Sequence) -> None:
        self._release_blocks(seq)
        state: _State | None = seq.state
        if state is not None and state.slot is not None:
            self._free.append(state.slot)
        if state is not None and state.draft_key and self.drafter is not None:
            self.drafter.release(state.draft_key)
        seq.state = None

    def step(self, seqs: list[Sequence]) -> list[tuple[int, float] | BaseException]:
        results: list[Any] = [None] * len(seqs)
        decoding: list[int] = []
        drafts: list[list[int]] = []
        for i, seq in enumerate(seqs):
            if seq.state.beam is not None:
                try:
                    results[i] = self._beam_step(seq)
                except Exception as exc:
                    results[i] = exc
                continue
            if seq.state.length and self.cache is not None:
                if seq.state.length < self.max_len:
                    decoding.append(i)
                    drafts.append(self._draft(seq))
                else:  # the request limits keep this from happening; never write past the cache
                    results[i] = RuntimeError(f"the sequence filled the engine's {self.max_len} positions")
                continue
            try:
                logits = self._prefill(seq) if not seq.state.length else self._decode_one(seq)
                results[i] = self._sample(seq, logits)
            except Exception as exc:  # a failure of one request must not stop the others
                results[i] = exc
        if decoding:
            self.decode_steps += 1
            batch = [seqs[i] for i in decoding]
            try:
                done = self._verify_batch(batch, drafts) if any(drafts) else self._decode_batch(batch)
                for i, result in zip(decoding, done, strict=True):
                    results[i] = result
            except Exception as exc:
                for i in decoding:
                    results[i] = exc
        return results

    def _draft(self, seq: Sequence) -> list[int]:
        """The drafter's proposal for `seq` (none without a drafter): at most what the request may
        still generate less one (the pass decodes one more), within the cache."""
        state: _State = seq.state
        if self.drafter is None or not state.draft_key:
            return []
        request = seq.request
        room = min(request.max_new - len(seq.generated) - 1, self.max_len - state.length - 1)
        if room <= 0:
            return []
        return self.drafter.draft(state.draft_key, request.input_ids + seq.generated, room)

    @torch.inference_mode()
    def _verify_batch(self, seqs: list[Sequence], drafts: list[list[int]]) -> list[Any]:
        """One forward over every slot with 1 + max_draft_len positions each: a sequence's last token
        and its drafts (none for some), then the tokens decoded from each (module docstring)."""
        cache = self.cache
        assert cache is not None and self.drafter is not None
        width = 1 + self.drafter.config.max_draft_len
        slots = cache.rows.shape[0]
        ids = torch.zeros((slots, width), dtype=torch.long)
        positions = torch.full((slots,), self.max_len, dtype=torch.long)  # idle: the scratch positions
        for seq, draft in zip(seqs, drafts, strict=True):
            state: _State = seq.state
            ids[state.slot, 0] = seq.generated[-1]
            ids[state.slot, 1 : 1 + len(draft)] = torch.tensor(draft, dtype=torch.long)
            positions[state.slot] = state.length
        longest = max(seq.state.length for seq in seqs)
        span = min(self.max_len, -(-(longest + width) // SPAN_BLOCK) * SPAN_BLOCK)
        cache.positions.copy_(positions)
        cache.span = span
        cache.width = width
        query_positions = cache.positions[:, None] + cache.offsets[None, :width]  # [slots, width]
        mask = (self._arange[None, None, :span] <= query_positions[:, :, None])[:, None]
        self._lora_groups = self._lora_rows(seqs, batched=True)
        _verifying[0] = True
        try:
            with self._batch_kernels():
                out = self.model(
                    input_ids=ids.to(self.device),
                    position_ids=query_positions,
                    attention_mask=mask,
                    past_key_values=cache,
                    use_cache=True,
                )
        finally:
            _verifying[0] = False
            self._lora_groups = []
            cache.width = 1
        logits = out.logits.float()
        greedy = torch.argmax(logits[:, :, : self.vocab_size], -1).tolist()
        results: list[Any] = []
        for seq, draft in zip(seqs, drafts, strict=True):
            try:
                tokens = self._accept(seq, draft, logits[seq.state.slot], greedy[seq.state.slot])
                results.append(tokens if draft else tokens[0])
            except Exception as exc:
                results.append(exc)
        self.verify_passes += 1
        return results

    def _accept(self, seq: Sequence, draft: list[int], logits: torch.Tensor, greedy: list[int]) -> Accepted:
        """The tokens one sequence decodes from its verification logits: each position as a one-token
        step would decode it, while the drafts equal them; then the counts."""
        state: _State = seq.state
        request = seq.request
        tokens = Accepted()
        if state.plain and not (
            0 <= request.end_id < self.vocab_size and len(seq.generated) < request.min_tokens
        ):
            for position, token in enumerate(greedy[: 1 + len(draft)]):
                tokens.append((token, 0.0))
                if position == len(draft) or token != draft[position] or token == request.end_id:
                    break
        else:
            generated = seq.generated
            size = len(generated)
            try:  # each position's sampling sees the tokens decoded before it (penalties, bad words)
                for position in range(1 + len(draft)):
                    token, log_prob = self._sample(seq, logits[position])
                    tokens.append((token, log_prob))
                    generated.append(token)
                    if position == len(draft) or token != draft[position] or token == request.end_id:
                        break
            finally:
                del generated[size:]
        last = len(tokens) - 1  # the tokens before the last one equal their drafts
        accepted = last + (last < len(draft) and tokens[last][0] == draft[last])  # (an end id draft)
        state.length += accepted + 1  # the last token's keys and values are valid
        seq.draft_tokens += len(draft)
        seq.accepted_draft_tokens += accepted
        self.draft_tokens += len(draft)
        self.accepted_draft_tokens += accepted
        return tokens

    # ---- KV blocks: prefix reuse (prefix_cache.py) and TensorRT-LLM's KvCacheStats --------------

    def _reuse_prefix(self, request: Any) -> tuple[Any, int]:
        """A prompt's prefill cache, holding the keys and values of its longest stored prefix (if
        block reuse is on), and how many tokens that is. Requests that want every position's logits
        or run an adapter compute the whole prompt."""
        cache = DynamicCache(config=self.model.config)
        if request.return_context_logits or request.lora is not None:
            return cache, 0
        reused, layers = self.prefixes.lookup(request.input_ids)
        for layer, (keys, values) in enumerate(layers or ()):
            cache.update(keys[:, :, :reused], values[:, :, :reused], layer)
        return cache, reused

    def _keep_prefix(self, seq: Sequence, reused: int, prefilled: Any) -> None:
        request = seq.request
        self.prefixes.count_prompt(len(request.input_ids), reused)
        if seq.perf is not None:  # the request's own kv_cache_reused_blocks
            seq.perf.kv_cache_reused_blocks = reused // self.prefixes.tokens_per_block
        if not request.return_context_logits and request.lora is None:
            self.prefixes.keep(request.input_ids, _layers(prefilled))

    def _release_blocks(self, seq: Sequence) -> None:
        """A finished sequence's blocks are free again; counts those it allocated past its prompt."""
        state: _State | None = seq.state
        if state is None:
            return
        self._states.discard(state)
        size, prompt = self.prefixes.tokens_per_block, len(seq.request.input_ids)
        if state.length > prompt:
            self.prefixes.count_generated(blocks(state.length, size) - blocks(prompt, size))

    def kv_cache_stats(self) -> dict[str, Any]:
        """TensorRT-LLM's KvCacheStats (the iteration stats' `kvCacheStats`) of this engine: its
        batch slots' positions as blocks, those the admitted sequences hold, and the reuse counts
        (cumulative, as the block manager's). Called from any thread: a snapshot, not a lock."""
        size = self.prefixes.tokens_per_block
        total = self.slots * blocks(self.max_len, size)
        for _ in range(3):  # the worker thread may admit or release meanwhile: take it again
            try:
                used = sum(blocks(state.length, size) for state in list(self._states))
                break
            except RuntimeError:
                continue
        else:
            used = 0
        used = min(used, total)
        store = self.prefixes
        return {
            "maxNumBlocks": total,
            "freeNumBlocks": total - used,
            "usedNumBlocks": used,
            "tokensPerBlock": size,
            "allocTotalBlocks": store.alloc_total,
            "allocNewBlocks": store.alloc_new,
            "reusedBlocks": store.reused,
            "missedBlocks": store.missed,
            "cacheHitRate": store.hit_rate,
        }

    @torch.inference_mode()
    def _prefill(self, seq: Sequence) -> torch.Tensor:
        """Runs the prompt alone; its keys and values go to the sequence's slot (or stay its own)."""
        state: _State = seq.state
        request = seq.request
        ids = torch.tensor([request.input_ids], device=self.device)
        prompt_counts = torch.bincount(ids[0], minlength=self.vocab_size)[: self.vocab_size]
        state.counts = torch.zeros(self.vocab_size, dtype=torch.int64, device=self.device)
        state.prompt_mask = prompt_counts > 0
        cache, reused = self._reuse_prefix(request)
        self._lora_groups = self._lora_rows([seq], batched=False)
        try:
            out = self.model(input_ids=ids[:, reused:], past_key_values=cache, use_cache=True)
        finally:
            self._lora_groups = []
        self._keep_prefix(seq, reused, out.past_key_values)
        if self.cache is not None:
            assert state.slot is not None  # every request has a slot where there is a slot cache
            self.cache.store(state.slot, out.past_key_values)
        else:
            state.own_cache = out.past_key_values
        state.length = len(request.input_ids)
        if request.return_context_logits and seq.context_logits is None:
            seq.context_logits = out.logits[0].float().cpu().numpy()
        return out.logits[0, -1].float()

    @torch.inference_mode()
    def _decode_one(self, seq: Sequence) -> torch.Tensor:
        """One step of one sequence with its own cache (models the slot cache cannot serve)."""
        state: _State = seq.state
        ids = torch.tensor([[seq.generated[-1]]], device=self.device)
        self._lora_groups = self._lora_rows([seq], batched=False)
        try:
            out = self.model(input_ids=ids, past_key_values=state.own_cache, use_cache=True)
        finally:
            self._lora_groups = []
        state.own_cache = out.past_key_values
        state.length += 1
        return out.logits[0, -1].float()

    @torch.inference_mode()
    def _decode_batch(self, seqs: list[Sequence]) -> list[tuple[int, float] | BaseException]:
        """One step of every sequence in generation: one forward over all the slots."""
        cache = self.cache
        assert cache is not None
        ids, positions = self._ids, self._positions
        # An idle slot (free, or its prompt prefilled this step) computes a throwaway token into
        # the scratch position past the end, which no mask ever shows.
        ids.zero_()
        positions.fill_(self.max_len)
        for seq in seqs:
            state: _State = seq.state
            ids[state.slot, 0] = seq.generated[-1]
            positions[state.slot] = state.length
        longest = max(seq.state.length for seq in seqs)
        span = min(self.max_len, -(-(longest + 1) // SPAN_BLOCK) * SPAN_BLOCK)
        cache.positions.copy_(positions)
        cache.span = span
        device_positions = cache.positions
        mask = (self._arange[None, :span] <= device_positions[:, None])[:, None, None, :]
        self._lora_groups = self._lora_rows(seqs, batched=True)
        try:
            with self._batch_kernels():
                out = self.model(
                    input_ids=ids.to(self.device),
                    position_ids=device_positions[:, None],
                    attention_mask=mask,
                    past_key_values=cache,
                    use_cache=True,
                )
        finally:
            self._lora_groups = []
        logits = out.logits[:, -1].float()
        greedy = torch.argmax(logits[:, : self.vocab_size], -1).tolist()
        results: list[tuple[int, float] | BaseException] = []
        for seq in seqs:
            state = seq.state
            assert state.slot is not None  # in the slot cache
            state.length += 1
            request = seq.request
            if state.plain and not (
                0 <= request.end_id < self.vocab_size and len(seq.generated) < request.min_tokens
            ):
                results.append((greedy[state.slot], 0.0))
                continue
            try:
                results.append(self._sample(seq, logits[state.slot]))
            except Exception as exc:
                results.append(exc)
        return results

    @torch.inference_mode()
    def _beam_step(self, seq: Sequence) -> Any:
        """One step of a beam search: a forward over its beams (the prompt, the first time: once per
        beam, as transformers expands it), then transformers' beam update."""
        beams: _Beams = seq.state.beam
        request = seq.request
        self._lora_groups = self._lora_rows([seq], batched=False)
        try:
            if beams.cache is None:
                ids = torch.tensor([request.input_ids] * beams.width, device=self.device)
                out = self.model(
                    input_ids=ids, past_key_values=DynamicCache(config=self.model.config), use_cache=True
                )
            else:
                assert beams.next_ids is not None  # set with the cache, by advance()
                out = self.model(
                    input_ids=beams.next_ids[:, None], past_key_values=beams.cache, use_cache=True
                )
        finally:
            self._lora_groups = []
        beams.cache = out.past_key_values
        logits = out.logits[:, -1, : self.vocab_size].float()
        if seq.state.bias is not None:
            logits = logits + seq.state.bias
        order = beams.advance(torch.log_softmax(logits, -1))
        if order is None:
            return BeamResult(beams.result())
        beams.cache.reorder_cache(order)
        return BEAM_STEP

    @torch.inference_mode()
    def _sample(self, seq: Sequence, logits: torch.Tensor) -> tuple[int, float]:
        state: _State = seq.state
        request = seq.request
        counts, prompt_mask = state.counts, state.prompt_mask
        assert counts is not None and prompt_mask is not None  # set by _prefill
        raw = logits[: self.vocab_size]
        # Log probs are the model's own distribution (raw logits: before bias, penalties, masks,
        # temperature, top-k/top-p), recorded for every step before anything can end it.
        raw_log_probs = None
        if request.return_log_probs or request.top_logprobs:
            raw_log_probs = torch.log_softmax(raw.float(), -1)
        if request.return_generation_logits:
            seq.generation_logits.append(raw.float().cpu().numpy())
        if request.top_logprobs and raw_log_probs is not None:  # it is, with top_logprobs
            top = torch.topk(raw_log_probs, min(request.top_logprobs, self.vocab_size))
            seq.top_logprobs.append((top.indices.tolist(), top.values.tolist()))
        logits = raw.clone()
        if state.bias is not None:
            logits += state.bias
        if request.repetition_penalty != 1.0:
            seen = prompt_mask | (counts > 0)
            penalized = torch.where(
                logits > 0, logits / request.repetition_penalty, logits * request.repetition_penalty
            )
            logits = torch.where(seen, penalized, logits)
        if request.presence_penalty or request.frequency_penalty:
            counted = counts.to(logits.dtype)
            logits -= (
                request.presence_penalty * (counted > 0).to(logits.dtype)
                + request.frequency_penalty * counted
            )
        for word in request.bad_words:
            if len(word) == 1 or seq.generated[-(len(word) - 1) :] == word[:-1]:
                logits[word[-1]] = -float("inf")
        if 0 <= request.end_id < self.vocab_size and len(seq.generated) < request.min_tokens:
            logits[request.end_id] = -float("inf")
        matcher = state.guide
        if matcher is not None:
            if matcher.is_stopped():  # the grammar is complete: the answer ends here
                return request.end_id, 0.0
            logits = logits.masked_fill(~self._allowed(matcher).to(logits.device), -float("inf"))

        if request.greedy:
            token = int(torch.argmax(logits))
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
            token = int(torch.multinomial(torch.log_softmax(scaled, -1).exp(), 1, generator=state.generator))
        log_prob = float(raw_log_probs[token]) if raw_log_probs is not None else 0.0
        counts[token] += 1
        if matcher is not None:
            if token in self._guide_ends:  # the grammar is satisfied and the model ends here
                return request.end_id, log_prob
            if not matcher.consume_token(token):
                raise RuntimeError(f"guided decoding: {matcher.get_error()}")
        return token, log_prob


class _Beams:
    """One request's beam search, as transformers' `_beam_search` runs it for one prompt (batch 1):
    the running beams, the pool of finished ones (scored with the length penalty), and its stopping
    rules. `advance` takes the beams' next-token log probs and returns the beam each new running beam
    continues (to reorder the cache), or None when the search is over."""

    def __init__(self, request: Any, ends: list[int], device: torch.device) -> None:
        width, limit = request.beam_width, request.max_new
        self.width, self.limit, self.device = width, limit, device
        self.num_return = request.num_return
        self.end_id = request.end_id
        self.ends = torch.tensor(ends, dtype=torch.long, device=device)
        self.keep = max(2, 1 + len(ends)) * width  # candidates per step, as transformers takes them
        self.length_penalty = float(request.length_penalty)
        self.early = (
            True if request.early_stopping == 1 else False if request.early_stopping == 0 else "never"
        )
        self.cache: Any = None
        self.next_ids: torch.Tensor | None = None
        self.step = 0  # tokens generated so far
        self.running = torch.zeros((width, limit), dtype=torch.long, device=device)
        self.running_lp = torch.zeros((width, limit), device=device)  # each token's own log prob
        self.scores = torch.full((width,), -1.0e9, device=device)
        self.scores[0] = 0.0  # one live beam at first: the others are its copies
        self.done = torch.zeros((width, limit), dtype=torch.long, device=device)
        self.done_lp = torch.zeros((width, limit), device=device)
        self.done_scores = torch.full((width,), -1.0e9, device=device)
        self.done_sums = torch.zeros(width, device=device)
        self.done_len = torch.zeros(width, dtype=torch.long, device=device)
        self.finished = torch.zeros(width, dtype=torch.bool, device=device)
        self.improvable = True

    def advance(self, log_probs: torch.Tensor) -> torch.Tensor | None:
        width, step, vocab = self.width, self.step, log_probs.shape[-1]
        total = (log_probs + self.scores[:, None]).reshape(-1)
        top_lp, top_index = torch.topk(total, self.keep)
        source, tokens = top_index // vocab, top_index % vocab
        candidates = self.running[source].clone()
        candidates[:, step] = tokens
        candidates_lp = self.running_lp[source].clone()
        candidates_lp[:, step] = log_probs[source, tokens]
        hits = torch.isin(tokens, self.ends) | (step + 1 >= self.limit)
        # the running beams of the next step: the best candidates that did not just finish
        live = top_lp + hits.float() * -1.0e9
        chosen = torch.topk(live, width).indices
        self.running, self.running_lp, self.scores = candidates[chosen], candidates_lp[chosen], live[chosen]
        self.next_ids = tokens[chosen]
        # the finished pool: candidates among the top `width` that just finished, length-penalized
        scored = top_lp / ((step + 1) ** self.length_penalty)
        if bool(self.finished.all()) and self.early is True:
            scored = scored - 1.0e9
        if not self.improvable:
            scored = scored - 1.0e9
        just = hits & (torch.arange(self.keep, device=self.device) < width)
        scored = scored + (~just).float() * -1.0e9
        merged = torch.cat((self.done_scores, scored))
        best = torch.topk(merged, width).indices
        lengths = torch.full((self.keep,), step + 1, dtype=torch.long, device=self.device)
        self.done = torch.cat((self.done, candidates))[best]
        self.done_lp = torch.cat((self.done_lp, candidates_lp))[best]
        self.done_sums = torch.cat((self.done_sums, top_lp))[best]
        self.done_len = torch.cat((self.done_len, lengths))[best]
        self.finished = torch.cat((self.finished, just))[best]
        self.done_scores = merged[best]
        self.step = step = step + 1
        # transformers' stopping rules: can a running beam still beat the worst finished one?
        best_length = self.limit if self.early == "never" and self.length_penalty > 0.0 else step
        best_possible = self.scores[0] / (best_length**self.length_penalty)
        worst = torch.where(self.finished, self.done_scores.min(), torch.tensor(-1.0e9, device=self.device))
        self.improvable = self.improvable and bool((best_possible > worst).any())
        open_beam = not (bool(self.finished.all()) and self.early is True)
        if self.improvable and open_beam and not bool(hits.all()):
            return source[chosen]
        return None

    def result(self) -> list[tuple[list[int], float, list[float], str]]:
        """The best `num_return` finished beams, best first: (ids, cumulative log prob, each token's
        log prob, finish reason). The end id that ended a beam is not part of it (as with one beam)."""
        out = []
        for i in range(self.num_return):
            length = int(self.done_len[i])
            ids = self.done[i, :length].tolist()
            log_probs = self.done_lp[i, :length].tolist()
            reason = "stop" if ids and ids[-1] in self.ends.tolist() else "length"
            if ids and ids[-1] == self.end_id:
                ids, log_probs = ids[:-1], log_probs[:-1]
            out.append((ids, float(self.done_sums[i]), log_probs, reason))
        return out


class _State:
    """Per-request state of the reference source."""

    __slots__ = (
        "beam", "bias", "counts", "draft_key", "generator", "guide", "length", "own_cache", "plain",
        "prompt_mask", "slot",
    )  # fmt: skip

    def __init__(self) -> None:
        self.slot: int | None = None  # its rows in the slot cache
        self.own_cache: Any = None  # its own cache, where there is no slot cache
        self.length = 0  # positions in its cache: 0 until the prompt is prefilled
        self.plain = False  # greedy with nothing to apply to the logits: batched argmax
        self.counts: torch.Tensor | None = None
        self.prompt_mask: torch.Tensor | None = None
        self.generator: torch.Generator | None = None
        self.bias: torch.Tensor | None = None
        self.guide: Any = None  # an llguidance matcher: its grammar masks every step's logits
        self.beam: _Beams | None = None  # a beam search's state (beam_width > 1)
        self.draft_key = 0  # its key in the NGram drafter (0: it is not drafted for)
