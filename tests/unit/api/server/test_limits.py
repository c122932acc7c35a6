"""The concurrency limit, on a real Starlette app through httpx's ASGI transport."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from trtllm_service.api.server.limits import ConcurrencyLimitMiddleware


def _app(release: asyncio.Event) -> Starlette:
    async def slow(_request: object) -> PlainTextResponse:
        await release.wait()
        return PlainTextResponse("done")

    async def ready(_request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/generate", slow, methods=["POST"]), Route("/readyz", ready)])


def test_excess_requests_get_openai_429_and_slots_are_released() -> None:
    async def scenario() -> None:
        release = asyncio.Event()
        limited = ConcurrencyLimitMiddleware(_app(release), limit=1)
        transport = httpx.ASGITransport(app=limited)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            first = asyncio.create_task(client.post("/generate"))
            while limited.in_flight == 0:
                await asyncio.sleep(0.01)
            refused = await client.post("/generate")
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "1"
            error = refused.json()["error"]
            assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
            assert (await client.get("/readyz")).status_code == 200  # probes are never limited
            release.set()
            assert (await first).text == "done"
            assert limited.in_flight == 0
            assert (await client.post("/generate")).status_code == 200

    asyncio.run(scenario())


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ConcurrencyLimitMiddleware(_app(asyncio.Event()), limit=0)


def _hold(path: str, ready: object, release: object, got: object) -> None:
    """In another process: take one slot, report, hold it until told to go."""
    from pathlib import Path

    from trtllm_service.api.server.limits import SharedSlots

    got.value = SharedSlots(Path(path)).try_acquire(2)  # type: ignore[attr-defined]  # multiprocessing's Value, passed as object
    ready.set()  # type: ignore[attr-defined]  # multiprocessing's Event, passed as object
    release.wait(30)  # type: ignore[attr-defined]  # multiprocessing's Event, passed as object


def test_the_limit_holds_across_processes_and_dead_ones_do_not_count(tmp_path: Path) -> None:
    """Two processes each hold a request; a third is refused; a process that dies frees its slot."""
    from multiprocessing import get_context

    from trtllm_service.api.server.limits import SharedSlots

    spawn = get_context("spawn")
    path = tmp_path / "run" / "in_flight.slots"
    holders = []
    for _ in range(2):
        ready, release, got = spawn.Event(), spawn.Event(), spawn.Value("b", 0)
        process = spawn.Process(target=_hold, args=(str(path), ready, release, got))
        process.start()
        assert ready.wait(30)
        assert got.value == 1
        holders.append((process, release))
    here = SharedSlots(path)
    assert not here.try_acquire(2), "two requests in flight elsewhere: the limit of 2 is reached"
    dead, _ = holders[0]
    dead.kill()
    dead.join(10)
    assert here.try_acquire(2), "the killed process's request no longer counts"
    assert not here.try_acquire(2)
    here.release()
    for process, release in holders[1:]:
        release.set()
        process.join(10)
    assert here.try_acquire(2) and here.try_acquire(2)


def test_the_short_way_to_a_slot_answers_as_the_whole_way_does(tmp_path: Path) -> None:
    """2,000 random acquisitions and releases over three stand-in processes, one of which dies
    half-way holding its requests and is replaced by a fourth, on two tables: one whose
    `try_acquire` takes its short way where it can, one that always takes the whole way. Every
    answer and total agrees."""
    import random

    from trtllm_service.api.server.limits import SharedSlots

    class WholeWay(SharedSlots):
        def try_acquire(self, limit: int) -> bool:
            with self.locked() as table:
                return self._try_acquire(table, self._me, limit)

    dead: set[int] = set()
    rng = random.Random(46)
    sides = [
        [
            kind(tmp_path / name / "slots", pid=pid, alive=lambda other: other not in dead)
            for pid in (11, 22, 33, 44)
        ]
        for name, kind in (("short", SharedSlots), ("whole", WholeWay))
    ]
    held, live, short_ways = [0, 0, 0, 0], [0, 1, 2], 0
    for step in range(2000):
        if step == 1000:  # 33 dies with its requests in flight; 44 starts
            dead.add(33)
            live = [0, 1, 3]
        who = rng.choice(live)
        if rng.random() < 0.55:
            short = sides[0][who]._mine is not None
            answers = [side[who].try_acquire(5) for side in sides]
            assert answers[0] == answers[1], step
            held[who] += answers[0]
            short_ways += short and answers[0]
        elif held[who]:
            held[who] -= 1
            for side in sides:
                side[who].release()
        assert sides[0][0].total() == sides[1][0].total() == sum(held[i] for i in live)
    assert short_ways > 300
