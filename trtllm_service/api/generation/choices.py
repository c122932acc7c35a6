"""A response's engine requests ("choices"): started together, each read to its first text before
the response starts, read to their end for a JSON answer, and always closed.

Shared by every generation endpoint (OpenAI's chat, completions and responses; Anthropic's messages).
One engine request per choice: chat runs its one prompt ``n`` times, completions run every prompt ``n``
times (choice index ``prompt_index * n + i``), a response or a message is one chat choice. Because every
choice has produced its first text before the response starts, errors found by the engine (not
ready, invalid arguments) are answered as JSON with their status, never inside a 200 stream.

Seeds: with a ``seed``, choice ``i`` of a prompt samples with ``seed + i``, so the choices differ and the
response is reproducible. Without one, a sampled request draws a random seed of its own
(`SamplingFields.sampling_params`) and its choices sample with it the same way, so choices and
repeated requests are independent whatever seed the engine falls back to when none is sent. A
response's only choice is its prepared request as it is, not a copy (31 fields copied: 29 us).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeVar

from starlette.requests import Request

from trtllm_service.api.server.admission import (
    CLIENT_GONE,
    client_gone,
    release_when_done,
    until_disconnect,
    wait_turn,
)
from trtllm_service.errors import APIError
from trtllm_service.relay.client import EngineStream
from trtllm_service.relay.logprobs import TokenLogprob
from trtllm_service.relay.request import GenerationRequest, SamplingParams
from trtllm_service.request_ids import engine_request_id

if TYPE_CHECKING:
    from trtllm_service.runtime import Runtime

logger = logging.getLogger("trtllm_service.api")

_UINT64_MASK = (1 << 64) - 1
_T = TypeVar("_T")


@dataclass(slots=True)
class Choice:
    """One engine request of a response, once it has produced its first text (or, streamed alone,
    once it is sent: `waiting`)."""

    index: int
    stream: EngineStream | Beam
    first: str
    echo: str = ""  # completions with echo: the prompt, sent before the generated text
    waiting: bool = False  # its first text is still to be read (by its streamed response: `first`)


@dataclass(slots=True)
class Result:
    """A finished choice of a non-streamed response."""

    text: str
    completion_tokens: int
    finish_reason: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    stop_string: str | None = None  # the stop string that ended it, if one did


def _engine_request(
    prepared: GenerationRequest, params: SamplingParams, i: int, request_id: str | None, count: int
) -> GenerationRequest:
    """Choice ``i`` of ``count``'s engine request (see the module docstring on seeds), with Triton's
    id: `prepared` itself for a response's only choice whose seed it already has (Triton's id is
    then the HTTP request's, relay/client.py's own fallback), else one copy."""
    if params.temperature == 0:  # greedy: no seed of its own
        seed = prepared.seed
    elif params.seed is None:
        seed = secrets.randbits(63)
    else:
        seed = (params.seed + i) & _UINT64_MASK
    if count == 1 and seed == prepared.seed:
        return prepared
    return replace(prepared, seed=seed, request_id=request_id)


async def start_choices(
    runtime: Runtime,
    prepared: Sequence[GenerationRequest],
    params: SamplingParams,
    n: int,
    *,
    read_first: bool = True,
    http_request: Request | None = None,
) -> list[Choice]:
    """Waits for the request's turn in the service's queue (as many slots as engine requests, held
    until the engine is done with them), starts every engine request and waits for each first text;
    on any failure closes them all. `read_first` False: one streamed choice is returned as soon as its
    engine request is sent, `waiting` for its first text, which its response reads before it starts
    (`sse_frames.SSEFraming`). `http_request`: a client that leaves before the first texts (or the
    beams) ends them at once, a 499 (`client_gone`), rather than when they come."""
    # one beam of a beam-packed model reads as an ordinary (one-chunk) stream
    beams = any(request.beam_width for request in prepared) and not (n == 1 and runtime.flavor.beam_packed)
    count = len(prepared) if beams else len(prepared) * n
    await wait_turn(*params.queue_rank, count)  # the service's queue, where it has one
    if beams:
        return await _start_beams(runtime, prepared, n, http_request)
    streams: list[tuple[int, EngineStream]] = []
    try:
        for p, request in enumerate(prepared):
            for i in range(n):
                # Triton's ids: the request's X-Request-Id, "<id>-<index>" for several
                engine = _engine_request(request, params, i, engine_request_id(p * n + i, count), count)
                streams.append((p * n + i, await runtime.generate(engine)))
        release_when_done([stream for _, stream in streams])
        if not read_first and len(streams) == 1:
            return [Choice(streams[0][0], streams[0][1], "", waiting=True)]
        firsts = await _unless_gone(asyncio.gather(*(stream.read() for _, stream in streams)), http_request)
    except BaseException as exc:
        for _, stream in streams:
            stream.close()
        if isinstance(exc, APIError | asyncio.CancelledError):
            raise
        raise api_error(exc) from None
    return [Choice(index, stream, first) for (index, stream), first in zip(streams, firsts, strict=True)]


async def _unless_gone(work: Awaitable[_T], http_request: Request | None) -> _T:
    """`work`'s result; `client_gone` (work cancelled) as soon as the client leaves before it is done."""
    if http_request is None:
        return await work
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(until_disconnect(http_request.receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise client_gone()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _start_beams(
    runtime: Runtime, prepared: Sequence[GenerationRequest], n: int, http_request: Request | None
) -> list[Choice]:
    """Beam search: one engine request per prompt returns its `n` best beams, which become that
    prompt's choices (best first). Never streamed: the engine sends every beam at once."""
    streams: list[EngineStream] = []
    try:
        for p, request in enumerate(prepared):
            engine = replace(request, num_return=n, request_id=engine_request_id(p, len(prepared)))
            streams.append(await runtime.generate(engine))
        release_when_done(streams)
        found = await _unless_gone(asyncio.gather(*(stream.beams() for stream in streams)), http_request)
    except BaseException as exc:
        for stream in streams:
            stream.close()
        if isinstance(exc, APIError | asyncio.CancelledError):
            raise
        raise api_error(exc) from None
    choices = []
    for p, (stream, beams) in enumerate(zip(streams, found, strict=True)):
        for i, (text, tokens, reason) in enumerate(beams[:n]):
            choices.append(Choice(p * n + i, Beam(stream if i == 0 else None, tokens, reason), text))
    return choices


class Beam:
    """One finished beam, read like an EngineStream (its text is the choice's first and only text);
    the first beam of a request holds the engine stream, for its cached_tokens and close()."""

    __slots__ = ("cached_tokens", "completion_tokens", "finish_reason", "prompt_logprobs", "stream")

    def __init__(self, stream: EngineStream | None, tokens: int, reason: str) -> None:
        self.stream = stream
        self.completion_tokens = tokens
        self.finish_reason = reason
        self.cached_tokens = stream.cached_tokens if stream is not None else 0
        self.prompt_logprobs = None

    async def read(self) -> str:
        return ""

    def take_logprobs(self) -> list[TokenLogprob]:
        return []

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()


def cached_tokens(choices: Sequence[Choice], n: int) -> int:
    """usage.prompt_tokens_details.cached_tokens: per prompt, the most prompt tokens any of its
    choices' engine requests found in the KV cache (each prompt counts once, as in prompt_tokens)."""
    best: dict[int, int] = {}
    for choice in choices:
        prompt = choice.index // max(n, 1)
        best[prompt] = max(best.get(prompt, 0), int(getattr(choice.stream, "cached_tokens", 0) or 0))
    return sum(best.values())


def keep_best(choices: list[Choice], results: list[Result], n: int, sampled: int) -> list[Result]:
    """best_of without beam search: of each prompt's `sampled` candidates, the `n` with the highest
    cumulative log prob (the sum of their tokens' log probs; ties: the first sampled) become its
    choices, in that order and numbered `prompt * n + i`. `choices` is narrowed to them in place (the
    response builders read it); returns their results."""
    kept: list[tuple[Choice, Result]] = []
    for start in range(0, len(choices), sampled):
        group = list(zip(choices[start : start + sampled], results[start : start + sampled], strict=True))
        group.sort(key=lambda pair: -sum(e.logprob or 0.0 for e in pair[1].logprobs))
        for i, (choice, result) in enumerate(group[:n]):
            choice.index = start // sampled * n + i
            kept.append((choice, result))
    choices[:] = [choice for choice, _ in kept]
    return [result for _, result in kept]


def finish_label(results: Sequence[Result]) -> str:
    """The metric label of a response: "length" if any choice ran out of tokens, else "stop"."""
    return "length" if any(r.finish_reason == "length" for r in results) else "stop"


def api_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    logger.error("generation request failed", exc_info=exc)
    return APIError.internal()


async def _collect(choice: Choice) -> Result:
    """Reads one choice to its end."""
    stream = choice.stream
    parts = [choice.first]
    logprobs = stream.take_logprobs()
    while stream.finish_reason is None:
        parts.append(await stream.read())
        logprobs += stream.take_logprobs()
    return Result(
        "".join(parts),
        stream.completion_tokens,
        stream.finish_reason,
        logprobs,
        getattr(stream, "stop_string", None),
    )


async def collect_all(choices: list[Choice], http_request: Request | None) -> list[Result] | None:
    """Reads every choice to its end (None: the client went away). Closes every stream however it ends."""
    tasks = [asyncio.ensure_future(_collect(c)) for c in choices]
    try:
        return await _unless_gone(asyncio.gather(*tasks), http_request)  # the first failure raises
    except APIError as exc:
        if exc.status == CLIENT_GONE:
            return None
        raise
    except Exception as exc:
        raise api_error(exc) from None
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for choice in choices:
            choice.stream.close()
