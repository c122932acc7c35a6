"""Serving through TensorRT-LLM's LLM API: `LLM(**args).generate_async`, streamed, for every engine.

`LLMEngine` runs over an `api`: the real `tensorrt_llm` (`TensorRTLLM` below, NVIDIA's image) or the
stand-in (llm_standin.StandIn: the same surface over our reference / synthetic engines), so the path
that serves production is the one CI runs. The LLM lives on an asyncio loop of its own thread (as the
LLM API wants, and as upstream's model runs it); Triton's execute() only schedules a coroutine per
request. What upstream's model leaves undone is done here: `streaming` reaches the engine (upstream
1.2.1 passes it positionally into `lora_request`: see nvidia_llmapi), streamed texts are deltas of the
whole text (never re-sent), token counts and log probs come back for usage, a cancelled request
(client gone, checked every `cancel_check_s` as upstream's cancellation loop does) or a `stop` request
aborts it in the engine, and shutdown waits for requests in flight before the LLM is shut down.

Responses leave through a few sender threads (lanes): each `send` of Triton's Python backend is a
round trip to the server, which must not block the loop; a request keeps its lane, so its responses
stay in order, and its lane is the only thread that calls its response sender (the cancellation
checks too: the watcher only asks for them), so no lock is held across a call into Triton. At most
MAX_QUEUED responses wait for the lanes: beyond that the loop reads no further results until they
are sent, so an engine faster than Triton relays never builds a backlog that delays other requests'
first tokens. The loop never calls Triton: counts stay in Python (triton_adapter.Counters).
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import itertools
import math
import queue
import threading
import time
from typing import Any

import nvidia_llmapi as nv
from llmapi_contract import LOGPROB_OUTPUTS, TOP_LOGPROB_OUTPUTS, TextRequest, beam_arrays, text_arrays
from shared_contract import RequestError

TOKEN_OUTPUTS = frozenset(LOGPROB_OUTPUTS + TOP_LOGPROB_OUTPUTS)
"""The outputs that need each new token's id and log probs."""
SHUTDOWN_DRAIN_S = 30.0
MAX_QUEUED = 64
"""The most responses waiting for the sender lanes before the loop waits for them."""
RESUME_QUEUED = 32
"""Then it waits until no more than this many wait."""


def _first(*candidates: tuple[str, str]) -> Any:
    """The first of (module, name) that imports."""
    for module, name in candidates:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"none of {', '.join(f'{m}.{n}' for m, n in candidates)} can be imported")


class TensorRTLLM:
    """The real `tensorrt_llm` surface LLMEngine uses; constructing it imports tensorrt_llm."""

    def __init__(self) -> None:
        import tensorrt_llm

        self.LLM = tensorrt_llm.LLM
        self.SamplingParams = tensorrt_llm.SamplingParams
        self.version = tensorrt_llm.__version__
        self.GuidedDecodingParams = _first(nv.GUIDED_DECODING_PARAMS)
        self.LoRARequest = _first(*nv.LORA_REQUEST)
        self.update_llm_args_with_extra_dict = _first(*nv.UPDATE_LLM_ARGS)

    def describe(self, llm: Any) -> str:
        return f"TensorRT-LLM {self.version} LLM API"

    @staticmethod
    def mpi_session() -> Any:
        """What upstream's rank 0 passes as `_mpi_session` under mpirun: the LLM's workers are the
        other ranks of COMM_WORLD (waiting in MPICommExecutor)."""
        from mpi4py.MPI import COMM_WORLD

        session = _first(nv.MPI_SESSION)
        return session(comm=COMM_WORLD, n_workers=COMM_WORLD.Get_size())


def sampling_params(api: Any, request: TextRequest) -> Any:
    """The api's SamplingParams of a request (its refusals are the LLM API's: ValueError, TypeError)."""
    kwargs = dict(request.sampling)
    if request.guide is not None:
        kwargs["guided_decoding"] = guided_decoding(api, *request.guide)
    return api.SamplingParams(**kwargs)


