"""The in-flight batching loop shared by our stand-in engines (reference and synthetic).

One worker thread owns the token source. It admits requests as they arrive and advances every
active request by one token per round, so no request waits for another to finish. What a request
asks of the engine is honoured here, the same for every token source: the end id, token stop
words, `max_new`, streaming (one response per round with the new token), the prompt echo, TRT-LLM's
`stop` request, and cancellation, checked every `cancel_check_s` per request (as the C++ backend
polls every `cancellation_check_period_ms`: asking Triton whether a request was cancelled is an
IPC round trip, too dear for every token).

Responses leave through a few sender lanes (threads): Triton's Python backend makes every `send`
a round trip to the server process, so one thread sending one response at a time caps the engine
near one response per round trip; lanes overlap the round trips. Each request keeps its lane, so its
responses stay in order.

No Triton import: responses are built through the `Responder` that model.py passes in.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from contract import EngineRequest, PerfMetrics, beam_arrays, response_arrays

STOP_TTL_S = 30.0
"""How long a `stop` for a request id that is not (yet) running is remembered."""
TOKENS_PER_BLOCK = 32
"""The KV cache block size the perf metrics count in (TensorRT-LLM's default tokens_per_block)."""


class Sink(Protocol):
    """Where the responses of one request go (a decoupled response sender, or a collector)."""

    def send(self, response: Any | None, final: bool) -> None: ...

    def is_cancelled(self) -> bool: ...


class Responder(Protocol):
    """Turns output arrays (or an error message) into the backend's response objects."""

    def response(self, arrays: dict[str, np.ndarray]) -> Any: ...

    def error(self, message: str) -> Any: ...

    def log(self, message: str) -> None: ...


class Counters(Protocol):
    """The engine's metrics: requests finished by outcome, tokens generated."""

    def finished(self, outcome: str) -> None: ...

    def tokens(self, count: int) -> None: ...


@dataclass(eq=False, slots=True)
class Sequence:
    """One request in flight: what was asked, what was generated, and the source's own state."""

    request: EngineRequest
    sink: Sink
    generated: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    cum_log_prob: float = 0.0
    unsent: int = 0
    checked_at: float = 0.0
    lane: int = 0
    state: Any = None  # the token source's per-request state (KV cache, RNG, ...)
    context_logits: np.ndarray | None = None
    generation_logits: list[np.ndarray] = field(default_factory=list)
    top_logprobs: list[tuple[list[int], list[float]]] = field(default_factory=list)  # per token
    finish_reason: str | None = None  # as the LLM API says it: stop, length, cancelled
    stop_reason: int | str | None = None  # the end id, stop token or stop string that ended it
    extra: Any = None  # what a subclass of EngineLoop keeps per request (e.g. text state)
    perf: PerfMetrics | None = None  # with return_perf_metrics: arrival, first token, ... (ns)
    draft_tokens: int = 0  # speculative decoding: draft tokens the source proposed for it
    accepted_draft_tokens: int = 0  # of them, those its verification accepted


def _tail(items: list[Any], count: int) -> list[Any]:
    """Removes and returns the last `count` items of `items` (fewer if it has fewer)."""
    if count <= 0:
        return []
    tail = items[-count:]
    del items[-count:]
    return tail


class BeamResult:
    """A beam search's outcome, from a source's `step`: the best beams, best first, each (token ids,
    cumulative log prob, each token's log prob, finish reason: "stop" or "length")."""

    __slots__ = ("beams",)

    def __init__(self, beams: list[tuple[list[int], float, list[float], str]]) -> None:
        self.beams = beams


class Accepted(list):
    """A source's `step` result when a verification pass accepted draft tokens: several (token id,
    log prob) in order, the last one the token the pass itself decoded (speculative decoding)."""

    __slots__ = ()


BEAM_STEP = object()
"""A source's `step` result for a beam search that advanced and has not finished: nothing to send."""


class TokenSource(Protocol):
    """Produces the next token of each active sequence."""

    capacity: int | None
    """The most sequences it runs at once (its batch slots); None: no limit."""

    def start(self, seq: Sequence) -> None:
        """Prepares `seq.state` when the request is admitted."""

    def step(self, seqs: list[Sequence]) -> list[tuple[int, float] | BaseException]:
        """The next token id and its log prob for each sequence (or the error that sequence hit);
        `Accepted` tokens where a speculative step produced several."""

    def release(self, seq: Sequence) -> None:
        """Frees what `start` allocated."""


class EngineLoop:
    """Runs a token source over the admitted requests on one worker thread."""

    def __init__(
        self,
        source: TokenSource,
        responder: Responder,
        counters: Counters,
        *,
        cancel_check_s: float = 0.1,
        step_delay_s: float = 0.0,
        sender_lanes: int = 4,
        name: str = "engine",
        logits_dtype: Any = np.float32,
    ) -> None:
        self.source = source
        self.logits_dtype = logits_dtype  # as config.pbtxt declares the logits outputs
        self.responder = responder
        self.counters = counters
        self.cancel_check_s = cancel_check_s
        self.step_delay_s = step_delay_s
        self.name = name
        self._inbox: queue.SimpleQueue[Sequence | None] = queue.SimpleQueue()
        self._stops: dict[str, float] = {}  # request id -> when its `stop` arrived
        self._stops_lock = threading.Lock()
        self._admitted = 0
        # Read by engine_stats.snapshot from other threads: rounds run, the last round's requests
        # (running, waiting for a slot) and its time.
        self.iterations = 0
        self.num_active = self.num_waiting = 0
        self.iteration_s = 0.0
        # Read by the supervisor's probe (probe_status): inside source.step now, and when the engine
        # last made progress (a round that gave tokens, or work arriving at an idle engine).
        self.in_step = False
        self.progress_at = time.monotonic()
        self._lanes: list[queue.SimpleQueue[tuple[Sink, Any, bool] | None]] = [
            queue.SimpleQueue() for _ in range(max(1, sender_lanes))
        ]
        self._senders = [
            threading.Thread(target=self._send_loop, args=(lane,), name=f"{name}-send-{i}", daemon=True)
            for i, lane in enumerate(self._lanes)
        ]
        for sender in self._senders:
            sender.start()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ---- called from Triton's execute() ------------------------------------------------------

    def probe_status(self) -> dict[str, Any]:
        """Requests in flight (running, waiting for a slot, arrived), seconds without progress while
        there are any, and whether the engine is inside a step (a long prefill is busy, not stuck)."""
        in_flight = self.num_active + self.num_waiting + self._inbox.qsize()
        return {
            "in_flight": in_flight,
            "idle_s": round(time.monotonic() - self.progress_at, 3) if in_flight else 0.0,
            "busy": self.in_step,
        }

    def submit(self, request: EngineRequest, sink: Sink) -> None:
        if self.num_active + self.num_waiting == 0 and self._inbox.empty():
            self.progress_at = time.monotonic()  # the clock of "no progress" starts with work
        seq = Sequence(request, sink, checked_at=time.monotonic())
        if request.return_perf_metrics:
            seq.perf = PerfMetrics(arrival_time_ns=time.time_ns())
        self._inbox.put(seq)

    def stop(self, request_id: str) -> None:
        """TRT-LLM's early stop: the request with this id ends at its next round."""
        with self._stops_lock:
            self._stops[request_id] = time.monotonic()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=timeout_s)
        for lane in self._lanes:
            lane.put(None)
        for sender in self._senders:
            sender.join(timeout=timeout_s)

    # ---- sender lanes ----------------------------------------------------------------------------

    @staticmethod
    def _send_loop(lane: queue.SimpleQueue[tuple[Sink, Any, bool] | None]) -> None:
        while (item := lane.get()) is not None:
            sink, response, final = item
            sink.send(response, final)

    def _send(self, seq: Sequence, response: Any, final: bool) -> None:
        self._lanes[seq.lane].put((seq.sink, response, final))

    # ---- the worker thread ---------------------------------------------------------------------

    def _run(self) -> None:
        active: list[Sequence] = []
        waiting: collections.deque[Sequence] = collections.deque()  # arrived, no free slot yet
        capacity = getattr(self.source, "capacity", None) or 1 << 30
        while True:
            try:
                while True:  # take everything that has arrived; block only when idle
                    seq = self._inbox.get(block=not active and not waiting)
                    if seq is None:
                        self._abort([*active, *waiting], "the engine is shutting down")
                        return
                    waiting.append(seq)
            except queue.Empty:
                pass
            if waiting:
                # A request waiting for a slot can still be cancelled or stopped.
                waiting = collections.deque(seq for seq in waiting if not self._ended_early(seq))
                while waiting and len(active) < capacity:
                    seq = waiting.popleft()
                    if self._admit(seq):
                        active.append(seq)
            live: list[Sequence] = []
            finished: set[int] = set()
            for seq in active:
                if self._ended_early(seq):
                    finished.add(id(seq))
                else:
                    live.append(seq)
            started = time.monotonic()
            self.in_step = True
            try:
                results = self.source.step(live) if live else []
            finally:
                self.in_step = False
            took_s = time.monotonic() - started
            tokens = 0
            for seq, result in zip(live, results, strict=True):
                if result is BEAM_STEP:
                    continue
                if isinstance(result, BeamResult):
                    self._finish_beams(seq, result)
                    tokens += sum(len(beam[0]) for beam in result.beams)
                    finished.add(id(seq))
                    continue
                if isinstance(result, BaseException):
                    self.responder.log(f"{self.name}: request {seq.request.request_id!r} failed: {result}")
                    self.counters.finished("error")
                    self._send(seq, self.responder.error(f"engine error: {result}"), True)
                    finished.add(id(seq))
                    continue
                if isinstance(result, Accepted):
                    applied, done = self._push_several(seq, result)
                    tokens += applied
                    if done:
                        finished.add(id(seq))
                    continue
                tokens += 1
                if self._push(seq, *result):
                    finished.add(id(seq))
            if tokens:
                self.counters.tokens(tokens)
            if tokens or finished:
                self.progress_at = time.monotonic()
            if finished:
                for seq in active:
                    if id(seq) in finished:
                        self.source.release(seq)
                active = [seq for seq in active if id(seq) not in finished]
            self._count_round(bool(live), len(active), len(waiting), took_s)
            if self.step_delay_s and active:
                self.in_step = True  # the delay stands for a slow step
                time.sleep(self.step_delay_s)
                self.in_step = False

    def _count_round(self, ran: bool, active: int, waiting: int, took_s: float) -> None:
        if ran:
            self.iterations += 1
            self.iteration_s = took_s
        self.num_active, self.num_waiting = active, waiting

    def _admit(self, seq: Sequence) -> bool:
        seq.lane = self._admitted % len(self._lanes)
        self._admitted += 1
        if seq.perf is not None:
            seq.perf.first_scheduled_time_ns = time.time_ns()
        try:
            self.source.start(seq)
        except Exception as exc:  # a request the source cannot take must not stop the engine
            self.counters.finished("error")
            self._send(seq, self.responder.error(f"engine error: {exc}"), True)
            return False
        return True

    def _ended_early(self, seq: Sequence) -> bool:
        """Finishes `seq` if it was cancelled or stopped; True if it was."""
        now = time.monotonic()
        if now - seq.checked_at >= self.cancel_check_s:
            seq.checked_at = now
            if seq.sink.is_cancelled():
                self.counters.finished("cancelled")
                self.responder.log(
                    f"{self.name}: request {seq.request.request_id!r} cancelled after "
                    f"{len(seq.generated)} tokens"
                )
                seq.finish_reason = "cancelled"
                self._send(seq, self._response(seq, [], final=True), True)
                return True
        if self._stops and self._stop_requested(seq.request.request_id, now):
            self._finish(seq, "stopped", reason="cancelled")
            return True
        return False

    def _stop_requested(self, request_id: str, now: float) -> bool:
        if not request_id:
            return False
        with self._stops_lock:
            for key, since in list(self._stops.items()):
                if now - since > STOP_TTL_S:  # a stop for a request that never came
                    del self._stops[key]
            return self._stops.pop(request_id, None) is not None

    def _push_several(self, seq: Sequence, accepted: Accepted) -> tuple[int, bool]:
        """Applies the tokens of one speculative step in order (a streamed request gets them in one
        response); stops at the one that ends the request. Returns how many were applied and
        whether the request is finished. What the source recorded per token (top log probs,
        generation logits) is handed over token by token, so a request that ends early returns
        none of the later tokens' records."""
        later = len(accepted) - 1
        request = seq.request
        held_top = _tail(seq.top_logprobs, later) if request.top_logprobs else []
        held_logits = _tail(seq.generation_logits, later) if request.return_generation_logits else []
        for i, (token, log_prob) in enumerate(accepted):
            if i:
                if i <= len(held_top):
                    seq.top_logprobs.append(held_top[i - 1])
                if i <= len(held_logits):
                    seq.generation_logits.append(held_logits[i - 1])
            if self._push(seq, token, log_prob, send=i == later):
                return i + 1, True
        return len(accepted), False

    def _push(self, seq: Sequence, token: int, log_prob: float, send: bool = True) -> bool:
        """Applies one generated token; returns True when the request is finished. A streamed
        request's response goes out when `send` (several tokens of one step go out together)."""
        request = seq.request
        if token == request.end_id:
            # The end token is not returned: neither are what the source recorded for its step.
            if len(seq.generation_logits) > seq.unsent:
                seq.generation_logits.pop()
            if len(seq.top_logprobs) > len(seq.generated):
                seq.top_logprobs.pop()
            self._finish(seq, reason="stop", stop_reason=token)
            return True
        seq.generated.append(token)
        if seq.perf is not None:
            seq.perf.last_token_time_ns = time.time_ns()
            seq.perf.first_token_time_ns = seq.perf.first_token_time_ns or seq.perf.last_token_time_ns
        seq.log_probs.append(log_prob)
        seq.cum_log_prob += log_prob
        seq.unsent += 1
        generated = seq.generated
        for word in request.stop_words:
            if generated[-len(word) :] == word:
                self._finish(seq, reason="stop", stop_reason=word[0] if len(word) == 1 else str(word))
                return True
        if self._should_stop(seq):
            self._finish(seq, reason="stop", stop_reason=seq.stop_reason)
            return True
        if len(generated) >= request.max_new:
            self._finish(seq, reason="length")
            return True
        if request.streaming and send:
            self._send_new(seq, final=False)
        return False

    def _should_stop(self, seq: Sequence) -> bool:
        """A subclass's own reason to end `seq` after its latest token (text stop strings)."""
        return False

    def _finish(
        self,
        seq: Sequence,
        outcome: str = "completed",
        *,
        reason: str = "stop",
        stop_reason: int | str | None = None,
    ) -> None:
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        self._send_final(seq)
        self.counters.finished(outcome)

    def _send_final(self, seq: Sequence) -> None:
        """The finished request's last responses (its finish and stop reasons set)."""
        request = seq.request
        if request.streaming:
            if seq.unsent:
                self._send_new(seq, final=False)
            # The last response of a stream carries no new tokens (as the C++ backend's).
            self._send(seq, self._response(seq, [], final=True), True)
        else:
            ids = seq.generated if request.exclude_input else request.input_ids + seq.generated
            self._send(seq, self._response(seq, ids, log_probs=seq.log_probs, first=True, final=True), True)

    def _finish_beams(self, seq: Sequence, result: BeamResult) -> None:
        """The one final response of a beam search (it is never streamed): the best beams."""
        request = seq.request
        seq.finish_reason = result.beams[0][3] if result.beams else "length"
        prefix = [] if request.exclude_input else request.input_ids
        beams = [(prefix + ids, cum, log_probs) for ids, cum, log_probs, _ in result.beams]
        perf = self._perf(seq, sum(len(ids) for ids, _, _, _ in result.beams))
        self._send(seq, self.responder.response(beam_arrays(request, beams, perf=perf)), True)
        self.counters.finished("completed")

    def _perf(self, seq: Sequence, generated: int) -> PerfMetrics | None:
        """The final response's perf metrics (with return_perf_metrics). Reused blocks are those the
        source set (the reference engine's prefix reuse, prefix_cache.py); every other block is new."""
        perf = seq.perf
        if perf is not None:
            blocks = -(-(len(seq.request.input_ids) + generated) // TOKENS_PER_BLOCK)
            perf.kv_cache_alloc_total_blocks = blocks
            perf.kv_cache_alloc_new_blocks = blocks - perf.kv_cache_reused_blocks
            perf.total_draft_tokens = seq.draft_tokens
            perf.total_accepted_draft_tokens = seq.accepted_draft_tokens
            perf.acceptance_rate = seq.accepted_draft_tokens / seq.draft_tokens if seq.draft_tokens else 0.0
            perf.last_token_time_ns = perf.last_token_time_ns or time.time_ns()
            perf.first_token_time_ns = perf.first_token_time_ns or perf.last_token_time_ns
        return perf

    def _send_new(self, seq: Sequence, final: bool) -> None:
        new = seq.generated[len(seq.generated) - seq.unsent :]
        new_log_probs = seq.log_probs[len(seq.log_probs) - seq.unsent :]
        first = len(seq.generated) == seq.unsent
        ids = seq.request.input_ids + new if first and not seq.request.exclude_input else new
        seq.unsent = 0
        self._send(seq, self._response(seq, ids, log_probs=new_log_probs, first=first), final)

    def _response(
        self,
        seq: Sequence,
        ids: list[int],
        log_probs: list[float] | None = None,
        first: bool = False,
        final: bool = False,
    ) -> Any:
        """The response carrying `ids` (C++ backend contract); `final` marks the request's last."""
        request = seq.request
        generation = None
        if request.return_generation_logits and seq.generation_logits:
            generation = np.stack(seq.generation_logits)
            seq.generation_logits = []
        perf = self._perf(seq, len(seq.generated)) if final else None
        arrays = response_arrays(
            request,
            ids,
            cum_log_prob=seq.cum_log_prob if request.return_log_probs else 0.0,
            log_probs=log_probs,
            context_logits=seq.context_logits if request.return_context_logits and first else None,
            generation_logits=generation,
            logits_dtype=self.logits_dtype,
            perf=perf,
        )
        return self.responder.response(arrays)

    def _abort(self, active: list[Sequence], why: str) -> None:
        for seq in active:
            self._send(seq, self.responder.error(why), True)
