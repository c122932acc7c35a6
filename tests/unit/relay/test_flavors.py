"""relay/flavors.py: the flavour decided once (one object per flavour), its readers, its LoRA policy;
and Runtime.adapter, the one LoRA lookup of every route."""

from __future__ import annotations

from array import array
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tensorrtllm_backend.lora import ROWS_CONFIG, ROWS_WEIGHTS
from trtllm_service.errors import APIError
from trtllm_service.packed_model import LORA_DIR
from trtllm_service.relay import readers
from trtllm_service.relay.flavors import FLAVORS, EnsembleFlavor, LLMAPIFlavor
from trtllm_service.relay.request import ENGINE_INPUTS, LLMAPI_INPUTS, GenerationRequest
from trtllm_service.runtime import Runtime

pytestmark = pytest.mark.unit

REQUEST = GenerationRequest(prompt_ids=array("i", [1, 2]), max_tokens=4)


def test_each_flavour_is_named_once_with_what_it_needs() -> None:
    assert set(FLAVORS) == {"llmapi", "ensemble"}
    assert (LLMAPIFlavor.models, LLMAPIFlavor.llmapi_launch, LLMAPIFlavor.inputs) == (
        ("tensorrt_llm",),
        True,
        LLMAPI_INPUTS,
    )
    assert (EnsembleFlavor.models, EnsembleFlavor.llmapi_launch, EnsembleFlavor.inputs) == (
        ("tensorrt_llm", "ensemble"),
        False,
        ENGINE_INPUTS,
    )
    assert EnsembleFlavor.legacy and LLMAPIFlavor.legacy is None


@pytest.mark.parametrize(
    ("changes", "ids", "text"),
    [
        ({}, readers.TokenIdReader, readers.TextReader),
        ({"logprobs": 2}, readers.TokenIdReader, readers.TextReader),
        ({"beam_width": 2, "num_return": 2}, readers.TokenIdBeams, readers.TextBeams),
    ],
)
def test_the_flavour_picks_the_reader(changes: dict[str, int], ids: type, text: type) -> None:
    from dataclasses import replace

    request = replace(REQUEST, **changes)
    engine = EnsembleFlavor(SimpleNamespace(all_special_ids=[]))
    assert type(engine.reader(request)) is ids and type(LLMAPIFlavor().reader(request)) is text
    with_logprobs = engine.reader(request).logprobs
    assert (with_logprobs is not None) == ("logprobs" in changes)


def test_an_llmapi_adapter_travels_by_name() -> None:
    request = GenerationRequest(prompt_ids=[1], max_tokens=1, lora_name="poet")
    flavor = LLMAPIFlavor()
    flavor.adapters = {"poet": {"id": 1, "dir": "/packed/loras/poet"}}
    assert flavor.with_adapter(request) == (request, None)


def test_a_loaded_llmapi_adapter_travels_with_its_id_and_files() -> None:
    request = GenerationRequest(prompt_ids=[1], max_tokens=1, lora_name="tenant")
    flavor = LLMAPIFlavor()
    flavor.adapters = {"tenant": {"id": 9, "dir": "/run/loras/9", "loaded": True}}
    sent, retry = flavor.with_adapter(request)
    assert retry is None and (sent.lora_name, sent.lora_id, sent.lora_path) == ("tenant", 9, "/run/loras/9")


def test_an_adapter_unloaded_after_its_check_is_a_404() -> None:
    request = GenerationRequest(prompt_ids=[1], max_tokens=1, lora_name="gone")
    for flavor in (LLMAPIFlavor(), EnsembleFlavor(None, None, {})):
        with pytest.raises(APIError) as caught:
            flavor.with_adapter(request)
        assert caught.value.status == 404


def test_a_cpp_adapter_is_sent_with_its_weights_once_per_triton(tmp_path: Path) -> None:
    rows = tmp_path / LORA_DIR / "poet"
    rows.mkdir(parents=True)
    np.save(rows / ROWS_WEIGHTS, np.ones((2, 3), dtype=np.float32))
    np.save(rows / ROWS_CONFIG, np.zeros((2, 3), dtype=np.int32))
    flavor = EnsembleFlavor(None, tmp_path, {"poet": {"id": 7}})
    request = GenerationRequest(prompt_ids=[1], max_tokens=1, lora_name="poet")
    first, retry = flavor.with_adapter(request)
    assert retry is None and first.lora_task_id == 7 and first.lora_weights is not None
    later, retry = flavor.with_adapter(request)  # the engine holds it: the id, the weights on a miss
    assert later.lora_task_id == 7 and later.lora_weights is None
    assert retry is not None and retry.lora_weights is not None
    flavor.triton_restarted()
    assert flavor.with_adapter(request)[0].lora_weights is not None
    assert flavor.with_adapter(REQUEST) == (REQUEST, None)


def test_one_lookup_names_the_adapter_of_every_route() -> None:
    runtime = object.__new__(Runtime)
    runtime.model_name, runtime.adapters = "base", {"poet": {"id": 1}}
    assert runtime.adapter(None) is None and runtime.adapter("base") is None
    assert runtime.adapter("poet") == "poet" and runtime.adapter("poet", param="lora") == "poet"
    with pytest.raises(APIError) as missing:
        runtime.adapter("nope")
    assert (missing.value.status, missing.value.code) == (404, "model_not_found")
    with pytest.raises(APIError) as unknown:  # /generate's field
        runtime.adapter("nope", param="lora")
    assert (unknown.value.status, unknown.value.param) == (400, "lora") and "poet" in unknown.value.message