def guided_decoding(api: Any, guide_type: str, guide: str) -> Any:
    """The api's GuidedDecodingParams of a guide (the LLM needs `guided_decoding_backend` set)."""
    field = nv.GUIDE_FIELDS[guide_type]
    return api.GuidedDecodingParams(**{field: True if field == "json_object" else guide})


def _rank_key(item: tuple[int, Any]) -> tuple[int, float]:
    rank = item[1].rank
    return (rank, 0.0) if rank is not None else (1 << 30, -float(item[1].logprob))


def token_log_probs(
    completion: Any, start: int, end: int, top: int
) -> tuple[list[int], list[float], list[tuple[list[int], list[float]]]]:
    """Tokens start..end of a completion, their log probs and (top > 0) their `top` most likely.

    The LLM API gives per token a dict token id -> Logprob(logprob, rank) (the sampled token and the
    top N); a token it gave nothing for has NaN. Top rows are cut to one width, the fewest any row has.
    """
    ids = list(completion.token_ids[start:end])
    steps = list(completion.logprobs or ())[start:end]
    log_probs: list[float] = []
    tops: list[tuple[list[int], list[float]]] = []
    for i, token in enumerate(ids):
        step = steps[i] if i < len(steps) else None
        if isinstance(step, dict):
            entry = step.get(token)
            log_probs.append(float(entry.logprob) if entry is not None else math.nan)
            if top:
                ranked = sorted(step.items(), key=_rank_key)[:top]
                tops.append(([int(k) for k, _ in ranked], [float(v.logprob) for _, v in ranked]))
        else:  # a float (TensorRT engines) or nothing
            log_probs.append(math.nan if step is None else float(step))
            if top:
                tops.append(([], []))
    if tops:
        width = min(len(row[0]) for row in tops)
        tops = [(row[0][:width], row[1][:width]) for row in tops]
    return ids, log_probs, tops


def prompt_log_probs(
    request: TextRequest, output: Any
) -> tuple[list[float], list[tuple[list[int], list[float]]]]:
    """Each prompt token's log prob (NaN for the first: nothing predicts it) and, for positions 1..,
    the N most likely tokens there, from a RequestOutput asked for prompt_logprobs and context logits.

    The LLM API's `prompt_logprobs[i]` ranks the tokens that could follow prompt token i (1.2's
    compute_logprobs: top N only, the prompt's own token not added); the prompt token's own value
    comes from the context logits (row i - 1), else from that ranking when it is there (else NaN)."""
    ids = list(output.prompt_token_ids)
    ranked = list(output.outputs[0].prompt_logprobs or ())
    logits = getattr(output, "context_logits", None)
    table = None
    if logits is not None:
        import torch

        table = torch.log_softmax(torch.as_tensor(logits).float().reshape(len(ids), -1)[:-1], -1).cpu()
    values = [math.nan]
    tops: list[tuple[list[int], list[float]]] = []
    for i in range(1, len(ids)):
        step = ranked[i - 1] if i - 1 < len(ranked) else {}
        if table is not None:
            values.append(float(table[i - 1, ids[i]]))
        else:
            entry = step.get(ids[i])
            values.append(float(entry.logprob) if entry is not None else math.nan)
        if request.prompt_logprobs:
            best = sorted(step.items(), key=_rank_key)[: request.prompt_logprobs]
            tops.append(([int(k) for k, _ in best], [float(v.logprob) for _, v in best]))
    return values, tops


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


CHECK = object()
"""A lane item that asks the request's sender whether its client went away."""


class _Live:
    """A request in flight: its sink, its lane, the task serving it, and what became of it.

    Only the request's lane calls its sink (its responses, and `is_cancelled()` when the watcher asks
    for a check), so nothing else ever touches a response sender, and never one whose final response
    went (`closed`: Triton frees the sender with it, and asking it then crashes the server)."""

    __slots__ = ("cancelled", "checking", "closed", "lane", "request_id", "sink", "stopped", "task")

    def __init__(self, sink: Any, lane: queue.SimpleQueue[Any], task: Any, request_id: str) -> None:
        self.sink = sink
        self.lane = lane
        self.task = task
        self.request_id = request_id
        self.cancelled = False
        self.stopped = False
        self.closed = False
        self.checking = False  # a CHECK waits in its lane


