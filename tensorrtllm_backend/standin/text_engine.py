"""The stand-in LLM API's engine: our token engine loop (engine.py) with the LLM API's text on top.

`TextEngineLoop` runs a token source (reference or synthetic) over the admitted requests exactly as
the ensemble's stand-in does, and adds per request what TensorRT-LLM's LLM API adds: an incremental
detokenizer (text that concatenates exactly to the whole text), stop strings matched on that text
(the request ends where one completes; its text is never emitted), the finish and stop reasons as
`CompletionOutput` reports them, and the log probs of each token with the most likely alternatives.

Its responses are `Update`s, not Triton tensors: each goes to the request's result object
(llm_standin.RequestOutput) on the asyncio loop that awaits it. Updates of one engine round travel
together: one wake-up of the loop per round, however many requests advanced. The loop runs at most
MAX_AHEAD updates ahead of their readers (it waits for them beyond that): a source that needs no
model (synthetic) produces tokens as fast as they are relayed, never a backlog that delays new
requests.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any

from contract import PerfMetrics
from detokenizer import IncrementalDetokenizer
from engine import BeamResult, EngineLoop, Sequence
from stop_strings import StopStringMatcher

MAX_AHEAD = 128
"""The most Updates the loop produces before their readers took them."""
RESUME_AHEAD = 64
"""Then it waits until no more than this many are ahead."""


class Update:
    """One response of the engine to one request: what it adds, and how it ends when `final`."""

    __slots__ = (
        "beams",
        "context_logits",
        "cumulative_logprob",
        "error",
        "final",
        "finish_reason",
        "ids",
        "log_probs",
        "perf",
        "stop_reason",
        "text",
        "top",
    )

    def __init__(
        self,
        text: str = "",
        ids: list[int] | None = None,
        log_probs: list[float] | None = None,
        top: list[tuple[list[int], list[float]]] | None = None,
        *,
        final: bool = False,
        finish_reason: str | None = None,
        stop_reason: int | str | None = None,
        cumulative_logprob: float = 0.0,
        error: str | None = None,
        beams: list[tuple[str, list[int], float, str]] | None = None,
        context_logits: Any = None,
        perf: Any = None,
    ) -> None:
        self.text = text
        self.ids = ids or []
        self.log_probs = log_probs
        self.top = top
        self.final = final
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        self.cumulative_logprob = cumulative_logprob
        self.error = error
        self.beams = beams  # a beam search's outcome: (text, ids, cumulative log prob, finish reason)
        self.context_logits = context_logits  # the prompt's logits [prompt, vocab], with the first Update
        self.perf = perf  # contract.PerfMetrics, with the final Update (return_perf_metrics)


class _Quiet:
    """The loop's responder: errors become final Updates; log lines go to `log`."""

    def __init__(self, log: Any) -> None:
        self.log = log

    def response(self, arrays: Any) -> Any:  # never used: TextEngineLoop builds Updates itself
        raise NotImplementedError

    @staticmethod
    def error(message: str) -> Update:
        return Update(final=True, error=message)


class _Uncounted:
    """The loop counts nothing: the LLM API's user (llm_engine.py) counts requests and tokens."""

    def finished(self, outcome: str) -> None:
        pass

    def tokens(self, count: int) -> None:
        pass


class _TextState:
    __slots__ = ("decoder", "logprobs", "matcher", "pending", "stops")

    def __init__(self, stops: tuple[str, ...], tokenizer: Any, logprobs: bool) -> None:
        self.decoder = IncrementalDetokenizer(tokenizer)
        self.matcher = StopStringMatcher(stops) if stops else None
        self.pending: list[str] = []
        self.logprobs = logprobs


