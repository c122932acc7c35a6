"""Response readers: what an `EngineStream` makes of the responses of one engine request.

A stream owns the request's life (waking its reader, errors, the end, timing, cancellation); its
reader owns what the responses carry. The flavour picks the reader (relay/flavors.py):

- `TokenIdReader`: token ids (NVIDIA's C++ backend contract), detokenized here.
- `TextReader`: text deltas and a running token count (the LLM API flavour detokenizes in Triton).
- either with a log-prob option (`EngineLogprobs`, `LLMAPILogprobs`): each token's log prob and top N.
- `TokenIdBeams`, `TextBeams`: a beam search's beams, all in one final response.

The per-token path is `add_raws` (a response of a learned shape, relay/response_shape.py) then `take`;
readers with `shape_outputs` empty read every response fully (`add`).
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

from tensorrtllm_backend.detokenizer import IncrementalDetokenizer
from tensorrtllm_backend.stop_strings import StopStringMatcher
from trtllm_service.relay.logprobs import TokenLogprob, prompt_from_logits, top_from_logits
from trtllm_service.relay.request import (
    ENGINE_OUTPUT,
    LLMAPI_COUNT_OUTPUT,
    LLMAPI_TEXT_OUTPUT,
    GenerationRequest,
)

Named = dict[str, tuple[Any, bytes]]


def named_outputs(result: Any) -> Named:
    """A response's outputs by name: (the output's metadata, its raw contents)."""
    return {o.name: (o, raw) for o, raw in zip(result.outputs, result.raw_output_contents, strict=False)}


def _floats(named: Named, name: str) -> list[float]:
    return np.frombuffer(named[name][1], dtype=np.float32).tolist() if name in named else []


def _strings(raw: bytes) -> list[bytes]:
    """The elements of a serialized BYTES tensor: each a 4-byte little-endian length, then its bytes."""
    out, at = [], 0
    while at + 4 <= len(raw):
        size = int.from_bytes(raw[at : at + 4], "little")
        out.append(raw[at + 4 : at + 4 + size])
        at += 4 + size
    return out


class Reader:
    """What every reader has: the token count, the stop-string matcher, the log-prob option.

    `pending` is true when `take()` has something; `take()` sets `stopped` when a stop string
    completed (the answer ends there). `logprobs`: the tokens' log probs (None: not asked for)."""

    __slots__ = ("_matcher", "completion_tokens", "logprobs", "pending", "shape_outputs", "stopped")
    pending: Any  # each reader's own: what arrived and was not taken yet

    def __init__(self, request: GenerationRequest) -> None:
        self.shape_outputs: tuple[str, ...] = ()  # what a learned response shape locates (none: never learn)
        self.completion_tokens = 0
        self.stopped = False
        self.logprobs: Logprobs | None = None
        self._matcher = StopStringMatcher(request.stop) if request.stop else None

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the answer; None if none did."""
        matcher = self._matcher
        return matcher.matched if matcher is not None else None

    def flush(self) -> str:
        """At the end: the text the matcher held back (it could have begun a stop string)."""
        return self._matcher.flush() if self._matcher is not None else ""

    def add(self, result: Any) -> None:
        """A response, parsed."""
        raise NotImplementedError

    def add_raws(self, raws: list[bytes], at: tuple[int, ...]) -> None:
        """A response of the learned shape: its raw contents, `at` the indexes of `shape_outputs`."""
        raise NotImplementedError

    def take(self) -> str:
        """The text of what arrived since the last call."""
        raise NotImplementedError


class Logprobs:
    """The log-prob option of a reader: `add` fills `_arrived`; a read moves them on; `take(finished)`
    returns those of the tokens whose text was read since it was last called (at the end: all)."""

    __slots__ = ("_arrived", "_cut", "_prompt", "_prompt_only", "_prompt_top", "_read", "_top", "prompt")

    def __init__(self, request: GenerationRequest, cut: frozenset[int] | None) -> None:
        self._top = request.logprobs or 0
        self._prompt = request.prompt_ids
        self._prompt_top = request.prompt_logprobs
        self._prompt_only = request.prompt_only
        self._cut = cut  # the caller's stop tokens (their log probs are not shown either)
        self._arrived: list[TokenLogprob] = []
        self._read: list[TokenLogprob] = []
        self.prompt: list[TokenLogprob] | None = None  # with prompt_logprobs: the prompt's

    def add(self, named: Named) -> None:
        raise NotImplementedError

    def read(self) -> None:
        """The text of the tokens that arrived is being read."""
        if self._cut is not None:
            self._arrived = self._uncut(self._arrived, self._cut)
        self._read.extend(self._arrived)
        self._arrived = []

    def _uncut(self, entries: list[TokenLogprob], cut: frozenset[int]) -> list[TokenLogprob]:
        if self._prompt_only:
            return []
        for i, entry in enumerate(entries):
            if entry.token in cut:
                return entries[:i]
        return entries

    def take(self, finished: bool) -> list[TokenLogprob]:
        if self._cut is not None:
            self._arrived = self._uncut(self._arrived, self._cut)
        if finished:  # the end: tokens that brought no text come too
            self._read.extend(self._arrived)
            self._arrived = []
        taken, self._read = self._read, []
        return taken


class EngineLogprobs(Logprobs):
    """Each token's log prob (`output_log_probs`) and, with `top` > 0, the `top` most likely tokens of
    its step, reduced from the generation logits; the prompt's from the context logits."""

    __slots__ = ()

    def add(self, named: Named) -> None:
        if self._prompt_top is not None and self.prompt is None and "context_logits" in named:
            output, raw = named["context_logits"]
            vocab = int(output.shape[-1]) if output.shape else 0
            if vocab:
                dtype = np.float16 if output.datatype == "FP16" else np.float32
                rows = np.frombuffer(raw, dtype=dtype).reshape(-1, vocab)
                self.prompt = prompt_from_logits(rows, self._prompt, self._prompt_top)
        if "output_ids" not in named:
            return
        ids = np.frombuffer(named["output_ids"][1], dtype=np.int32).tolist()
        if not ids:
            return
        count = len(ids)
        values = _floats(named, "output_log_probs")
        log_probs = values[-count:] if len(values) >= count else [float("nan")] * count
        tops: list[tuple[list[int], list[float]]] = [([], [])] * count
        if self._top and "generation_logits" in named:
            output, raw = named["generation_logits"]
            vocab = int(output.shape[-1]) if output.shape else 0
            if vocab:
                dtype = np.float16 if output.datatype == "FP16" else np.float32  # the engine's logits_dtype
                rows = np.frombuffer(raw, dtype=dtype).reshape(-1, vocab).astype(np.float32)
                if len(rows) >= count:
                    tops = top_from_logits(rows[:count], self._top)
        self._arrived.extend(TokenLogprob(t, v, *top) for t, v, top in zip(ids, log_probs, tops, strict=True))


