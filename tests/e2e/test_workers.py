"""Several HTTP workers share ONE supervised Triton: never one per worker, whoever dies.

The worker holding the ownership lock starts Triton; the others relay to it. Killing a follower
leaves Triton alone; killing the owner takes its Triton down with it (PR_SET_PDEATHSIG), and another
worker takes over. Either way exactly one Triton runs afterwards and the service serves again.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from tests.e2e.conftest import BentoService, _name
from tests.support import held_request, wait_for

BODY = {"prompt": "Hello", "max_tokens": 8, "temperature": 0}


def workers(service: BentoService) -> list[psutil.Process]:
    found = []
    for process in service.descendants():
        try:
            if "_bentoml_impl.worker.service" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            pass
    return found


def tritons(service: BentoService) -> list[int]:
    """Every live tritonserver of this service, wherever it is in the process tree."""
    run_dir = service.env["TRTLLM_RUN_DIR"]
    found = []
    for process in psutil.process_iter(["name", "cmdline", "status"]):
        try:
            live = _name(process) == "tritonserver" and process.status() != psutil.STATUS_ZOMBIE
            if live and any(run_dir in arg for arg in process.cmdline()):
                found.append(process.pid)
        except psutil.Error:
            pass
    return found


def state(service: BentoService) -> dict[str, object]:
    return json.loads((Path(service.env["TRTLLM_RUN_DIR"]) / "triton.json").read_text())


def generate_ok(service: BentoService) -> bool:
    try:
        return httpx.post(f"{service.url}/generate", json=BODY, timeout=30).status_code == 200
    except httpx.HTTPError:
        return False


def test_two_workers_share_one_triton_and_both_serve(make_service: Callable[..., BentoService]) -> None:
    service = make_service({"TRTLLM_WORKERS": "2"})
    assert len(workers(service)) == 2
    assert len(tritons(service)) == 1
    owner = state(service)["owner_pid"]
    assert owner in {w.pid for w in workers(service)}
    assert psutil.Process(tritons(service)[0]).ppid() == owner, "the owner worker is Triton's parent"
    for _ in range(8):  # fresh connections land on either worker; all are answered
        assert generate_ok(service)


def test_killing_a_follower_leaves_triton_alone(make_service: Callable[..., BentoService]) -> None:
    service = make_service({"TRTLLM_WORKERS": "2"})
    owner = state(service)["owner_pid"]
    (triton,) = tritons(service)
    follower = next(w for w in workers(service) if w.pid != owner)
    follower.send_signal(signal.SIGKILL)
    # The service keeps answering while the follower is replaced.
    deadline = time.monotonic() + 60
    answered = 0
    while time.monotonic() < deadline and answered < 5:
        answered += generate_ok(service)
    assert answered == 5
    assert wait_for(
        lambda: len(workers(service)) == 2 and follower.pid not in {w.pid for w in workers(service)}, 60
    ), "the killed worker was not replaced"
    assert tritons(service) == [triton], "Triton was restarted or duplicated"
    assert state(service)["owner_pid"] == owner and state(service)["restarts"] == 0


def test_killing_the_owner_leaves_exactly_one_triton(make_service: Callable[..., BentoService]) -> None:
    service = make_service({"TRTLLM_WORKERS": "2"})
    owner = int(state(service)["owner_pid"])  # type: ignore[call-overload]
    (old_triton,) = tritons(service)
    os.kill(owner, signal.SIGKILL)
    assert wait_for(
        lambda: (
            not psutil.pid_exists(old_triton) or psutil.Process(old_triton).status() == psutil.STATUS_ZOMBIE
        ),
        30,
    ), "the dead owner's Triton is still running"
    assert wait_for(lambda: state(service)["owner_pid"] != owner and state(service)["ready"] is True, 120), (
        state(service)
    )
    assert wait_for(lambda: generate_ok(service), 60)
    assert wait_for(lambda: len(workers(service)) == 2, 60), "the killed worker was not replaced"
    time.sleep(2)  # a second Triton, if any, would be starting by now
    assert len(tritons(service)) == 1, tritons(service)
    assert psutil.Process(tritons(service)[0]).ppid() == state(service)["owner_pid"]
    for _ in range(4):
        assert generate_ok(service)


def test_the_concurrency_limit_counts_across_workers(make_service: Callable[..., BentoService]) -> None:
    """TRTLLM_MAX_CONCURRENCY=1 with two workers: one stream in flight, and every other request,
    whichever worker takes it, gets the 429."""
    service = make_service({"TRTLLM_WORKERS": "2", "TRTLLM_MAX_CONCURRENCY": "1"})
    with held_request(service.url, "/generate"):
        assert wait_for(
            lambda: httpx.post(f"{service.url}/generate", json=BODY, timeout=30).status_code == 429, 10
        )
        statuses = []
        for _ in range(6):  # fresh connections: both workers take some
            statuses.append(httpx.post(f"{service.url}/generate", json=BODY, timeout=30).status_code)
        assert statuses == [429] * 6
    assert wait_for(lambda: generate_ok(service), 30), "the slot was not released"