class TextEngineLoop(EngineLoop):
    """EngineLoop whose responses are the LLM API's (see the module docstring)."""

    def __init__(self, source: Any, tokenizer: Any, *, log: Any, **options: Any) -> None:
        self.tokenizer = tokenizer
        self._ready: collections.deque[tuple[Any, Update]] = collections.deque()
        self._scheduled = False
        self.loop: asyncio.AbstractEventLoop | None = None  # where results are awaited
        self.produced = 0  # Updates sent (engine thread)
        self.taken = 0  # of them, those their readers took or dropped (the loop's thread: `took`)
        self._waiting = False
        self._caught_up = threading.Event()
        # Every round checks for aborted requests: asking a result is an attribute read, not an IPC.
        super().__init__(source, _Quiet(log), _Uncounted(), cancel_check_s=0.0, sender_lanes=1, **options)

    def submit_text(self, request: Any, stops: tuple[str, ...], result: Any) -> None:
        """Runs `request` (an EngineRequest) for `result`, which takes the Updates (`_push`) and
        says when it was aborted (`is_cancelled`)."""
        seq = Sequence(request, result, checked_at=time.monotonic())
        seq.extra = _TextState(stops, self.tokenizer, request.return_log_probs)
        if request.return_perf_metrics:
            seq.perf = PerfMetrics(arrival_time_ns=time.time_ns())
        self._inbox.put(seq)

    # ---- delivery to the loop -------------------------------------------------------------------

    def _send(self, seq: Sequence, response: Any, final: bool) -> None:
        self._ready.append((seq.sink, response))
        if not self._scheduled:
            self._scheduled = True
            assert self.loop is not None
            self.loop.call_soon_threadsafe(self._deliver)
        self.produced += 1
        if self.produced - self.taken > MAX_AHEAD:
            self._wait_for_readers()

    def _wait_for_readers(self) -> None:
        """Blocks the engine until no more than RESUME_AHEAD Updates are ahead of their readers."""
        while self.produced - self.taken > RESUME_AHEAD:
            self._caught_up.clear()
            self._waiting = True
            if self.produced - self.taken > RESUME_AHEAD:
                self._caught_up.wait(0.05)  # the timeout only guards against a reader gone for good
            self._waiting = False

    def took(self, count: int = 1) -> None:
        """A reader took (or dropped) `count` Updates; on the loop's thread."""
        self.taken += count
        if self._waiting and self.produced - self.taken <= RESUME_AHEAD:
            self._caught_up.set()

    def _deliver(self) -> None:
        self._scheduled = False  # before taking: an Update appended from now on schedules again
        ready = self._ready
        while ready:
            result, update = ready.popleft()
            result._push(update)

    # ---- text ---------------------------------------------------------------------------------------

    def _should_stop(self, seq: Sequence) -> bool:
        state: _TextState = seq.extra
        text = state.decoder.push(seq.generated[-1:])
        if state.matcher is not None and text:
            text, stopped = state.matcher.push(text)
            if stopped:
                seq.stop_reason = state.matcher.matched
                if text:
                    state.pending.append(text)
                return True
        if text:
            state.pending.append(text)
        return False

    def _send_final(self, seq: Sequence) -> None:
        """One final Update with everything not yet sent (a streamed request's last tokens too: the
        LLM API's last response carries the token that ended the request)."""
        state: _TextState = seq.extra
        if state.matcher is not None and not state.matcher.stopped:
            held = state.matcher.flush()  # text kept back as a possible stop string start
            if held:
                state.pending.append(held)
        if isinstance(seq.stop_reason, int) and (not seq.generated or seq.generated[-1] != seq.stop_reason):
            seq.stop_reason = None  # the end id (never appended): the LLM API gives no stop reason
        new = seq.unsent if seq.request.streaming else len(seq.generated)
        ids = seq.generated[len(seq.generated) - new :]
        seq.unsent = 0
        self._send(seq, self._response(seq, ids, seq.log_probs[len(seq.log_probs) - new :], final=True), True)

    def _finish_beams(self, seq: Sequence, result: BeamResult) -> None:
        """A beam search's one Update: every returned beam decoded whole (as the LLM API decodes
        beams), best first."""
        decode = self.tokenizer.decode
        beams = [
            (decode(ids, skip_special_tokens=True), ids, cum, reason) for ids, cum, _, reason in result.beams
        ]
        seq.finish_reason = beams[0][3] if beams else "length"
        perf = self._perf(seq, sum(len(ids) for _, ids, _, _ in beams))
        self._send(seq, Update(final=True, beams=beams, perf=perf, finish_reason=seq.finish_reason), True)

    def _response(
        self,
        seq: Sequence,
        ids: list[int],
        log_probs: list[float] | None = None,
        first: bool = False,
        final: bool = False,
    ) -> Update:
        state: _TextState = seq.extra
        text = "".join(state.pending)
        state.pending.clear()
        end = len(seq.generated)  # `ids` are the newest tokens
        top = None
        if state.logprobs:
            top = seq.top_logprobs[end - len(ids) : end] if ids else []
        context, seq.context_logits = seq.context_logits, None  # with the first Update only
        return Update(
            text,
            ids,
            log_probs if state.logprobs else None,
            top,
            final=final,
            finish_reason=seq.finish_reason if final else None,
            stop_reason=seq.stop_reason if final else None,
            cumulative_logprob=seq.cum_log_prob,
            context_logits=context,
            perf=self._perf(seq, len(seq.generated)) if final else None,
        )
