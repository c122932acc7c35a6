"""LoRA adapters without Triton: PEFT checks (one-line errors), TensorRT-LLM rows, the cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tensorrtllm_backend.lora import CACHE_MISS, LoraCache, LoraError, from_rows, read_peft, to_rows
from tests.lora_support import make_adapter
from trtllm_service.packed_model import PackError
from trtllm_service.packing.adapters import read_loras
from trtllm_service.packing.sources import read_hf_checkpoint


def test_rows_round_trip_to_the_same_factors(tmp_path: Path, base_config: dict) -> None:
    adapter = read_peft(make_adapter(tmp_path / "a", base_config, seed=3, rank=4, alpha=16), base_config)
    assert adapter.rank == 4 and adapter.alpha == 16
    weights, config = to_rows(adapter.factors)
    assert weights.shape[0] == config.shape[0] == len(adapter.factors) == 4 * base_config["num_hidden_layers"]
    assert set(config[:, 0].tolist()) == {1, 3, 4, 6}  # attn_q, attn_v, attn_dense, mlp_4h_to_h
    back = from_rows(weights, config, base_config)
    assert back.keys() == adapter.factors.keys()
    for key, (a, b) in adapter.factors.items():
        np.testing.assert_array_equal(back[key][0], a)
        np.testing.assert_array_equal(back[key][1], b)
    # alpha / r is folded into B: 16 / 4 = 4 times the file's B
    from safetensors.numpy import load_file

    raw = load_file(str(tmp_path / "a" / "adapter_model.safetensors"))
    b_file = raw["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    np.testing.assert_allclose(adapter.factors[(0, "q_proj")][1], 4 * b_file, rtol=1e-6)


def _edit_config(directory: Path, **changes: object) -> None:
    path = directory / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"r": 0}, "rank r must be a positive integer"),
        ({"target_modules": ["q_proj", "embed_tokens"]}, "unsupported target module(s) embed_tokens"),
        ({"target_modules": ["q_proj"]}, "not a target module"),
        ({"peft_type": "IA3"}, "only LoRA adapters"),
        ({"r": 8}, "the base model needs"),  # the tensors are rank 4: shapes do not match
    ],
)
def test_bad_adapters_are_one_line_errors(
    tmp_path: Path, base_config: dict, change: dict, message: str
) -> None:
    directory = make_adapter(tmp_path / "a", base_config, seed=1)
    _edit_config(directory, **change)
    with pytest.raises(LoraError) as info:
        read_peft(directory, base_config)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_adapter_for_another_base_model_is_refused(tmp_path: Path, base_config: dict) -> None:
    other = {
        **base_config,
        "hidden_size": base_config["hidden_size"] * 2,
        "head_dim": base_config["hidden_size"] // base_config["num_attention_heads"] * 2,
    }
    directory = make_adapter(tmp_path / "a", other, seed=1)
    with pytest.raises(LoraError, match="another base model"):
        read_peft(directory, base_config)
    deeper = make_adapter(
        tmp_path / "b", {**base_config, "num_hidden_layers": base_config["num_hidden_layers"] + 1}, seed=1
    )
    with pytest.raises(LoraError, match="does not exist in the base model"):
        read_peft(deeper, base_config)
    with pytest.raises(LoraError, match="is not a PEFT adapter"):
        read_peft(tmp_path, base_config)


def test_cache_evicts_the_least_recently_used() -> None:
    cache = LoraCache(2)
    cache.put(1, "one")
    cache.put(2, "two")
    assert cache.get(1) == "one"  # 1 is now the most recent
    cache.put(3, "three")  # evicts 2
    with pytest.raises(LoraError, match=CACHE_MISS):
        cache.get(2)
    assert cache.get(2, lambda: "two again") == "two again" and cache.loads == 4
    with pytest.raises(LoraError, match=CACHE_MISS):
        cache.get(1)  # 1 was evicted by 2's reload


def test_pack_refuses_bad_lora_arguments(tmp_path: Path, demo_model_dir: Path, base_config: dict) -> None:
    source = read_hf_checkpoint(demo_model_dir, mode="demo")
    good = make_adapter(tmp_path / "good", base_config, seed=1)
    assert list(read_loras(source, [("poet", good)])) == ["poet"]
    for loras, message in [
        ([("poet", good), ("poet", good)], "given twice"),
        ([("bad name", good)], "use letters"),
        ([("x", tmp_path / "missing")], "--lora x"),
    ]:
        with pytest.raises(PackError, match=message):
            read_loras(source, loras)


def test_max_lora_rank_writes_a_lora_config_with_no_adapter_packed(
    tmp_path: Path, demo_model_dir: Path, base_config: dict
) -> None:
    """--max-lora-rank: the LoraConfig a runtime-loaded adapter needs, with nothing packed (vLLM's
    --enable-lora --max-lora-rank R); its modules default to every one the engine supports."""
    from tensorrtllm_backend.lora import HF_TO_TRTLLM
    from trtllm_service.packing.adapters import lora_values

    assert lora_values({}, tmp_path, cache=3) == {"loras_json": "{}", "llm_lora_config": "null"}
    alone = json.loads(lora_values({}, tmp_path, cache=3, max_rank=16)["llm_lora_config"])
    assert alone == {
        "lora_dir": [],
        "max_lora_rank": 16,
        "lora_target_modules": sorted(HF_TO_TRTLLM.values()),
        "max_loras": 3,
        "max_cpu_loras": 3,
    }
    source = read_hf_checkpoint(demo_model_dir, mode="demo")
    poet = read_loras(source, [("poet", make_adapter(tmp_path / "poet", base_config, seed=1))])  # rank 4
    values = lora_values(
        poet, tmp_path, cache=1, max_rank=8, modules=("q_proj", "v_proj", "o_proj", "down_proj")
    )
    config = json.loads(values["llm_lora_config"])
    assert config["max_lora_rank"] == 8 and config["lora_dir"] == [str(tmp_path / "loras" / "poet")]
    assert config["lora_target_modules"] == ["attn_dense", "attn_q", "attn_v", "mlp_4h_to_h"]
    assert json.loads(values["loras_json"]) == {"poet": {"id": 1, "path": str(tmp_path / "loras" / "poet")}}
    for rank, modules, says in (
        (2, None, "--lora poet: rank 4 exceeds the engine's max_lora_rank 2"),
        (8, ("q_proj",), "--lora poet: the engine was built without LoRA on attn_dense"),
    ):
        with pytest.raises(PackError, match=says):
            lora_values(poet, tmp_path, cache=1, max_rank=rank, modules=modules)
