"""LoRA adapters end to end: packed with `pack_model.py --lora`, served by `bentoml serve`, selected by
`model` (OpenAI) or `lora` (/generate), on both flavours.

The adapters are made by our own code (random A/B, fixed seeds, PEFT format); the expected output is
`transformers` greedy decoding on the base model with the adapter merged into its weights (the merge
is computed here). The engine caches one adapter at a time (--lora-cache-adapters 1), so two adapters
in turn are evicted and loaded again.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
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
    server = BentoService(home, tmp_path_factory.mktemp("lora-serve")).start()
    try:
        yield server
    finally:
        server.stop()


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
