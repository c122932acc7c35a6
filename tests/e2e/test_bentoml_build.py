"""`bentoml build .` packages the service with the packed model, the Triton templates and no tests."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import yaml

from tensorrtllm_backend import pinned
from tests.e2e.conftest import REPO_ROOT

TRITON_MODELS = ("ensemble", "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls")
GPU_TYPE = "nvidia-h100-80gb"
FLAVORS = ("llmapi",)  # the packed repository is checked on the default flavour; sources for both


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_bentoml_build_packages_model_code_and_templates(
    bentoml_home: Path, packed_model_dir: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"  # a copy: the build adds a bento and must not touch the shared store
    shutil.copytree(bentoml_home / "models", home / "models", symlinks=True)
    env = {**os.environ, "BENTOML_HOME": str(home), "BENTOML_DO_NOT_TRACK": "true"}

    def bentoml(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "bentoml", *args],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    built = bentoml("build", ".", "--arg", f"gpu_type={GPU_TYPE}")  # the GPU type is the deployer's
    assert built.returncode == 0, built.stdout + built.stderr
    bentos = sorted(p for p in (home / "bentos" / "trtllm").iterdir() if p.is_dir())
    assert len(bentos) == 1, bentos
    bento = bentos[0]

    info = yaml.safe_load((bento / "bento.yaml").read_text())
    assert info["service"] == "service:TRTLLM"
    model_tag = f"{packed_model_dir.parent.name}:{packed_model_dir.name}"
    assert [m["tag"] for m in info["services"][0]["models"]] == [model_tag], info["services"]
    check_deployment_settings(info, packed_model_dir, bento)
    check_image(bento, info)

    # The model travels with the bento: `bentoml export` writes the self-contained archive.
    archive = tmp_path / "trtllm.bento"
    exported = bentoml("export", f"trtllm:{bento.name}", str(archive))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    with tarfile.open(archive) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers()}
        model_root = f"models/{packed_model_dir.parent.name}/{packed_model_dir.name}"
        for name in (
            "pack.json",
            "engine/config.json",
            "engine/model.safetensors",
            "tokenizer/tokenizer.json",
        ):
            assert f"{model_root}/{name}" in members, f"{name} missing from the exported bento"
        assert f"{model_root}/repository/tensorrt_llm/config.pbtxt" in members
        assert f"{model_root}/repository/tensorrt_llm/1/model.yaml" in members
        weights = tar.extractfile(members[f"{model_root}/engine/model.safetensors"])
        assert weights is not None
        assert sha256(weights.read()) == sha256(
            (packed_model_dir / "engine" / "model.safetensors").read_bytes()
        )

    sources = {p.relative_to(bento / "src").as_posix() for p in (bento / "src").rglob("*") if p.is_file()}
    assert "service.py" in sources
    assert (bento / "src" / "service.py").read_bytes() == (REPO_ROOT / "service.py").read_bytes()
    for package in (
        "trtllm_service/runtime.py",
        "trtllm_service/relay/client.py",
        "trtllm_service/relay/grpc_http2.py",
        "trtllm_service/triton/process.py",
        "tensorrtllm_backend/launcher.py",
        "tensorrtllm_backend/scripts/launch_triton_server.py",
    ):
        assert package in sources, f"{package} missing"
    for model in TRITON_MODELS:
        assert f"tensorrtllm_backend/all_models/inflight_batcher_llm/{model}/config.pbtxt" in sources, model
        assert f"tensorrtllm_backend/all_models/inflight_batcher_llm/{model}/1/model.py" in sources or (
            model == "ensemble"
            and "tensorrtllm_backend/all_models/inflight_batcher_llm/ensemble/1/.gitkeep" in sources
        ), model
    for name in ("config.pbtxt", "1/model.py", "1/model.yaml", "1/llmapi_contract.py"):
        assert f"tensorrtllm_backend/all_models/llmapi/tensorrt_llm/{name}" in sources, name
    unwanted = sorted(s for s in sources if s.startswith(("tests/", "bench/")) or "__pycache__" in s)
    assert not unwanted, f"the bento carries files it must not: {unwanted[:10]}"


def check_deployment_settings(info: dict[str, Any], packed_model_dir: Path, bento: Path) -> None:
    """What BentoCloud reads in bento.yaml: traffic from the engine's batch slots (the autoscaler's
    target), one GPU per rank of the type given at build time, the OpenAI route; and the Bento's
    README is the service's own description."""
    pack = json.loads((packed_model_dir / "pack.json").read_text())
    config = info["services"][0]["config"]
    slots = pack["max_batch_size"]
    assert config["traffic"] == {
        "timeout": 600.0,
        "concurrency": slots,
        "max_concurrency": max(256, 4 * slots),
    }
    assert config["resources"] == {"gpu": pack["tp_size"] * pack["pp_size"], "gpu_type": GPU_TYPE}
    assert info["args"] == {"gpu_type": GPU_TYPE}
    assert info["labels"]["openai_endpoint"] == "/v1"
    assert config["http"]["cors"]["enabled"] is False
    readme = (bento / "README.md").read_text()
    assert "How to call it" in readme and "/v1/chat/completions" in readme and "![" not in readme


def check_image(bento: Path, info: dict[str, Any]) -> None:
    """A bento v2 (what BentoML 1.4 builds natively: `bentoml containerize` regenerates nothing from
    the build machine's files, issue 44) on the pinned image: BentoML's own steps make a venv from the
    image's Python (never the build machine's: nothing to download) and install the requirements,
    then the setup script (trtllm_service/image_env.py) moves them into the image's own Python,
    before the service's files land; no uv --system (which skips the image's venv), no apt-get."""
    dockerfile = (bento / "env" / "docker" / "Dockerfile").read_text()
    assert dockerfile.count("FROM ") == 1, dockerfile
    assert f"FROM {pinned.IMAGE} AS base-container" in dockerfile
    image = info["image"]
    assert (image["base_image"], image["python_version"]) == (pinned.IMAGE, pinned.IMAGE_PYTHON)
    assert "docker" not in info or not info["docker"], "a bento v1: bentoml containerize breaks on it"
    assert f"uv venv --python {pinned.IMAGE_PYTHON} /app/.venv" in dockerfile
    assert "UV_SYSTEM_PYTHON" not in dockerfile and "apt-get" not in dockerfile
    (setup,) = image["post_commands"]
    script = setup.rsplit(" ", 1)[-1]
    assert (bento / script).read_bytes() == (REPO_ROOT / "trtllm_service" / "image_env.py").read_bytes()
    lines = dockerfile.splitlines()
    installed = next(
        i for i, line in enumerate(lines) if "pip install -r $BENTO_PATH/env/python/requirements.txt" in line
    )
    moved = lines.index(f"RUN {setup}")
    copy_all = next(i for i, line in enumerate(lines) if line.startswith("COPY ") and line.endswith(" . ./"))
    assert installed < moved < copy_all, "image_env.py runs after BentoML's install, before the files land"
    requirements = [
        line.split("==")[0].split("[")[0].lower()
        for line in (bento / "env" / "python" / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert not {"torch", "tensorrt-llm", "tensorrt_llm", "tensorrt"} & set(requirements), requirements
    assert "openai" in requirements, "the image's openai (1.107.3) cannot import tensorrt_llm.serve"
    envs = {env["name"]: env["value"] for env in info["envs"]}
    assert not [name for name in envs if name.startswith("UV_")], envs
    assert envs["TRTLLM_REQUIRE_TENSORRT_LLM"] == "1"
