"""The service's admission (api/server/admission.py) over a real shared table, without servers:
order, bounds, a client that leaves, a cancelled wait, and two workers sharing one queue."""

from __future__ import annotations

import asyncio
from array import array
from pathlib import Path
from typing import Any

import pytest

from tensorrtllm_backend.detokenizer import IncrementalDetokenizer
from tests.support import engine_response
from trtllm_service.api.server.admission import (
    _TURN,
    CLIENT_GONE,
    Admission,
    QueueLimits,
    Turn,
    release_when_done,
    wait_turn,
)
from trtllm_service.api.server.waiting_queue import SharedQueue
from trtllm_service.errors import APIError
from trtllm_service.relay.client import EngineStream
from trtllm_service.relay.readers import TokenIdReader
from trtllm_service.relay.request import GenerationRequest


def admission(
    path: Path, pid: int = 101, slots: int = 1, max_waiting: int = 10, timeout_s: float = 30.0
) -> Admission:
    queue = SharedQueue(path / "queue", pid=pid, alive=lambda _: True)
    return Admission(queue, QueueLimits(slots, max_waiting, timeout_s), model_name="m", poll_s=0.005)


async def started_order(worker: Admission, requests: list[tuple[str, int, int]]) -> list[str]:
    """Starts `requests` (name, tier, priority) one after another while the single slot is busy,
    then frees the slot once per request; the order they started in."""
    await worker.wait(1, 0)  # the slot is taken
    order: list[str] = []

    async def one(name: str, tier: int, priority: int) -> None:
        await worker.wait(tier, priority)
        order.append(name)

    tasks = []
    for request in requests:
        tasks.append(asyncio.create_task(one(*request)))
        await asyncio.sleep(0.02)  # arrival order
    for count in range(1, len(requests) + 1):
        worker.release()  # one slot frees: the next request in rank order starts, and holds it
        while len(order) < count:
            await asyncio.sleep(0.005)
    await asyncio.gather(*tasks)
    return order


def test_priority_then_arrival(tmp_path: Path) -> None:
    worker = admission(tmp_path)
    order = asyncio.run(
        started_order(worker, [("low", 1, 5), ("a", 1, 0), ("b", 1, 0), ("urgent", 1, -3), ("tier", 0, 9)])
    )
    assert order == ["tier", "urgent", "a", "b", "low"]


def test_the_count_bound_refuses_with_429_and_retry_after(tmp_path: Path) -> None:
    async def run() -> APIError:
        worker = admission(tmp_path, max_waiting=1)
        await worker.wait(1, 0)
        waiting = asyncio.create_task(worker.wait(1, 0))
        await asyncio.sleep(0.02)
        with pytest.raises(APIError) as refused:
            await worker.wait(1, 0)
        worker.release()
        await waiting  # the admitted one is not lost
        assert worker.counts() == (1, 0)
        return refused.value

    error = asyncio.run(run())
    assert (error.status, error.code, error.headers()) == (429, "queue_full", {"Retry-After": "1"})


def test_the_time_bound_refuses_and_frees_the_place(tmp_path: Path) -> None:
    async def run() -> APIError:
        worker = admission(tmp_path, timeout_s=0.05)
        await worker.wait(1, 0)
        with pytest.raises(APIError) as refused:
            await worker.wait(1, 0)
        assert worker.counts() == (1, 0)
        return refused.value

    error = asyncio.run(run())
    assert (error.status, error.code) == (429, "queue_timeout")


def test_a_client_that_leaves_while_waiting_frees_its_place_at_once(tmp_path: Path) -> None:
    async def run() -> APIError:
        worker = admission(tmp_path)
        await worker.wait(1, 0)
        left = asyncio.Event()
        waiting = asyncio.create_task(worker.wait(1, 0, left.wait))
        await asyncio.sleep(0.02)
        assert worker.counts() == (1, 1)
        left.set()
        with pytest.raises(APIError) as gone:
            await waiting
        assert worker.counts() == (1, 0)
        worker.release()
        assert worker.counts() == (0, 0)
        return gone.value

    assert asyncio.run(run()).status == CLIENT_GONE


def test_a_cancelled_wait_leaves_the_queue(tmp_path: Path) -> None:
    async def run() -> None:
        worker = admission(tmp_path)
        await worker.wait(1, 0)
        waiting = asyncio.create_task(worker.wait(1, 0))
        await asyncio.sleep(0.02)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert worker.counts() == (1, 0)

    asyncio.run(run())


def test_two_workers_share_one_queue_in_rank_order(tmp_path: Path) -> None:
    async def run() -> list[str]:
        one, two = admission(tmp_path, pid=101), admission(tmp_path, pid=202)
        await one.wait(1, 0)
        order: list[str] = []

        async def request(worker: Admission, name: str, priority: int) -> None:
            await worker.wait(1, priority)
            order.append(name)
            await asyncio.sleep(0.02)
            worker.release()

        tasks = []
        for worker, name, priority in ((two, "two-late", 1), (one, "one-first", 0), (two, "two-first", 0)):
            tasks.append(asyncio.create_task(request(worker, name, priority)))
            await asyncio.sleep(0.02)
        one.release()  # the other worker's requests start when it next looks
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert one.counts() == (0, 0)
        return order

    assert asyncio.run(run()) == ["one-first", "two-first", "two-late"]


def _engine_stream(tokenizer: Any) -> EngineStream:
    request = GenerationRequest(prompt_ids=array("i", [1]), max_tokens=10)
    return EngineStream(
        request, TokenIdReader(request, IncrementalDetokenizer(tokenizer)), "id", lambda _: None
    )


def test_slots_are_freed_when_the_engine_is_done_not_when_the_answer_is_read(
    tmp_path: Path, tokenizer: Any
) -> None:
    """A request of n=2 holds two slots until both engine requests have ended (their last response,
    or a cancel), while its client may still be reading: then the next waiting request starts."""

    async def scenario() -> None:
        worker = admission(tmp_path, slots=2)

        async def receive() -> dict[str, str]:
            await asyncio.sleep(3600)  # the client stays
            return {"type": "http.disconnect"}

        turn = Turn(worker, receive)
        _TURN.set(turn)
        await wait_turn(1, 0, 2)
        assert worker.counts() == (2, 0)
        first, second = _engine_stream(tokenizer), _engine_stream(tokenizer)
        release_when_done([first, second])
        later = asyncio.create_task(worker.wait(1, 0))
        await asyncio.sleep(0.05)
        assert worker.counts() == (2, 1)  # both slots held: the later request waits
        first.on_message(engine_response([5], final=True))
        await asyncio.sleep(0.05)
        assert worker.counts() == (2, 1)  # one engine request is still running
        second.close()  # the other one cancelled (a stop string, or the client left)
        assert await asyncio.wait_for(later, 5) == 1
        assert worker.counts() == (1, 0)
        turn.release()  # the HTTP request ends later: nothing more to free
        assert worker.counts() == (1, 0)

    asyncio.run(scenario())
