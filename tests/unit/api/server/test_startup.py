"""api/server/startup.py: the hook returns at once; until the runtime is loaded and Triton ready, requests
get a 503 with Retry-After; a start that fails is logged and answered without one, for good."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from trtllm_service.api.server.startup import Startup
from trtllm_service.errors import APIError
from trtllm_service.triton.process import TritonStartupError


class FakeRuntime:
    """Loads when `loading` is set (at once by default), or fails with `load_error`; starts when
    `go` is set, or fails with `error`. `events` says in which order that happened."""

    def __init__(self, error: Exception | None = None, load_error: Exception | None = None) -> None:
        self.error, self.load_error = error, load_error
        self.go = asyncio.Event()
        self.loading = threading.Event()
        self.loading.set()
        self.ready = False
        self.stopped = 0
        self.events: list[str] = []

    def load(self) -> None:
        self.loading.wait(5)  # the tokenizer, read in a thread: the event loop answers meanwhile
        if self.load_error is not None:
            raise self.load_error
        self.events.append("load ended")

    def loaded_now(self) -> None:
        self.events.append("loaded_now")

    async def start(self) -> None:
        self.events.append("start began")
        try:
            await self.go.wait()
        except asyncio.CancelledError:
            self.events.append("start cancelled")
            raise
        if self.error is not None:
            raise self.error
        self.ready = True

    async def stop(self) -> None:
        self.stopped += 1


def test_serves_503s_until_ready_then_the_runtime() -> None:
    async def scenario() -> None:
        runtime = FakeRuntime()
        runtime.loading.clear()
        startup: Startup[FakeRuntime] = Startup(lambda: runtime)
        events: list[str] = []
        startup.begin(on_loaded=lambda r: events.append("loaded"), on_ready=lambda r: events.append("ready"))
        for _ in range(3):
            await asyncio.sleep(0.01)
        with pytest.raises(APIError) as starting:
            startup.serving()
        assert starting.value.status == 503 and starting.value.headers() == {"Retry-After": "1"}
        assert not startup.ready and not startup.failed and events == []

        assert runtime.events == ["start began"], "Triton starts while the tokenizer is read"
        runtime.loading.set()
        while startup.runtime is None:
            await asyncio.sleep(0.01)
        assert events == ["loaded"] and not startup.ready
        assert runtime.events == ["start began", "load ended", "loaded_now"]
        assert (
            startup.serving() is runtime
        )  # requests reach the runtime, whose relay 503s until Triton is ready

        runtime.go.set()
        await startup.wait()
        assert events == ["loaded", "ready"] and startup.ready and not startup.failed
        await startup.stop()
        assert runtime.stopped == 1

    asyncio.run(scenario())


def test_a_failed_start_is_logged_and_answered_for_good(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> Startup[FakeRuntime]:
        runtime = FakeRuntime(
            TritonStartupError("tritonserver exited with code 1 during start-up. Triton errors: ...")
        )
        startup: Startup[FakeRuntime] = Startup(lambda: runtime)
        startup.begin(on_loaded=lambda r: None, on_ready=lambda r: pytest.fail("not ready"))
        runtime.go.set()
        await startup.wait()
        return startup

    with caplog.at_level(logging.ERROR, logger="trtllm_service"):
        startup = asyncio.run(scenario())
    assert startup.failed and not startup.ready
    with pytest.raises(APIError) as failed:
        startup.serving()
    assert failed.value.status == 503 and failed.value.headers() == {}, "no Retry-After: retrying cannot help"
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "TritonStartupError: tritonserver exited with code 1" in record.getMessage()
    assert record.exc_info is None, "the message says it all: no traceback"


def test_a_failed_load_is_a_failed_start_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    runtime = FakeRuntime(load_error=OSError("tokenizer.json: no such file"))

    async def scenario() -> Startup[FakeRuntime]:
        startup: Startup[FakeRuntime] = Startup(lambda: runtime)
        startup.begin(
            on_loaded=lambda r: pytest.fail("not loaded"), on_ready=lambda r: pytest.fail("not ready")
        )
        await startup.wait()
        await startup.stop()
        return startup

    with caplog.at_level(logging.ERROR, logger="trtllm_service"):
        startup = asyncio.run(scenario())
    assert startup.failed and startup.runtime is None
    assert runtime.events == ["start began", "start cancelled"], "the Triton being started is stopped"
    assert runtime.stopped == 1
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "OSError: tokenizer.json" in record.getMessage() and record.exc_info is not None


def test_a_runtime_that_cannot_be_made_is_a_failed_start() -> None:
    def make() -> FakeRuntime:
        raise OSError("pack.json: no such file")

    async def scenario() -> Startup[FakeRuntime]:
        startup: Startup[FakeRuntime] = Startup(make)
        startup.begin(
            on_loaded=lambda r: pytest.fail("not loaded"), on_ready=lambda r: pytest.fail("not ready")
        )
        await startup.wait()
        await startup.stop()  # nothing to stop
        return startup

    startup = asyncio.run(scenario())
    assert startup.failed and isinstance(startup.error, OSError) and startup.runtime is None


def test_stopping_while_starting_ends_the_start() -> None:
    async def scenario() -> FakeRuntime:
        runtime = FakeRuntime()
        startup: Startup[FakeRuntime] = Startup(lambda: runtime)
        startup.begin(on_loaded=lambda r: None, on_ready=lambda r: pytest.fail("not ready"))
        while startup.runtime is None:
            await asyncio.sleep(0.01)
        await asyncio.wait_for(startup.stop(), 5)  # Triton never gets ready: the stop does not wait for it
        assert startup.done and not startup.failed
        return runtime

    runtime = asyncio.run(scenario())
    assert runtime.stopped == 1 and runtime.events[-1] == "start cancelled"


def test_stopping_while_loading_stops_the_triton_being_started() -> None:
    async def scenario() -> FakeRuntime:
        runtime = FakeRuntime()
        runtime.loading.clear()
        startup: Startup[FakeRuntime] = Startup(lambda: runtime)
        startup.begin(
            on_loaded=lambda r: pytest.fail("not loaded"), on_ready=lambda r: pytest.fail("not ready")
        )
        while runtime.events != ["start began"]:
            await asyncio.sleep(0.01)
        await asyncio.wait_for(startup.stop(), 5)
        runtime.loading.set()  # the thread reading the tokenizer ends on its own
        return runtime

    runtime = asyncio.run(scenario())
    assert runtime.stopped == 1 and runtime.events[:2] == ["start began", "start cancelled"]


class StuckRuntime(FakeRuntime):
    """A runtime whose stop never ends (a fake: the real stop cannot be made to hang on purpose;
    a full suite once left a worker and its Triton running after one did, cause unknown)."""

    def __init__(self) -> None:
        super().__init__()
        self.killed = 0
        self.never = asyncio.Event()

    async def stop(self) -> None:
        await self.wait_forever()

    async def wait_forever(self) -> None:
        await self.never.wait()

    def kill_now(self) -> None:
        self.killed += 1


def test_a_stuck_stop_is_bounded_logged_where_it_waits_and_kills_triton(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = StuckRuntime()
    with caplog.at_level(logging.ERROR, logger="trtllm_service"):
        took = asyncio.run(_start_then_stop(runtime, bound_s=0.3))
    assert took < 2 and runtime.killed == 1
    (record,) = [r for r in caplog.records if "stopping took over" in r.getMessage()]
    message = record.getMessage()
    assert "trtllm-stop: _stop" in message and "wait_forever (" in message and "test_startup.py" in message


def test_a_stop_within_the_bound_kills_nothing() -> None:
    runtime = FakeRuntime()
    asyncio.run(_start_then_stop(runtime, bound_s=5))
    assert runtime.stopped == 1 and not hasattr(runtime, "killed")


async def _start_then_stop(runtime: FakeRuntime, bound_s: float) -> float:
    """Starts `runtime` through Startup, stops it within `bound_s`; returns how long the stop took."""
    runtime.go.set()
    startup: Startup[FakeRuntime] = Startup(lambda: runtime)
    startup.begin(on_loaded=lambda r: None, on_ready=lambda r: None)
    await startup.wait()
    started = time.monotonic()
    await startup.stop(bound_s=bound_s)
    return time.monotonic() - started
