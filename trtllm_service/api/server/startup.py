"""The service's start-up, in the background: the port answers from the moment the worker serves it.

BentoML runs a service's start-up hooks before its worker serves a single request, and a connection
made meanwhile is accepted by the kernel and left without an answer. Loading the tokenizer (seconds:
transformers imports torch) and starting Triton (a minute for a large engine) happen here instead,
in a task the hook starts and does not wait for. Until they are done `/livez` answers 200, `/readyz`
503, and the generation routes 503 with `Retry-After`; a start that fails is logged with its cause
and makes `/livez` 503 (the orchestrator replaces the service; `bentoml serve` keeps answering why).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from trtllm_service.api.server.early import STARTING_RETRY_S
from trtllm_service.errors import STARTING, APIError
from trtllm_service.triton.process import EXIT_TIMEOUT_S, TritonStartupError

logger = logging.getLogger("trtllm_service")

STOP_BOUND_S = EXIT_TIMEOUT_S + 25.0
"""The most the service's stop may take: Triton's own stop (its exit timeout, then SIGKILL to its
group, then the log pump) fits well inside. Past it the stop is stuck somewhere: the worker logs
where every task waits, kills Triton's process tree and lets the worker end."""


class Startable(Protocol):
    """What the start-up needs of the runtime (`runtime.Runtime`)."""

    @property
    def ready(self) -> bool: ...

    def load(self) -> None: ...

    def loaded_now(self) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def kill_now(self) -> None: ...


R = TypeVar("R", bound=Startable)


class Startup(Generic[R]):
    """Starts the runtime (Triton, as owner or follower) in a task and, meanwhile, loads it (the
    tokenizer, in a thread): a start takes the longer of the two, not their sum.

    Args:
        make: Builds the runtime (the pack's facts: milliseconds); its `load` does the rest.
    """

    def __init__(self, make: Callable[[], R]) -> None:
        self._make = make
        self._made: R | None = None  # from its making on, for stop and kill_now
        self.runtime: R | None = None  # once loaded: requests may use it
        self.error: BaseException | None = None  # why the start failed; None while it has not
        self.served = False  # ready once: restarts later are not the start
        self._task: asyncio.Task[None] | None = None

    def begin(self, on_loaded: Callable[[R], None], on_ready: Callable[[R], None]) -> None:
        """Starts in the background and returns at once; `on_loaded` runs once the runtime exists
        (before Triton is ready), `on_ready` once Triton is."""
        self._task = asyncio.get_running_loop().create_task(
            self._run(on_loaded, on_ready), name="trtllm-startup"
        )

    async def _run(self, on_loaded: Callable[[R], None], on_ready: Callable[[R], None]) -> None:
        started = time.monotonic()
        starting: asyncio.Task[None] | None = None
        try:
            runtime = self._made = await asyncio.to_thread(self._make)
            # a failed or cancelled start leaves no process behind (Runtime.start)
            starting = asyncio.get_running_loop().create_task(runtime.start(), name="trtllm-triton-start")
            await asyncio.to_thread(runtime.load)
            runtime.loaded_now()
            self.runtime = runtime
            on_loaded(runtime)
            logger.debug("runtime loaded in %.1f s", time.monotonic() - started)
            await starting
            self.served = True
            on_ready(runtime)
        except BaseException as exc:
            if starting is not None and not starting.done():  # the load failed, or a stop came
                starting.cancel()
                with contextlib.suppress(BaseException):
                    await starting
            if not isinstance(exc, Exception):
                raise
            self.error = exc
            # A TritonStartupError's message says it all (Triton's errors, its log's tail); anything
            # else comes with its traceback.
            logger.error(
                "the service could not start (/livez answers 503): %s: %s",
                type(exc).__name__,
                exc,
                exc_info=None if isinstance(exc, TritonStartupError) else exc,
            )

    @property
    def done(self) -> bool:
        return self._task is not None and self._task.done()

    @property
    def starting(self) -> bool:
        """Not ready yet for the first time, and not failed: clients poll meanwhile."""
        return not self.served and self.error is None

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def ready(self) -> bool:
        return self.error is None and self.runtime is not None and self.runtime.ready

    def serving(self) -> R:
        """The runtime, for a request; a 503 before it exists or when the start failed."""
        runtime = self.runtime
        if self.error is not None:
            raise APIError.unavailable(
                "The service could not start; its log says why. It serves no requests until it is restarted."
            )
        if runtime is None:
            raise APIError.unavailable(STARTING, retry_after=STARTING_RETRY_S)
        return runtime

    async def wait(self) -> None:
        """Until the start has ended, ready or failed (tests, and a worker replaced while its siblings
        serve)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def stop(self, bound_s: float = STOP_BOUND_S) -> None:
        """Ends a start still under way, then stops the runtime (Triton, when this worker owns it),
        within `bound_s`: a stop stuck past it must not leave this worker and its Triton running
        after `bentoml serve` has gone."""
        stopping = asyncio.get_running_loop().create_task(self._stop(), name="trtllm-stop")
        done, _ = await asyncio.wait({stopping}, timeout=bound_s)
        if done:
            stopping.result()
            return
        logger.error(
            "stopping took over %g s; killing Triton's process tree. Where each task waited:\n%s",
            bound_s,
            task_stacks(),
        )
        if self._made is not None:
            self._made.kill_now()
        stopping.cancel()  # not awaited: what is stuck may not end on cancellation either

    async def _stop(self) -> None:
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._made is not None:
            await self._made.stop()


def task_stacks() -> str:
    """Every task of the running loop and where it waits, down its chain of awaits (a stuck stop's
    diagnosis: Task.get_stack shows only a suspended coroutine's outermost frame)."""
    lines = []
    for task in asyncio.all_tasks():
        chain = []
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is None:  # a future, or a coroutine not written in Python
                chain.append(repr(awaited)[:120])
                break
            chain.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        lines.append(f"  {task.get_name()}: " + " -> ".join(chain))
    return "\n".join(sorted(lines))
