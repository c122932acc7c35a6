"""The model repository templates: filled for both engines, parsed as real Triton model configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tensorrtllm_backend.repository import (
    DEFAULTS,
    MODELS,
    RepositoryError,
    build_repository,
    fill_model_config,
    repository_values,
)

pytestmark = pytest.mark.unit

DataType = model_config_pb2.DataType

# What upstream's ensemble declares at TensorRT-LLM v1.2.1 (triton_backend/all_models/inflight_batcher_llm/
# ensemble/config.pbtxt): clients send exactly these. v0.19 named min_tokens and seed min_length and random_seed.
UPSTREAM_ENSEMBLE_INPUTS = {
    "text_input": "TYPE_STRING",
    "max_tokens": "TYPE_INT32",
    "bad_words": "TYPE_STRING",
    "stop_words": "TYPE_STRING",
    "end_id": "TYPE_INT32",
    "pad_id": "TYPE_INT32",
    "top_k": "TYPE_INT32",
    "top_p": "TYPE_FP32",
    "temperature": "TYPE_FP32",
    "length_penalty": "TYPE_FP32",
    "repetition_penalty": "TYPE_FP32",
    "min_tokens": "TYPE_INT32",
    "presence_penalty": "TYPE_FP32",
    "frequency_penalty": "TYPE_FP32",
    "seed": "TYPE_UINT64",
    "return_log_probs": "TYPE_BOOL",
    "return_context_logits": "TYPE_BOOL",
    "return_generation_logits": "TYPE_BOOL",
    "return_num_input_tokens": "TYPE_BOOL",
    "return_num_output_tokens": "TYPE_BOOL",
    "exclude_input_in_output": "TYPE_BOOL",
    "beam_width": "TYPE_INT32",
    "stream": "TYPE_BOOL",
    "embedding_bias_words": "TYPE_STRING",
    "embedding_bias_weights": "TYPE_FP32",
}
REQUIRED_ENSEMBLE_INPUTS = {"text_input"}  # max_tokens is checked by preprocessing (see ensemble config)
ENSEMBLE_OUTPUTS = {
    "text_output": "TYPE_STRING",
    "cum_log_probs": "TYPE_FP32",
    "output_log_probs": "TYPE_FP32",
    "context_logits": "TYPE_FP32",
    "generation_logits": "TYPE_FP32",
    "num_input_tokens": "TYPE_INT32",
    "num_output_tokens": "TYPE_INT32",
}

# The C++ backend's contract at v1.2.1 (NVIDIA's tensorrt_llm/config.pbtxt, a subset: what we send and read).
ENGINE_INPUTS = {
    "input_ids": "TYPE_INT32",
    "input_lengths": "TYPE_INT32",
    "request_output_len": "TYPE_INT32",
    "end_id": "TYPE_INT32",
    "pad_id": "TYPE_INT32",
    "streaming": "TYPE_BOOL",
    "temperature": "TYPE_FP32",
    "runtime_top_k": "TYPE_INT32",
    "runtime_top_p": "TYPE_FP32",
    "len_penalty": "TYPE_FP32",
    "repetition_penalty": "TYPE_FP32",
    "presence_penalty": "TYPE_FP32",
    "frequency_penalty": "TYPE_FP32",
    "min_tokens": "TYPE_INT32",
    "seed": "TYPE_UINT64",
    "beam_width": "TYPE_INT32",
    "stop_words_list": "TYPE_INT32",
    "bad_words_list": "TYPE_INT32",
    "embedding_bias": "TYPE_FP32",
    "return_log_probs": "TYPE_BOOL",
    "return_context_logits": "TYPE_BOOL",
    "return_generation_logits": "TYPE_BOOL",
    "stop": "TYPE_BOOL",
    "lora_task_id": "TYPE_UINT64",
    "lora_config": "TYPE_INT32",
    "return_perf_metrics": "TYPE_BOOL",
    "return_num_input_tokens": "TYPE_BOOL",
    "return_num_output_tokens": "TYPE_BOOL",
    "exclude_input_in_output": "TYPE_BOOL",
    "guided_decoding_guide_type": "TYPE_STRING",
    "guided_decoding_guide": "TYPE_STRING",
    "num_return_sequences": "TYPE_INT32",
}
ENGINE_OUTPUTS = {
    "output_ids": "TYPE_INT32",
    "sequence_length": "TYPE_INT32",
    "cum_log_probs": "TYPE_FP32",
    "output_log_probs": "TYPE_FP32",
    "num_input_tokens": "TYPE_INT32",
    "num_output_tokens": "TYPE_INT32",
    "kv_cache_reused_blocks": "TYPE_INT32",
}
ENGINE_REQUIRED_INPUTS = {"input_lengths", "request_output_len"}  # everything else optional, input_ids too

# Runtime knobs of the C++ backend (REFERENCE.md section 4): parameter key -> template variable.
ENGINE_KNOBS = {
    "gpt_model_type": "batching_strategy",
    "gpt_model_path": "engine_dir",
    "max_beam_width": "max_beam_width",
    "max_tokens_in_paged_kv_cache": "max_tokens_in_paged_kv_cache",
    "max_attention_window_size": "max_attention_window_size",
    "sink_token_length": "sink_token_length",
    "batch_scheduler_policy": "batch_scheduler_policy",
    "kv_cache_free_gpu_mem_fraction": "kv_cache_free_gpu_mem_fraction",
    "kv_cache_host_memory_bytes": "kv_cache_host_memory_bytes",
    "exclude_input_in_output": "exclude_input_in_output",
    "cancellation_check_period_ms": "cancellation_check_period_ms",
    "enable_kv_cache_reuse": "enable_kv_cache_reuse",
    "normalize_log_probs": "normalize_log_probs",
    "enable_chunked_context": "enable_chunked_context",
    "gpu_device_ids": "gpu_device_ids",
    "decoding_mode": "decoding_mode",
    "multi_block_mode": "multi_block_mode",
    "lora_cache_optimal_adapter_size": "lora_cache_optimal_adapter_size",
    "lora_cache_max_adapter_size": "lora_cache_max_adapter_size",
    "lora_cache_gpu_memory_fraction": "lora_cache_gpu_memory_fraction",
    "lora_cache_host_memory_bytes": "lora_cache_host_memory_bytes",
}


def parse(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def dtype_name(value: int) -> str:
    return DataType.Name(value)


@pytest.fixture(params=["python", "tensorrtllm"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def values(tmp_path: Path, backend: str) -> dict[str, str]:
    engine, tokenizer = tmp_path / "engine", tmp_path / "tokenizer"
    engine.mkdir()
    tokenizer.mkdir()
    return repository_values(engine_dir=engine, tokenizer_dir=tokenizer, backend=backend)


@pytest.fixture
def configs(values: dict[str, str]) -> dict[str, model_config_pb2.ModelConfig]:
    return {model: parse(fill_model_config(model, values)) for model in MODELS}


def inputs_of(config: model_config_pb2.ModelConfig) -> dict[str, model_config_pb2.ModelInput]:
    return {item.name: item for item in config.input}


def outputs_of(config: model_config_pb2.ModelConfig) -> dict[str, model_config_pb2.ModelOutput]:
    return {item.name: item for item in config.output}


def test_every_model_fills_and_parses(configs: dict[str, model_config_pb2.ModelConfig]) -> None:
    assert set(configs) == {"ensemble", "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls"}
    for name, config in configs.items():
        assert config.name == name
        assert config.max_batch_size == int(DEFAULTS["triton_max_batch_size"])


def test_ensemble_inputs_match_upstream(configs: dict[str, model_config_pb2.ModelConfig]) -> None:
    declared = inputs_of(configs["ensemble"])
    assert configs["ensemble"].platform == "ensemble"
    for name, dtype in UPSTREAM_ENSEMBLE_INPUTS.items():
        assert name in declared, f"ensemble lacks upstream input {name}"
        assert dtype_name(declared[name].data_type) == dtype, name
        assert declared[name].optional == (name not in REQUIRED_ENSEMBLE_INPUTS), name
    # Scalars are [1] per batch row (clients send [1, 1]); word lists are variable length.
    for name in ("text_input", "max_tokens", "stream", "temperature", "top_k", "seed"):
        assert list(declared[name].dims) == [1], name
    for name in ("stop_words", "bad_words", "embedding_bias_words", "embedding_bias_weights"):
        assert list(declared[name].dims) == [-1], name


def test_ensemble_outputs(configs: dict[str, model_config_pb2.ModelConfig]) -> None:
    declared = outputs_of(configs["ensemble"])
    for name, dtype in ENSEMBLE_OUTPUTS.items():
        assert name in declared, f"ensemble lacks output {name}"
        assert dtype_name(declared[name].data_type) == dtype, name


def test_bls_declares_what_the_ensemble_declares(tmp_path: Path) -> None:
    """A client switches between `ensemble` and `tensorrt_llm_bls` by name only (upstream's client
    offers both): the BLS config says "Same inputs and outputs as the ensemble"."""
    values = repository_values(engine_dir=tmp_path, tokenizer_dir=tmp_path)
    ensemble = parse(fill_model_config("ensemble", values))
    bls = parse(fill_model_config("tensorrt_llm_bls", values))
    ensemble_inputs = {n: (dtype_name(i.data_type), i.optional) for n, i in inputs_of(ensemble).items()}
    bls_inputs = {n: (dtype_name(i.data_type), i.optional) for n, i in inputs_of(bls).items()}
    assert bls_inputs == ensemble_inputs
    ensemble_outputs = {n: dtype_name(o.data_type) for n, o in outputs_of(ensemble).items()}
    assert {n: dtype_name(o.data_type) for n, o in outputs_of(bls).items()} == ensemble_outputs
    assert bls.model_transaction_policy.decoupled


def test_engine_contract(configs: dict[str, model_config_pb2.ModelConfig], backend: str) -> None:
    engine = configs["tensorrt_llm"]
    assert engine.backend == backend
    assert engine.model_transaction_policy.decoupled is True
    declared, produced = inputs_of(engine), outputs_of(engine)
    for name, dtype in ENGINE_INPUTS.items():
        assert name in declared, f"tensorrt_llm lacks input {name}"
        assert dtype_name(declared[name].data_type) == dtype, name
    for name, item in declared.items():
        assert item.optional == (name not in ENGINE_REQUIRED_INPUTS), name
    assert list(declared["stop_words_list"].dims) == [2, -1]
    assert list(declared["bad_words_list"].dims) == [2, -1]
    for name, dtype in ENGINE_OUTPUTS.items():
        assert name in produced, f"tensorrt_llm lacks output {name}"
        assert dtype_name(produced[name].data_type) == dtype, name


def test_tensorrtllm_engine_has_every_runtime_knob(tmp_path: Path) -> None:
    engine_dir, tokenizer_dir = tmp_path / "engine", tmp_path / "tokenizer"
    engine_dir.mkdir()
    tokenizer_dir.mkdir()
    defaults = repository_values(engine_dir=engine_dir, tokenizer_dir=tokenizer_dir, backend="tensorrtllm")
    config = parse(fill_model_config("tensorrt_llm", defaults))
    assert config.backend == "tensorrtllm"
    assert config.model_transaction_policy.decoupled is True
    params = {key: value.string_value for key, value in config.parameters.items()}
    for key in ENGINE_KNOBS:
        assert key in params, f"tensorrt_llm lacks parameter {key}"
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["gpt_model_path"] == str(engine_dir.resolve())
    assert params["exclude_input_in_output"] == "true"
    assert params["batch_scheduler_policy"] in {"max_utilization", "guaranteed_no_evict"}
    assert params["cancellation_check_period_ms"] == "100"

    # Each knob is wired to its own variable: a value given for it lands in that parameter.
    overrides = {var: f"value-of-{var}" for key, var in ENGINE_KNOBS.items() if var != "engine_dir"}
    filled = repository_values(
        engine_dir=engine_dir, tokenizer_dir=tokenizer_dir, backend="tensorrtllm", overrides=overrides
    )
    params = {
        k: v.string_value for k, v in parse(fill_model_config("tensorrt_llm", filled)).parameters.items()
    }
    for key, var in ENGINE_KNOBS.items():
        expected = str(engine_dir.resolve()) if var == "engine_dir" else f"value-of-{var}"
        assert params[key] == expected, key


def test_tensorrtllm_repository_has_no_python_engine(tmp_path: Path) -> None:
    values = repository_values(engine_dir=tmp_path, tokenizer_dir=tmp_path, backend="tensorrtllm")
    repo = build_repository(tmp_path / "repo", values)
    assert not (repo / "tensorrt_llm" / "1" / "model.py").exists()
    assert (repo / "tensorrt_llm" / "1").is_dir()
    for model in ("preprocessing", "postprocessing", "tensorrt_llm_bls"):
        assert (repo / model / "1" / "model.py").is_file(), model
    python_repo = build_repository(
        tmp_path / "python-repo", repository_values(engine_dir=tmp_path, tokenizer_dir=tmp_path)
    )
    assert (python_repo / "tensorrt_llm" / "1" / "model.py").is_file()


def test_pre_and_postprocessing_parameters(configs: dict[str, model_config_pb2.ModelConfig], values) -> None:
    for model in ("preprocessing", "postprocessing"):
        params = {k: v.string_value for k, v in configs[model].parameters.items()}
        assert params["tokenizer_dir"] == values["tokenizer_dir"], model
    pre = {k: v.string_value for k, v in configs["preprocessing"].parameters.items()}
    assert pre["add_special_tokens"] == "true"
    post = {k: v.string_value for k, v in configs["postprocessing"].parameters.items()}
    assert post["skip_special_tokens"] == "true"
    bls = {k: v.string_value for k, v in configs["tensorrt_llm_bls"].parameters.items()}
    assert bls["accumulate_tokens"] == "false"
    assert bls["tensorrt_llm_model_name"] == "tensorrt_llm"


def test_ensemble_steps_are_wired_consistently(configs: dict[str, model_config_pb2.ModelConfig]) -> None:
    """Every input_map/output_map key is a real tensor of the step's model, every value is an
    ensemble input or an earlier step's output, and the data types agree along every edge."""
    ensemble = configs["ensemble"]
    available = {name: item.data_type for name, item in inputs_of(ensemble).items()}
    steps = ensemble.ensemble_scheduling.step
    assert [step.model_name for step in steps] == ["preprocessing", "tensorrt_llm", "postprocessing"]
    for step in steps:
        target = configs[step.model_name]
        target_inputs, target_outputs = inputs_of(target), outputs_of(target)
        assert step.input_map, step.model_name
        for key, value in step.input_map.items():
            assert key in target_inputs, f"{step.model_name} has no input {key}"
            assert value in available, f"{step.model_name}.{key} <- {value}: nothing produces {value}"
            assert available[value] == target_inputs[key].data_type, f"{step.model_name}.{key} <- {value}"
        mapped = set(step.input_map)
        for name, item in target_inputs.items():
            assert item.optional or name in mapped, f"{step.model_name}: required input {name} is not mapped"
        for key, value in step.output_map.items():
            assert key in target_outputs, f"{step.model_name} has no output {key}"
            available[value] = target_outputs[key].data_type
    for name, item in outputs_of(ensemble).items():
        assert name in available, f"no step produces ensemble output {name}"
        assert available[name] == item.data_type, name


