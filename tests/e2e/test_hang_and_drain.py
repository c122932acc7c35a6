"""A Triton that hangs (SIGSTOP) under open streams, its recovery, and a graceful SIGTERM under load.

On one flavour: the relay, the watchdog and the drain are the same code for both.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.faults_support import (
    FAST_RESTART,
    LONG_REQUEST,
    StreamReader,
    describe,
    triton_processes,
    wait_gone,
)
from tests.support import http_ok, wait_for

FLAVORS = ("llmapi",)


def chat_stream(url: str, body: dict[str, Any], results: list[Any], index: int) -> None:
    """Streams a chat completion; records (finish_reason, whether [DONE] came, text) or the error."""
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=180) as response:
            if response.status_code != 200:
                results[index] = ("status", response.status_code, response.read()[:200])
                return
            results[index] = ("streaming",)  # answered: the service has taken it
            finish, done, text = None, False, []
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        results[index] = ("error event", event["error"])
                        return
                    choice = event["choices"][0]
                    text.append(choice["delta"].get("content") or "")
                    finish = choice.get("finish_reason") or finish
            results[index] = (finish, done, "".join(text))
    except httpx.HTTPError as exc:
        results[index] = ("broken", repr(exc))


@pytest.mark.stress
def test_hung_triton_then_recovery_then_graceful_shutdown_under_load(
    make_service: Any, model_name: str
) -> None:
    """SIGSTOP Triton with streams open: they end with an error within the idle timeout,
    /readyz turns 503, new requests get 503 at once; SIGCONT: served again, same Triton. Stopped
    for good: the supervisor restarts it. Then SIGTERM with 32 streams running: every one
    finishes, new requests get 503 meanwhile, and the service exits 0 leaving nothing behind."""
    idle_timeout, stall_timeout = 3, 12
    server = make_service(
        {
            **FAST_RESTART,
            "TRTLLM_STREAM_IDLE_TIMEOUT": str(idle_timeout),
            "TRITON_STALL_TIMEOUT": str(stall_timeout),
            "TRTLLM_SHUTDOWN_GRACE": "120",
        }
    )
    readyz, generate = f"{server.url}/readyz", f"{server.url}/generate"
    hello = {"prompt": "Hello!", "max_tokens": 5, "temperature": 0}
    [tritonserver] = server.tritonserver_pids()

    # 1. Hung: the streams end with an error, readiness and new requests say 503.
    readers = [StreamReader(server.url, LONG_REQUEST) for _ in range(3)]
    for reader in readers:
        reader.start()
    assert all(reader.streaming.wait(60) for reader in readers), "the streams did not start"
    os.kill(tritonserver, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        assert all(reader.done.wait(idle_timeout + 5) for reader in readers), "a stream hung with Triton"
        assert all(isinstance(reader.error, httpx.RemoteProtocolError) for reader in readers), [
            reader.error for reader in readers
        ]
        ended = max(reader.ended_at or 0 for reader in readers) - stopped_at
        assert ended < idle_timeout + 2, f"streams ended {ended:.1f} s after Triton hung"
        assert wait_for(lambda: not http_ok(readyz), timeout=8), "/readyz still 200 with Triton hung"
        asked = time.monotonic()
        refused = httpx.post(generate, json=hello, timeout=30)
        assert refused.status_code == 503 and time.monotonic() - asked < 2, refused.text
        assert refused.json()["error"]["code"] == "service_unavailable"
    finally:
        os.kill(tritonserver, signal.SIGCONT)

    # 2. Answering again: ready, served, the same Triton.
    assert wait_for(lambda: http_ok(readyz), timeout=15), "/readyz did not recover after SIGCONT"
    answer = httpx.post(generate, json=hello, timeout=60)
    assert answer.status_code == 200 and answer.text
    assert server.tritonserver_pids() == [tritonserver]

    # 3. Hung for good: killed and restarted by the supervisor after the stall timeout.
    os.kill(tritonserver, signal.SIGSTOP)
    assert wait_for(lambda: not http_ok(readyz), timeout=8)
    assert wait_for(lambda: http_ok(readyz), timeout=stall_timeout + 60, interval=0.5), server.log()[-3000:]
    assert tritonserver not in server.tritonserver_pids()
    answer = httpx.post(generate, json=hello, timeout=60)
    assert answer.status_code == 200 and answer.text

    # 4. SIGTERM with 32 streams running: they finish; meanwhile new requests get 503.
    body = {"model": model_name, "messages": [{"role": "user", "content": "Count."}], "stream": True}
    # long enough to outlast the second after SIGTERM below: 400 tokens were not, once (the 32
    # streams took 2.5-4.5 s; 8 were left at SIGTERM, all done a second later)
    bodies = [{**body, "max_tokens": 900 + i % 5, "temperature": 0} for i in range(32)]
    results: list[Any] = [None] * 32
    threads = [
        threading.Thread(target=chat_stream, args=(server.url, b, results, i), daemon=True)
        for i, b in enumerate(bodies)
    ]
    for thread in threads:
        thread.start()
    seen: list[int] = []
    # every one taken, most of them at once (on a loaded machine the first may end before the
    # last has begun: then they are not all in flight together)
    assert wait_for(
        lambda: seen.append(in_flight(server)) or (None not in results and max(seen) >= 16), 60
    ), f"in flight: {sorted(set(seen))}, taken: {sum(r is not None for r in results)}"
    processes = server.descendants() + triton_processes(server)
    triton_log = Path(server.env["TRTLLM_RUN_DIR"]) / "triton.log"
    signals_before = triton_log.read_text().count("Signal (")
    assert server.process is not None
    server.process.send_signal(signal.SIGTERM)
    # BentoML's arbiter passes SIGTERM on to the workers: once one drains, /readyz says so (a
    # request that came before that is served, as it should be).
    assert wait_for(lambda: not http_ok(readyz), timeout=10, interval=0.02), "/readyz still 200 draining"
    turned_away = httpx.post(generate, json=hello, timeout=30)
    assert turned_away.status_code == 503, turned_away.text
    assert turned_away.json()["error"]["message"].startswith("The service is shutting down")
    # BentoML's process manager SIGTERMs the workers' children too: Triton must not begin its own
    # shutdown (its engine gives streams 30 s, then cuts them) before the drain has ended.
    time.sleep(1)
    assert in_flight(server) > 0 and triton_log.read_text().count("Signal (") == signals_before, (
        "Triton was signalled while streams were still draining"
    )
    for thread in threads:
        thread.join(120)
    unfinished = [r for r in results if not (r and r[0] == "length" and r[1] is True and r[2])]
    assert not unfinished, (
        f"{len(unfinished)} of 32 streams did not finish: {unfinished[:3]}\n"
        f"service log:\n{server.log()[-3000:]}\ntriton.log:\n{triton_log.read_text()[-2000:]}"
    )
    code = server.process.wait(timeout=60)
    assert code == 0, f"bentoml serve exited with {code}:\n{server.log()[-3000:]}"
    left = wait_gone(processes, timeout=10)
    assert not left, f"processes left behind:\n{describe(left)}"


def in_flight(server: Any) -> int:
    """Requests in flight in the service, from the count its workers share (pid, count per slot)."""
    data = (Path(server.env["TRTLLM_RUN_DIR"]) / "in_flight.slots").read_bytes()
    return sum(count for _, count in struct.iter_unpack("<qq", data) if count > 0)


@pytest.mark.stress
def test_requests_still_running_when_the_grace_runs_out_end_with_a_503(
    make_service: Any, model_name: str
) -> None:
    """TRTLLM_SHUTDOWN_GRACE is the most a SIGTERM waits (uvicorn alone waits for every response,
    however long): a chat stream, a /generate stream and an unstreamed chat request still running
    then end with a 503 (the error event, a cut text stream, an error response), and the service
    exits 0 leaving nothing behind."""
    grace = 2
    server = make_service({"TRTLLM_SHUTDOWN_GRACE": str(grace)})
    chat = {"model": model_name, "messages": [{"role": "user", "content": "Count."}], "temperature": 0}
    long = {**chat, "max_tokens": 1500}  # ~8 s on the demo engine alone: far past the grace
    streamed: list[Any] = [None]
    whole: list[Any] = [None]

    def unstreamed() -> None:
        response = httpx.post(f"{server.url}/v1/chat/completions", json=long, timeout=120)
        whole[0] = (response.status_code, response.json())

    threads = [
        threading.Thread(target=chat_stream, args=(server.url, {**long, "stream": True}, streamed, 0)),
        threading.Thread(target=unstreamed),
    ]
    reader = StreamReader(server.url, LONG_REQUEST)
    for thread in [*threads, reader]:
        thread.daemon = True
        thread.start()
    assert reader.streaming.wait(60) and wait_for(lambda: in_flight(server) == 3, 30), in_flight(server)
    processes = server.descendants() + triton_processes(server)
    assert server.process is not None
    server.process.send_signal(signal.SIGTERM)
    code = server.process.wait(timeout=grace + 40)
    for thread in [*threads, reader]:
        thread.join(10)

    assert code == 0, f"bentoml serve exited with {code}:\n{server.log()[-3000:]}"
    assert streamed[0][0] == "error event", f"the chat stream ran on past the grace: {streamed[0][:2]}"
    error = streamed[0][1]
    assert error["code"] == "service_unavailable", error
    assert "shutdown grace ran out" in error["message"], error
    status, body = whole[0]
    assert status == 503 and "shutdown grace ran out" in body["error"]["message"], whole[0]
    assert isinstance(reader.error, httpx.RemoteProtocolError), (
        f"the /generate stream cut by the shutdown ended like a complete answer: {reader.error!r}"
    )
    left = wait_gone(processes, timeout=10)
    assert not left, f"processes left behind:\n{describe(left)}"
