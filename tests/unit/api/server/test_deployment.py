"""What BentoML and BentoCloud are told about the service (api/server/deployment.py), and deployment.yaml
read with BentoML's own deployment config classes and configuration schema."""

from __future__ import annotations

import re
import typing
from typing import Any

import attrs
import pytest
import yaml
from bentoml._internal.cloud.deployment import DeploymentAPI
from bentoml._internal.cloud.schemas.modelschemas import DeploymentServiceConfig
from bentoml._internal.cloud.schemas.schemasv2 import CreateDeploymentSchema
from bentoml._internal.configuration.containers import BentoMLConfiguration
from bentoml._internal.utils.cattr import bentoml_cattr

from tests.support import REPO_ROOT
from trtllm_service.api.server import deployment
from trtllm_service.packed_model import PackInfo
from trtllm_service.settings import Settings

ROOT = REPO_ROOT
DEPLOYMENT_YAML = ROOT / "deployment.yaml"


def pack_info(
    max_batch_size: int = 8,
    tp_size: int = 1,
    pp_size: int = 1,
    instances: int = 1,
    llm_batch: str | None = None,
) -> PackInfo:
    """A packed model's pack.json, with what deployment.py reads of it given."""
    return PackInfo(
        tag="m:1",
        mode="demo",
        backend="python",
        packed_root="/nowhere",
        world_size=tp_size * pp_size,
        tp_size=tp_size,
        pp_size=pp_size,
        architecture="LlamaForCausalLM",
        dtype="float32",
        max_batch_size=max_batch_size,
        max_input_len=None,
        max_seq_len=None,
        max_beam_width=1,
        template_values={"engine_instance_count": str(instances)}
        if llm_batch is None
        else {"llm_max_batch_size": llm_batch},
        flavor="ensemble" if llm_batch is None else "llmapi",
    )


