"""The stand-in engines' tests (tensorrtllm_backend/standin/), without Triton.

The modules are imported by their bare names, as a Triton model imports the files copied beside its
model.py: pyproject.toml's pytest `pythonpath` puts tensorrtllm_backend/ (the production modules),
the llmapi model's version dir and standin/ on the path, once, for every test (the relay's and the
API's tests read the models' contracts through it too). Fixtures the stand-ins' tests share live here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop of the test's own, for the stand-in LLM API's coroutines."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()
