"""Several HTTP workers share ONE supervised Triton: never one per worker, whoever dies.

The worker holding the ownership lock starts Triton; the others relay to it. Killing a follower
leaves Triton alone; killing the owner takes its Triton down with it (PR_SET_PDEATHSIG), and another
worker takes over. Either way exactly one Triton runs afterwards and the service serves again.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.conftest import BentoService, _name
from tests.faults_support import shm_regions
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


def generate_ok(service: BentoService, headers: dict[str, str] | None = None) -> bool:
    try:
        return (
            httpx.post(f"{service.url}/generate", json=BODY, headers=headers, timeout=30).status_code == 200
        )
    except httpx.HTTPError:
        return False


KEY = "sk-workers-7f3a9c"
SECRET = "PurpleElephant4417"  # a prompt text that must not reach the logs
LONG = {"prompt": f"{SECRET} tell me a long story.", "max_tokens": 1000, "temperature": 0, "ignore_eos": True}


@pytest.mark.flavors("llmapi")  # the workers' sharing of Triton does not depend on the flavour
def test_killing_a_follower_mid_stream_leaves_triton_alone(
    make_service: Callable[..., BentoService], model_name: str
) -> None:
    """Two workers with API keys: Triton listens on loopback only, every generating route asks
    for the key whichever worker answers; a follower killed mid-stream breaks its own streams
    only, the owner's finish, the service serves on, the follower is replaced and Triton is
    neither restarted nor duplicated; neither the key nor the prompt reaches the logs."""
    service = make_service({"TRTLLM_WORKERS": "2", "TRTLLM_API_KEYS": KEY})
    owner = state(service)["owner_pid"]
    (triton,) = tritons(service)
    assert len(workers(service)) == 2 and owner in {w.pid for w in workers(service)}
    assert psutil.Process(triton).ppid() == owner, "the owner worker is Triton's parent"
    follower = next(w for w in workers(service) if w.pid != owner)

    listening = listening_addresses(triton)
    ports = {service.triton_grpc_port, service.triton_http_port, service.triton_metrics_port}
    assert ports <= {port for _, port in listening}, listening
    assert all(loopback(host) for host, _ in listening), f"Triton listens beyond loopback: {listening}"

    routes = [
        ("/generate", {"prompt": SECRET, "max_tokens": 2}),
        ("/v1/chat/completions", {"model": model_name, "messages": [{"role": "user", "content": SECRET}], "max_tokens": 2}),
        ("/v1/completions", {"model": model_name, "prompt": SECRET, "max_tokens": 2}),
    ]  # fmt: skip
    for path, body in routes:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {KEY}"}):
            statuses = {  # fresh connections: both workers answer some
                httpx.post(f"{service.url}{path}", json=body, headers=headers, timeout=60).status_code
                for _ in range(6)
            }
            assert statuses == (
                {200} if "Authorization" in headers and KEY in headers["Authorization"] else {401}
            )

    streams = open_streams_on_both_workers(service, owner, follower.pid)
    follower.send_signal(signal.SIGKILL)
    for worker, sock in streams:
        complete = read_to_end(sock)
        assert complete == (worker == owner), f"worker {worker} (owner {owner}): complete={complete}"
        sock.close()
    # The service keeps answering while the follower is replaced.
    deadline = time.monotonic() + 60
    answered = 0
    while time.monotonic() < deadline and answered < 5:
        answered += generate_ok(service, {"Authorization": f"Bearer {KEY}"})
    assert answered == 5
    assert wait_for(
        lambda: len(workers(service)) == 2 and follower.pid not in {w.pid for w in workers(service)}, 60
    ), "the killed worker was not replaced"
    assert tritons(service) == [triton], "Triton was restarted or duplicated"
    assert state(service)["owner_pid"] == owner and state(service)["restarts"] == 0

    triton_log = (Path(service.env["TRTLLM_RUN_DIR"]) / "triton.log").read_text(errors="replace")
    for secret in (KEY, SECRET):
        assert secret not in service.log(), f"{secret!r} is in the service log"
        assert secret not in triton_log, f"{secret!r} is in Triton's log"


def open_streams_on_both_workers(
    service: BentoService, owner: int, follower: int
) -> list[tuple[int, socket.socket]]:
    """Streams of LONG on fresh connections until both workers serve at least one, the follower's
    opened last: (worker pid, socket), each with its answer started. A follower's stream opened
    before the owner was reached is closed: it could have finished (a CI run saw one complete)
    by the time the follower is killed."""
    streams: list[tuple[int, socket.socket]] = []
    body = json.dumps(LONG).encode()
    for _ in range(24):
        sock = socket.create_connection(("127.0.0.1", service.port), timeout=60)
        sock.sendall(
            f"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 200"), "the stream did not start"
        port = sock.getsockname()[1]
        worker = next(
            w.pid
            for w in workers(service)
            if any(c.raddr and c.raddr.port == port for c in w.net_connections(kind="tcp"))
        )
        if worker == follower and not streams:
            sock.close()
            continue
        streams.append((worker, sock))
        if worker == follower:
            return streams
    raise AssertionError(
        f"24 connections did not reach the owner, then the follower: {[w for w, _ in streams]}"
    )


def read_to_end(sock: socket.socket) -> bool:
    """Reads a chunked answer; True when it ended with its last chunk, False when cut off."""
    received = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionError:
            return False
        if not data:
            return False
        received += data
        if received.endswith(b"0\r\n\r\n"):
            return True


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(host, port) of every TCP socket `pid` listens on, from /proc/net/tcp and tcp6."""
    fd_dir = Path(f"/proc/{pid}/fd")
    inodes = set()
    for fd in fd_dir.iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state_code, inode = fields[1], fields[3], fields[9]
            if state_code == "0A" and inode in inodes:  # 0A: LISTEN
                address, port = local.split(":")
                raw = bytes.fromhex(address)
                # The kernel prints each 32-bit word of the address in host (little-endian) order.
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.append((str(ipaddress.ip_address(words)), int(port, 16)))
    return found


@pytest.mark.flavors("ensemble")
def test_killing_the_owner_leaves_exactly_one_triton(make_service: Callable[..., BentoService]) -> None:
    service = make_service({"TRTLLM_WORKERS": "2"})
    owner = int(state(service)["owner_pid"])  # type: ignore[call-overload]  # triton.json's owner_pid is an int
    (old_triton,) = tritons(service)
    old_regions = shm_regions(old_triton)  # its Python backend's shared memory, under the owner's tag
    assert old_regions(), "no shared-memory region of the Python backend found"
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
    # nobody stopped the killed owner's Triton: the next owner swept what it left (triton/shm.py)
    assert wait_for(lambda: not old_regions(), 30), f"the killed owner's regions are left: {old_regions()}"
    assert wait_for(lambda: len(workers(service)) == 2, 60), "the killed worker was not replaced"
    time.sleep(2)  # a second Triton, if any, would be starting by now
    assert len(tritons(service)) == 1, tritons(service)
    assert psutil.Process(tritons(service)[0]).ppid() == state(service)["owner_pid"]
    for _ in range(4):
        assert generate_ok(service)


@pytest.mark.flavors("llmapi")
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


def loopback(host: str) -> bool:
    """127.0.0.0/8 or ::1, also as an IPv4-mapped IPv6 address (::ffff:127.0.0.1)."""
    address = ipaddress.ip_address(host)
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)
