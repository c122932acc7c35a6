"""`bentoml build .` packages the service with the packed model, the Triton templates and no tests."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

from tests.e2e.conftest import REPO_ROOT

TRITON_MODELS = ("ensemble", "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls")
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

    built = bentoml("build", ".")
    assert built.returncode == 0, built.stdout + built.stderr
    bentos = sorted(p for p in (home / "bentos" / "trtllm").iterdir() if p.is_dir())
    assert len(bentos) == 1, bentos
    bento = bentos[0]

    info = yaml.safe_load((bento / "bento.yaml").read_text())
    assert info["service"] == "service:TRTLLM"
    model_tag = f"{packed_model_dir.parent.name}:{packed_model_dir.name}"
    assert [m["tag"] for m in info["services"][0]["models"]] == [model_tag], info["services"]

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
        "trtllm_service/relay/runtime.py",
        "trtllm_service/relay/client.py",
        "trtllm_service/relay/grpc_http2.py",
        "trtllm_service/triton/process.py",
    ):
        assert package in sources, f"{package} missing"
    assert "tensorrtllm_backend/scripts/launch_triton_server.py" in sources
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