class LLMAPILogprobs(Logprobs):
    """The tokens (ids, log probs, top log probs) the LLM API flavour's model returns with
    `sampling_param_logprobs`, and the prompt's with `sampling_param_prompt_logprobs`."""

    __slots__ = ()

    def add(self, named: Named) -> None:
        if "prompt_log_probs" in named and self.prompt is None:
            self.prompt = _prompt_entries(self._prompt, named)
        if "output_ids" not in named:
            return
        ids = np.frombuffer(named["output_ids"][1], dtype=np.int32).tolist()
        values = _floats(named, "output_log_probs")
        tops: list[tuple[list[int], list[float]]] = [([], [])] * len(ids)
        if "top_log_probs" in named and ids:
            top_ids = np.frombuffer(named["top_log_prob_ids"][1], dtype=np.int32).reshape(len(ids), -1)
            top_values = np.frombuffer(named["top_log_probs"][1], dtype=np.float32).reshape(len(ids), -1)
            tops = list(zip(top_ids.tolist(), top_values.tolist(), strict=True))
        self._arrived.extend(TokenLogprob(t, v, *top) for t, v, top in zip(ids, values, tops, strict=True))


def _prompt_entries(prompt: Any, named: Named) -> list[TokenLogprob]:
    """The LLM API flavour's prompt log probs: `prompt_log_probs` [prompt] (NaN first) and, for
    positions 1.., `prompt_top_log_prob_ids` / `prompt_top_log_probs` [prompt - 1, N]."""
    values = _floats(named, "prompt_log_probs")
    tops: list[tuple[list[int], list[float]]] = [([], [])] * len(values)
    if "prompt_top_log_probs" in named and len(values) > 1:
        ids = np.frombuffer(named["prompt_top_log_prob_ids"][1], dtype=np.int32).reshape(len(values) - 1, -1)
        top = np.frombuffer(named["prompt_top_log_probs"][1], dtype=np.float32).reshape(len(values) - 1, -1)
        tops = [([], []), *zip(ids.tolist(), top.tolist(), strict=True)]
    return [
        TokenLogprob(int(t), None if i == 0 else v, *tops[i])
        for i, (t, v) in enumerate(zip(prompt, values, strict=False))
    ]