def bentoml_services_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` as BentoML configures a service from its decorator: merged into its defaults and
    validated against its schema (as `Service.inject_config` does)."""
    loaded = BentoMLConfiguration(override_defaults={"services": {"svc": config}}, use_version=2).to_dict()
    return loaded["services"]["svc"]


@pytest.mark.parametrize(
    ("slots", "concurrency", "max_concurrency"),
    [(8, 8, 256), (1, 1, 256), (64, 64, 256), (128, 128, 512), (256, 256, 1024)],
)
def test_traffic_follows_the_engines_batch_slots(slots: int, concurrency: int, max_concurrency: int) -> None:
    traffic = deployment.traffic(pack_info(max_batch_size=slots), Settings.from_env({}))
    assert traffic == {"timeout": 600.0, "concurrency": concurrency, "max_concurrency": max_concurrency}


def test_every_instance_of_the_engine_counts_its_batch() -> None:
    """The synthetic stand-in packed with --engine-instances 4 runs four token sources of 8 slots
    each: 32 requests run at once, and the service's queue (`auto`) lets 32 in, not 8."""
    traffic = deployment.traffic(pack_info(max_batch_size=8, instances=4), Settings.from_env({}))
    assert traffic["concurrency"] == 32
    limits = deployment.queue_limits(Settings.from_env({}), traffic)
    assert limits is not None and limits.slots == 32


def test_auto_queues_only_an_engine_whose_batch_is_known() -> None:
    """An LLM API model packed without --max-batch-size runs at the LLM API's own batch size, which
    nothing packed records: `auto` then leaves the queue off rather than hold the engine to 8."""
    unknown, packed = pack_info(llm_batch="null"), pack_info(max_batch_size=48, llm_batch="48")
    assert (unknown.batch_slots, packed.batch_slots) == (None, 48)
    defaults = Settings.from_env({})
    traffic = deployment.traffic(unknown, defaults)
    assert traffic["concurrency"] == 8, "the autoscaling target stays Triton's batch"
    assert deployment.queue_limits(defaults, traffic, batch_known=False) is None
    told = Settings.from_env({"TRTLLM_CONCURRENCY": "512"})  # the operator says how many run at once
    limits = deployment.queue_limits(told, deployment.traffic(unknown, told), batch_known=False)
    assert limits is not None and limits.slots == 512
    fixed = Settings.from_env({"TRTLLM_ENGINE_SLOTS": "100"})
    limits = deployment.queue_limits(fixed, traffic, batch_known=False)
    assert limits is not None and limits.slots == 100
    limits = deployment.queue_limits(defaults, deployment.traffic(packed, defaults))
    assert limits is not None and limits.slots == 48


def test_traffic_can_be_overridden_and_stays_consistent() -> None:
    settings = Settings.from_env(
        {"TRTLLM_CONCURRENCY": "48", "TRTLLM_MAX_CONCURRENCY": "100", "TRTLLM_STREAM_TIMEOUT": "1200"}
    )
    assert deployment.traffic(pack_info(), settings) == {
        "timeout": 1200.0,
        "concurrency": 48,
        "max_concurrency": 100,
    }
    # A target above the hard limit could never be reached: the target comes down to it.
    low = Settings.from_env({"TRTLLM_CONCURRENCY": "64", "TRTLLM_MAX_CONCURRENCY": "16"})
    assert deployment.traffic(pack_info(), low) == {
        "timeout": 600.0,
        "concurrency": 16,
        "max_concurrency": 16,
    }
    one = Settings.from_env({"TRTLLM_MAX_CONCURRENCY": "1"})
    assert deployment.traffic(pack_info(), one) == {"timeout": 600.0, "concurrency": 1, "max_concurrency": 1}


@pytest.mark.parametrize(("tp", "pp", "gpus"), [(1, 1, 1), (2, 1, 2), (4, 2, 8), (1, 2, 2)])
def test_one_gpu_per_rank_and_the_type_only_when_given(tp: int, pp: int, gpus: int) -> None:
    info = pack_info(tp_size=tp, pp_size=pp)
    assert deployment.resources(info) == {"gpu": gpus}
    assert deployment.resources(info, "nvidia-h100-80gb") == {"gpu": gpus, "gpu_type": "nvidia-h100-80gb"}


def test_service_config_is_what_bentoml_accepts() -> None:
    info = pack_info(max_batch_size=16, tp_size=2)
    settings = Settings.from_env(
        {"TRTLLM_CORS_ALLOW_ORIGINS": "https://app.example.com, http://localhost:5173"}
    )
    config = deployment.service_config(info, settings, {"gpu_type": "nvidia-a100-80gb"})
    assert config["traffic"] == {"timeout": 600.0, "concurrency": 16, "max_concurrency": 256}
    assert config["resources"] == {"gpu": 2, "gpu_type": "nvidia-a100-80gb"}
    loaded = bentoml_services_config(config)  # raises on a key or value BentoML does not take
    assert loaded["traffic"]["concurrency"] == 16 and loaded["resources"]["gpu"] == 2
    cors = loaded["http"]["cors"]
    assert cors["enabled"] is True
    assert cors["access_control_allow_origins"] == ["https://app.example.com", "http://localhost:5173"]
    assert cors["access_control_expose_headers"] == ["X-Request-Id"]
    assert cors["access_control_allow_credentials"] is False


def test_cors_is_off_unless_origins_are_named() -> None:
    config = deployment.service_config(pack_info(), Settings.from_env({}), {})
    assert bentoml_services_config(config)["http"]["cors"]["enabled"] is False
    assert "gpu_type" not in config["resources"]


def test_labels_name_the_openai_route() -> None:
    assert deployment.labels() == {"openai_endpoint": "/v1"}


def test_the_limiter_takes_bentomls_configured_max_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    monkeypatch.setattr(deployment, "configured_traffic", lambda name: {"max_concurrency": 7})
    assert deployment.ServiceConcurrencyLimit(app, fallback=256).limit == 7
    monkeypatch.setattr(deployment, "configured_traffic", lambda name: {"timeout": 60})
    assert deployment.ServiceConcurrencyLimit(app, fallback=256).limit == 256


# ---- deployment.yaml ------------------------------------------------------------------------------------


def unknown_keys(data: Any, cls: Any, where: str = "") -> list[str]:
    """Keys of `data` that the attrs class `cls` (recursively) has no field for: BentoML's
    deployment schemas drop them silently (`__forbid_extra_keys__ = False`)."""
    if not attrs.has(cls) or not isinstance(data, dict):
        return []
    fields = {field.name: field for field in attrs.fields(cls)}
    hints = typing.get_type_hints(cls)
    found = []
    for key, value in data.items():
        if key not in fields:
            found.append(f"{where}{key}")
            continue
        found += [
            problem
            for inner in _attrs_types(hints[key])
            for problem in _unknown_in(value, inner, f"{where}{key}.")
        ]
    return found


def _unknown_in(value: Any, cls: Any, where: str) -> list[str]:
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in unknown_keys(item, cls, f"{where}{i}.")]
    if isinstance(value, dict) and not attrs.has(cls):
        return []
    return unknown_keys(value, cls, where)


def _attrs_types(hint: Any) -> list[Any]:
    """The attrs classes inside a type hint (X, Optional[X], List[X]; mappings are left out:
    `services` is checked on its own, `config_overrides` against BentoML's configuration)."""
    if attrs.has(hint):
        return [hint]
    if typing.get_origin(hint) is dict:
        return []
    return [t for arg in typing.get_args(hint) for t in _attrs_types(arg)]


def _unknown_keys_of_config(config: dict[str, Any]) -> list[str]:
    problems = unknown_keys(config, CreateDeploymentSchema)
    for name, service in config.get("services", {}).items():
        problems += unknown_keys(service, DeploymentServiceConfig, f"services.{name}.")
    return problems


def test_deployment_yaml_is_a_deployment_config_bentoml_reads() -> None:
    config = yaml.safe_load(DEPLOYMENT_YAML.read_text())
    assert not _unknown_keys_of_config(config), _unknown_keys_of_config(config)
    # As `bentoml deploy -f` does: structure it with BentoML's schema, then fix and check scaling.
    structured = bentoml_cattr.structure(config, CreateDeploymentSchema)
    DeploymentAPI._fix_and_validate_schema(structured)
    assert structured.name and structured.bento == "."
    assert structured.access_authorization is False  # the service checks its own API keys
    assert structured.secrets == ["trtllm-api-keys", "hf-token"]
    assert set(structured.services) == {deployment.SERVICE_NAME}, "services are keyed by the service's name"
    service = structured.services[deployment.SERVICE_NAME]
    assert service.instance_type
    assert service.scaling is not None and service.scaling.policy is not None
    assert 0 <= service.scaling.min_replicas <= service.scaling.max_replicas
    assert service.scaling.policy.scale_up_behavior in ("fast", "stable", "disabled")
    assert service.scaling.policy.scale_down_behavior in ("fast", "stable", "disabled")
    # config_overrides are the service's BentoML configuration: its schema takes them.
    traffic = service.config_overrides["traffic"]
    assert {"concurrency", "max_concurrency", "timeout", "external_queue"} <= set(traffic)
    assert (
        bentoml_services_config(service.config_overrides)["traffic"]["concurrency"] == traffic["concurrency"]
    )


def test_a_misspelt_key_is_caught() -> None:
    config = yaml.safe_load(DEPLOYMENT_YAML.read_text())
    config["services"][deployment.SERVICE_NAME]["scaling"]["min_replica"] = 1
    config["acces_authorization"] = True
    assert sorted(_unknown_keys_of_config(config)) == [
        "acces_authorization",
        f"services.{deployment.SERVICE_NAME}.scaling.min_replica",
    ]


def test_readme_creates_the_secrets_the_deployment_names() -> None:
    config = yaml.safe_load(DEPLOYMENT_YAML.read_text())
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Deploy to BentoCloud") :]
    for secret in config["secrets"]:
        assert re.search(rf"bentoml secret create {re.escape(secret)} \w+=", section), secret
    assert "bentoml deploy -f deployment.yaml" in section
