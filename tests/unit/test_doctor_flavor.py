"""trtllm_service.doctor without Triton: the legacy flavour's one warning line, and what a warning does."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tensorrtllm_backend import pinned
from trtllm_service import doctor
from trtllm_service.relay.flavors import FLAVORS, EnsembleFlavor, LLMAPIFlavor

pytestmark = pytest.mark.unit


def test_the_ensemble_flavour_is_one_warning() -> None:
    checks = doctor.flavor_checks(EnsembleFlavor())
    assert checks == [doctor.Check("flavor", doctor.WARNING, pinned.ENSEMBLE_LEGACY_WARNING)]
    assert doctor.flavor_checks(LLMAPIFlavor()) == []


class FakeRuntime:
    """What diagnose() touches of a Runtime, for a packed model of `flavor`."""

    kind = "ensemble"  # the pack's flavour

    def __init__(self, path: Path, name: str, settings: Any) -> None:
        self.info = SimpleNamespace(
            world_size=1, tp_size=1, pp_size=1, backend="python", versions={}, llm_options_line=lambda: None
        )
        self.flavor = FLAVORS[self.kind]()
        self.engine = "reference"
        self.triton = SimpleNamespace(http_url="http://127.0.0.1:1")
        self.settings = settings
        self.lora_limits = SimpleNamespace(unavailable=None)

    def load(self) -> None:
        pass

    async def start(self) -> None:
        pass

    async def learn_engine(self) -> None:
        pass

    async def stop(self) -> None:
        pass


@pytest.mark.parametrize("flavor", ["ensemble", "llmapi"])
def test_the_report_has_one_warning_line_for_the_legacy_flavour(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, flavor: str
) -> None:
    import importlib

    from trtllm_service import runtime

    model = SimpleNamespace(path=str(tmp_path), tag=SimpleNamespace(name="m"))
    # bentoml.models is a lazy loader: patch the module it loads
    monkeypatch.setattr(importlib.import_module("bentoml.models"), "get", lambda tag: model)
    monkeypatch.setattr(runtime, "default_model_tag", lambda tag: tag)
    monkeypatch.setattr(runtime, "Runtime", type("Runtime", (FakeRuntime,), {"kind": flavor}))
    monkeypatch.setattr(doctor, "triton_version", lambda url: "2.71.0")
    monkeypatch.setattr(doctor, "installed_tensorrt_llm", lambda: None)
    monkeypatch.setattr(doctor, "gpus_seen", lambda: 0)

    async def no_probes(self: doctor.FeatureProbe) -> list[doctor.Check]:
        return [doctor.Check("stream", doctor.OK, "8 tokens")]

    monkeypatch.setattr(doctor.FeatureProbe, "run", no_probes)
    assert doctor.main(["m"]) == 0  # a warning does not fail the command
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if " warning " in line]
    if flavor == "ensemble":
        assert len(warnings) == 1 and warnings[0].split() == [
            "flavor",
            "warning",
            *pinned.ENSEMBLE_LEGACY_WARNING.split(),
        ]
    else:
        assert warnings == []
    assert f"flavor: {flavor}" in out


def _packed_with(options: dict[str, Any]) -> Any:
    from trtllm_service.packed_model import PackInfo

    return PackInfo(
        tag="m:1",
        mode="demo",
        backend="python",
        packed_root="/m",
        world_size=1,
        tp_size=1,
        pp_size=1,
        architecture="LlamaForCausalLM",
        dtype="float32",
        max_batch_size=8,
        max_input_len=None,
        max_seq_len=None,
        max_beam_width=1,
        llm_options=options,
        llm_options_from=["--config x.yaml"],
    )


def test_llm_options_say_what_a_stand_in_ignores() -> None:
    info = _packed_with(
        {
            "max_num_tokens": 512,
            "kv_cache_config": {"free_gpu_memory_fraction": 0.7, "max_tokens": 4096},
            "cuda_graph_config": {"enable_padding": True},
            "speculative_config": {
                "decoding_type": "NGram",
                "max_draft_len": 4,
                "max_matching_ngram_size": 2,
            },
        }
    )
    assert doctor.llm_options_checks(info, "reference") == [
        doctor.Check(
            "llm options",
            doctor.UNSUPPORTED,
            "the reference engine ignores cuda_graph_config.enable_padding, "
            "kv_cache_config.free_gpu_memory_fraction (validated; they take effect with TensorRT-LLM on a GPU)",
        )
    ]
    synthetic = doctor.llm_options_checks(info, "synthetic")[0].detail
    assert "speculative_config.decoding_type" in synthetic  # NGram drafting is the reference engine's
    assert doctor.llm_options_checks(info, "tensorrt_llm") == [
        doctor.Check("llm options", doctor.OK, "7 from --config x.yaml, applied by TensorRT-LLM")
    ]
    assert doctor.llm_options_checks(_packed_with({}), "reference") == []
    assert doctor.llm_options_checks(_packed_with({"max_batch_size": 4}), "reference")[0].status == doctor.OK
