"""The service's admission (api/server/admission.py) over a real shared table, without servers:
order, bounds, a client that leaves, a cancelled wait, and two workers sharing one queue."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from trtllm_service.api.server.admission import CLIENT_GONE, Admission, QueueLimits
from trtllm_service.api.server.waiting_queue import SharedQueue
from trtllm_service.errors import APIError


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
