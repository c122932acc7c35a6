"""What is served is explicit: after a second model is packed into the store, `bentoml serve .` and
`bentoml build` still take the first (the served model pack_model.py recorded), and each names it
with the rule that chose it; TRTLLM_MODEL picks the other."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.conftest import REPO_ROOT, pack_demo, serving

FLAVORS = ("llmapi",)  # the choice of model does not depend on the repository flavour


def tag_of(home: Path, name: str) -> str:
    (version,) = [p.name for p in (home / "models" / name).iterdir() if p.is_dir()]
    return f"{name}:{version}"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`first` packed, then `second`: a user trying their own model after the demo."""
    home = pack_demo(tmp_path_factory.mktemp("bentoml_home_two"), "llmapi", "--name", "first")
    return pack_demo(home, "llmapi", "--name", "second")


def test_bentoml_build_takes_the_served_model_and_says_so(home: Path, tmp_path: Path) -> None:
    copy = tmp_path / "home"  # the build adds a bento: not into the module's store
    shutil.copytree(home, copy, symlinks=True)
    env = {**os.environ, "BENTOML_HOME": str(copy), "BENTOML_DO_NOT_TRACK": "true"}
    env.pop("TRTLLM_MODEL", None)
    built = subprocess.run(
        [sys.executable, "-m", "bentoml", "build", "."],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    first = tag_of(home, "first")
    record = copy / "trtllm-service" / "served-model"
    assert f"trtllm_service: model {first} (the served model recorded in {record}; " in built.stderr, (
        built.stderr
    )
    (bento,) = [p for p in (copy / "bentos" / "trtllm").iterdir() if p.is_dir()]
    info = yaml.safe_load((bento / "bento.yaml").read_text())
    assert [m["tag"] for m in info["services"][0]["models"]] == [first]  # the newest was: second


@pytest.mark.parametrize("explicit", [None, "second"])
def test_bentoml_serve_serves_the_served_model(home: Path, tmp_path: Path, explicit: str | None) -> None:
    served = explicit or "first"
    extra = {"BENTOML_HOME": str(home)}  # the store's own home, as a user serves it
    if explicit:
        extra["TRTLLM_MODEL"] = explicit
    with serving(home, tmp_path, extra) as server:
        models = httpx.get(f"{server.url}/v1/models", timeout=30).json()
        assert [card["id"] for card in models["data"]] == [served]
        answer = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"model": served, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        named = [line for line in server.log().splitlines() if line.startswith("trtllm_service: model ")]
        why = f"TRTLLM_MODEL={explicit}" if explicit else "the served model recorded in "
        assert len(named) == 1 and named[0].startswith(f"trtllm_service: model {tag_of(home, served)} ({why}")
