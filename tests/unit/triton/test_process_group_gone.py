"""A stop returns once Triton's whole process group is gone (triton/process.py `_group_gone`): real
processes, a group of a parent and a child."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from trtllm_service.triton.process import _group_gone


def _group() -> subprocess.Popen[bytes]:
    """A process group: a shell and a child of it that outlives nothing on its own."""
    child = f"{sys.executable} -c 'import time; time.sleep(60)'"
    return subprocess.Popen(["bash", "-c", f"{child} & wait"], start_new_session=True)


def test_a_live_group_is_waited_for_until_the_timeout_and_a_killed_one_is_gone() -> None:
    group = _group()
    try:
        time.sleep(0.2)
        started = time.monotonic()
        assert asyncio.run(_group_gone(group.pid, 0.3)) is False  # alive: waited for, not gone
        assert time.monotonic() - started >= 0.3
        os.killpg(group.pid, signal.SIGKILL)
        group.wait()  # the shell reaped here; its child by whoever inherits it
        assert asyncio.run(_group_gone(group.pid, 5)) is True
        with pytest.raises(ProcessLookupError):
            os.killpg(group.pid, 0)  # no process of the group is left
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group.pid, signal.SIGKILL)
        group.wait()
