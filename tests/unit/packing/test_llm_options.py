"""pack_model.py --config / --set (trtllm_service.packing.llm_options): a trtllm-serve YAML from
NVIDIA's 1.2.1 documentation packs unchanged; an unknown, misspelt or refused key at any depth is one
line naming where it came from; the merge into model.yaml is 1.2.1's update_llm_args_with_extra_dict."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tensorrtllm_backend import nvidia_llmapi as nv
from tensorrtllm_backend.repository import merge_llm_options, repository_values
from trtllm_service.packed_model import PackInfo, flatten_options
from trtllm_service.packing.llm_options import (
    LlmOptions,
    LlmOptionsError,
    check_model_yaml,
    estimated,
    load_llm_options,
    parse_set,
)
from trtllm_service.packing.options import RuntimeOptions
from trtllm_service.packing.sources import read_hf_checkpoint

# ---- trtllm-serve YAMLs from NVIDIA's documentation at 1.2.1, unchanged ----------------------------------
# Read from the documentation NVIDIA publishes for the tag (NVIDIA/TensorRT-LLM gh-pages 58fb435e, the
# 1.2.1/ tree): the "Show code" blocks of the deployment guides (examples/configs/curated/*.yaml as
# rendered there) and the YAML of the speculative decoding feature page.

NVIDIA_YAMLS: dict[str, str] = {
    # 1.2.1/deployment-guide/deployment-guide-for-deepseek-r1-on-trtllm.html
    # (docs/source/deployment-guide/deployment-guide-for-deepseek-r1-on-trtllm.md,
    # examples/configs/curated/deepseek-r1-throughput.yaml)
    "deepseek-r1-throughput": """\
max_batch_size: 1024
max_num_tokens: 3200
kv_cache_free_gpu_memory_fraction: 0.8
tensor_parallel_size: 8
moe_expert_parallel_size: 8
trust_remote_code: true
enable_attention_dp: true
cuda_graph_config:
  enable_padding: true
  max_batch_size: 128
kv_cache_config:
  dtype: fp8
stream_interval: 10
speculative_config:
  decoding_type: MTP
  num_nextn_predict_layers: 1
""",
    # the same guide, for the DeepGEMM MoE backend (examples/configs/curated/deepseek-r1-deepgemm.yaml)
    "deepseek-r1-deepgemm": """\
max_batch_size: 1024
max_num_tokens: 3200
kv_cache_free_gpu_memory_fraction: 0.8
tensor_parallel_size: 8
moe_expert_parallel_size: 8
trust_remote_code: true
enable_attention_dp: true
cuda_graph_config:
  enable_padding: true
  max_batch_size: 128
kv_cache_config:
  dtype: fp8
stream_interval: 10
speculative_config:
  decoding_type: MTP
  num_nextn_predict_layers: 1
moe_config:
  backend: DEEPGEMM
  max_num_tokens: 3200
""",
    # 1.2.1/deployment-guide/deployment-guide-for-gpt-oss-on-trtllm.html, max-throughput
    # (docs/source/deployment-guide/deployment-guide-for-gpt-oss-on-trtllm.md,
    # examples/configs/curated/gpt-oss-120b-throughput.yaml)
    "gpt-oss-120b-throughput": """\
max_batch_size: 720 # Depends on max_sequence_length
max_num_tokens: 16384
kv_cache_free_gpu_memory_fraction: 0.9
tensor_parallel_size: 2
moe_expert_parallel_size: 2
trust_remote_code: true
enable_attention_dp: true
cuda_graph_config:
  enable_padding: true
  max_batch_size: 720
moe_config:
  backend: TRTLLM
stream_interval: 20
num_postprocess_workers: 4
attention_dp_config:
  enable_balance: true
  batching_wait_iters: 50
  timeout_iters: 1
""",
    # 1.2.1/features/speculative-decoding.html, "Usage with trtllm-bench and trtllm-serve", local path
    # (docs/source/features/speculative-decoding.md)
    "speculative-eagle3": """\
# Or using a local path
disable_overlap_scheduler: true
speculative_config:
  decoding_type: Eagle
  max_draft_len: 4
  speculative_model: /path/to/draft/model
