"""Shared fixtures, one per concept (tests/unit/repo/test_tests.py holds each name to one definition):
the demo model (its files, its tokenizer, its transformers model) and real tritonservers on it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("BENTOML_DO_NOT_TRACK", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Our stand-in engines refuse, instead of ignoring as NVIDIA's backend does, inputs that would do
# nothing in production (every Triton the tests start inherits this).
os.environ.setdefault("TRTLLM_CONTRACT_CHECK", "1")

from tests.support import TritonServer, finish_deferred_stops, load_tokenizer, stopped_soon

TESTS_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks each test unit / integration / e2e from the directory it lives in."""
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(TESTS_DIR).parts
        if parts and parts[0] in {"unit", "integration", "e2e"}:
            item.add_marker(getattr(pytest.mark, parts[0]))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Finishes the services' stops that nobody waited for (tests/support.DEFERRED_STOPS)."""
    finish_deferred_stops()


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random demo checkpoint (`pack_model.py --demo tiny`: Llama-3's tokens and chat
    template), built once for the session. Read it, never write into it."""
    from trtllm_service.packing.demo_model import build_demo_model

    return build_demo_model(tmp_path_factory.mktemp("demo") / "model")


@pytest.fixture(scope="session")
def base_config(demo_model_dir: Path) -> dict[str, Any]:
    """The demo checkpoint's config.json: the base model LoRA adapters are made for and checked against."""
    import json

    return dict(json.loads((demo_model_dir / "config.json").read_text()))


@pytest.fixture(scope="session")
def triton(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """One tritonserver with our repository on the demo model, shared by the integration tests."""
    server = TritonServer(
        tmp_path_factory.mktemp("triton"),
        engine_dir=demo_model_dir,
        tokenizer_dir=demo_model_dir,
        overrides={"max_beam_width": "4"},  # beam search (tests/integration/test_engine_features.py)
    )
    with stopped_soon(server):
        yield server


@pytest.fixture(scope="session")
def tokenizer(demo_model_dir: Path) -> Any:
    """The demo model's tokenizer (transformers' AutoTokenizer, as the service and the llmapi model
    load it), one for the session: a test that changes a tokenizer loads its own."""
    return load_tokenizer(str(demo_model_dir))


@pytest.fixture(scope="session")
def hf_model(demo_model_dir: Path) -> Any:
    """The demo model in transformers (float32, eval mode): the reference the engines' greedy and
    beam outputs are held to."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llmapi(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A tritonserver with the llmapi flavour's repository on the demo model (the reference engine
    behind the stand-in LLM API here). Module-scoped: each module that uses it starts its own, so
    that no module sees another's requests in the engine's counters."""
    server = TritonServer(
        tmp_path_factory.mktemp("llmapi"),
        engine_dir=demo_model_dir,
        tokenizer_dir=demo_model_dir,
        flavor="llmapi",
    )
    with stopped_soon(server):
        yield server
