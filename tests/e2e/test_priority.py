"""The service's waiting queue under contention, end to end: `bentoml serve .` (two workers sharing
the queue) on the synthetic engine packed with one batch slot and a slow step, so that one request
holds the engine while the others wait in the service.

What is asserted is order and counts, never durations: each request is known to be waiting (the
queue's gauge on /metrics) before the next is sent, and the engine's single slot serializes the
answers, each of several slow steps, so the order they complete in is the order they started in.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import BentoService, pack_demo
from tests.support import prometheus_metric

STEP_MS = "50"
ANSWER_TOKENS = 8  # each queued answer takes 8 slow steps: the answers cannot overlap
WAIT_S = 60.0  # how long a condition may take to come true on a busy machine (not asserted)


@pytest.fixture(scope="module")
def slow_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo packed with the synthetic engine: one batch slot, each step 50 ms."""
    return pack_demo(
        tmp_path_factory.mktemp("bentoml_home_priority"),
        "ensemble",
        "--engine",
        "synthetic",
        "--step-delay-ms",
        STEP_MS,
        "--max-batch-size",
        "1",
    )


def serve(
    home: Path, tmp_path_factory: pytest.TempPathFactory, name: str, env: dict[str, str]
) -> Iterator[BentoService]:
    """`bentoml serve .` on `home` with `env`, stopped once the module is done with it."""
    server = BentoService(home, tmp_path_factory.mktemp(f"serve_{name}"), env).start()
    try:
        yield server
    finally:
        server.stop_soon()


@pytest.fixture(scope="module")
def queued(slow_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BentoService]:
    """Two workers, the queue as it is by default: its slots are the engine's batch slots (auto: 1)."""
    yield from serve(slow_home, tmp_path_factory, "queued", {"TRTLLM_WORKERS": "2"})


@pytest.fixture(scope="module")
def bounded(slow_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BentoService]:
    """One slot, at most two waiting, each for at most 5 s."""
    env = {"TRTLLM_ENGINE_SLOTS": "1", "TRTLLM_MAX_WAITING": "2", "TRTLLM_QUEUE_TIMEOUT": "5"}
    yield from serve(slow_home, tmp_path_factory, "bounded", env)


@pytest.fixture(scope="module")
def paired(slow_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BentoService]:
    """Two slots in the service's queue (the synthetic engine runs at once every request it is sent)."""
    yield from serve(slow_home, tmp_path_factory, "paired", {"TRTLLM_ENGINE_SLOTS": "2"})


def metric(server: BentoService, name: str, **labels: str) -> float:
    return prometheus_metric(f"{server.url}/metrics", name, **labels)


def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"never came true: {what}"
        time.sleep(0.05)


def waiting(server: BentoService, count: int) -> None:
    until(lambda: metric(server, "trtllm:num_requests_waiting") == count, f"{count} requests waiting")


def model_of(server: BentoService) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request("GET", "/v1/models")
    return json.loads(connection.getresponse().read())["data"][0]["id"]


class Held:
    """A streamed chat request that holds a slot of the service's until `release` (its client leaves)."""

    def __init__(self, server: BentoService) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        body = {"messages": [{"role": "user", "content": "hold"}], "max_tokens": 1500, "stream": True}
        self.connection.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        response = self.connection.getresponse()  # the status comes with the first text: it started
        assert response.status == 200, (response.status, response.read()[:500])

    def release(self) -> None:
        self.connection.close()


