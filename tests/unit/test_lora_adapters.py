"""LoRA adapters loaded while serving, without a service: where `lora_path` may lead, the checks
against the packed model (the pack-time ones, shared), and the set two workers share in one run
directory (two SharedAdapters over it are two workers)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorrtllm_backend.lora import ROWS_CONFIG, ROWS_WEIGHTS, LoraError
from tests.lora_support import make_adapter
from trtllm_service.lora_adapters import LoadRefused, LoraLimits, NotLoaded, SharedAdapters, resolve_source
from trtllm_service.packed_model import LORA_DIR, PackInfo


@pytest.fixture
def root(tmp_path: Path, base_config: dict[str, Any]) -> Path:
    """TRTLLM_LORA_ROOT holding one good adapter, `a`."""
    make_adapter(tmp_path / "root" / "a", base_config, seed=1)
    return tmp_path / "root"


def _limits(base_config: dict[str, Any], max_rank: int = 4) -> LoraLimits:
    return LoraLimits(base_config, max_rank, ("attn_q", "attn_v", "attn_dense", "mlp_4h_to_h"), "float16")


def test_a_path_resolves_only_inside_the_root(
    root: Path, tmp_path: Path, base_config: dict[str, Any]
) -> None:
    assert resolve_source("a", root) == (root / "a").resolve()
    assert resolve_source(str(root / "a"), root) == (root / "a").resolve()
    outside = make_adapter(tmp_path / "outside", base_config, seed=2)
    (root / "out").symlink_to(outside, target_is_directory=True)
    (root / "file").write_text("")
    for path, says in (
        ("../outside", "'..' is not allowed"),
        ("a/../../outside", "'..' is not allowed"),
        (str(outside), "outside TRTLLM_LORA_ROOT"),
        ("out", "outside TRTLLM_LORA_ROOT"),  # a symlink that leads out
        ("/", "outside TRTLLM_LORA_ROOT"),
        ("file", "not a directory"),
        ("", "empty"),
    ):
        with pytest.raises(LoraError, match=says):
            resolve_source(path, root)


def test_without_a_root_only_model_tags_are_taken(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BENTOML_HOME", str(tmp_path / "bentoml"))
    with pytest.raises(LoraError, match="only under TRTLLM_LORA_ROOT"):
        resolve_source(str(root / "a"), None)
    with pytest.raises(LoraError, match="no such directory under TRTLLM_LORA_ROOT, nor BentoML model"):
        resolve_source("missing:v1", root)


def test_an_adapter_is_checked_against_the_packed_model(root: Path, base_config: dict[str, Any]) -> None:
    assert _limits(base_config).check(root / "a").rank == 4
    make_adapter(root / "wide", base_config, seed=3, rank=8)
    with pytest.raises(LoraError, match="rank 8 exceeds the engine's max_lora_rank 4"):
        _limits(base_config).check(root / "wide")
    with pytest.raises(LoraError, match="without LoRA on attn_dense"):
        LoraLimits(base_config, 8, ("attn_q", "attn_v", "mlp_4h_to_h"), "float16").check(root / "a")
    other = {**base_config, "hidden_size": base_config["hidden_size"] * 2}
    with pytest.raises(LoraError, match="another base model"):
        LoraLimits(other, 4, (), "float16").check(root / "a")
    (root / "a" / "adapter_model.safetensors").unlink()
    with pytest.raises(LoraError, match=r"adapter_model\.safetensors"):
        _limits(base_config).check(root / "a")
    with pytest.raises(LoraError, match="packed without"):
        LoraLimits(base_config, 0, (), "float16", "packed without LoRA").check(root / "a")


def test_integer_weights_are_refused(root: Path, base_config: dict[str, Any]) -> None:
    from safetensors.numpy import load_file, save_file

    weights = root / "a" / "adapter_model.safetensors"
    save_file({k: v.astype(np.int32) for k, v in load_file(str(weights)).items()}, str(weights))
    with pytest.raises(LoraError, match="must be float16, bfloat16 or float32"):
        _limits(base_config).check(root / "a")


def test_limits_of_a_pack_are_its_adapters(base_config: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "config.json").write_text(json.dumps(base_config))
    fields: dict[str, Any] = dict(
        tag="m:v", mode="demo", backend="python", packed_root="", world_size=1, tp_size=1, pp_size=1,
        architecture="LlamaForCausalLM", dtype="bfloat16", max_batch_size=1, max_input_len=None,
        max_seq_len=None, max_beam_width=1,
    )  # fmt: skip
    loras = {
        "p": {"id": 1, "rank": 4, "target_modules": ["q_proj"]},
        "q": {"id": 2, "rank": 2, "target_modules": ["v_proj"]},
    }
    limits = LoraLimits.of_pack(tmp_path, PackInfo(**fields, loras=loras))
    assert (limits.max_rank, limits.modules, limits.dtype, limits.unavailable) == (
        4,
        ("attn_q", "attn_v"),
        "bfloat16",
        None,
    )
    assert "packed without LoRA adapters" in str(LoraLimits.of_pack(tmp_path, PackInfo(**fields)).unavailable)


def test_two_workers_see_one_set(root: Path, tmp_path: Path, base_config: dict[str, Any]) -> None:
    packed = {"p": {"id": 1, "rank": 4}, "q": {"id": 2, "rank": 4}}
    one, two = (SharedAdapters(packed, tmp_path / "model", tmp_path / "run") for _ in range(2))
    assert list(two) == ["p", "q"] and two["p"]["dir"] == str(tmp_path / "model" / LORA_DIR / "p")
    adapter = _limits(base_config).check(root / "a")
    entry = one.load("t", root / "a", adapter, "bfloat16", given="a", replace=False, keep_s=60)
    assert entry["id"] == 3 and two["t"]["id"] == 3 and list(two) == ["p", "q", "t"]  # ids after the packed
    rows = np.load(Path(two["t"]["dir"]) / ROWS_WEIGHTS)
    assert rows.dtype == np.uint16 and np.load(Path(two["t"]["dir"]) / ROWS_CONFIG).shape[1] == 3
    with pytest.raises(LoadRefused, match="has already been loaded"):
        two.load("t", root / "a", adapter, "bfloat16", given="a", replace=False, keep_s=60)
    replaced = two.load("t", root / "a", adapter, "bfloat16", given="a", replace=True, keep_s=60)
    assert replaced["id"] == 4 and one["t"]["id"] == 4  # a new id: the engines cache by id
    assert Path(entry["dir"]).is_dir()  # the replaced one's files stay for requests in flight
    one.unload("t", keep_s=60)
    assert "t" not in two and "t" not in list(one)
    with pytest.raises(NotLoaded, match="cannot be found"):
        two.unload("t", keep_s=60)
    time.sleep(0.01)
    two.load("u", root / "a", adapter, "float16", given="a", replace=False, keep_s=0)  # purges what is unused
    assert not Path(entry["dir"]).exists() and not Path(replaced["dir"]).exists()
    assert one["u"]["id"] == 5 and Path(one["u"]["dir"]).is_dir()
    assert not list((tmp_path / "run" / LORA_DIR).glob(".*staged"))  # nothing half-made left


def test_llm_api_limits_are_its_model_yaml_lora_config(base_config: dict[str, Any], tmp_path: Path) -> None:
    """The llmapi flavour's limits are model.yaml's lora_config, as packed, whatever the adapters say:
    a base model packed alone with --max-lora-rank takes adapters up to that rank."""
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "config.json").write_text(json.dumps(base_config))
    model_yaml = tmp_path / "repository" / "tensorrt_llm" / "1" / "model.yaml"
    model_yaml.parent.mkdir(parents=True)
    fields: dict[str, Any] = dict(
        tag="m:v", mode="demo", backend="python", packed_root="", world_size=1, tp_size=1, pp_size=1,
        architecture="LlamaForCausalLM", dtype="float16", max_batch_size=1, max_input_len=None,
        max_seq_len=None, max_beam_width=1, flavor="llmapi",
    )  # fmt: skip
    lora = {"lora_dir": [], "max_lora_rank": 16, "lora_target_modules": ["attn_q", "attn_v"], "max_loras": 2}
    model_yaml.write_text(f"model: /m\nlora_config: {json.dumps(lora)}\n")
    packed = {"p": {"id": 1, "rank": 4, "target_modules": ["q_proj"]}}  # not what the limits come from
    for info in (PackInfo(**fields), PackInfo(**fields, loras=packed)):
        limits = LoraLimits.of_pack(tmp_path, info)
        assert (limits.max_rank, limits.modules, limits.unavailable) == (16, ("attn_q", "attn_v"), None)
    model_yaml.write_text("model: /m\nlora_config: null\n")
    assert "--max-lora-rank R" in str(LoraLimits.of_pack(tmp_path, PackInfo(**fields)).unavailable)


def test_a_bentoml_model_tag_is_an_adapter_source(tmp_path: Path, base_config: dict[str, Any]) -> None:
    """lora_path may name an adapter saved as a BentoML model (name[:version]), with or without a root."""
    from bentoml._internal.configuration.containers import BentoMLContainer
    from bentoml._internal.models import ModelStore

    store = tmp_path / "bentoml" / "models"  # the process's store is made once: this one replaces it
    store.mkdir(parents=True)
    BentoMLContainer.model_store.set(ModelStore(str(store)))
    try:
        _resolve_tags(tmp_path, base_config)
    finally:
        BentoMLContainer.model_store.reset()


def _resolve_tags(tmp_path: Path, base_config: dict[str, Any]) -> None:
    import bentoml

    with bentoml.models.create("poet-adapter") as model:
        make_adapter(Path(model.path), base_config, seed=1)
    saved = bentoml.models.get("poet-adapter")
    assert Path(saved.path).is_relative_to(tmp_path / "bentoml")  # the temporary store, nothing else
    for path, root in (("poet-adapter", None), (str(saved.tag), None), ("poet-adapter:latest", tmp_path)):
        found = resolve_source(path, root)
        assert found == Path(saved.path).resolve(), path
        assert _limits(base_config).check(found).rank == 4
