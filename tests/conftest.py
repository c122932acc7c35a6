"""Shared fixtures: the demo model, a filled model repository and a real tritonserver."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("BENTOML_DO_NOT_TRACK", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Our stand-in engines refuse, instead of ignoring as NVIDIA's backend does, inputs that would do
# nothing in production (every Triton the tests start inherits this).
os.environ.setdefault("TRTLLM_CONTRACT_CHECK", "1")

from tests.support import TritonServer

TESTS_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks each test unit / integration / e2e from the directory it lives in."""
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(TESTS_DIR).parts
        if parts and parts[0] in {"unit", "integration", "e2e"}:
            item.add_marker(getattr(pytest.mark, parts[0]))


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trtllm_service.packing.demo_model import build_demo_model

    return build_demo_model(tmp_path_factory.mktemp("demo") / "model")


@pytest.fixture(scope="session")
def triton(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """One tritonserver with our repository on the demo model, shared by the integration tests."""
    server = TritonServer(
        tmp_path_factory.mktemp("triton"),
        engine_dir=demo_model_dir,
        tokenizer_dir=demo_model_dir,
        overrides={"max_beam_width": "4"},  # beam search (tests/integration/test_engine_features.py)
    )
    with server:
        yield server