class TokenIdReader(Reader):
    """Token ids (`output_ids`), detokenized here; the caller's stop tokens end the answer without
    being part of it, and a prompt-only request (max_tokens 0) shows none of the one token generated."""

    __slots__ = ("_cut", "_decoder", "_prompt_only")

    def __init__(
        self, request: GenerationRequest, decoder: IncrementalDetokenizer, logprobs: bool = False
    ) -> None:
        super().__init__(request)
        self.pending: Any = array("i")  # arrived, not read yet
        self._decoder = decoder
        self._prompt_only = request.prompt_only
        self._cut: frozenset[int] | None = (
            frozenset(request.cut_token_ids) if request.cut_token_ids or request.prompt_only else None
        )
        if logprobs:  # every response is read whole
            self.logprobs = EngineLogprobs(request, self._cut)
        else:
            self.shape_outputs = (ENGINE_OUTPUT,)

    def add(self, result: Any) -> None:
        outputs = result.outputs
        if outputs and outputs[0].name == ENGINE_OUTPUT:  # where engines put it: no loop
            self.pending.frombytes(result.raw_output_contents[0])
        else:
            for output, raw in zip(outputs, result.raw_output_contents, strict=False):
                if output.name == ENGINE_OUTPUT:  # beside it: sequence_length, which NVIDIA requires
                    self.pending.frombytes(raw)
                    break
        if self.logprobs is not None:
            self.logprobs.add(named_outputs(result))

    def add_raws(self, raws: list[bytes], at: tuple[int, ...]) -> None:
        self.pending.frombytes(raws[at[0]])

    def take(self) -> str:
        if self._cut is not None:
            self._take_cut(self._cut)
        if self.logprobs is not None:
            self.logprobs.read()
        ids, self.pending = self.pending, array("i")
        matcher = self._matcher
        if matcher is None or len(ids) == 1:
            self.completion_tokens += len(ids)
            text = self._decoder.push(ids)
            if matcher is not None and text:
                text, self.stopped = matcher.push(text)
            return text
        # Several tokens at once (the reader was behind) and stop strings: token by token, so that
        # the count ends with the token that completed a stop string, not with the last received.
        pieces = []
        for i in range(len(ids)):
            self.completion_tokens += 1
            text = self._decoder.push(ids[i : i + 1])
            if text:
                text, stopped = matcher.push(text)
                pieces.append(text)
                if stopped:
                    self.stopped = True
                    break
        return "".join(pieces)

    def _take_cut(self, cut: frozenset[int]) -> None:
        """Drops from the pending ids the caller's stop token and what follows it (a prompt-only
        request: all of them); the answer then ends there."""
        ids = self.pending
        if self._prompt_only:  # the one generated token is not shown nor counted
            self.pending = array("i")
            return
        for i, token in enumerate(ids):
            if token in cut:
                self.pending = ids[:i]  # the engine ends the request with that token
                return


