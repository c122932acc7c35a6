"""The nested LLM API configs users set most, as TensorRT-LLM 1.2.1 declares them
(tensorrtllm_backend/nvidia_llmapi.py): cuda_graph_config, scheduler_config, attention_dp_config,
moe_config and speculative_config by its decoding_type. Unknown keys at any depth are refused with the
nearest valid key; values are pydantic's to refuse, condensed to one line."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tensorrtllm_backend import nvidia_llmapi as nv


def _validate(**args: object) -> object:
    return nv.validate_llm_args({"model": "/m", **args})


def _error(**args: object) -> str:
    with pytest.raises(ValidationError) as info:
        _validate(**args)
    return nv.describe_validation_error(info.value)


def test_nested_configs_validate_to_objects() -> None:
    args = _validate(
        cuda_graph_config={"enable_padding": True, "max_batch_size": 64},
        scheduler_config={
            "capacity_scheduler_policy": "MAX_UTILIZATION",
            "context_chunking_policy": "EQUAL_PROGRESS",
            "dynamic_batch_config": {"enable_batch_size_tuning": False},
        },
        attention_dp_config={"enable_balance": True, "timeout_iters": 10},
        moe_config={"backend": "TRTLLM", "max_num_tokens": 3200},
    )
    assert args.cuda_graph_config.enable_padding and args.cuda_graph_config.max_batch_size == 64
    assert args.scheduler_config.dynamic_batch_config.enable_batch_size_tuning is False
    assert args.attention_dp_config.batching_wait_iters == 10
    assert args.moe_config.backend == "TRTLLM"
    assert _validate(cuda_graph_config=None).cuda_graph_config is None  # null turns CUDA graphs off


@pytest.mark.parametrize(
    ("config", "kind", "fields"),
    [
        (
            {
                "decoding_type": "NGram",
                "max_draft_len": 4,
                "max_matching_ngram_size": 2,
                "is_keep_all": False,
            },
            "NGramDecodingConfig",
            {"max_draft_len": 4, "max_matching_ngram_size": 2, "is_keep_all": False, "is_public_pool": True},
        ),
        (
            {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model_dir": "/draft"},
            "EagleDecodingConfig",
            {"speculative_model": "/draft", "eagle3_one_model": True},
        ),
        (
            {"decoding_type": "MTP", "num_nextn_predict_layers": 3},
            "MTPDecodingConfig",
            {"num_nextn_predict_layers": 3, "use_relaxed_acceptance_for_thinking": False},
        ),
        (
            {"decoding_type": "DraftTarget", "max_draft_len": 2, "speculative_model": "/draft"},
            "DraftTargetDecodingConfig",
            {"max_draft_len": 2},
        ),
    ],
)
def test_speculative_config_is_the_object_of_its_decoding_type(
    config: dict[str, object], kind: str, fields: dict[str, object]
) -> None:
    spec = _validate(speculative_config=config).speculative_config
    assert type(spec).__name__ == kind and spec.decoding_type == config["decoding_type"]
    for name, value in fields.items():
        assert getattr(spec, name) == value, name


def test_speculative_config_refusals_are_121s() -> None:
    assert _error(speculative_config={"decoding_type": "NGram", "max_draft_len": 4}) == (
        "speculative_config: max_draft_len > 0 and max_matching_ngram_size > 0 are required for NGram"
    )
    assert _error(speculative_config={"decoding_type": "Eagle", "speculative_model": "/d"}) == (
        "speculative_config: max_draft_len is required for Eagle"
    )
    assert _error(speculative_config={"decoding_type": "Eagle", "max_draft_len": 3}) == (
        "speculative_config: Draft model must be provided for EAGLE"
    )
    assert "max_matching_ngram_size: Input should be a valid integer" in _error(
        speculative_config={"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": "x"}
    )
    assert _error(moe_config={"backend": "AUTO"}).startswith("moe_config.backend: Input should be 'CUTLASS'")


def test_key_errors_name_the_dotted_key_and_the_nearest() -> None:
    assert nv.key_errors(
        {
            "max_batch_sise": 8,
            "kv_cache_config": {"free_gpu_mem_fraction": 0.5},
            "cuda_graph_config": {"enable_paddding": True},
            "scheduler_config": {"dynamic_batch_config": {"enable_batch_size_tunning": True}},
            "speculative_config": {"decoding_type": "NGram", "max_matching_ngram": 2},
            "zzz": 1,
        }
    ) == [
        "max_batch_sise is not an LLM API argument at TensorRT-LLM 1.2.1; did you mean max_batch_size?",
        "kv_cache_config.free_gpu_mem_fraction is not an LLM API argument at TensorRT-LLM 1.2.1; "
        "did you mean kv_cache_config.free_gpu_memory_fraction?",
        "cuda_graph_config.enable_paddding is not an LLM API argument at TensorRT-LLM 1.2.1; "
        "did you mean cuda_graph_config.enable_padding?",
        "scheduler_config.dynamic_batch_config.enable_batch_size_tunning is not an LLM API argument at "
        "TensorRT-LLM 1.2.1; did you mean scheduler_config.dynamic_batch_config.enable_batch_size_tuning?",
        "speculative_config.max_matching_ngram is not an LLM API argument at TensorRT-LLM 1.2.1; "
        "did you mean speculative_config.max_matching_ngram_size?",
        "zzz is not an LLM API argument at TensorRT-LLM 1.2.1",
    ]


def test_decoding_types_are_121s_spellings() -> None:
    assert nv.key_errors({"speculative_config": {"decoding_type": "Ngram"}}) == [
        "speculative_config.decoding_type Ngram is not a decoding type of TensorRT-LLM 1.2.1 "
        "(NGram, Eagle, MTP, DraftTarget, AUTO); did you mean NGram?"
    ]
    # Eagle3 as a decoding type arrives after 1.2.1: there, Eagle serves EAGLE-3 drafts
    assert nv.key_errors({"speculative_config": {"decoding_type": "Eagle3"}})[0].endswith(
        "did you mean Eagle?"
    )
    assert "missing" in nv.key_errors({"speculative_config": {"max_draft_len": 2}})[0]
    assert (
        "TensorRT engine backend only"
        in nv.key_errors({"speculative_config": {"decoding_type": "Medusa"}})[0]
    )
    assert nv.key_errors({"build_config": {}}) == [f"build_config: {nv.REFUSED_LLM_ARGS['build_config']}"]


def test_estimated_keys_are_told_apart() -> None:
    config = {"scheduler_config": {"waiting_queue_policy": "FCFS"}, "env_overrides": {}}
    assert nv.key_errors(config) == []
    assert nv.estimated_keys(config) == ["scheduler_config.waiting_queue_policy", "env_overrides"]
    assert nv.unknown_keys(config) == ["scheduler_config.waiting_queue_policy", "env_overrides"]
