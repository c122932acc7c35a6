"""`serving_elsewhere`: whether a starting worker is a replacement whose siblings serve (it then
takes no connection until it can serve too; tests/e2e/test_workers.py runs the real case)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trtllm_service.triton.shared import STATE_FILE, serving_elsewhere


def _write(run_dir: Path, **state: object) -> None:
    (run_dir / STATE_FILE).write_text(json.dumps({"owner_pid": os.getppid(), "ready": True, **state}))


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
