"""The doctor's feature probes without Triton: every probe is a chat rendered with the model's chat
template, and a check that is not ok says whose fault it is (the engine's or the model's answer)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from trtllm_service import doctor
from trtllm_service.relay.flavors import EnsembleFlavor
from trtllm_service.relay.request import SamplingParams

pytestmark = pytest.mark.unit

ANSWER = ["The", " sea", " is", " wide", " and", " deep", "."]


@dataclass
class FakeStream:
    pieces: list[str]
    finish: str | None
    logprobs: int | None
    sent: list[str] = field(default_factory=list)
    finish_reason: str | None = None

    async def read(self) -> str:
        if self.pieces:
            piece = self.pieces.pop(0)
            self.sent.append(piece)
            if not self.pieces:
                self.finish_reason = self.finish
            return piece
        self.finish_reason = self.finish
        return ""

    def take_logprobs(self) -> list[Any]:
        if self.logprobs is None or not self.sent:
            return []
        return [SimpleNamespace(top_ids=list(range(self.logprobs)))]

    @property
    def completion_tokens(self) -> int:
        return len(self.sent)

    def close(self) -> None:
        pass


class FakeRuntime:
    """A chat model on an engine: `answers(request)` decides what comes back for each request."""

    flavor = EnsembleFlavor(no_guides="was packed without guided decoding")
    adapters: dict[str, Any] = {}  # noqa: RUF012

    def __init__(self, answers: Any) -> None:
        self.answers = answers
        self.chats: list[list[dict[str, str]]] = []

    async def prepare_chat(self, messages: list[dict[str, str]], params: SamplingParams, **_: Any) -> Any:
        self.chats.append(messages)
        return SimpleNamespace(chat=True, params=params)

    async def prepare_prompts(self, prompts: list[str], params: SamplingParams) -> list[Any]:
        return [SimpleNamespace(chat=False, params=params) for _ in prompts]

    async def generate(self, request: Any) -> FakeStream:
        pieces, finish = self.answers(request)
        for stop in request.params.stop:  # the engine ends before a stop string
            text = "".join(pieces)
            if stop in text:
                kept: list[str] = []
                while len("".join([*kept, pieces[len(kept)]])) <= text.index(stop):
                    kept.append(pieces[len(kept)])
                pieces, finish = [*kept, text[len("".join(kept)) : text.index(stop)]], "stop"
        return FakeStream(list(pieces), finish, request.params.logprobs)


def checks_of(runtime: FakeRuntime) -> dict[str, doctor.Check]:
    return {check.name: check for check in asyncio.run(doctor.FeatureProbe(runtime).run())}


def smollm2_like(request: Any) -> tuple[list[str], str]:
    """A chat model: a raw prompt's greedy first token is end-of-text; a chat gets an answer."""
    if not request.chat and not request.params.ignore_eos:
        return [], "stop"
    return ANSWER, "stop"


def test_probes_go_through_the_chat_template() -> None:
    runtime = FakeRuntime(smollm2_like)
    checks = checks_of(runtime)
    for name in ("stream", "stop", "seed", "logprobs"):
        assert checks[name].status == doctor.OK, checks[name]
    assert checks["logprobs"].detail.startswith("7 tokens with their log probs and top 2")
    assert runtime.chats and all(
        chat == [{"role": "user", "content": doctor.PROMPT}] for chat in runtime.chats
    )


def test_an_empty_answer_is_the_models_and_a_warning() -> None:
    def ends_at_once(request: Any) -> tuple[list[str], str]:
        return (ANSWER, "length") if request.params.ignore_eos else ([], "stop")

    checks = checks_of(FakeRuntime(ends_at_once))
    stream = checks["stream"]
    assert (stream.status, stream.fault) == (doctor.WARNING, doctor.MODEL), stream
    assert stream.detail.startswith("the model's answer: ") and "7 tokens with ignore_eos" in stream.detail
    # the probes of engine features ask again with ignore_eos: the engine does log probs and stops
    assert checks["logprobs"].status == doctor.OK and checks["stop"].status == doctor.OK


def test_an_engine_that_sends_nothing_is_the_engines_fault() -> None:
    checks = checks_of(FakeRuntime(lambda request: ([], "stop")))
    for name in ("stream", "logprobs"):
        assert (checks[name].status, checks[name].fault) == (doctor.FAILED, doctor.ENGINE), checks[name]
        assert checks[name].detail.startswith("the engine: ")
    assert "not even with ignore_eos" in checks["stream"].detail
    assert (checks["stop"].status, checks["stop"].fault) == (doctor.UNSUPPORTED, doctor.MODEL)


def test_an_error_is_the_engines_fault() -> None:
    def broken(request: Any) -> tuple[list[str], str]:
        raise ConnectionError("Triton went away")

    checks = checks_of(FakeRuntime(broken))
    assert checks["stream"] == doctor.Check(
        "stream", doctor.FAILED, "the engine: ConnectionError: Triton went away", doctor.ENGINE
    )
    assert checks["guided"].status == doctor.UNSUPPORTED and checks["guided"].fault is None