""",
}


def _file(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _filled_model_yaml(demo_model_dir: Path, options: RuntimeOptions | None = None) -> str:
    from tensorrtllm_backend import LLMAPI_TEMPLATES_DIR
    from tensorrtllm_backend.tools.fill_template import fill_text, placeholders

    source = read_hf_checkpoint(demo_model_dir, mode="demo")
    values = repository_values(
        engine_dir=demo_model_dir,
        tokenizer_dir=demo_model_dir,
        overrides={"end_ids": "1", **(options or RuntimeOptions()).template_values(source)},
    )
    text = (LLMAPI_TEMPLATES_DIR / "tensorrt_llm" / "1" / "model.yaml").read_text()
    return fill_text(text, {k: values[k] for k in placeholders(text)}, source="model.yaml")


@pytest.mark.parametrize("name", sorted(NVIDIA_YAMLS))
def test_nvidia_yaml_packs_unchanged(tmp_path: Path, demo_model_dir: Path, name: str) -> None:
    path = _file(tmp_path, NVIDIA_YAMLS[name])
    loaded = load_llm_options(path)
    assert estimated(loaded) == []  # every key is read at the tag or in both versions around it
    given = yaml.safe_load(NVIDIA_YAMLS[name])
    if "kv_cache_free_gpu_memory_fraction" in given:  # trtllm-serve's option name, as its flag applies it
        assert loaded.options["kv_cache_config"]["free_gpu_memory_fraction"] == given.pop(
            "kv_cache_free_gpu_memory_fraction"
        )
        assert "kv_cache_free_gpu_memory_fraction" not in loaded.options
    for key, value in given.items():
        if key != "kv_cache_config":
            assert loaded.options[key] == value, key
    runtime = RuntimeOptions(**loaded.flag_values())
    text = merge_llm_options(_filled_model_yaml(demo_model_dir, runtime), loaded.model_yaml_options())
    check_model_yaml(text, loaded)
    merged = yaml.safe_load(text)
    assert merged["triton_config"]["engine"] == "tensorrt_llm"
    assert merged["tensor_parallel_size"] == given.get("tensor_parallel_size", 1)
    args = nv.validate_llm_args(nv.drop_nulls({k: v for k, v in merged.items() if k != "triton_config"}))
    if "speculative_config" in given:
        assert args.speculative_config.decoding_type == given["speculative_config"]["decoding_type"]


def test_kv_cache_config_is_deep_merged_the_rest_replaced(demo_model_dir: Path) -> None:
    base = _filled_model_yaml(
        demo_model_dir, RuntimeOptions(kv_cache_free_gpu_mem_fraction=0.5, enable_kv_cache_reuse=True)
    )
    text = merge_llm_options(
        base,
        {"kv_cache_config": {"dtype": "fp8"}, "cuda_graph_config": {"enable_padding": True}},
    )
    merged = yaml.safe_load(text)
    assert merged["kv_cache_config"] == {
        "free_gpu_memory_fraction": 0.5,
        "enable_block_reuse": True,
        "dtype": "fp8",
    }
    assert merged["cuda_graph_config"] == {"enable_padding": True}
    assert text.count("\ncuda_graph_config:") == 1 and text.count("\nkv_cache_config:") == 1
    assert list(merged)[-1] == "triton_config"
    assert merge_llm_options(base, {}) == base


def test_set_overrides_the_file_and_parses_yaml(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        "kv_cache_config:\n  free_gpu_memory_fraction: 0.8\n  dtype: fp8\nenable_chunked_prefill: false\n",
    )
    loaded = load_llm_options(
        path,
        [
            "kv_cache_config.free_gpu_memory_fraction=0.7",
            "enable_chunked_prefill=true",
            "speculative_config={decoding_type: NGram, max_draft_len: 4, max_matching_ngram_size: 2}",
        ],
    )
    assert loaded.options == {
        "kv_cache_config": {"free_gpu_memory_fraction": 0.7, "dtype": "fp8"},
        "enable_chunked_prefill": True,
        "speculative_config": {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 2},
    }
    assert loaded.sources[0] == f"--config {path}" and len(loaded.sources) == 4
    assert parse_set("a.b=[1, 2]") == (["a", "b"], [1, 2])
    assert parse_set("a=") == (["a"], None)
    # the trtllm-serve name yields to the file's own kv_cache_config key
    both = load_llm_options(
        _file(
            tmp_path,
            "kv_cache_free_gpu_memory_fraction: 0.9\nkv_cache_config: {free_gpu_memory_fraction: 0.6}\n",
        )
    )
    assert both.options == {"kv_cache_config": {"free_gpu_memory_fraction": 0.6}}


def test_flag_fields_replace_the_flags() -> None:
    loaded = LlmOptions({"tensor_parallel_size": 2, "max_batch_size": 16, "enable_chunked_prefill": True})
    assert loaded.flag_values() == {"tp_size": 2, "max_batch_size": 16}
    assert loaded.model_yaml_options() == {"enable_chunked_prefill": True}


@pytest.mark.parametrize(
    ("text", "sets", "line"),
    [
        (
            "kv_cache_config:\n  free_gpu_mem_fraction: 0.7\n",
            [],
            "--config {path}: kv_cache_config.free_gpu_mem_fraction is not an LLM API argument at "
            "TensorRT-LLM 1.2.1; did you mean kv_cache_config.free_gpu_memory_fraction?",
        ),
        (
            "max_num_token: 4096\n",
            [],
            "--config {path}: max_num_token is not an LLM API argument at TensorRT-LLM 1.2.1; "
            "did you mean max_num_tokens?",
        ),
        (
            "speculative_config:\n  decoding_type: NGram\n  max_draft_len: 4\n  max_matching_ngram_sise: 2\n",
            [],
            "--config {path}: speculative_config.max_matching_ngram_sise is not an LLM API argument at "
            "TensorRT-LLM 1.2.1; did you mean speculative_config.max_matching_ngram_size?",
        ),
        (
            "",
            ["cuda_graph_config.enable_paddding=true"],
            "--set cuda_graph_config.enable_paddding=true: cuda_graph_config.enable_paddding is not an LLM "
            "API argument at TensorRT-LLM 1.2.1; did you mean cuda_graph_config.enable_padding?",
        ),
        (
            "speculative_config: {decoding_type: Ngram, max_draft_len: 4}\n",
            [],
            "--config {path}: speculative_config.decoding_type Ngram is not a decoding type of TensorRT-LLM "
            "1.2.1 (NGram, Eagle, MTP, DraftTarget, AUTO); did you mean NGram?",
        ),
        (
            "kv_cache_config:\n  free_gpu_memory_fraction: 1.5\n",
            [],
            "--config {path}: kv_cache_config.free_gpu_memory_fraction: Input should be less than or "
            "equal to 1 (got 1.5)",
        ),
        (
            "max_batch_size: lots\n",
            [],
            "--config {path}: max_batch_size: Input should be a valid integer, unable to parse string as "
            "an integer (got 'lots')",
        ),
        (
            "triton_config:\n  engine: reference\n",
            [],
            "--config {path}: triton_config is not an LLM API argument: it is Triton's and the service's "
            "part of model.yaml, which pack_model.py's flags set",
        ),
        (
            "",
            ["model=/elsewhere"],
            "--set model=/elsewhere: model is the packed checkpoint (--hf-model DIR or --demo), not a setting",
        ),
        (
            "lora_config: {max_lora_rank: 8}\n",
            [],
            "--config {path}: lora_config is the packed adapters': pack them with --lora NAME=DIR "
            "(--lora-cache-adapters sets max_loras, --max-lora-rank R max_lora_rank)",
        ),
        (
            "backend: tensorrt\n",
            [],
            "--config {path}: backend 'tensorrt': the llmapi flavour serves the PyTorch backend (pytorch)",
        ),
        ("- a\n- b\n", [], "--config {path}: holds a list, not a mapping of LLM API arguments"),
        (
            "",
            ["guided_decoding_backend="],
            "--set guided_decoding_backend=: guided_decoding_backend null turns grammar-guided decoding off, "
            "which a packed llmapi model always serves (response_format, tools): use llguidance or xgrammar",
        ),
        ("", ["nokey"], "--set takes KEY=VALUE (KEY dotted: kv_cache_config.dtype=fp8), got 'nokey'"),
        (
            "kv_cache_config: 0.5\n",
            ["kv_cache_config.dtype=fp8"],
            "--set kv_cache_config.dtype=fp8: kv_cache_config is 0.5, not a mapping",
        ),
    ],
)
def test_bad_options_are_one_line(tmp_path: Path, text: str, sets: list[str], line: str) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(LlmOptionsError) as info:
        load_llm_options(path, sets)
    message = str(info.value)
    assert "\n" not in message
    assert message == line.format(path=path)


def test_estimated_keys_are_warned_about(tmp_path: Path) -> None:
    loaded = load_llm_options(_file(tmp_path, "scheduler_config:\n  waiting_queue_policy: FCFS\n"))
    assert estimated(loaded) == [
        f"--config {tmp_path / 'config.yaml'}: scheduler_config.waiting_queue_policy is in only one of the "
        "TensorRT-LLM versions read around 1.2.1 (estimated): the real image may refuse it"
    ]


def test_pack_info_keeps_and_tells_them() -> None:
    info = PackInfo.from_dict(
        {
            "tag": "m:1",
            "mode": "demo",
            "backend": "python",
            "packed_root": "/m",
            "world_size": 1,
            "tp_size": 1,
            "pp_size": 1,
            "architecture": "LlamaForCausalLM",
            "dtype": "float32",
            "max_batch_size": 8,
            "max_input_len": None,
            "max_seq_len": None,
            "max_beam_width": 1,
            "llm_options": {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 4}},
            "llm_options_from": ["--config x.yaml"],
        }
    )
    assert info.llm_options_line() == (
        "LLM API options from --config x.yaml: speculative_config.decoding_type=NGram, "
        "speculative_config.max_draft_len=4"
    )
    older = PackInfo.from_dict({**info.__dict__, "llm_options": {}, "llm_options_from": []})
    assert older.llm_options_line() is None
    assert flatten_options({"a": None, "b": [1, 2], "c": {}, "d": True}) == [
        "a=null",
        "b=[1, 2]",
        "c={}",
        "d=true",
    ]
