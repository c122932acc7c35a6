"""TensorRT-LLM's LLM API behind the same contract: `tensorrt_llm.LLM.generate_async`, streamed.

The LLM runs on an asyncio loop of its own thread (as the LLM API wants); Triton's execute() only
schedules a coroutine per request. What upstream's model leaves undone is done here: a cancelled
request (client gone, checked every `cancel_check_s`) is aborted in the engine, streamed texts are
deltas of the whole text (never re-sent, never revised), token counts come back for usage, and
shutdown waits for requests in flight before the LLM is shut down.

Needs the `tensorrt_llm` package (NVIDIA's Triton TRT-LLM image); model.py imports this module only
when it can import `tensorrt_llm`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import tensorrt_llm
from llmapi_contract import TextRequest, text_arrays

SHUTDOWN_DRAIN_S = 30.0


def sampling_params(request: TextRequest) -> Any:
    """The `tensorrt_llm.SamplingParams` of a validated request."""
    engine = request.engine
    kwargs: dict[str, Any] = {
        "max_tokens": engine.max_new,
        "min_tokens": engine.min_tokens or None,
        "repetition_penalty": engine.repetition_penalty,
        "presence_penalty": engine.presence_penalty,
        "frequency_penalty": engine.frequency_penalty,
        "stop": list(request.stop) or None,
        "stop_token_ids": [word[0] for word in engine.stop_words] or None,
        "seed": engine.seed,
        "logprobs": engine.top_logprobs if engine.return_log_probs else None,
    }
    if engine.return_log_probs and "logprobs_mode" in _SAMPLING_FIELDS:
        kwargs["logprobs_mode"] = "raw_logprobs"  # the model's own distribution, as the reference's
    if engine.end_id < 0:
        kwargs["ignore_eos"] = True
    else:
        kwargs["end_id"] = engine.end_id
    if engine.greedy:
        kwargs.update(temperature=0.0, top_k=1)
    else:
        kwargs.update(temperature=engine.temperature, top_k=engine.top_k or None, top_p=engine.top_p or None)
    if engine.guide is not None:
        kwargs["guided_decoding"] = guided_decoding(*engine.guide)
    return tensorrt_llm.SamplingParams(**{k: v for k, v in kwargs.items() if v is not None})


def _sampling_fields() -> frozenset[str]:
    import dataclasses

    try:
        return frozenset(f.name for f in dataclasses.fields(tensorrt_llm.SamplingParams))
    except TypeError:  # not a dataclass in this version
        return frozenset()


_SAMPLING_FIELDS = _sampling_fields()


def token_log_probs(
    completion: Any, start: int, end: int, top: int
) -> tuple[list[int], list[float], list[tuple[list[int], list[float]]]]:
    """Tokens start..end of an LLM API completion with their log probs (and the `top` most likely).

    The LLM API gives, per token, a dict token id -> Logprob(logprob, rank) holding the top N and
    the sampled token.
    """
    ids = list(completion.token_ids[start:end])
    steps = list(completion.logprobs or [])[start:end]
    log_probs: list[float] = []
    tops: list[tuple[list[int], list[float]]] = []
    for token, step in zip(ids, steps, strict=False):
        entry = step.get(token) if isinstance(step, dict) else None
        log_probs.append(float(entry.logprob) if entry is not None else float("nan"))
        if top and isinstance(step, dict):
            ranked = sorted(step.items(), key=lambda item: -float(item[1].logprob))[:top]
            tops.append(([int(k) for k, _ in ranked], [float(v.logprob) for _, v in ranked]))
    return ids, log_probs[: len(ids)], tops


def lora_request(name: str, adapter_id: int, path: str) -> Any:
    """The LLM API's LoRARequest of a packed adapter (the LLM loads and caches it by id)."""
    try:
        from tensorrt_llm.executor import LoRARequest
    except ImportError:
        from tensorrt_llm.executor.request import LoRARequest
    return LoRARequest(name, adapter_id, path)