def post(server: BentoService, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


ANSWERED = threading.Lock()


def send(
    server: BentoService, name: str, path: str, body: dict[str, Any], done: list[Any]
) -> threading.Thread:
    """Sends a request from a thread of its own; (name, status, body) joins `done` once answered."""

    def run() -> None:
        status, _, content = post(server, path, body)
        with ANSWERED:
            done.append((name, status, content))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": ANSWER_TOKENS, **fields}


def test_better_ranked_requests_start_first_and_equal_ones_in_arrival_order(queued: BentoService) -> None:
    model = model_of(queued)
    requests = [  # (name, route, body), in the order they arrive
        ("flex", "/v1/chat/completions", chat(service_tier="flex")),
        ("low", "/generate", {"prompt": "hi", "max_tokens": ANSWER_TOKENS, "priority": 5}),
        ("first", "/v1/completions", {"prompt": "hi", "max_tokens": ANSWER_TOKENS, "priority": 0}),
        (
            "second",
            "/v1/messages",
            {"model": model, "max_tokens": ANSWER_TOKENS, "messages": [{"role": "user", "content": "hi"}]},
        ),
        ("urgent", "/v1/chat/completions", chat(priority=-1)),
        (
            "tier",
            "/v1/responses",
            {"input": "hi", "max_output_tokens": ANSWER_TOKENS, "service_tier": "priority"},
        ),
    ]
    started_before = metric(queued, "trtllm:request_queue_time_seconds_count")
    held = Held(queued)
    done: list[Any] = []
    sent = []
    try:
        for count, (name, path, body) in enumerate(requests, start=1):
            sent.append(send(queued, name, path, body, done))
            waiting(queued, count)  # it waits, behind the held slot: the next arrives after it
    finally:
        held.release()
    for request in sent:
        request.join(WAIT_S)
    assert [(name, status) for name, status, _ in done] == [
        ("tier", 200),
        ("urgent", 200),
        ("first", 200),
        ("second", 200),
        ("low", 200),
        ("flex", 200),
    ], [content[:300] for _, _, content in done]
    answers = {name: content for name, _, content in done}
    assert json.loads(answers["flex"])["service_tier"] == "flex"
    assert json.loads(answers["urgent"])["service_tier"] == "default"
    assert json.loads(answers["tier"])["service_tier"] == "priority"
    assert json.loads(answers["second"])["usage"]["service_tier"] == "standard"
    waiting(queued, 0)
    assert metric(queued, "trtllm:request_queue_time_seconds_count") >= started_before + len(requests) + 1


def test_a_client_that_leaves_while_waiting_frees_its_place(queued: BentoService) -> None:
    held = Held(queued)
    try:
        leaving = http.client.HTTPConnection("127.0.0.1", queued.port, timeout=30)
        leaving.request(
            "POST", "/generate", json.dumps({"prompt": "hi"}), {"Content-Type": "application/json"}
        )
        waiting(queued, 1)
        leaving.close()
        waiting(queued, 0)  # out of the queue while the slot is still held
        assert metric(queued, "trtllm:requests_total", route="/generate", status="499") >= 1
    finally:
        held.release()
    status, _, _ = post(queued, "/generate", {"prompt": "hi", "max_tokens": 2})
    assert status == 200  # the slot is free again: nothing was left holding it


def test_the_count_bound_answers_429_and_loses_nothing_admitted(bounded: BentoService) -> None:
    refused_before = metric(bounded, "trtllm:queue_rejections_total", reason="queue_full")
    model = model_of(bounded)
    held = Held(bounded)
    done: list[Any] = []
    try:
        sent = [send(bounded, "a", "/generate", {"prompt": "hi", "max_tokens": 2}, done)]
        waiting(bounded, 1)
        sent.append(send(bounded, "b", "/v1/chat/completions", chat(max_tokens=2), done))
        waiting(bounded, 2)
        status, headers, body = post(bounded, "/v1/chat/completions", chat())
        assert (status, json.loads(body)["error"]["code"], headers.get("retry-after")) == (
            429,
            "queue_full",
            "1",
        )
        status, headers, body = post(
            bounded,
            "/v1/messages",
            {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        )
        error = json.loads(body)
        assert (status, error["type"], error["error"]["type"]) == (529, "error", "overloaded_error")
        assert headers.get("retry-after") == "1"
    finally:
        held.release()
    for request in sent:
        request.join(WAIT_S)
    assert sorted((name, status) for name, status, _ in done) == [("a", 200), ("b", 200)]
    assert metric(bounded, "trtllm:queue_rejections_total", reason="queue_full") == refused_before + 2


def test_the_time_bound_answers_429(bounded: BentoService) -> None:
    timed_out_before = metric(bounded, "trtllm:queue_rejections_total", reason="queue_timeout")
    held = Held(bounded)
    try:
        status, headers, body = post(bounded, "/generate", {"prompt": "hi", "max_tokens": 2})
        waiting(bounded, 0)
    finally:
        held.release()
    assert (status, json.loads(body)["error"]["code"], headers.get("retry-after")) == (
        429,
        "queue_timeout",
        "1",
    )
    assert metric(bounded, "trtllm:queue_rejections_total", reason="queue_timeout") == timed_out_before + 1


def test_a_request_of_two_choices_takes_two_slots(paired: BentoService) -> None:
    started_before = metric(paired, "trtllm:request_queue_time_seconds_count")
    done: list[Any] = []
    sent = [send(paired, "pair", "/v1/completions", {"prompt": "hi", "max_tokens": 40, "n": 2}, done)]
    until(
        lambda: metric(paired, "trtllm:request_queue_time_seconds_count") == started_before + 1,
        "the request of two choices started",
    )
    sent.append(send(paired, "single", "/generate", {"prompt": "hi", "max_tokens": 2}, done))
    waiting(paired, 1)  # both slots are the pair's: the single one waits (it used to take the second)
    for request in sent:
        request.join(WAIT_S)
    assert [(name, status) for name, status, _ in done] == [("pair", 200), ("single", 200)]
    assert len(json.loads(done[0][2])["choices"]) == 2
    waiting(paired, 0)


LEAVING = {
    "stream": ("/generate", {"prompt": "hi"}),
    # read in the handler, not by the response: an answer that is not streamed, and a streamed one
    # with tools in play (whether it is calls is known only from its text)
    "whole": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    "tools": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        },
    ),
}


