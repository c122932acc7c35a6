"""The launcher refuses a Triton whose Python backend stub would run with numpy >= 2.

pytriton 0.7's stub predates numpy 2: under it an INT32 [7, 8, 9] arrives as [7, 7, 7] and BYTES
inputs kill the stub, with no error anywhere (../shared/REFERENCE.md section 9). The stub takes its
packages from the first python3 on the server's PATH, which the launcher sets to the directory of
the interpreter that runs it: run by an interpreter with numpy 2, it must refuse, in one line.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tensorrtllm_backend import LAUNCHER, launcher

pytestmark = pytest.mark.integration

NUMPY_2 = "2.2.6"


def test_a_stub_environment_with_numpy_2_is_refused_in_one_line(tmp_path: Path) -> None:
    venv = tmp_path / "numpy2"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site_packages = next(venv.glob("lib/python*/site-packages"))
    subprocess.run(  # a real numpy 2, from the package index (this venv has no pip of its own)
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--target", str(site_packages), f"numpy=={NUMPY_2}"],
        check=True,
        timeout=600,
    )  # fmt: skip
    python = venv / "bin" / "python"
    found = subprocess.run(
        [python, "-c", "import numpy; print(numpy.__version__)"], capture_output=True, text=True
    )
    assert found.stdout.strip() == NUMPY_2, found.stderr

    bundled = launcher.find_tritonserver(environ={"PATH": os.defpath})  # nvidia-pytriton's build
    assert bundled.source == "nvidia-pytriton"
    repo = tmp_path / "repo"
    repo.mkdir()
    result = subprocess.run(
        [python, str(LAUNCHER), "--model_repo", str(repo)],
        env={**os.environ, "TRITONSERVER": bundled.binary},
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("launch_triton_server: error: "), line
    assert str(venv / "bin" / "python3") in line and f"numpy {NUMPY_2}" in line, line
    assert "numpy<2" in line, "the line does not say how to fix it"
    assert not tritonservers_of(repo), "a tritonserver was started"


def tritonservers_of(repo: Path) -> list[int]:
    """The tritonservers serving `repo` (not another test's, which may run beside this one)."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.name() == "tritonserver" and str(repo) in " ".join(process.cmdline()):
                found.append(process.pid)
    return found


def test_the_environment_of_these_tests_passes_the_check() -> None:
    """The same check on the interpreter running the tests (numpy 1.x) lets the stub be staged."""
    install = launcher.find_tritonserver(environ={"PATH": os.defpath})
    launcher.check_stub_numpy(install)