def guided_decoding(guide_type: str, guide: str) -> Any:
    """The LLM API's GuidedDecodingParams of a guide (the LLM needs `guided_decoding_backend` set)."""
    from tensorrt_llm.sampling_params import GuidedDecodingParams

    field = {"json": "json_object", "json_schema": "json", "regex": "regex", "ebnf_grammar": "grammar"}[
        guide_type
    ]
    return GuidedDecodingParams(**{field: True if guide_type == "json" else guide})


class LLMEngine:
    """Serves requests with `tensorrt_llm.LLM(**llm_args)`."""

    def __init__(
        self, llm_args: dict[str, Any], responder: Any, counters: Any, *, cancel_check_s: float
    ) -> None:
        self.responder = responder
        self.counters = counters
        self.cancel_check_s = cancel_check_s
        self.in_flight = 0
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="llm-api", daemon=True)
        self._thread.start()
        self.llm = asyncio.run_coroutine_threadsafe(self._create(llm_args), self.loop).result()

    async def _create(self, llm_args: dict[str, Any]) -> Any:
        return await asyncio.to_thread(tensorrt_llm.LLM, **llm_args)

    def describe(self) -> str:
        return f"TensorRT-LLM {tensorrt_llm.__version__} LLM API"

    def submit_text(self, request: TextRequest, sink: Any) -> None:
        self.in_flight += 1  # on Triton's thread; decremented on the loop
        asyncio.run_coroutine_threadsafe(self._serve(request, sink), self.loop)

    async def _serve(self, request: TextRequest, sink: Any) -> None:
        engine = request.engine
        sent = 0
        tokens_sent = 0
        checked = time.monotonic()
        outcome = "completed"
        try:
            result = self.llm.generate_async(
                engine.input_ids,
                sampling_params=sampling_params(request),
                streaming=engine.streaming,
                **({"lora_request": lora_request(*request.lora)} if request.lora else {}),
            )
            prefix = request.echo_prompt or ""
            async for output in result:
                now = time.monotonic()
                if now - checked >= self.cancel_check_s:
                    checked = now
                    if await asyncio.to_thread(sink.is_cancelled):
                        result.abort()
                        outcome = "cancelled"
                        sink.send(self._arrays(request, "", output, "cancelled", tokens_sent), True)
                        return
                if not engine.streaming and not result.finished:
                    continue
                completion = output.outputs[0]
                text = completion.text
                delta, sent = prefix + text[sent:], len(text)
                prefix = ""
                finished = result.finished
                start, tokens_sent = tokens_sent, len(completion.token_ids)
                reason = completion.finish_reason if finished else None
                sink.send(self._arrays(request, delta, output, reason, start), finished)
                if finished:
                    self.counters.tokens(len(completion.token_ids))
                    return
        except Exception as exc:  # one failed request must not stop the engine
            outcome = "error"
            sink.send(self.responder.error(f"engine error: {exc}"), True)
        finally:
            self.counters.finished(outcome)
            self.in_flight -= 1

    def _arrays(
        self, request: TextRequest, text: str, output: Any, finish_reason: str | None, start: int = 0
    ) -> Any:
        completion = output.outputs[0]
        ids, log_probs, top = [], [], []
        if "output_ids" in request.outputs:
            end = len(completion.token_ids)
            ids, log_probs, top = token_log_probs(completion, start, end, request.engine.top_logprobs)
        return self.responder.response(
            text_arrays(
                request,
                text,
                generated=len(completion.token_ids),
                finish_reason=finish_reason,
                stop_reason=completion.stop_reason if finish_reason else None,
                cumulative_logprob=completion.cumulative_logprob or 0.0,
                ids=ids,
                log_probs=log_probs,
                top=top,
            )
        )

    def shutdown(self, timeout_s: float = SHUTDOWN_DRAIN_S) -> None:
        """Waits for requests in flight (up to `timeout_s`), then shuts the LLM down."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        asyncio.run_coroutine_threadsafe(asyncio.to_thread(self.llm.shutdown), self.loop).result(timeout_s)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=timeout_s)