def test_missing_structural_value_raises(values: dict[str, str]) -> None:
    for key in ("triton_max_batch_size", "decoupled_mode", "preprocessing_instance_count"):
        broken = {k: v for k, v in values.items() if k != key}
        model = {
            "triton_max_batch_size": "ensemble",
            "decoupled_mode": "tensorrt_llm",
            "preprocessing_instance_count": "preprocessing",
        }[key]
        with pytest.raises(RepositoryError, match=key):
            fill_model_config(model, broken)
    without_backend = {k: v for k, v in values.items() if k != "triton_backend"}
    with pytest.raises(RepositoryError, match="triton_backend"):
        fill_model_config("tensorrt_llm", without_backend)


def test_unfilled_parameter_values_are_allowed(values: dict[str, str]) -> None:
    """Parameters left as `${var}` fall back to backend defaults; they do not break the config."""
    assert "max_tokens_in_paged_kv_cache" not in values
    config = parse(fill_model_config("tensorrt_llm", values))
    assert config.parameters["max_tokens_in_paged_kv_cache"].string_value == "${max_tokens_in_paged_kv_cache}"


def test_unknown_backend_raises(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="onnxruntime"):
        repository_values(engine_dir=tmp_path, tokenizer_dir=tmp_path, backend="onnxruntime")


def test_build_repository_refuses_before_writing(tmp_path: Path) -> None:
    values = repository_values(engine_dir=tmp_path, tokenizer_dir=tmp_path)
    del values["bls_instance_count"]
    with pytest.raises(RepositoryError, match="bls_instance_count"):
        build_repository(tmp_path / "repo", values)
    assert not (tmp_path / "repo").exists()
