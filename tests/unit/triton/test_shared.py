"""`serving_elsewhere`: whether a starting worker is a replacement whose siblings serve (it then
takes no connection until it can serve too; tests/e2e/test_workers.py runs the real case); a
follower sees the owner's readiness as soon as it is published."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trtllm_service.triton.shared import STATE_FILE, SharedTriton, serving_elsewhere


def _write(run_dir: Path, **state: object) -> None:
    """The owner's state, published as the owner does (a new file put in place)."""
    temporary = run_dir / "state.tmp"
    temporary.write_text(json.dumps({"owner_pid": os.getppid(), "ready": True, **state}))
    os.replace(temporary, run_dir / STATE_FILE)


def test_a_ready_triton_of_a_live_sibling(tmp_path: Path) -> None:
    _write(tmp_path)
    assert serving_elsewhere(tmp_path)


def test_not_when_starting_stopping_or_own(tmp_path: Path) -> None:
    assert not serving_elsewhere(tmp_path)  # no state: the first start
    _write(tmp_path, ready=False)
    assert not serving_elsewhere(tmp_path)
    _write(tmp_path, stopping=True)
    assert not serving_elsewhere(tmp_path)
    _write(tmp_path, owner_pid=os.getpid())
    assert not serving_elsewhere(tmp_path)
    (tmp_path / STATE_FILE).write_text("{not json")
    assert not serving_elsewhere(tmp_path)


def test_not_when_the_owner_is_dead(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    _write(tmp_path, owner_pid=int(gone.stdout))
    assert not serving_elsewhere(tmp_path)


def test_a_follower_sees_the_owner_ready_at_once(tmp_path: Path) -> None:
    """Not at its next poll: a request then would get a 503 while the owner already serves."""
    seen: list[bool] = []
    follower = SharedTriton(tmp_path, make_supervisor=lambda: None, on_change=seen.append)  # type: ignore[arg-type,return-value]  # a follower never makes one
    assert follower.grpc_address() is None  # nothing published yet
    _write(tmp_path, ready=False, host="127.0.0.1", grpc_port=1234, http_port=1235, metrics_port=1236)
    assert follower.grpc_address() is None
    _write(tmp_path, host="127.0.0.1", grpc_port=1234, http_port=1235, metrics_port=1236, generation=1)
    assert follower.grpc_address() == ("127.0.0.1", 1234)
    assert seen == [True]  # the runtime heard it too (it reconnects and learns the engine)
