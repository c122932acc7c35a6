"""Settings from the environment."""

from __future__ import annotations

import pytest

from trtllm_service.settings import Settings, SettingsError


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


def test_workers_default_to_one_per_8_cores_and_can_be_set() -> None:
    import os

    from trtllm_service.settings import default_workers

    cores = len(os.sched_getaffinity(0))
    assert Settings.from_env({}).workers == default_workers() == max(1, min(8, cores // 8))
    assert Settings.from_env({"TRTLLM_WORKERS": "3"}).workers == 3
    with pytest.raises(SettingsError, match="TRTLLM_WORKERS"):
        Settings.from_env({"TRTLLM_WORKERS": "0"})


def test_every_variable_is_documented_once_in_the_configuration_table() -> None:
    """Each environment variable settings.py reads has one row (or one name in a row) of the
    configuration table (docs/operations.md)."""
    import re
    from pathlib import Path

    import trtllm_service.settings as module

    root = Path(module.__file__).resolve().parents[1]
    names = set(re.findall(r'"((?:TRTLLM|TRITON)_[A-Z_]+)"', Path(module.__file__).read_text()))
    page = (root / "docs" / "operations.md").read_text()
    section = page[page.index("## Configuration") : page.index("### CORS")]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    assert len(names) > 20
    for name in sorted(names):
        assert sum(row.count(f"`{name}`") for row in rows) == 1, name


def test_request_reading_limits_and_special_tokens_mode() -> None:
    settings = Settings.from_env({})
    assert (settings.header_timeout_s, settings.body_timeout_s) == (20.0, 30.0)
    assert (settings.max_header_bytes, settings.max_headers, settings.content_special_tokens) == (
        32768,
        100,
        "control",
    )
    assert Settings.from_env({"TRTLLM_CONTENT_SPECIAL_TOKENS": "text"}).content_special_tokens == "text"
    for name, value in (("TRTLLM_CONTENT_SPECIAL_TOKENS", "plain"), ("TRTLLM_HEADER_TIMEOUT", "0")):
        with pytest.raises(SettingsError, match=name):
            Settings.from_env({name: value})
