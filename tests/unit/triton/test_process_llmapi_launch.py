"""The llmapi flavour starts Triton as NVIDIA does: `trtllm-llmapi-launch tritonserver ...`, one rank
or one per mpirun rank (upstream launch_triton_server.py's --trtllm_llmapi_launch), under the
launcher's supervising mode; where TensorRT-LLM is neither installed nor required, directly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tensorrtllm_backend import LAUNCHER
from tensorrtllm_backend import launcher as lts
from tests.support import REPO_ROOT
from trtllm_service.triton import process
from trtllm_service.triton.process import TritonPorts, TritonStartupError, triton_command

pytestmark = pytest.mark.unit

PLAIN = lts.TritonInstall(binary="/opt/tritonserver/bin/tritonserver", source="test")
LAUNCH = "/opt/venv-tritonserver/bin/trtllm-llmapi-launch"
DOUBLE_BIN = REPO_ROOT / "tests" / "image_double" / "bin"


def parse(*argv: str):
    return lts.build_parser().parse_args(["--model_repo", "/models", *argv])


def test_one_rank_is_the_script_around_tritonserver() -> None:
    cmd = lts.build_command(parse("--trtllm_llmapi_launch"), PLAIN, unique=3, llmapi_launch=LAUNCH)
    assert cmd[:2] == [LAUNCH, PLAIN.binary]
    assert "--model-repository=/models" in cmd
    assert lts.build_command(parse(), PLAIN, unique=3, llmapi_launch=LAUNCH)[0] == PLAIN.binary


def test_every_rank_runs_the_script_under_mpirun() -> None:
    args = parse("--trtllm_llmapi_launch", "--world_size", "2")
    cmd = lts.build_command(args, PLAIN, unique=3, mpirun="mpirun", llmapi_launch=LAUNCH)
    ranks = " ".join(cmd).split(" : ")
    assert len(ranks) == 2
    for rank in ranks:
        argv = rank.split()
        wrapper = argv.index(str(LAUNCHER))
        assert argv[wrapper + 1] == lts.RANK_MODE
        assert argv[wrapper + 4 : wrapper + 6] == [LAUNCH, PLAIN.binary]


def test_missing_script_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(lts.sys, "executable", str(tmp_path / "python"))
    with pytest.raises(lts.LauncherError, match="trtllm-llmapi-launch not found"):
        lts.build_command(parse("--trtllm_llmapi_launch"), PLAIN, unique=3)


def test_found_on_path_or_beside_python(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert lts.find_llmapi_launch({"PATH": str(DOUBLE_BIN)}) == str(DOUBLE_BIN / lts.LLMAPI_LAUNCH)
    monkeypatch.setattr(lts.sys, "executable", str(DOUBLE_BIN / "python"))
    assert lts.find_llmapi_launch({"PATH": str(tmp_path)}) == str(DOUBLE_BIN / lts.LLMAPI_LAUNCH)


def ports() -> TritonPorts:
    return TritonPorts(8001, 8000, 8002)


def test_service_supervises_the_launch_tree(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", f"{DOUBLE_BIN}:{Path(sys.executable).parent}:/usr/bin:/bin")
    argv, _ = triton_command(tmp_path, ports(), host="127.0.0.1", world_size=1, workdir=tmp_path, llmapi=True)
    mode = argv.index(lts.SUPERVISE_HOLDING_SIGTERM_MODE)
    assert argv[:mode] == [sys.executable, str(LAUNCHER)]
    assert float(argv[mode + 1]) >= lts.MIN_KILL_GRACE_SECS and argv[mode + 2] == "--"
    assert argv[mode + 3] == str(DOUBLE_BIN / lts.LLMAPI_LAUNCH)
    assert Path(argv[mode + 4]).name == "tritonserver"


def test_ensemble_and_stand_in_start_triton_directly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", f"{DOUBLE_BIN}:{Path(sys.executable).parent}:/usr/bin:/bin")
    argv, _ = triton_command(
        tmp_path, ports(), host="127.0.0.1", world_size=1, workdir=tmp_path, llmapi=False
    )
    assert lts.HOLD_SIGTERM_MODE in argv and lts.LLMAPI_LAUNCH not in " ".join(argv)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.delenv(process.REQUIRE_TENSORRT_LLM, raising=False)
    monkeypatch.setattr(process, "installed_tensorrt_llm", lambda: None)
    monkeypatch.setattr(lts.sys, "executable", str(tmp_path / "python"))
    argv, _ = triton_command(tmp_path, ports(), host="127.0.0.1", world_size=1, workdir=tmp_path, llmapi=True)
    assert lts.HOLD_SIGTERM_MODE in argv and lts.LLMAPI_LAUNCH not in " ".join(argv)


@pytest.mark.parametrize("why", ["required", "installed"])
def test_no_script_where_tensorrt_llm_needs_it_is_a_startup_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, why: str
) -> None:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setattr(lts.sys, "executable", str(tmp_path / "python"))
    if why == "required":
        monkeypatch.setenv(process.REQUIRE_TENSORRT_LLM, "1")
    else:
        monkeypatch.delenv(process.REQUIRE_TENSORRT_LLM, raising=False)
        monkeypatch.setattr(process, "installed_tensorrt_llm", lambda: "1.2.1")
    with pytest.raises(TritonStartupError, match="trtllm-llmapi-launch not found"):
        triton_command(tmp_path, ports(), host="127.0.0.1", world_size=1, workdir=tmp_path, llmapi=True)