class LLMEngine:
    """Serves requests with `api.LLM(**llm_args)` (see the module docstring).

    `responder` builds Triton responses: `response(arrays)`, `error(message)` (NVIDIA's refusals and
    failures) and `invalid(message)` (ours, INVALID_ARG); `counters` counts outcomes and tokens (in
    Python: the model's metrics thread publishes them).

    Threads: the loop (the LLM API and every request's coroutine), `sender_lanes` lanes (each the
    only caller of its requests' senders), and the watcher, which every `cancel_check_s` puts a
    CHECK in the lane of each request not yet checked. None holds a lock while it calls Triton.
    """

    def __init__(
        self,
        api: Any,
        llm_args: dict[str, Any],
        responder: Any,
        counters: Any,
        *,
        cancel_check_s: float,
        sender_lanes: int = 4,
    ) -> None:
        self.api = api
        self.responder = responder
        self.counters = counters
        self.cancel_check_s = cancel_check_s
        self.in_flight = 0
        self._lock = threading.Lock()  # in_flight: execute() adds, the loop takes away
        self._live: dict[int, _Live] = {}
        self._progress_at = time.monotonic()  # the last output from the engine, or work arriving
        self._next_lane = itertools.count()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="llm-api", daemon=True)
        self._thread.start()
        try:
            self.llm = asyncio.run_coroutine_threadsafe(self._create(llm_args), self.loop).result()
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            raise
        self._lanes: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(max(1, sender_lanes))]
        self._posted = 0  # responses handed to the lanes (the loop's thread)
        self._room_waiters: collections.deque[asyncio.Future[None]] = collections.deque()  # loop only
        self._waking = False
        self._sent = [0] * len(self._lanes)  # of them, those each lane sent (its own slot)
        self._senders = [
            threading.Thread(target=self._send_loop, args=(i, lane), name=f"llm-api-send-{i}", daemon=True)
            for i, lane in enumerate(self._lanes)
        ]
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="llm-api-cancel", daemon=True)
        for thread in (*self._senders, self._watcher):
            thread.start()

    async def _create(self, llm_args: dict[str, Any]) -> Any:
        return await asyncio.to_thread(lambda: self.api.LLM(**llm_args))

    def describe(self) -> str:
        return self.api.describe(self.llm)

    def speculative_counters(self) -> dict[str, int | float] | None:
        """Speculative decoding counters of the engine since start, for /metrics: draft_tokens
        (proposed), accepted_draft_tokens, verify_passes (forwards that verified drafts),
        decode_steps (engine rounds that decoded), acceptance_rate. None where the LLM keeps none
        (the real tensorrt_llm reports these per request only; the stand-in counts them)."""
        counters = getattr(self.llm, "speculative_counters", None)
        return counters() if callable(counters) else None

    # ---- called from Triton's execute() ------------------------------------------------------------

    def submit_text(self, request: TextRequest, sink: Any) -> None:
        with self._lock:
            if self.in_flight == 0:
                self._progress_at = time.monotonic()  # the clock of "no progress" starts with work
            self.in_flight += 1
        lane = self._lanes[next(self._next_lane) % len(self._lanes)]
        asyncio.run_coroutine_threadsafe(self._serve(request, sink, lane), self.loop)

    def stop(self, request_id: str) -> None:
        """Upstream's `stop`: aborts every request in flight with this request id."""
        for live in list(self._live.values()):
            if live.request_id == request_id and not live.cancelled:
                live.cancelled = live.stopped = True
                self.loop.call_soon_threadsafe(live.task.cancel)

    def probe(self, sink: Any) -> None:
        """Answers the supervisor's probe the way a request's responses go: the loop builds the
        answer (probe_status) and a lane sends it, so a stuck loop or lane leaves it unanswered."""
        asyncio.run_coroutine_threadsafe(self._probe(sink), self.loop)

    def probe_status(self) -> dict[str, Any]:
        """Requests in flight, seconds since the engine last gave an output while it had work, and
        whether the engine says it is busy in a step (None where it cannot say: TensorRT-LLM)."""
        busy = getattr(self.llm, "busy", None)
        in_flight = self.in_flight
        return {
            "in_flight": in_flight,
            "idle_s": round(time.monotonic() - self._progress_at, 3) if in_flight else 0.0,
            "busy": busy() if callable(busy) else None,
        }

    # ---- on the loop ---------------------------------------------------------------------------------

    async def _probe(self, sink: Any) -> None:
        live = _Live(sink, self._lanes[0], None, "")
        self._lanes[0].put((live, self.responder.probe(self.probe_status()), True))

    async def _serve(self, request: TextRequest, sink: Any, lane: queue.SimpleQueue[Any]) -> None:
        live = _Live(sink, lane, asyncio.current_task(), request.request_id)

        def send(payload: Any, final: bool) -> None:
            self._posted += 1
            lane.put((live, payload, final))

        self._live[id(live)] = live
        outcome = "completed"
        result = None
        sent = 0
        tokens_sent = 0
        try:
            try:
                params = sampling_params(self.api, request)
                lora = {"lora_request": self.api.LoRARequest(*request.lora)} if request.lora else {}
                result = self.llm.generate_async(
                    request.input_ids, sampling_params=params, streaming=request.streaming, **lora
                )
            except RequestError as exc:  # ours: what the stand-in engines cannot serve
                outcome = "error"
                send(self.responder.invalid(str(exc)), True)
                return
            prefix = request.echo_prompt or ""
            streaming = request.streaming
            beams = bool(request.sampling.get("use_beam_search"))
            prompt = request.prompt_logprobs is not None  # prompt log probs: with the first response
            async for output in result:
                self._progress_at = time.monotonic()
                if self._posted - sum(self._sent) > MAX_QUEUED:
                    await self._room()
                finished = output.finished
                if not streaming and not finished:
                    continue
                if beams:  # one response: every beam (beam search is never streamed here)
                    if finished:
                        metrics = output.outputs[0].request_perf_metrics
                        self.counters.tokens(sum(len(o.token_ids) for o in output.outputs))
                        send(beam_arrays(request, output.outputs, perf=metrics), True)
                        return
                    continue
                completion = output.outputs[0]
                text = completion.text
                delta, sent = prefix + text[sent:], len(text)
                prefix = ""
                count = len(completion.token_ids)
                first = prompt_log_probs(request, output) if prompt else None
                prompt = False
                arrays = self._arrays(request, delta, completion, finished, tokens_sent, count, first)
                if count > tokens_sent:
                    self.counters.tokens(count - tokens_sent)
                    tokens_sent = count
                if finished:
                    send(arrays, True)
                    return
                send(arrays, False)
            send(None, True)  # the results ended unfinished: end the request anyway
        except asyncio.CancelledError:  # the client went away, or a `stop` request came
            outcome = "stopped" if live.stopped else "cancelled"
            arrays = text_arrays(request, "", generated=tokens_sent, finish_reason="cancelled")
            send(arrays, True)
        except RequestError as exc:
            outcome = "error"
            send(self.responder.invalid(str(exc)), True)
        except Exception as exc:  # one failed request must not stop the engine; upstream's wording
            outcome = "error"
            send(self.responder.error(f"{nv.GENERATE_ERROR}{exc}"), True)
        finally:
            if result is not None and not result.finished:
                result.abort()  # cancelled, or failed on our side: the engine must not run on
            del self._live[id(live)]
            self.counters.finished(outcome)
            with self._lock:
                self.in_flight -= 1

    async def _room(self) -> None:
        """Waits (in line) until no more than RESUME_QUEUED responses wait for the lanes."""
        waiter = self.loop.create_future()
        self._room_waiters.append(waiter)
        if self._posted - sum(self._sent) <= RESUME_QUEUED:  # again: a lane may just have looked
            self._wake_waiters()
        handle = self.loop.call_later(0.05, _resolve, waiter)  # only if a wake-up went astray
        try:
            await waiter
        finally:
            handle.cancel()

    def _wake_waiters(self) -> None:
        """Lets as many waiting requests go on as the lanes have room for (at least one); on the loop."""
        self._waking = False
        waiters = self._room_waiters
        room = max(1, MAX_QUEUED - (self._posted - sum(self._sent)))
        while waiters and room > 0:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                room -= 1

    def _roomy(self) -> None:
        """A lane sent one: once the queue is short again, wakes the requests waiting (lane threads)."""
        if not self._waking and self._posted - sum(self._sent) <= RESUME_QUEUED:
            self._waking = True
            self.loop.call_soon_threadsafe(self._wake_waiters)

    def _arrays(
        self,
        request: TextRequest,
        text: str,
        completion: Any,
        finished: bool,
        start: int,
        end: int,
        prompt: Any = None,
    ) -> dict[str, Any]:
        ids = log_probs = top = None
        if not request.outputs.isdisjoint(TOKEN_OUTPUTS):
            ids, log_probs, top = token_log_probs(completion, start, end, request.top_logprobs)
        perf = (
            completion.request_perf_metrics
            if finished and request.sampling.get("return_perf_metrics")
            else None
        )
        return text_arrays(
            request,
            text,
            generated=end,
            finish_reason=completion.finish_reason if finished else None,
            stop_reason=completion.stop_reason if finished else None,
            cumulative_logprob=completion.cumulative_logprob,
            ids=ids,
            log_probs=log_probs,
            top=top,
            prompt=prompt,
            perf=perf,
        )

    # ---- threads -------------------------------------------------------------------------------------

    def _send_loop(self, index: int, lane: queue.SimpleQueue[Any]) -> None:
        response = self.responder.response
        sent = self._sent
        while (item := lane.get()) is not None:
            live, payload, final = item
            if payload is CHECK:
                self._check(live)
                continue
            try:
                if payload.__class__ is dict:
                    payload = response(payload)
                if final:
                    live.closed = True
                live.sink.send(payload, final)
            except Exception as exc:  # a request whose client is gone: nothing to tell it
                self.responder.log(f"llm-api: could not send a response: {exc}")
            sent[index] += 1
            if self._room_waiters:
                self._roomy()

    def _check(self, live: _Live) -> None:
        """On the request's lane: asks its sender whether the client went away; aborts it if so."""
        live.checking = False
        if live.closed or live.cancelled:
            return
        try:
            cancelled = live.sink.is_cancelled()
        except Exception:  # its response sender is closed: it ends on its own
            return
        if cancelled:
            live.cancelled = True
            self.loop.call_soon_threadsafe(live.task.cancel)

    def _watch(self) -> None:
        """Every cancel_check_s: a CHECK for each request in flight whose last one was answered."""
        while not self._stopping.wait(self.cancel_check_s):
            for live in list(self._live.values()):
                if not (live.checking or live.cancelled or live.closed):
                    live.checking = True
                    live.lane.put((live, CHECK, False))

    def shutdown(self, timeout_s: float = SHUTDOWN_DRAIN_S) -> None:
        """Waits for requests in flight (up to `timeout_s`), then shuts the LLM down."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stopping.set()
        self._watcher.join(timeout=timeout_s)
        try:
            asyncio.run_coroutine_threadsafe(asyncio.to_thread(self.llm.shutdown), self.loop).result(
                timeout_s
            )
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=timeout_s)
            for lane in self._lanes:
                lane.put(None)
            for sender in self._senders:
                sender.join(timeout=timeout_s)
