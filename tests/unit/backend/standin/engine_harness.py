"""The stand-in engine loop without Triton, for the stand-ins' tests: a request as the contract
settles it, a recording stand-in for Triton's response side, and `run` (a fresh loop, every request
at once, each one's final response)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import numpy as np
from contract import EngineRequest
from engine import EngineLoop

OUTPUTS = frozenset({"output_ids", "output_log_probs", "num_output_tokens"})


def request(input_ids: list[int], max_new: int, **sampling: Any) -> EngineRequest:
    fields: dict[str, Any] = {
        "greedy": True,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "min_tokens": 0,
        "seed": None,
        "bad_words": [],
        "embedding_bias": None,
        "return_log_probs": False,
        **sampling,
    }
    return EngineRequest(
        request_id=uuid.uuid4().hex,
        input_ids=input_ids,
        max_new=max_new,
        end_id=-1,
        streaming=False,
        exclude_input=True,
        stop_words=[],
        return_context_logits=False,
        return_generation_logits=False,
        outputs=OUTPUTS,
        **fields,
    )


class Recorder:
    """Triton's side of the loop (responses, metrics, log), kept in memory."""

    def response(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return arrays

    def error(self, message: str) -> dict[str, str]:
        return {"error": message}

    def log(self, message: str) -> None:
        pass

    def finished(self, outcome: str) -> None:
        pass

    def tokens(self, count: int) -> None:
        pass


class Sink:
    """One request's responses; `cancelled` is what Triton would report for the client."""

    def __init__(self, cancelled: bool = False) -> None:
        self.cancelled = cancelled
        self.final: Any = None
        self.done = threading.Event()

    def send(self, response: Any, final: bool) -> None:
        if final:
            self.final = response
            self.done.set()

    def is_cancelled(self) -> bool:
        return self.cancelled


def run(source: Any, requests: list[EngineRequest], sinks: list[Sink] | None = None) -> list[Any]:
    """Submits all `requests` at once to a fresh engine loop; the final response of each."""
    sinks = sinks or [Sink() for _ in requests]
    loop = EngineLoop(source, Recorder(), Recorder(), cancel_check_s=0.0)
    try:
        for req, sink in zip(requests, sinks, strict=True):
            loop.submit(req, sink)
        for sink in sinks:
            assert sink.done.wait(120), "a request never finished"
    finally:
        loop.shutdown()
    return [sink.final for sink in sinks]


def ids_and_log_probs(final: dict[str, np.ndarray]) -> tuple[list[int], list[float]]:
    assert "error" not in final, final
    return final["output_ids"].reshape(-1).tolist(), final["output_log_probs"].reshape(-1).tolist()
