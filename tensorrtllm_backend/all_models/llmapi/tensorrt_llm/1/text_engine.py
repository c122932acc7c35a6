"""The stand-in engines (reference, synthetic) behind the LLM API contract: text out.

`TextEngineLoop` is the token-level engine loop (engine.py) with text on top, per request: an
incremental detokenizer (deltas that concatenate exactly to the whole text), stop strings matched on
that text (the stream ends where one completes; its text is never emitted), the prompt echoed when
asked, and finish / stop reasons as the LLM API reports them.
"""

from __future__ import annotations

import time
from typing import Any

from detokenizer import IncrementalDetokenizer
from engine import EngineLoop, Sequence, Sink
from llmapi_contract import TextRequest, text_arrays
from stop_strings import StopStringMatcher


class _TextState:
    __slots__ = ("decoder", "matcher", "pending", "request")

    def __init__(self, request: TextRequest, tokenizer: Any) -> None:
        self.request = request
        self.decoder = IncrementalDetokenizer(tokenizer)
        self.matcher = StopStringMatcher(request.stop) if request.stop else None
        self.pending: list[str] = [request.echo_prompt] if request.echo_prompt else []


class TextEngineLoop(EngineLoop):
    """EngineLoop whose responses carry text (see the module docstring)."""

    def __init__(self, source: Any, responder: Any, counters: Any, tokenizer: Any, **options: Any) -> None:
        self.tokenizer = tokenizer
        super().__init__(source, responder, counters, **options)

    def submit_text(self, request: TextRequest, sink: Sink) -> None:
        seq = Sequence(request.engine, sink, checked_at=time.monotonic())
        seq.extra = _TextState(request, self.tokenizer)
        self._inbox.put(seq)

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

    def _finish(self, seq: Sequence, outcome: str = "completed", **reason: Any) -> None:
        state: _TextState = seq.extra
        if state.matcher is not None and not state.matcher.stopped:
            held = state.matcher.flush()  # text kept back as a possible stop string start
            if held:
                state.pending.append(held)
        super()._finish(seq, outcome, **reason)

    def _response(
        self,
        seq: Sequence,
        ids: list[int],
        log_probs: list[float] | None = None,
        first: bool = False,
        final: bool = False,
    ) -> Any:
        state: _TextState = seq.extra
        text = "".join(state.pending)
        state.pending.clear()
        end = len(seq.generated)  # `ids` are the newest tokens (all of them, unstreamed)
        return self.responder.response(
            text_arrays(
                state.request,
                text,
                generated=end,
                finish_reason=seq.finish_reason if final else None,
                stop_reason=seq.stop_reason if final else None,
                cumulative_logprob=seq.cum_log_prob,
                ids=ids,
                log_probs=log_probs,
                top=seq.top_logprobs[end - len(ids) : end] if ids else [],
            )
        )
