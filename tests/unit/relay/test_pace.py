"""First tokens first (relay/pace.py): while a request of the worker is starting, a stream past its
first text writes at most once per the pace's interval; with none starting, every token as it comes.
Engine responses are fed to the streams as Triton's bytes (tests.support.engine_response), on a
real event loop; the server side (ServerSendApp counting POSTs in) is the real ASGI app."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from array import array
from typing import Any

import pytest

from tensorrtllm_backend.detokenizer import IncrementalDetokenizer
from tests.support import engine_response, timed_reads
from trtllm_service.api.server.streaming import ServerSendApp
from trtllm_service.errors import APIError
from trtllm_service.relay.client import EngineStream
from trtllm_service.relay.pace import STARTING, Pace, Ticket
from trtllm_service.relay.readers import TokenIdReader
from trtllm_service.relay.request import GenerationRequest
from trtllm_service.settings import Settings, SettingsError


def _stream(tokenizer: Any, pace: Pace, ticket: Ticket | None = None) -> EngineStream:
    request = GenerationRequest(prompt_ids=array("i", [1]), max_tokens=100)
    reader = TokenIdReader(request, IncrementalDetokenizer(tokenizer))
    return EngineStream(request, reader, "id", lambda _: None, pace=pace, ticket=ticket)


def _reads(tokenizer: Any, pace: Pace, ids: list[int], gap_s: float) -> list[tuple[float, str]]:
    """Feeds one id per `gap_s`, then the final response; returns (time, text) of each read with text."""
    return [(at, text) for at, text in timed_reads(_stream(tokenizer, pace), ids, gap_s) if text]


def _words(tokenizer: Any) -> list[int]:
    return list(tokenizer.encode(" one two three four five six seven eight", add_special_tokens=False))


def test_with_no_request_starting_each_token_is_read_as_it_arrives(tokenizer: Any) -> None:
    ids = _words(tokenizer)
    reads = _reads(tokenizer, Pace(0.05), ids, 0.005)
    assert len(reads) == len(ids)


def test_while_a_request_is_starting_later_text_waits_for_the_interval(tokenizer: Any) -> None:
    ids = _words(tokenizer)
    pace = Pace(0.05)
    pace.enter()  # another request of the worker, still waiting for its first token
    reads = _reads(tokenizer, pace, ids, 0.005)
    assert reads[0][0] < 0.03, "a stream's own first text is never held"
    assert "".join(text for _, text in reads) == tokenizer.decode(ids)
    assert len(reads) < len(ids) / 2, reads
    gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(reads)]
    assert all(gap >= 0.045 for gap in gaps), gaps


def test_an_interval_of_zero_holds_nothing(tokenizer: Any) -> None:
    ids = _words(tokenizer)
    pace = Pace(0.0)
    pace.enter()
    assert len(_reads(tokenizer, pace, ids, 0.005)) == len(ids)


def test_a_request_stops_starting_at_its_first_response(tokenizer: Any) -> None:
    pace = Pace()
    ticket = pace.enter()
    stream = _stream(tokenizer, pace, ticket)
    assert pace.starting == 1
    stream.on_message(engine_response([5]))
    assert pace.starting == 0
    stream.on_message(engine_response([6]))
    ticket.done()  # the server's own `done` at the request's end changes nothing more
    assert pace.starting == 0


@pytest.mark.parametrize("ending", ["close", "error", "timeout"])
def test_a_request_that_ends_before_any_response_stops_starting(tokenizer: Any, ending: str) -> None:
    pace = Pace()
    stream = _stream(tokenizer, pace, pace.enter())
    if ending == "close":
        stream.close()
    elif ending == "error":
        stream.end(APIError.unavailable("gone"))
    else:
        stream.timed_out()
    assert pace.starting == 0


def _serve(pace: Pace, method: str, fails: bool = False) -> tuple[list[int], list[Ticket | None]]:
    """Runs a request through ServerSendApp; returns `pace.starting` and the request's ticket as
    the app saw them."""
    starting: list[int] = []
    tickets: list[Ticket | None] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        starting.append(pace.starting)
        tickets.append(STARTING.get())
        if fails:
            raise RuntimeError("the app failed")

    async def send(message: dict[str, Any]) -> None:
        pass

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": method, "path": "/v1/chat/completions"}
    with pytest.raises(RuntimeError) if fails else contextlib.nullcontext():
        asyncio.run(ServerSendApp(app, pace)(scope, receive, send))
    return starting, tickets


def test_the_server_counts_a_post_as_starting_until_it_ends() -> None:
    pace = Pace()
    starting, tickets = _serve(pace, "POST")
    assert starting == [1]
    assert tickets[0] is not None
    assert pace.starting == 0


def test_a_request_that_is_not_a_post_is_not_counted() -> None:
    pace = Pace()
    starting, tickets = _serve(pace, "GET")
    assert starting == [0]
    assert tickets == [None]


def test_a_failing_request_stops_starting() -> None:
    pace = Pace()
    starting, _ = _serve(pace, "POST", fails=True)
    assert starting == [1]
    assert pace.starting == 0


def test_the_setting_is_read_and_bounded() -> None:
    assert Settings.from_env({}).loaded_stream_interval_ms == 10
    assert Settings.from_env({"TRTLLM_LOADED_STREAM_INTERVAL_MS": "0"}).loaded_stream_interval_ms == 0
    with pytest.raises(SettingsError, match="TRTLLM_LOADED_STREAM_INTERVAL_MS"):
        Settings.from_env({"TRTLLM_LOADED_STREAM_INTERVAL_MS": "-1"})
