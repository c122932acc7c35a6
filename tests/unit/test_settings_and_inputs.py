"""Settings from the environment, and the tensors a request becomes."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from trtllm_service.sampling import SamplingParams
from trtllm_service.settings import Settings, SettingsError
from trtllm_service.stream import _error_from, build_inputs


def test_defaults_work_on_a_fresh_machine() -> None:
    settings = Settings.from_env({})
    assert settings.triton_host == "127.0.0.1"
    assert (settings.triton_grpc_port, settings.triton_http_port, settings.triton_metrics_port) == (0, 0, 0)
    assert settings.api_keys == ()
    assert settings.model_tag is None


def test_environment_overrides_and_key_splitting() -> None:
    settings = Settings.from_env(
        {
            "TRITON_GRPC_PORT": "9001",
            "TRTLLM_API_KEYS": " k1, k2 ,,",
            "TRTLLM_MODEL": "m:v",
            "TRITON_LOG_VERBOSE": "true",
        }
    )
    assert settings.triton_grpc_port == 9001
    assert settings.api_keys == ("k1", "k2")
    assert settings.model_tag == "m:v"
    assert settings.triton_log_verbose is True


def test_bad_values_name_the_variable() -> None:
    with pytest.raises(SettingsError, match="TRITON_GRPC_PORT"):
        Settings.from_env({"TRITON_GRPC_PORT": "70000"})
    with pytest.raises(SettingsError, match="TRITON_STARTUP_TIMEOUT"):
        Settings.from_env({"TRITON_STARTUP_TIMEOUT": "soon"})


def test_api_keys_never_appear_in_repr() -> None:
    settings = Settings.from_env({"TRTLLM_API_KEYS": "secret-one,secret-two"})
    assert "secret" not in repr(settings) and "secret" not in str(settings)
    assert "2 keys" in repr(settings)


def _tensors(prompt: str, params: SamplingParams, max_tokens: int) -> dict[str, np.ndarray]:
    out = {}
    for infer_input in build_inputs(prompt, params, max_tokens):
        # InferInput keeps the serialized bytes; read back what we set through its protobuf.
        tensor = infer_input._get_tensor()
        out[tensor.name] = (tensor.datatype, list(tensor.shape))
    return out


def test_every_scalar_is_sent_as_a_1x1_tensor_with_upstream_names() -> None:
    sent = _tensors(
        "hi", SamplingParams(temperature=0.7, top_p=0.9, top_k=40, seed=3, presence_penalty=0.5), 16
    )
    assert sent["text_input"] == ("BYTES", [1, 1])
    assert sent["max_tokens"] == ("INT32", [1, 1])
    assert sent["stream"] == ("BOOL", [1, 1])
    assert sent["temperature"] == ("FP32", [1, 1])
    assert sent["top_p"] == ("FP32", [1, 1])
    assert sent["top_k"] == ("INT32", [1, 1])
    assert sent["random_seed"] == ("UINT64", [1, 1])
    assert sent["presence_penalty"] == ("FP32", [1, 1])
    assert "end_id" not in sent


def test_temperature_zero_is_greedy_and_the_default_samples() -> None:
    greedy = _tensors("hi", SamplingParams(temperature=0.0), 8)
    assert "temperature" not in greedy and greedy["top_k"] == ("INT32", [1, 1])
    default = _tensors("hi", SamplingParams(), 8)
    # TRT-LLM decodes greedily when neither top_k nor top_p is set: sampling needs top_p sent.
    assert "top_p" in default and "temperature" in default


def test_ignore_eos_and_min_tokens_map_to_engine_inputs() -> None:
    sent = _tensors("hi", SamplingParams(ignore_eos=True, min_tokens=4), 8)
    assert sent["end_id"] == ("INT32", [1, 1])
    assert sent["min_length"] == ("INT32", [1, 1])


def test_errors_map_to_http_statuses() -> None:
    bad = _error_from(
        InferenceServerException("in ensemble 'ensemble', invalid request: text_input is empty")
    )
    assert bad.status == 400 and bad.message == "text_input is empty"
    assert _error_from(InferenceServerException("boom")).status == 500

    class Unavailable(grpc.aio.AioRpcError):
        def __init__(self) -> None:
            super().__init__(grpc.StatusCode.UNAVAILABLE, None, None, details="connection refused")

    assert _error_from(Unavailable()).status == 503
