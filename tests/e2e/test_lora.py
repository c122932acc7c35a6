"""LoRA adapters end to end: packed with `pack_model.py --lora`, or loaded while serving (vLLM's
/v1/load_lora_adapter, TRTLLM_ALLOW_RUNTIME_LORA_UPDATING), served by `bentoml serve` with two workers,
selected by `model` (OpenAI, Anthropic) or `lora` (/generate), on both flavours.

The adapters are made by our own code (random A/B, fixed seeds, PEFT format); the expected output is
`transformers` greedy decoding on the base model with the adapter merged into its weights (the merge
is computed here). The engine caches one adapter at a time (--lora-cache-adapters 1), so two adapters
in turn are evicted and loaded again.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.e2e.conftest import BentoService, pack_demo
from tests.lora_support import make_adapter, merge_into
from tests.openai_support import Reference
from tests.support import prometheus_metric
from trtllm_service.packing.demo_model import build_demo_model

MESSAGES = [{"role": "user", "content": "Write about rivers."}]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = build_demo_model(tmp_path_factory.mktemp("lora-base") / "model")
    config = json.loads((base / "config.json").read_text())
    root = tmp_path_factory.mktemp("adapters")
    return {name: make_adapter(root / name, config, seed=seed) for name, seed in (("poet", 1), ("critic", 2))}


@pytest.fixture(scope="module")
def lora_service(
    flavor: str, adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BentoService]:
    lora_args = [arg for name, path in adapters.items() for arg in ("--lora", f"{name}={path}")]
    home = pack_demo(
        tmp_path_factory.mktemp(f"lora_home_{flavor}"), flavor, "--lora-cache-adapters", "1", *lora_args
    )
    root = next(iter(adapters.values())).parent  # the adapters' directory: loadable by name too
    env = {"TRTLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "TRTLLM_LORA_ROOT": str(root), "TRTLLM_WORKERS": "2"}
    server = BentoService(home, tmp_path_factory.mktemp("lora-serve"), env).start()
    try:
        yield server
    finally:
        server.stop_soon()


@pytest.fixture(scope="module")
def expected(lora_service: BentoService, adapters: dict[str, Path]) -> dict[str, str]:
    """model id -> the greedy answer transformers gives with that adapter merged (base: none)."""
    (model_dir,) = [p.parent for p in (lora_service.home / "models").glob("*/*/pack.json")]
    out = {}
    for name in (None, *adapters):
        ref = Reference(model_dir)
        if name is not None:
            merge_into(ref.model, adapters[name])
        out[name or model_dir.parent.name] = ref.greedy(ref.chat_ids(MESSAGES), MAX_TOKENS).text
    return out


def _chat(client: openai.OpenAI, model: str) -> str:
    out = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
    assert out.model == model
    return out.choices[0].message.content or ""


@pytest.mark.box
def test_models_lists_the_adapters(lora_service: BentoService, expected: dict[str, str]) -> None:
    client = openai.OpenAI(base_url=f"{lora_service.url}/v1", api_key="x", max_retries=0)
    cards = {card.id: card for card in client.models.list().data}
    base = next(name for name in expected if name not in ("poet", "critic"))
    assert set(cards) == {base, "poet", "critic"}
    assert cards["poet"].parent == base and cards["critic"].parent == base
    assert getattr(cards[base], "parent", None) is None
    assert client.models.retrieve("critic").parent == base


def test_each_adapter_answers_as_its_merged_weights(
    lora_service: BentoService, expected: dict[str, str]
) -> None:
    assert len(set(expected.values())) == 3  # the adapters do change the answer
    client = openai.OpenAI(base_url=f"{lora_service.url}/v1", api_key="x", max_retries=0, timeout=120)
    for model, text in [*expected.items(), *expected.items()]:  # in turn: evicted and reloaded
        assert _chat(client, model) == text, model
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model="poet", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        if chunk.choices
    )
    assert streamed == expected["poet"]


def test_concurrent_requests_each_get_their_own_adapter(
    lora_service: BentoService, expected: dict[str, str]
) -> None:
    client = openai.OpenAI(base_url=f"{lora_service.url}/v1", api_key="x", max_retries=0, timeout=120)
    models = list(expected) * 3
    with ThreadPoolExecutor(len(models)) as pool:
        answers = list(pool.map(lambda m: _chat(client, m), models))
    assert answers == [expected[m] for m in models]


@pytest.mark.box
def test_generate_takes_lora(lora_service: BentoService, expected: dict[str, str]) -> None:
    body = {"prompt": "Write about rivers.", "max_tokens": MAX_TOKENS, "temperature": 0, "lora": "critic"}
    response = httpx.post(f"{lora_service.url}/generate", json=body, timeout=120)
    assert response.status_code == 200 and response.text == expected["critic"]
    bad = httpx.post(f"{lora_service.url}/generate", json={**body, "lora": "nope"}, timeout=30)
    assert bad.status_code == 400 and "nope" in bad.text
    missing = httpx.post(
        f"{lora_service.url}/v1/chat/completions", json={"model": "nope", "messages": MESSAGES}, timeout=30
    )
    assert missing.status_code == 404
    served = f"{lora_service.url}/metrics"
    assert (
        prometheus_metric(
            served, "trtllm:requests_total", model_name="critic", route="/generate", status="200"
        )
        >= 1
    )
    assert prometheus_metric(served, "trtllm:requests_total", model_name="nope") == 0


def test_adapter_survives_a_triton_restart(lora_service: BentoService, expected: dict[str, str]) -> None:
    client = openai.OpenAI(base_url=f"{lora_service.url}/v1", api_key="x", max_retries=0, timeout=120)
    assert _chat(client, "poet") == expected["poet"]  # held by the engine now
    assert _load(lora_service, "poet-kept", "poet").status_code == 200
    assert _chat(client, "poet-kept") == expected["poet"]
    (old,) = lora_service.tritonserver_pids()
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pids = lora_service.tritonserver_pids()
        if pids and pids != [old] and httpx.get(f"{lora_service.url}/readyz", timeout=5).status_code == 200:
            break
        time.sleep(0.5)
    else:
        pytest.fail("Triton was not restarted")
    assert _chat(client, "poet") == expected["poet"]
    assert _chat(client, "poet-kept") == expected["poet"]  # the loaded one is kept, weights sent again
    assert _unload(lora_service, "poet-kept").status_code == 200


# ---- adapters loaded while serving ------------------------------------------------------------------


def _load(service: BentoService, name: str, path: str, **extra: object) -> httpx.Response:
    body = {"lora_name": name, "lora_path": path, **extra}
    return httpx.post(f"{service.url}/v1/load_lora_adapter", json=body, timeout=120)


def _unload(service: BentoService, name: str) -> httpx.Response:
    return httpx.post(f"{service.url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def _workers(service: BentoService) -> list[psutil.Process]:
    return [p for p in service.descendants() if "_bentoml_impl.worker.service" in " ".join(p.cmdline())]


def _send(service: BentoService, method: str, path: str, body: dict[str, object] | None) -> socket.socket:
    payload = json.dumps(body).encode() if body is not None else b""
    sock = socket.create_connection(("127.0.0.1", service.port), timeout=60)
    sock.sendall(
        f"{method} {path} HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


BUSY = {"prompt": "Count to a thousand.", "max_tokens": 400, "ignore_eos": True, "temperature": 1.0}
"""A long stream held open on a worker that already answered, so that the next connection goes to
the other one (an idle worker takes the shared socket's connections first)."""


def _on_each_worker(
    service: BentoService, method: str, path: str, body: dict[str, object] | None = None
) -> dict[int, bytes]:
    """Each worker's raw answer to one request, by worker pid, each on a fresh connection."""
    answers: dict[int, bytes] = {}
    workers = _workers(service)
    assert len(workers) == 2
    held: list[socket.socket] = []
    try:
        for _ in range(24):
            with _send(service, method, path, body) as sock:  # kept open: its worker is found by it
                received = sock.recv(65536)
                head, _, _ = received.partition(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                )
                while len(received) - len(head) - 4 < length:
                    received += sock.recv(65536)
                port = sock.getsockname()[1]
                owner = next(
                    w.pid
                    for w in workers
                    if any(c.raddr and c.raddr.port == port for c in w.net_connections("tcp"))
                )
            answers.setdefault(owner, received)
            if len(answers) == 2:
                return answers
            held.append(_send(service, "POST", "/generate", BUSY))
            assert held[-1].recv(65536).startswith(b"HTTP/1.1 200"), "the stream did not start"
    finally:
        for sock in held:
            sock.close()
    raise AssertionError(f"24 connections did not reach both workers: {list(answers)}")


def _status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def test_a_loaded_adapter_answers_as_packed_on_every_worker(
    lora_service: BentoService, expected: dict[str, str]
) -> None:
    base = next(name for name in expected if name not in ("poet", "critic"))
    loaded = _load(lora_service, "poet-live", "poet")  # the packed poet's files, by name under the root
    assert loaded.status_code == 200, loaded.text
    assert loaded.text == "Success: LoRA adapter 'poet-live' added successfully."
    for raw in _on_each_worker(lora_service, "GET", "/v1/models").values():
        cards = {card["id"]: card for card in json.loads(raw.split(b"\r\n\r\n", 1)[1])["data"]}
        assert cards["poet-live"]["parent"] == base and cards["poet-live"]["root"] == "poet"
        assert cards["poet"]["parent"] == base
    client = openai.OpenAI(base_url=f"{lora_service.url}/v1", api_key="x", max_retries=0, timeout=120)
    assert _chat(client, "poet-live") == expected["poet"] != expected[base]
    chat = {"model": "poet-live", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0}
    for raw in _on_each_worker(lora_service, "POST", "/v1/chat/completions", chat).values():
        assert _status(raw) == 200 and json.dumps(expected["poet"])[1:-1].encode() in raw
    message = {"model": "poet-live", "max_tokens": 4, "messages": MESSAGES}
    assert httpx.post(f"{lora_service.url}/v1/messages", json=message, timeout=120).status_code == 200

    again = _load(lora_service, "poet-live", "critic")  # vLLM: a second load is a 400, unless in place
    assert again.status_code == 400 and "has already been loaded" in again.json()["error"]["message"]
    assert _chat(client, "poet-live") == expected["poet"]
    assert _load(lora_service, "poet-live", "critic", load_inplace=True).status_code == 200
    assert _chat(client, "poet-live") == expected["critic"]

    gone = _unload(lora_service, "poet-live")
    assert gone.status_code == 200 and gone.text == "Success: LoRA adapter 'poet-live' removed successfully."
    for raw in _on_each_worker(lora_service, "POST", "/v1/chat/completions", chat).values():
        assert _status(raw) == 404 and b"model_not_found" in raw
    unknown = _unload(lora_service, "poet-live")
    assert unknown.status_code == 404 and "cannot be found" in unknown.json()["error"]["message"]
    assert "poet-live" not in {card.id for card in client.models.list().data}
    served = f"{lora_service.url}/metrics"
    ok = prometheus_metric(served, "trtllm:lora_adapter_operations_total", operation="load", result="ok")
    failed = prometheus_metric(
        served, "trtllm:lora_adapter_operations_total", operation="load", result="failed"
    )
    assert ok >= 2 and failed >= 1
    assert "LoRA adapter 'poet-live' loaded from 'poet'" in lora_service.log()


def test_unloading_during_a_stream_lets_it_finish(
    lora_service: BentoService, expected: dict[str, str]
) -> None:
    assert _load(lora_service, "critic-live", "critic").status_code == 200
    client = openai.OpenAI(base_url=f"{lora_service.url}/v1", api_key="x", max_retries=0, timeout=120)
    stream = client.chat.completions.create(
        model="critic-live", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    text = ""
    while not text:  # the answer has begun
        chunk = next(stream)
        text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
    assert _unload(lora_service, "critic-live").status_code == 200  # while the stream is open
    text += "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == expected["critic"]
    with pytest.raises(openai.NotFoundError):
        _chat(client, "critic-live")


def test_bad_adapters_are_refused_with_nothing_loaded(
    lora_service: BentoService, adapters: dict[str, Path], tmp_path: Path
) -> None:
    root = adapters["poet"].parent
    config = json.loads((adapters["poet"] / "adapter_config.json").read_text())
    base = json.loads(next((lora_service.home / "models").glob("*/*/engine/config.json")).read_text())
    make_adapter(root / "wide", base, seed=5, rank=8)  # the packed adapters' rank is 4
    make_adapter(root / "other-base", {**base, "hidden_size": base["hidden_size"] * 2}, seed=6)
    (root / "no-weights").mkdir(exist_ok=True)
    (root / "no-weights" / "adapter_config.json").write_text(json.dumps(config))
    outside = make_adapter(tmp_path / "outside", base, seed=7)
    (root / "link-out").unlink(missing_ok=True)
    (root / "link-out").symlink_to(outside, target_is_directory=True)
    for path, says in (
        ("../outside", "'..' is not allowed"),
        (str(outside), "outside TRTLLM_LORA_ROOT"),
        ("link-out", "outside TRTLLM_LORA_ROOT"),
        ("wide", "rank 8 exceeds the engine's max_lora_rank 4"),
        ("other-base", "has shape"),
        ("no-weights", "adapter_model.safetensors"),
        ("nowhere", "no such directory"),
    ):
        refused = _load(lora_service, "bad", path)
        assert refused.status_code == 400, (path, refused.text)
        error = refused.json()["error"]
        assert says in error["message"] and error["param"] == "lora_path", (path, error)
    for name in ("poet", "bad name!"):  # a packed adapter's name; not a name clients can send
        assert _load(lora_service, name, "poet").status_code == 400
    models = httpx.get(f"{lora_service.url}/v1/models", timeout=30).json()["data"]
    assert "bad" not in {card["id"] for card in models}
    assert (
        httpx.post(
            f"{lora_service.url}/v1/chat/completions", json={"model": "bad", "messages": MESSAGES}, timeout=30
        ).status_code
        == 404
    )