class TextReader(Reader):
    """Text deltas (detokenized in Triton) and a token count: the LLM API flavour.

    Each response carries `text_output` (one BYTES element: a 4-byte length, then UTF-8 that ends on
    a whole character) and `num_output_tokens`, the tokens generated so far. `pending` holds the
    text pieces not read yet, each with the token count it came with (a stop string ends the count
    at the piece that completed it). The LLM API cuts the caller's stop tokens itself.
    """

    __slots__ = ("_prompt_only",)

    def __init__(self, request: GenerationRequest, logprobs: bool = False) -> None:
        super().__init__(request)
        self.pending: Any = []  # (text bytes, tokens generated up to and including them)
        self._prompt_only = request.prompt_only
        cut: frozenset[int] | None = (
            frozenset() if request.prompt_only else None
        )  # prompt only: no token is shown
        if logprobs:  # every response is read whole
            self.logprobs = LLMAPILogprobs(request, cut)
        else:
            self.shape_outputs = (LLMAPI_TEXT_OUTPUT, LLMAPI_COUNT_OUTPUT)

    def add(self, result: Any) -> None:
        text, count = b"", b""
        for output, raw in zip(result.outputs, result.raw_output_contents, strict=False):
            if output.name == LLMAPI_TEXT_OUTPUT:
                text = raw
            elif output.name == LLMAPI_COUNT_OUTPUT:
                count = raw
        if self.logprobs is not None:
            self.logprobs.add(named_outputs(result))
        self._add_text(text, count)

    def add_raws(self, raws: list[bytes], at: tuple[int, ...]) -> None:
        self._add_text(raws[at[0]], raws[at[1]])

    def _add_text(self, text: bytes, count: bytes) -> None:
        """One response's `text_output` and `num_output_tokens` contents (b"": not in it)."""
        if len(count) >= 4:
            self.completion_tokens = int.from_bytes(count[:4], "little", signed=True)
        if self._prompt_only:  # max_tokens 0: the generated token is not shown
            self.completion_tokens = 0
        elif len(text) > 4:
            self.pending.append((text[4:], self.completion_tokens))

    def take(self) -> str:
        if self.logprobs is not None:
            self.logprobs.read()
        pieces, self.pending = self.pending, []
        matcher = self._matcher
        if matcher is None:
            return b"".join(piece for piece, _ in pieces).decode("utf-8", errors="replace")
        texts = []
        for piece, tokens in pieces:  # each piece ends on a whole character
            text, stopped = matcher.push(piece.decode("utf-8", errors="replace"))
            texts.append(text)
            if stopped:
                self.completion_tokens = tokens  # the count ends where the stop string did
                self.stopped = True
                break
        return "".join(texts)


class BeamReader(Reader):
    """A beam search's beams: the engine sends every beam at once, when the search is over (never
    streamed); `finished` gives them with their finish reasons."""

    __slots__ = ("_beams", "_stops")

    def __init__(self, request: GenerationRequest) -> None:
        super().__init__(request)
        self.pending = False  # nothing is ever read as a stream
        self._beams: list[tuple[str, int]] | None = None
        self._stops = request.stop

    def add(self, result: Any) -> None:
        beams = self._read_beams(named_outputs(result))
        if beams is not None:
            self._beams = beams

    def _read_beams(self, named: Named) -> list[tuple[str, int]] | None:
        """(text, tokens) of each beam in a response, best first; None when it carries none."""
        raise NotImplementedError

    def finished(self, max_tokens: int) -> list[tuple[str, int, str]]:
        """(text, tokens, finish reason) of each returned beam, best first."""
        out = []
        for text, tokens in self._beams or ():
            reason = "length" if tokens >= max_tokens else "stop"
            if self._stops:  # stop strings: each beam ends before its first one
                matcher = StopStringMatcher(self._stops)
                shown, stopped = matcher.push(text)
                text, reason = (shown, "stop") if stopped else (shown + matcher.flush(), reason)
            out.append((text, tokens, reason))
        self.completion_tokens = sum(tokens for _, tokens, _ in out)
        return out


class TokenIdBeams(BeamReader):
    """A beam search on the C++ contract: output_ids [1, beams, longest] and sequence_length [1,
    beams], decoded here."""

    __slots__ = ("_decoder",)

    def __init__(self, request: GenerationRequest, decoder: IncrementalDetokenizer) -> None:
        super().__init__(request)
        self._decoder = decoder

    def _read_beams(self, named: Named) -> list[tuple[str, int]] | None:
        if "output_ids" not in named or "sequence_length" not in named:
            return None
        lengths = np.frombuffer(named["sequence_length"][1], dtype=np.int32).tolist()
        raw = named["output_ids"][1]
        rows: np.ndarray | list[np.ndarray] = (
            np.frombuffer(raw, dtype=np.int32).reshape(len(lengths), -1) if lengths else []
        )
        return [
            (self._decoder.decode(row[:length].tolist()), int(length))
            for row, length in zip(rows, lengths, strict=True)
        ]


class TextBeams(BeamReader):
    """A beam search on the LLM API flavour: one row of text_output and num_output_tokens per beam."""

    __slots__ = ()

    def _read_beams(self, named: Named) -> list[tuple[str, int]] | None:
        if LLMAPI_TEXT_OUTPUT not in named:
            return None
        texts = [t.decode("utf-8", errors="replace") for t in _strings(named[LLMAPI_TEXT_OUTPUT][1])]
        counts = (
            np.frombuffer(named[LLMAPI_COUNT_OUTPUT][1], dtype=np.int32).tolist()
            if LLMAPI_COUNT_OUTPUT in named
            else [0] * len(texts)
        )
        return list(zip(texts, counts, strict=False))
