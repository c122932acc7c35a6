"""trtllm_service.packing: engine/checkpoint reading, options, names, pack.json and relocation."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest

from tensorrtllm_backend.repository import ENSEMBLE, LLMAPI, MODELS, build_repository, repository_values
from tests.support import engine_config
from trtllm_service.packed_model import (
    XGRAMMAR_TOKENIZER_INFO,
    PackError,
    PackInfo,
    guided_decoding_unsupported,
    layout_runtime_repository,
    read_pack_info,
)
from trtllm_service.packing import copying, packer
from trtllm_service.packing.guided_decoding import write_xgrammar_tokenizer_info, xgrammar_tokenizer_info
from trtllm_service.packing.model_name import default_name, validate_name
from trtllm_service.packing.options import RuntimeOptions
from trtllm_service.packing.packer import launch_command
from trtllm_service.packing.sources import (
    ModelSource,
    check_tokenizer,
    read_chat_template,
    read_engine_dir,
    read_hf_checkpoint,
    tokenizer_files,
)

pytestmark = pytest.mark.unit


def write_engine(directory: Path, config: dict[str, Any] | None = None, ranks: int = 2) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config or engine_config(), indent=2))
    for rank in range(ranks):
        (directory / f"rank{rank}.engine").write_bytes(b"\x00engine" * 4)
    return directory


# --------------------------------------------------------------------------- engine dirs


def test_reads_engine_config(tmp_path: Path) -> None:
    source = read_engine_dir(write_engine(tmp_path / "llama-tp2"))
    assert source.mode == "engine" and source.backend == "tensorrtllm"
    assert (source.tp_size, source.pp_size, source.world_size) == (2, 1, 2)
    assert (source.max_batch_size, source.max_input_len, source.max_seq_len) == (16, 1024, 2048)
    assert (source.max_num_tokens, source.max_beam_width) == (8192, 1)
    assert (source.architecture, source.dtype, source.trtllm_version) == (
        "LlamaForCausalLM",
        "bfloat16",
        "0.19.0",
    )
    assert source.files == ("config.json", "rank0.engine", "rank1.engine")


def test_engine_dir_ignores_other_files(tmp_path: Path) -> None:
    engine = write_engine(tmp_path / "e")
    (engine / "model.cache").write_bytes(b"timing cache")
    (engine / ".git").mkdir()
    assert read_engine_dir(engine).files == ("config.json", "rank0.engine", "rank1.engine")


def test_pipeline_parallel_world_size(tmp_path: Path) -> None:
    source = read_engine_dir(write_engine(tmp_path / "e", engine_config(tp=2, pp=2), ranks=4))
    assert source.world_size == 4
    assert source.files[-1] == "rank3.engine"


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: d.rmdir(), "does not exist"),
        (lambda d: (d / "config.json").unlink(), "has no config.json"),
        (lambda d: (d / "config.json").write_text("{not json"), "not valid JSON"),
        (lambda d: (d / "config.json").write_text("[1, 2]"), "not a JSON object"),
        (
            lambda d: (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]})),
            "--hf-model",
        ),
        (
            lambda d: (d / "config.json").write_text(
                json.dumps({"architecture": "LlamaForCausalLM", "mapping": {"tp_size": 2}})
            ),
            "trtllm-build",
        ),
        (lambda d: (d / "rank1.engine").unlink(), "missing rank1.engine"),
        (lambda d: (d / "rank2.engine").write_bytes(b"x"), "rank2.engine beyond world_size 2"),
        (
            lambda d: (d / "config.json").write_text(
                json.dumps(
                    {
                        **engine_config(),
                        "pretrained_config": {
                            **engine_config()["pretrained_config"],
                            "mapping": {"world_size": 4, "tp_size": 2, "pp_size": 1},
                        },
                    }
                )
            ),
            "mapping.world_size 4 != tp_size 2 x pp_size 1",
        ),
        (
            lambda d: (d / "config.json").write_text(json.dumps(engine_config(max_batch_size=-1))),
            "max_batch_size must be a positive integer",
        ),
        (lambda d: ((d / "rank1.engine").unlink(), (d / "rank1.engine").mkdir()), "not a regular file"),
        (
            lambda d: ((d / "rank1.engine").unlink(), (d / "rank1.engine").symlink_to(d / "gone")),
            "not a regular file",
        ),
    ],
    ids=[
        "missing-dir",
        "no-config",
        "bad-json",
        "not-object",
        "hf-config",
        "trtllm-checkpoint",
        "tp2-one-rank",
        "extra-rank",
        "world-size-mismatch",
        "negative-batch",
        "rank-is-dir",
        "rank-broken-link",
    ],
)
def test_bad_engine_dirs(tmp_path: Path, setup: Any, message: str) -> None:
    engine = write_engine(tmp_path / "e")
    if message == "does not exist":
        shutil.rmtree(engine)
    else:
        setup(engine)
    with pytest.raises(PackError, match=re.escape(message)) as info:
        read_engine_dir(engine)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- HF checkpoints


def write_checkpoint(directory: Path, *weights: str, config: dict[str, Any] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    default = {
        "architectures": ["LlamaForCausalLM"],
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 4096,
    }
    (directory / "config.json").write_text(json.dumps(config or default))
    for name in weights:
        (directory / name).write_bytes(b"w")
    return directory


def test_reads_hf_checkpoint(tmp_path: Path) -> None:
    model = write_checkpoint(
        tmp_path / "m", "model.safetensors", "pytorch_model.bin", "training_args.bin", "optimizer.pt"
    )
    (model / "generation_config.json").write_text("{}")
    source = read_hf_checkpoint(model)
    assert (source.mode, source.backend, source.world_size) == ("hf", "python", 1)
    assert source.files == ("config.json", "generation_config.json", "model.safetensors")
    assert (source.architecture, source.dtype, source.max_seq_len, source.max_input_len) == (
        "LlamaForCausalLM",
        "bfloat16",
        4096,
        4095,
    )
    assert source.max_batch_size is None


def test_hf_sharded_weights_follow_the_index(tmp_path: Path) -> None:
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    model = write_checkpoint(tmp_path / "m", *shards, "consolidated.safetensors")
    index = {"metadata": {}, "weight_map": {"a": shards[0], "b": shards[1], "c": shards[0]}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    assert read_hf_checkpoint(model).files == ("config.json", "model.safetensors.index.json", *shards)
    (model / shards[1]).unlink()
    with pytest.raises(PackError, match="missing"):
        read_hf_checkpoint(model)


def test_hf_bin_only_when_no_safetensors(tmp_path: Path) -> None:
    model = write_checkpoint(tmp_path / "m", "pytorch_model.bin", "training_args.bin")
    assert read_hf_checkpoint(model).files == ("config.json", "pytorch_model.bin")


def test_hf_checkpoint_errors(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="has no weights"):
        read_hf_checkpoint(write_checkpoint(tmp_path / "noweights", "training_args.bin"))
    with pytest.raises(PackError, match="does not exist"):
        read_hf_checkpoint(tmp_path / "absent")
    (tmp_path / "noconfig").mkdir()
    with pytest.raises(PackError, match=r"has no config\.json"):
        read_hf_checkpoint(tmp_path / "noconfig")
    with pytest.raises(PackError, match="--engine-dir"):
        read_hf_checkpoint(write_engine(tmp_path / "engine"))


# --------------------------------------------------------------------------- tokenizers


def test_tokenizer_files_only(demo_model_dir: Path) -> None:
    names = tokenizer_files(demo_model_dir)
    assert "model.safetensors" not in names
    assert set(names) == {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
        "config.json",
    }


def test_no_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "tokenizer_config.json").write_text("{}")
    with pytest.raises(PackError, match="holds no tokenizer"):
        tokenizer_files(tmp_path / "t")
    with pytest.raises(PackError, match="does not exist"):
        tokenizer_files(tmp_path / "absent")


def test_check_tokenizer_renders_templates(demo_model_dir: Path) -> None:
    check_tokenizer(demo_model_dir)
    check_tokenizer(
        demo_model_dir, "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    )
    with pytest.raises(PackError, match="does not render"):
        check_tokenizer(demo_model_dir, "{{ raise_exception('no assistant messages') }}")
    with pytest.raises(PackError, match="does not render"):
        check_tokenizer(demo_model_dir, "{{ messages[5]['content'].upper() }}")


def test_read_chat_template(tmp_path: Path) -> None:
    good = tmp_path / "good.jinja"
    good.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert read_chat_template(good) == good.read_text()
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m['content'] }}")
    with pytest.raises(PackError, match="line 1"):
        read_chat_template(bad)
    with pytest.raises(PackError, match="not a file"):
        read_chat_template(tmp_path / "absent.jinja")
    (tmp_path / "empty.jinja").write_text("  \n")
    with pytest.raises(PackError, match="is empty"):
        read_chat_template(tmp_path / "empty.jinja")


# --------------------------------------------------------------------------- options and names


def hf_source(tmp_path: Path) -> ModelSource:
    return read_hf_checkpoint(write_checkpoint(tmp_path / "m", "model.safetensors"))


def test_template_values_from_engine(tmp_path: Path) -> None:
    source = read_engine_dir(write_engine(tmp_path / "e"))
    values = RuntimeOptions().template_values(source)
    assert values["triton_max_batch_size"] == "16"
    assert values["kv_cache_free_gpu_mem_fraction"] == "0.9"
    assert values["exclude_input_in_output"] == "true"
    assert values["enable_kv_cache_reuse"] == "false"
    assert "max_tokens_in_paged_kv_cache" not in values
    values = RuntimeOptions(
        max_batch_size=4,
        max_tokens_in_paged_kv_cache=65536,
        enable_chunked_context=True,
        batch_scheduler_policy="guaranteed_no_evict",
        preprocessing_instances=3,
        max_queue_size=100,
    ).template_values(source)
    assert values["triton_max_batch_size"] == "4"
    assert values["max_tokens_in_paged_kv_cache"] == "65536"
    assert values["enable_chunked_context"] == "true"
    assert values["batch_scheduler_policy"] == "guaranteed_no_evict"
    assert values["preprocessing_instance_count"] == "3"
    assert values["max_queue_size"] == "100"
    assert values["engine_instance_count"] == "1", "NVIDIA's C++ backend: one instance"
    with pytest.raises(PackError, match=r"exceeds the engine's build_config\.max_batch_size 16"):
        RuntimeOptions(max_batch_size=17).template_values(source)


def test_template_values_for_checkpoint(tmp_path: Path) -> None:
    synthetic = RuntimeOptions(engine="synthetic", engine_instances=4, flavor="ensemble").template_values(
        hf_source(tmp_path)
    )
    assert synthetic["engine_instance_count"] == "4"
    values = RuntimeOptions().template_values(hf_source(tmp_path))
    assert values["triton_max_batch_size"] == "8"
    assert values["max_seq_len"] == "4096"
    assert (
        RuntimeOptions(max_batch_size=64).template_values(hf_source(tmp_path))["triton_max_batch_size"]
        == "64"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (RuntimeOptions(kv_cache_free_gpu_mem_fraction=0.0), r"in \(0, 1\]"),
        (RuntimeOptions(kv_cache_free_gpu_mem_fraction=1.5), r"in \(0, 1\]"),
        (RuntimeOptions(kv_cache_free_gpu_mem_fraction=float("nan")), r"in \(0, 1\]"),
        (RuntimeOptions(max_batch_size=0), "--max-batch-size"),
        (RuntimeOptions(max_tokens_in_paged_kv_cache=-5), "--max-tokens-in-paged-kv-cache"),
        (RuntimeOptions(max_queue_delay_microseconds=-1), "--max-queue-delay-microseconds"),
        (RuntimeOptions(max_queue_size=-1), "--max-queue-size"),
        (RuntimeOptions(preprocessing_instances=0), "--preprocessing-instances"),
        (RuntimeOptions(batch_scheduler_policy="fifo"), "--batch-scheduler-policy"),
        (RuntimeOptions(engine="synthetic", engine_instances=0), r"--engine-instances must be within"),
        (RuntimeOptions(engine="reference", engine_instances=2), "--engine synthetic and the ensemble"),
        (
            RuntimeOptions(engine="synthetic", flavor="llmapi", engine_instances=2),
            "--engine synthetic and the ensemble",
        ),
        (RuntimeOptions(max_lora_rank=0), "--max-lora-rank must be >= 1, got 0"),
        (RuntimeOptions(max_lora_rank=-4), "--max-lora-rank must be >= 1, got -4"),
        (RuntimeOptions(max_lora_rank=8, flavor="ensemble"), r"llmapi flavour's.*trtllm-build --lora_plugin"),
        (RuntimeOptions(max_lora_rank=8, lora_target_modules=("q_proj", "qkv")), "Hugging Face module names"),
        (RuntimeOptions(max_lora_rank=8, lora_target_modules=()), "got 'none'"),
        (RuntimeOptions(lora_target_modules=("q_proj",)), "goes with --max-lora-rank R"),
    ],
)
def test_bad_options(options: RuntimeOptions, message: str) -> None:
    with pytest.raises(PackError, match=message):
        options.validate()


def test_every_runtime_option_is_the_argument_of_its_name() -> None:
    """RuntimeOptions.from_args: the parser's defaults are RuntimeOptions' own, and each field is set."""
    from trtllm_service.packing import cli

    parser = cli.build_parser()
    assert RuntimeOptions.from_args(parser.parse_args(["--demo", "tiny"])) == RuntimeOptions()
    given = parser.parse_args(
        ["--demo", "tiny", "--tp-size", "2", "--no-exclude-input-in-output", "--reasoning-parser", "qwen3"]
    )
    assert RuntimeOptions.from_args(given) == RuntimeOptions(
        tp_size=2, exclude_input_in_output=False, reasoning_parser="qwen3"
    )
    lora = parser.parse_args(
        ["--demo", "tiny", "--max-lora-rank", "16", "--lora-target-modules", "q_proj, v_proj"]
    )
    assert RuntimeOptions.from_args(lora) == RuntimeOptions(
        max_lora_rank=16, lora_target_modules=("q_proj", "v_proj")
    )


# --------------------------------------------------------------------------- flavours: llmapi first


def demo_source(tmp_path: Path) -> ModelSource:
    return dataclasses.replace(hf_source(tmp_path), mode="demo", demo="tiny")


def engine_source(tmp_path: Path) -> ModelSource:
    return read_engine_dir(write_engine(tmp_path / "e"))


@pytest.mark.parametrize(
    ("make", "options", "flavor"),
    [
        (hf_source, RuntimeOptions(), "llmapi"),
        (demo_source, RuntimeOptions(), "llmapi"),
        (hf_source, RuntimeOptions(engine="reference"), "llmapi"),
        (demo_source, RuntimeOptions(engine="synthetic", step_delay_ms=5.0), "llmapi"),
        (hf_source, RuntimeOptions(tp_size=2, max_seq_len=1024, dtype="float16"), "llmapi"),
        (engine_source, RuntimeOptions(), "ensemble"),  # a TensorRT engine: the C++ backend's only
        (demo_source, RuntimeOptions(flavor="ensemble"), "ensemble"),
    ],
    ids=["hf", "demo", "hf-reference", "demo-synthetic", "hf-llm-options", "engine", "asked-for"],
)
def test_llmapi_is_the_default_for_every_source_it_serves(
    tmp_path: Path, make: Any, options: RuntimeOptions, flavor: str
) -> None:
    source = make(tmp_path)
    assert options.flavor_for(source).name == flavor
    values = options.template_values(source)
    if flavor == "llmapi":
        assert values["llmapi_engine"] == (options.engine or "tensorrt_llm")


def test_engine_instances_do_not_pick_the_legacy_flavour(tmp_path: Path) -> None:
    """Only the ensemble runs synthetic engines side by side; the default stays llmapi, and says so."""
    options = RuntimeOptions(engine="synthetic", engine_instances=4)
    assert options.flavor_for(hf_source(tmp_path)).name == "llmapi"
    with pytest.raises(
        PackError, match=r"--engine-instances is the ensemble flavour's.*add --flavor ensemble"
    ):
        options.template_values(hf_source(tmp_path))
    asked = dataclasses.replace(options, flavor="ensemble").template_values(hf_source(tmp_path))
    assert asked["engine_instance_count"] == "4"


def test_a_trtllm_checkpoint_points_to_the_llmapi_path(tmp_path: Path) -> None:
    engine = write_engine(tmp_path / "ckpt")
    (engine / "config.json").write_text(json.dumps({"architecture": "LlamaForCausalLM", "mapping": {}}))
    with pytest.raises(PackError, match=r"pack the Hugging Face checkpoint it came from with --hf-model"):
        read_engine_dir(engine)


def test_the_legacy_warning_is_one_line_naming_the_way_forward() -> None:
    from tensorrtllm_backend import pinned

    text = pinned.ENSEMBLE_LEGACY_WARNING
    assert "\n" not in text and "legacy" in text
    assert f"images up to {pinned.LAST_ENSEMBLE_IMAGE}" in text and pinned.LAST_ENSEMBLE_IMAGE == "26.07"
    assert "--flavor llmapi" in text and "Hugging Face checkpoint" in text


@pytest.mark.parametrize(
    ("argv", "flavor"),
    [
        (["--hf-model", "{ckpt}"], "llmapi"),
        (["--hf-model", "{ckpt}", "--tokenizer", "{ckpt}"], "llmapi"),
        (["--demo", "tiny"], "llmapi"),
        (["--demo"], "llmapi"),
        (["--engine-dir", "{engine}", "--tokenizer", "{ckpt}"], "ensemble"),
        (["--hf-model", "{ckpt}", "--build-engine"], "ensemble"),
    ],
    ids=["hf-model", "hf-model-tokenizer", "demo-tiny", "demo-smollm2", "engine-dir", "build-engine"],
)
def test_each_pack_model_source_defaults_to_llmapi_where_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], flavor: str
) -> None:
    """Through the command line, without a model store: the flavour pack() is handed for each source."""
    from trtllm_service.packing import cli, engine_build

    ckpt = write_checkpoint(tmp_path / "ckpt", "model.safetensors")
    engine = write_engine(tmp_path / "engine")
    monkeypatch.setattr(cli, "build_demo", lambda kind, out: write_checkpoint(out, "model.safetensors"))
    monkeypatch.setattr(engine_build, "build_engine", lambda source, options, workdir: engine)
    chosen: list[str] = []

    def pack(source: ModelSource, tokenizer: Path, options: RuntimeOptions, **_: Any) -> None:
        chosen.append(options.flavor_for(source).name)

    monkeypatch.setattr(packer, "pack", pack)
    args = cli.build_parser().parse_args([a.format(ckpt=ckpt, engine=engine) for a in argv])
    cli.run(args)
    assert chosen == [flavor]


def packed(tmp_path: Path, flavor: str) -> packer.PackResult:
    info = dataclasses.replace(read_pack_info(fake_packed_model(tmp_path / "m")), flavor=flavor)
    return packer.PackResult(tag=info.tag, path=tmp_path / "m", size=1, info=info)


@pytest.mark.parametrize("flavor", ["ensemble", "llmapi"])
def test_packing_the_legacy_flavour_warns_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flavor: str
) -> None:
    from tensorrtllm_backend import pinned
    from trtllm_service.packing import cli

    monkeypatch.setattr(cli, "run", lambda args: packed(tmp_path, flavor))
    assert cli.main(["--demo", "tiny", "--quiet"]) == 0  # no phase lines: only the warning (or nothing)
    out = capsys.readouterr()
    expected = f"pack_model: warning: {pinned.ENSEMBLE_LEGACY_WARNING}\n" if flavor == "ensemble" else ""
    assert out.err == expected
    assert f"flavor: {flavor}" in out.out


def test_a_failed_pack_is_only_its_error_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trtllm_service.packing import cli

    def run(args: Any) -> None:
        raise PackError("--dtype is an LLM API option: it goes with --flavor llmapi")

    monkeypatch.setattr(cli, "run", run)
    assert cli.main(["--demo", "tiny", "--flavor", "ensemble"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "pack_model: error: --dtype is an LLM API option: it goes with --flavor llmapi"
    ]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--max-lora-rank", "0"], "--max-lora-rank must be >= 1, got 0"),
        (["--max-lora-rank", "8", "--flavor", "ensemble"], "--max-lora-rank is the llmapi flavour's"),
        (["--max-lora-rank", "8", "--lora-target-modules", "q_proj,nope"], "Hugging Face module names"),
    ],
)
def test_bad_lora_rank_arguments_are_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from trtllm_service.packing import cli

    assert cli.main(["--demo", "tiny", "--quiet", *argv]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("pack_model: error: ") and says in line


def test_an_ensemble_engine_refuses_max_lora_rank(tmp_path: Path) -> None:
    """An engine's LoRA set-up is its build's: --max-lora-rank is refused with --engine-dir too."""
    with pytest.raises(PackError, match="trtllm-build --lora_plugin auto --max_lora_rank R"):
        RuntimeOptions(max_lora_rank=8).template_values(engine_source(tmp_path))
    assert "max_lora_rank" not in RuntimeOptions(max_lora_rank=8).template_values(demo_source(tmp_path))


def test_names(tmp_path: Path) -> None:
    assert validate_name("llama-3.1_8b") == "llama-3.1_8b"
    for bad in ("Bad Name", "UPPER", "-x", "x-", "a:b", "a" * 64, ""):
        with pytest.raises(PackError, match="not a valid BentoML model name"):
            validate_name(bad)
    engine = read_engine_dir(write_engine(tmp_path / "Llama-3.1-8B Instruct__"))
    assert default_name(engine) == "trtllm-llama-3.1-8b-instruct"
    demo = ModelSource(
        mode="demo", backend="python", directory=tmp_path, files=(), architecture="x", dtype="y"
    )
    assert default_name(demo) == "trtllm-demo"


def test_launch_command_uses_mpirun_for_ranks() -> None:
    single = shlex.split(launch_command(Path("/m/repository"), 1, unique="v1"))
    assert single[0] == packer.PRODUCTION_TRITONSERVER
    assert "--model-repository=/m/repository" in single
    multi = shlex.split(launch_command(Path("/m/repository"), 2, unique="v1"))
    assert multi[:2] == ["mpirun", "--allow-run-as-root"]
    assert multi.count(packer.PRODUCTION_TRITONSERVER) == 2
    assert multi.count("-n") == 2 and ":" in multi


# --------------------------------------------------------------------------- pack.json and relocation


def fake_packed_model(root: Path) -> Path:
    """A model dir laid out as pack() does, without going through the model store."""
    (root / "engine").mkdir(parents=True)
    (root / "tokenizer").mkdir()
    values = repository_values(
        engine_dir=root / "engine", tokenizer_dir=root / "tokenizer", backend="python", overrides={}
    )
    build_repository(root / "repository", values)
    info = PackInfo(
        tag="trtllm-x:v1",
        mode="hf",
        backend="python",
        packed_root=str(root.resolve()),
        world_size=1,
        tp_size=1,
        pp_size=1,
        architecture="LlamaForCausalLM",
        dtype="float32",
        max_batch_size=8,
        max_input_len=2047,
        max_seq_len=2048,
        max_beam_width=1,
        template_values=values,
        versions={"bentoml": "1.4.39"},
        launch_command=launch_command(root / "repository", 1, unique="v1"),
    )
    (root / "pack.json").write_text(info.to_json())
    return root


def test_pack_info_round_trip(tmp_path: Path) -> None:
    model = fake_packed_model(tmp_path / "store" / "trtllm-x" / "v1")
    info = read_pack_info(model)
    assert info.tag == "trtllm-x:v1" and info.packed_root == str(model.resolve())
    assert info.launch_argv[0] == packer.PRODUCTION_TRITONSERVER
    assert PackInfo.from_dict(json.loads(info.to_json())) == info


def test_read_pack_info_errors(tmp_path: Path) -> None:
    with pytest.raises(PackError, match=r"not packed by pack_model\.py"):
        read_pack_info(tmp_path)
    model = fake_packed_model(tmp_path / "m")
    data = json.loads((model / "pack.json").read_text())
    (model / "pack.json").write_text(json.dumps({**data, "format": 99}))
    with pytest.raises(PackError, match="format 99"):
        read_pack_info(model)
    del data["backend"]
    (model / "pack.json").write_text(json.dumps(data))
    with pytest.raises(PackError, match="lacks backend"):
        read_pack_info(model)


def test_layout_runtime_repository_relocates(tmp_path: Path) -> None:
    old = fake_packed_model(tmp_path / "old-store" / "trtllm-x" / "v1")
    new = tmp_path / "new store" / "trtllm-x" / "v1"
    new.parent.mkdir(parents=True)
    shutil.move(old, new)
    dest = layout_runtime_repository(new, tmp_path / "runtime")
    assert sorted(p.name for p in dest.iterdir()) == sorted(MODELS)
    for model in MODELS:
        text = (dest / model / "config.pbtxt").read_text()
        assert str(tmp_path / "old-store") not in text
    assert f'string_value: "{new.resolve()}/engine"' in (dest / "tensorrt_llm" / "config.pbtxt").read_text()
    for model in ("preprocessing", "postprocessing"):
        assert f'string_value: "{new.resolve()}/tokenizer"' in (dest / model / "config.pbtxt").read_text()
    assert (dest / "tensorrt_llm" / "1" / "model.py").is_file()
    # The model's own repository is left as packed; a second layout into the same dest replaces it.
    assert str(tmp_path / "old-store") in (new / "repository" / "tensorrt_llm" / "config.pbtxt").read_text()
    (dest / "tensorrt_llm" / "stale").write_text("x")
    layout_runtime_repository(new, dest)
    assert not (dest / "tensorrt_llm" / "stale").exists()


def test_layout_runtime_repository_errors(tmp_path: Path) -> None:
    model = fake_packed_model(tmp_path / "m")
    shutil.rmtree(model / "engine")
    with pytest.raises(PackError, match="lacks engine/"):
        layout_runtime_repository(model, tmp_path / "out")
    with pytest.raises(PackError, match=r"no pack\.json"):
        layout_runtime_repository(tmp_path, tmp_path / "out")


def test_layout_does_not_touch_lookalike_paths(tmp_path: Path) -> None:
    model = fake_packed_model(tmp_path / "m")
    config = model / "repository" / "tensorrt_llm" / "config.pbtxt"
    root = str(model.resolve())
    config.write_text(config.read_text() + f'# "{root}-other/file"\n')
    dest = layout_runtime_repository(model, tmp_path / "out")
    assert f'"{root}-other/file"' in (dest / "tensorrt_llm" / "config.pbtxt").read_text()


def test_copy_is_chunked_and_reports_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copying, "_COPY_CHUNK", 7)
    source = tmp_path / "big.engine"
    source.write_bytes(os.urandom(100))
    seen: list[int] = []

    class Recorder(copying.Progress):
        def update(self, count: int) -> None:
            seen.append(count)

    copying.copy_files([(source, tmp_path / "out" / "big.engine")], Recorder(100, enabled=False))
    assert (tmp_path / "out" / "big.engine").read_bytes() == source.read_bytes()
    assert sum(seen) == 100 and max(seen) == 7


# --------------------------------------------------------------------------- what the packed model can do


def test_logits_datatype_from_the_engine(tmp_path: Path) -> None:
    fp16 = read_engine_dir(
        write_engine(tmp_path / "fp16", engine_config(pretrained={"logits_dtype": "float16"}))
    )
    assert fp16.logits_dtype == "float16"
    assert RuntimeOptions().template_values(fp16)["logits_datatype"] == "TYPE_FP16"
    fp32 = read_engine_dir(
        write_engine(tmp_path / "fp32", engine_config(pretrained={"logits_dtype": "float32"}))
    )
    assert RuntimeOptions().template_values(fp32)["logits_datatype"] == "TYPE_FP32"
    unsaid = read_engine_dir(write_engine(tmp_path / "unsaid"))
    assert RuntimeOptions().template_values(unsaid)["logits_datatype"] == "TYPE_FP32"
    in_build = read_engine_dir(write_engine(tmp_path / "build", engine_config(logits_dtype="float16")))
    assert RuntimeOptions().template_values(in_build)["logits_datatype"] == "TYPE_FP16"
    with pytest.raises(PackError, match="logits_dtype 'bfloat16' is not one of float16, float32"):
        read_engine_dir(
            write_engine(tmp_path / "bf16", engine_config(pretrained={"logits_dtype": "bfloat16"}))
        )


def test_xgrammar_tokenizer_info_is_the_vocabulary(demo_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from tensorrtllm_backend.repository import end_ids

    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir)
    ends = end_ids(demo_model_dir)
    assert len(ends) == 2  # <|eot_id|> and <|end_of_text|>
    info = json.loads(json.dumps(xgrammar_tokenizer_info(tokenizer, ends)))  # as the file holds it
    assert set(info) == {"encoded_vocab", "tokenizer_str", "stop_token_ids"}  # what the C++ backend reads
    vocab = info["encoded_vocab"]
    assert len(vocab) == len(tokenizer.get_vocab())
    for token, token_id in tokenizer.get_vocab().items():  # every id, spelled as the vocabulary does
        assert vocab[token_id] == token
    assert vocab == tokenizer.convert_ids_to_tokens(list(range(len(vocab))))
    assert info["stop_token_ids"] == ends  # every end id of the packed model, not only eos
    assert json.loads(info["tokenizer_str"]) == json.loads((demo_model_dir / "tokenizer.json").read_text())
    assert json.loads(info["tokenizer_str"])["decoder"]["type"] == "ByteLevel"  # what xgrammar detects


def test_xgrammar_tokenizer_info_edges(demo_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir)
    size = len(tokenizer.get_vocab())
    # the model's vocabulary is the limit: tokens past it cannot be produced, nor end a guide
    cut = xgrammar_tokenizer_info(tokenizer, [size - 1, 5, 5], vocab_size=size - 1)
    assert len(cut["encoded_vocab"]) == size - 1 and cut["stop_token_ids"] == [5]

    class Holes:  # a vocabulary that skips an id: later ids keep their places
        backend_tokenizer = tokenizer.backend_tokenizer

        def get_vocab(self) -> dict[str, int]:
            return {"a": 0, "c": 2}

    assert xgrammar_tokenizer_info(Holes(), [2])["encoded_vocab"] == ["a", "", "c"]
    with pytest.raises(PackError, match="needs an end-of-sequence id within the vocabulary"):
        xgrammar_tokenizer_info(tokenizer, [size + 10])

    class Slow:  # a Python tokenizer has no tokenizer.json for xgrammar to read how tokens decode
        def get_vocab(self) -> dict[str, int]:
            return {"a": 0}

    with pytest.raises(PackError, match=r"needs a fast tokenizer .*--no-guided-decoding"):
        xgrammar_tokenizer_info(Slow(), [0])


def test_guided_decoding_options(tmp_path: Path) -> None:
    source = hf_source(tmp_path)
    assert RuntimeOptions().guides(ENSEMBLE) and RuntimeOptions().guides(LLMAPI)
    assert not RuntimeOptions(guided_decoding=False).guides(ENSEMBLE)
    RuntimeOptions(guided_decoding=False, flavor="ensemble").template_values(source)
    with pytest.raises(PackError, match="--no-guided-decoding goes with the ensemble flavour"):
        RuntimeOptions(guided_decoding=False).template_values(source)  # a checkpoint: llmapi


def test_old_pack_json_still_loads(tmp_path: Path) -> None:
    """pack.json written before the capability fields: what it says by other means."""
    model = fake_packed_model(tmp_path / "m")
    data = json.loads((model / "pack.json").read_text())
    for key in ("gather_generation_logits", "gather_context_logits", "guided_decoding"):
        del data[key]

    def load(**changes: Any) -> PackInfo:
        return PackInfo.from_dict({**data, **changes})

    python_ensemble = load()
    assert python_ensemble.gather_generation_logits and python_ensemble.gather_context_logits
    assert not python_ensemble.guided_decoding  # its config did not name the xgrammar tokenizer info
    assert load(flavor="llmapi").guided_decoding
    engine = load(backend="tensorrtllm")
    assert not (engine.gather_generation_logits or engine.gather_context_logits or engine.guided_decoding)
    values = {**data["template_values"], "guided_decoding_backend": "xgrammar"}
    assert load(
        template_values={**values, "xgrammar_tokenizer_info_path": "/m/tokenizer/x.json"}
    ).guided_decoding
    assert not load(template_values=values).guided_decoding
    # recorded fields win
    assert load(backend="tensorrtllm", gather_generation_logits=True, guided_decoding=True).guided_decoding


def test_guided_decoding_unsupported() -> None:
    info = PackInfo.from_dict(json.loads(PackInfo(**{**_INFO, "guided_decoding": True}).to_json()))
    assert guided_decoding_unsupported(info) is None
    why = guided_decoding_unsupported(dataclasses.replace(info, guided_decoding=False))
    assert why is not None and "packed without it" in why and "--no-guided-decoding" in why


def test_layout_relocates_the_xgrammar_tokenizer_info(tmp_path: Path) -> None:
    old = tmp_path / "old" / "m"
    (old / "engine").mkdir(parents=True)
    (old / "tokenizer").mkdir()
    path = old.resolve() / "tokenizer" / XGRAMMAR_TOKENIZER_INFO
    write_xgrammar_tokenizer_info(
        path, {"encoded_vocab": ["a"], "tokenizer_str": "{}", "stop_token_ids": [0]}
    )
    values = repository_values(
        engine_dir=old / "engine",
        tokenizer_dir=old / "tokenizer",
        backend="tensorrtllm",
        overrides={"guided_decoding_backend": "xgrammar", "xgrammar_tokenizer_info_path": str(path)},
    )
    build_repository(old / "repository", values)
    info = PackInfo(**{**_INFO, "packed_root": str(old.resolve()), "template_values": values})
    (old / "pack.json").write_text(info.to_json())
    new = tmp_path / "new" / "m"
    new.parent.mkdir()
    shutil.move(old, new)
    config = (
        layout_runtime_repository(new, tmp_path / "runtime") / "tensorrt_llm" / "config.pbtxt"
    ).read_text()
    moved = new.resolve() / "tokenizer" / XGRAMMAR_TOKENIZER_INFO
    assert f'key: "xgrammar_tokenizer_info_path" value: {{ string_value: "{moved}" }}' in config
    assert 'key: "guided_decoding_backend" value: { string_value: "xgrammar" }' in config
    assert moved.is_file() and str(tmp_path / "old") not in config


def test_defaults_leave_guided_decoding_off(tmp_path: Path) -> None:
    """A repository filled without pack_model.py's values: the C++ backend's "no guided decoding"."""
    values = repository_values(engine_dir=tmp_path, tokenizer_dir=tmp_path, backend="tensorrtllm")
    build_repository(tmp_path / "repo", values)
    config = (tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    for key in ("guided_decoding_backend", "xgrammar_tokenizer_info_path"):
        assert f'key: "{key}" value: {{ string_value: "" }}' in config


# The service refuses a guide the packed model cannot follow, naming the field, before Triton.

_INFO: dict[str, Any] = {
    "tag": "m:v1",
    "mode": "engine",
    "backend": "tensorrtllm",
    "packed_root": "/m",
    "world_size": 1,
    "tp_size": 1,
    "pp_size": 1,
    "architecture": "LlamaForCausalLM",
    "dtype": "bfloat16",
    "max_batch_size": 8,
    "max_input_len": 63,
    "max_seq_len": 64,
    "max_beam_width": 1,
    "flavor": "ensemble",
}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
        (
            "/chat/completions",
            {"response_format": {"type": "text"}, "guided_regex": "[ab]+"},
            "guided_regex",
        ),
        ("/completions", {"guided_choice": ["yes", "no"]}, "guided_choice"),
        ("/completions", {"guided_json": {"type": "object"}}, "guided_json"),
        ("/completions", {"guided_grammar": 'root ::= "a"'}, "guided_grammar"),
        (
            "/chat/completions",
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                "tool_choice": "required",
            },
            "tool_choice",
        ),
    ],
)
def test_guided_request_refused_when_packed_without(path: str, body: dict[str, Any], param: str) -> None:
    from tests.serving_support import FakeRuntime, post
    from trtllm_service.relay.flavors import EnsembleFlavor

    runtime = FakeRuntime()
    runtime.flavor = EnsembleFlavor(no_guides=guided_decoding_unsupported(PackInfo(**_INFO)))
    base = (
        {"messages": [{"role": "user", "content": "hi"}]} if path == "/chat/completions" else {"prompt": "hi"}
    )
    response = post(runtime, path, {**base, **body, "max_tokens": 2})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param
    assert error["message"].startswith(
        f"'{param}' needs guided decoding, and this model was packed without it"
    )
    assert runtime.requests == []  # nothing reached the engine
    assert post(runtime, path, {**base, "max_tokens": 2}).status_code == 200  # unguided requests are served


def test_served_prompt_limit_of_an_engine(tmp_path: Path) -> None:
    """TensorRT-LLM's runtime takes prompts up to max_num_tokens unless chunked context is on."""
    engine = read_engine_dir(
        write_engine(tmp_path / "e", engine_config(max_input_len=32767, max_seq_len=32768))
    )
    assert packer.served_max_input_len(engine, RuntimeOptions()) == 8192  # its max_num_tokens
    assert packer.served_max_input_len(engine, RuntimeOptions(enable_chunked_context=True)) == 32767
    short = read_engine_dir(write_engine(tmp_path / "s"))
    assert packer.served_max_input_len(short, RuntimeOptions()) == 1024
    assert packer.served_max_input_len(hf_source(tmp_path), RuntimeOptions()) == 4095