@pytest.mark.parametrize("leaving_kind", LEAVING)
def test_a_client_that_leaves_early_frees_its_engine_request(paired: BentoService, leaving_kind: str) -> None:
    """A request sent to the engine whose client leaves at once, while another request holds the
    other of the service's two slots: it ends as a 499 before that one does, and its slot goes to
    the next request. (The synthetic engine runs every request at once, so its first token may come
    before the client leaves; tests/unit/api/generation/test_choices.py holds the first token back.)"""
    route, body = LEAVING[leaving_kind]
    held = Held(paired)  # the first of the service's two slots
    try:
        gone_before = metric(paired, "trtllm:requests_total", route=route, status="499")
        held_done = metric(paired, "trtllm:requests_total", route="/v1/chat/completions", status="200")
        started_before = metric(paired, "trtllm:request_queue_time_seconds_count")
        leaving = http.client.HTTPConnection("127.0.0.1", paired.port, timeout=30)
        leaving.request("POST", route, json.dumps(body), {"Content-Type": "application/json"})
        until(  # the second slot: it is in the engine, behind the held request
            lambda: metric(paired, "trtllm:request_queue_time_seconds_count") == started_before + 1,
            "the leaving request was sent to the engine",
        )
        leaving.close()
        until(
            lambda: metric(paired, "trtllm:requests_total", route=route, status="499") == gone_before + 1,
            "the request whose client left was ended",
        )
        assert (
            metric(paired, "trtllm:requests_total", route="/v1/chat/completions", status="200") == held_done
        ), "the request whose client left was ended only after the held one: at its first token"
        done: list[Any] = []
        sent = send(paired, "next", "/generate", {"prompt": "hi", "max_tokens": 2}, done)
        until(  # its slot was given back: the next request goes to the engine, no wait in the service
            lambda: metric(paired, "trtllm:request_queue_time_seconds_count") == started_before + 2,
            "the next request was sent to the engine",
        )
        assert metric(paired, "trtllm:num_requests_waiting") == 0
    finally:
        held.release()
    sent.join(WAIT_S)
    assert [(name, status) for name, status, _ in done] == [("next", 200)]
