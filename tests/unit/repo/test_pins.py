"""The pins: what the bento installs into the production image resolves with TensorRT-LLM's own pins
(constraints/, read from the wheel's metadata at the pinned tag), bentofile.yaml builds on the pinned
image, and the service refuses, in one line, a TensorRT-LLM older than it supports.

The resolver tests run pip itself against the package index (network, as in CI): what pip cannot
resolve here, the image build cannot install either.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tensorrtllm_backend import nvidia_backend, nvidia_llmapi, pinned
from tests.support import REPO_ROOT
from trtllm_service.runtime import Runtime, check_tensorrt_llm
from trtllm_service.triton.process import TritonStartupError

pytestmark = pytest.mark.unit

ROOT = REPO_ROOT
REQUIREMENTS = ROOT / "requirements.txt"
CONSTRAINTS = ROOT / pinned.CONSTRAINTS_FILE


def requirement_lines(path: Path) -> list[Requirement]:
    """The requirements of a plain requirements file (no options, no includes)."""
    found = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("-"), f"{path.name}: options have no place here: {line!r}"
        found.append(Requirement(line))
    return found


def pip_resolve(*args: str) -> subprocess.CompletedProcess[str]:
    """pip's own resolver, installing nothing, for the image's Python (3.12, binary wheels only)."""
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    command += ["--python-version", "3.12", "--only-binary=:all:", "--disable-pip-version-check", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_constraints_are_tensorrt_llm_pins_at_the_pinned_tag() -> None:
    assert CONSTRAINTS.is_file(), f"{pinned.CONSTRAINTS_FILE} is missing"
    assert pinned.TENSORRT_LLM_VERSION in CONSTRAINTS.name
    header = CONSTRAINTS.read_text()
    assert f"v{pinned.TENSORRT_LLM_VERSION}" in header and pinned.TENSORRT_LLM_COMMIT in header
    assert pinned.IMAGE in header
    constraints = requirement_lines(CONSTRAINTS)
    # pip refuses extras and URLs in a constraints file ("Constraints cannot have extras").
    assert all(not c.extras and not c.url for c in constraints), [str(c) for c in constraints if c.extras]
    names = [canonicalize_name(c.name) for c in constraints]
    assert len(names) == len(set(names)), "a package is constrained twice"


def test_every_requirement_satisfies_what_tensorrt_llm_pins() -> None:
    constraints = {canonicalize_name(c.name): c for c in requirement_lines(CONSTRAINTS)}
    checked = set()
    for requirement in requirement_lines(REQUIREMENTS):
        name = canonicalize_name(requirement.name)
        assert name != "torch", "the image has its own torch: requirements.txt must not install one"
        pins = [spec for spec in requirement.specifier if spec.operator == "=="]
        assert len(pins) == 1, f"requirements.txt pins every package exactly: {requirement}"
        constraint = constraints.get(name)
        if constraint is None or not constraint.specifier:
            continue
        version = pins[0].version
        assert constraint.specifier.contains(version, prereleases=True), (
            f"requirements.txt pins {requirement}, TensorRT-LLM {pinned.TENSORRT_LLM_VERSION} pins {constraint}"
        )
        checked.add(name)
    # The packages the service shares with TensorRT-LLM: checked, not skipped by a name mismatch.
    assert {"transformers", "numpy", "fastapi", "starlette", "pydantic", "llguidance"} <= checked, checked


def test_requirements_resolve_with_tensorrt_llm_pins() -> None:
    result = pip_resolve("-r", str(REQUIREMENTS), "-c", str(CONSTRAINTS))
    assert result.returncode == 0, (
        f"pip cannot install requirements.txt beside TensorRT-LLM {pinned.TENSORRT_LLM_VERSION}:\n"
        f"{result.stderr[-4000:]}"
    )


def test_the_resolver_refuses_a_pin_tensorrt_llm_holds_elsewhere(tmp_path: Path) -> None:
    """The check above can fail: the transformers the project pinned before is refused."""
    conflicting = tmp_path / "requirements.txt"
    conflicting.write_text("transformers==5.23.0\n")
    result = pip_resolve("-r", str(conflicting), "-c", str(CONSTRAINTS))
    assert result.returncode != 0
    assert "transformers" in result.stderr, result.stderr[-2000:]


def test_the_bento_builds_on_the_pinned_image() -> None:
    """The base image and its Python come from pinned.py alone (api/server/deployment.py's image); the
    bentofile names neither (BentoML would warn that a v1 option is ignored)."""
    from trtllm_service.api.server.deployment import image

    assert (image().base_image, image().python_version) == (pinned.IMAGE, pinned.IMAGE_PYTHON)
    bentofile = yaml.safe_load((ROOT / "bentofile.yaml").read_text())
    assert set(bentofile["docker"]) == {"setup_script"}, bentofile["docker"]
    assert bentofile["python"]["requirements_txt"] == "./requirements.txt"


@pytest.mark.parametrize(
    ("version", "parts", "supported"),
    [
        ("1.2.1", (1, 2, 1), True),
        ("1.1.0", (1, 1, 0), True),
        ("1.2.0rc8", (1, 2, 0), True),
        ("1.3.0.post1", (1, 3, 0), True),
        ("1.0.3.2510", (1, 0, 3), False),  # image 25.11
        ("1.0.0", (1, 0, 0), False),
        ("0.19.0", (0, 19, 0), False),  # image 25.05
        ("1.1.0rc5", (1, 1, 0), True),
        ("", (), False),
        ("unknown", (), False),
    ],
)
def test_version_comparison(version: str, parts: tuple[int, ...], supported: bool) -> None:
    assert pinned.version_tuple(version) == parts
    assert pinned.supported(version) is supported


def test_the_pinned_tensorrt_llm_is_supported() -> None:
    assert pinned.supported(pinned.TENSORRT_LLM_VERSION)
    assert pinned.supported(pinned.MIN_TENSORRT_LLM)
    check_tensorrt_llm(pinned.TENSORRT_LLM_VERSION)
    check_tensorrt_llm(None)  # not installed: the stand-in engines serve


def test_nvidias_contracts_are_written_at_the_pinned_tag() -> None:
    """nvidia_backend.py and nvidia_llmapi.py are copied beside model.py without pinned.py: each
    names its tag, and both must name the pinned one."""
    assert nvidia_backend.TAG == nvidia_llmapi.TAG == f"v{pinned.TENSORRT_LLM_VERSION}"


class FakeTriton:
    """The part of SharedTriton that Runtime.start touches."""

    owner = True
    http_url = None  # no server to ask: its version is unknown

    def __init__(self) -> None:
        self.started = False

    async def start(self) -> None:
        self.started = True


class FakeInfo:
    """The part of PackInfo that Runtime.start touches: the LLM API options line (--config / --set)."""

    def __init__(self, line: str | None = None) -> None:
        self.line = line

    def llm_options_line(self) -> str | None:
        return self.line


def start_with_tensorrt_llm(
    monkeypatch: pytest.MonkeyPatch, installed: str | None, info: FakeInfo | None = None
) -> FakeTriton:
    """Runtime.start with `installed` as TensorRT-LLM's version (None: not installed)."""
    real_version = importlib.metadata.version

    def version(name: str) -> str:
        if name != "tensorrt_llm":
            return real_version(name)
        if installed is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed

    monkeypatch.setattr(importlib.metadata, "version", version)
    runtime = object.__new__(Runtime)
    runtime.triton = FakeTriton()
    runtime.model_name = "demo"
    runtime.info = info or FakeInfo()
    asyncio.run(runtime.start())
    return runtime.triton


def test_an_older_tensorrt_llm_is_refused_in_one_line_before_triton_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(TritonStartupError) as refused:
        start_with_tensorrt_llm(monkeypatch, "1.0.3.2510")
    message = str(refused.value)
    assert "\n" not in message
    assert "TensorRT-LLM 1.0.3.2510 is older than 1.1.0" in message
    assert pinned.IMAGE in message


@pytest.mark.parametrize(
    ("installed", "logged"),
    [("1.1.0", "TensorRT-LLM 1.1.0"), (None, "TensorRT-LLM not installed")],
)
def test_a_supported_or_absent_tensorrt_llm_starts_and_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, installed: str | None, logged: str
) -> None:
    with caplog.at_level(logging.INFO, logger="trtllm_service"):
        triton = start_with_tensorrt_llm(monkeypatch, installed)
    assert triton.started
    assert any(logged in record.getMessage() and "Triton" in record.getMessage() for record in caplog.records)


def test_the_start_up_log_names_the_llm_api_options(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    line = "LLM API options from --config x.yaml: speculative_config.decoding_type=NGram"
    with caplog.at_level(logging.INFO, logger="trtllm_service"):
        start_with_tensorrt_llm(monkeypatch, None, FakeInfo(line))
    messages = [record.getMessage() for record in caplog.records]
    assert f"demo: {line}" in messages
    ready = next(i for i, m in enumerate(messages) if "Triton is ready for demo" in m)
    assert messages.index(f"demo: {line}") == ready + 1
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trtllm_service"):
        start_with_tensorrt_llm(monkeypatch, None)
    assert not any("LLM API options" in record.getMessage() for record in caplog.records)
