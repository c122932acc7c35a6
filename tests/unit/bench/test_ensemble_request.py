"""bench/ensemble_request.py: the request bench/loadgen.py sends straight to Triton's `ensemble` (its
`direct` target) is one the ensemble takes, in upstream's names."""

from __future__ import annotations

from array import array
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2, service_pb2

from bench.ensemble_request import ENSEMBLE_INPUTS, ensemble_message
from tensorrtllm_backend.repository import fill_model_config, repository_values
from trtllm_service.relay.request import GenerationRequest

pytestmark = pytest.mark.unit


def test_every_row_is_an_input_the_ensemble_declares(tmp_path: Path) -> None:
    values = repository_values(engine_dir=tmp_path, tokenizer_dir=tmp_path, overrides={"end_ids": "7"})
    config = text_format.Parse(fill_model_config("ensemble", values), model_config_pb2.ModelConfig())
    declared = {
        i.name: model_config_pb2.DataType.Name(i.data_type).removeprefix("TYPE_") for i in config.input
    }
    for spec in ENSEMBLE_INPUTS.values():
        triton_type = "STRING" if spec.datatype == "BYTES" else spec.datatype
        assert declared.get(spec.name) == triton_type, (
            f"ensemble declares {spec.name} as {declared.get(spec.name)}"
        )


def test_min_tokens_and_seed_carry_their_v1_2_names() -> None:
    """min_length -> min_tokens, random_seed -> seed (NVIDIA renamed them in May 2025)."""
    assert (ENSEMBLE_INPUTS["min_tokens"].name, ENSEMBLE_INPUTS["seed"].name) == ("min_tokens", "seed")


def test_ensemble_message_uses_upstream_names() -> None:
    request = GenerationRequest(prompt_ids=(), max_tokens=5, top_k=1, seed=4, end_id=-1)
    message = service_pb2.ModelInferRequest.FromString(ensemble_message("héllo", request, "e1"))
    names = [t.name for t in message.inputs]
    assert names == ["text_input", "max_tokens", "top_k", "seed", "end_id", "stream"]
    raw = message.raw_input_contents[0]
    assert int.from_bytes(raw[:4], "little") == len("héllo".encode()) and raw[4:].decode() == "héllo"
    assert array("q", message.raw_input_contents[3])[0] == 4
