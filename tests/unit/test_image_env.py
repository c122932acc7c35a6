"""image_env: what the image build installs against and checks (TensorRT-LLM's pins, the imports),
on distributions made for the test beside this interpreter's own."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtllm_service import image_env

pytestmark = pytest.mark.unit


def make_dist(site: Path, name: str, version: str, requires: list[str]) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {line}" for line in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))


def test_constraints_are_the_pinned_requirements_that_apply(site: Path) -> None:
    make_dist(
        site,
        "fake_trt",
        "1.2.1",
        ["numpy<2", "openai", "nvidia-modelopt[torch]~=0.37.0", 'only-windows==1; sys_platform == "win32"'],
    )
    assert image_env.constraint_lines("fake_trt") == ["numpy<2", "nvidia-modelopt~=0.37.0"]


def test_a_pin_the_install_moved_fails_one_the_image_broke_warns(site: Path) -> None:
    make_dist(site, "fake_pinned", "1.0", [])
    make_dist(site, "fake_other", "3.0", [])
    make_dist(site, "fake_trt", "1.2.1", ["fake_pinned>=2", "fake_other<2", "fake-missing==1"])
    moved, already = image_env.broken_pins({"fake_pinned": "2.5", "fake_other": "3.0"}, "fake_trt")
    assert moved == ["fake_pinned 1.0 (TensorRT-LLM pins >=2)"]
    assert already == ["fake_other 3.0 (TensorRT-LLM pins <2)"]
    assert image_env.versions("fake_trt") == {"fake_pinned": "1.0", "fake_other": "3.0"}


def test_imports_that_fail_are_named() -> None:
    failed = image_env.failed_imports(["json", "tensorrt_llm_not_here"])
    assert len(failed) == 1 and failed[0].startswith("tensorrt_llm_not_here: ModuleNotFoundError")


def test_check_fails_here_without_tensorrt_llm(capsys: pytest.CaptureFixture[str]) -> None:
    assert image_env.main(["check"]) == 1
    assert "cannot import tensorrt_llm:" in capsys.readouterr().err
    assert image_env.main(["nonsense"]) == 2


def test_the_image_python_is_never_the_venv_bentoml_made(tmp_path: Path) -> None:
    """While the image builds, BentoML's own /app/.venv is first on PATH; the setup script installs
    into the image's Python, which TRTLLM_IMAGE_PYTHON names when set."""
    venv_bin = tmp_path / "bin"
    venv_bin.mkdir()
    (venv_bin / "python3").symlink_to(sys.executable)
    assert image_env.image_python({"TRTLLM_IMAGE_PYTHON": "/x/python"}) == "/x/python"
    found = image_env.image_python({"PATH": f"{image_env.BENTO_VENV}/bin:{venv_bin}"})
    assert found in (image_env.IMAGE_VENV_PYTHON, str(venv_bin / "python3"))
