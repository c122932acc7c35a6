"""engine_build: the trtllm-build command line `pack_model.py --build-engine` runs, and the build
options refused where no engine is built (no TensorRT-LLM needed)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.support import engine_config
from trtllm_service.packed_model import PackError
from trtllm_service.packing import cli as pack_model
from trtllm_service.packing.engine_build import build_limits, trtllm_build_command
from trtllm_service.packing.options import RuntimeOptions
from trtllm_service.packing.sources import ModelSource, read_engine_dir

pytestmark = pytest.mark.unit

CKPT, OUT, BINARY = Path("/w/checkpoint"), Path("/w/engine"), "/opt/bin/trtllm-build"


def checkpoint(max_seq_len: int | None = 8192) -> ModelSource:
    """A Hugging Face checkpoint as read_hf_checkpoint describes it."""
    return ModelSource(
        mode="hf",
        backend="python",
        directory=Path("/models/llama"),
        files=("config.json", "model.safetensors"),
        architecture="LlamaForCausalLM",
        dtype="bfloat16",
        max_seq_len=max_seq_len,
        max_input_len=max_seq_len - 1 if max_seq_len else None,
        gather_generation_logits=True,
        gather_context_logits=True,
    )


def argv(options: RuntimeOptions | None = None, source: ModelSource | None = None) -> list[str]:
    return trtllm_build_command(CKPT, OUT, options or RuntimeOptions(), source or checkpoint(), binary=BINARY)


def flags(command: list[str]) -> dict[str, str | None]:
    """`--name value` pairs and bare `--switch`es of a command line."""
    found: dict[str, str | None] = {}
    for i, part in enumerate(command):
        if part.startswith("--"):
            following = command[i + 1] if i + 1 < len(command) else "--"
            found[part] = None if following.startswith("--") else following
    return found


def test_default_build_serves_what_the_api_offers() -> None:
    command = argv()
    assert command[:5] == [BINARY, "--checkpoint_dir", str(CKPT), "--output_dir", str(OUT)]
    assert flags(command) == {
        "--checkpoint_dir": str(CKPT),
        "--output_dir": str(OUT),
        "--max_seq_len": "8192",
        "--max_input_len": "8191",  # not trtllm-build's 1024: any prompt that fits the context
        "--max_beam_width": "1",
        "--gather_generation_logits": None,  # top log probs
    }


def test_every_build_option_reaches_trtllm_build() -> None:
    options = RuntimeOptions(
        max_batch_size=64,
        max_num_tokens=4096,
        max_seq_len=4096,
        max_input_len=3000,
        max_beam_width=4,
        gather_generation_logits=False,
        gather_context_logits=True,
        enable_chunked_context=True,
    )
    assert flags(argv(options)) == {
        "--checkpoint_dir": str(CKPT),
        "--output_dir": str(OUT),
        "--max_batch_size": "64",
        "--max_seq_len": "4096",
        "--max_input_len": "3000",
        "--max_num_tokens": "4096",
        "--max_beam_width": "4",
        "--gather_context_logits": None,
        "--use_paged_context_fmha": "enable",
    }


def test_max_seq_len_sets_the_prompt_limit() -> None:
    assert flags(argv(RuntimeOptions(max_seq_len=2048)))["--max_input_len"] == "2047"
    assert build_limits(checkpoint(), RuntimeOptions(max_seq_len=2048)) == (2048, 2047)


def test_unknown_context_length() -> None:
    with pytest.raises(PackError, match=r"does not say the context length .*pass --max-seq-len N"):
        argv(source=checkpoint(None))
    command = flags(argv(RuntimeOptions(max_input_len=1500), checkpoint(None)))
    assert command["--max_input_len"] == "1500" and "--max_seq_len" not in command  # trtllm-build deduces
    assert flags(argv(RuntimeOptions(max_seq_len=1024), checkpoint(None)))["--max_input_len"] == "1023"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            RuntimeOptions(max_input_len=8192),
            "--max-input-len 8192 must be below the max sequence length 8192",
        ),
        (
            RuntimeOptions(max_seq_len=1024, max_input_len=2000),
            "--max-input-len 2000 must be below the max sequence length 1024",
        ),
        (RuntimeOptions(max_seq_len=16384), "--max-seq-len 16384 exceeds what the model was trained for"),
    ],
)
def test_limits_that_cannot_be_built(options: RuntimeOptions, message: str) -> None:
    with pytest.raises(PackError, match=message):
        argv(options)


def test_trtllm_build_from_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "trtllm-build"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert trtllm_build_command(CKPT, OUT, RuntimeOptions(), checkpoint())[0] == str(fake)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(PackError, match="needs the trtllm-build command, which is not on PATH"):
        trtllm_build_command(CKPT, OUT, RuntimeOptions(), checkpoint())


def cli_options(*args: str) -> RuntimeOptions:
    return pack_model._options(pack_model.build_parser().parse_args(["--hf-model", "/m", *args]))


def test_pack_flags_to_trtllm_build() -> None:
    options = cli_options(
        "--build-engine",
        "--max-input-len",
        "4000",
        "--max-beam-width",
        "2",
        "--no-gather-generation-logits",
        "--gather-context-logits",
    )
    command = flags(argv(options))
    assert (command["--max_input_len"], command["--max_beam_width"]) == ("4000", "2")
    assert "--gather_context_logits" in command and "--gather_generation_logits" not in command
    # defaults: nothing given, so nothing is refused where no engine is built
    defaults = cli_options()
    assert (defaults.max_input_len, defaults.max_beam_width, defaults.guided_decoding) == (None, None, None)
    assert (defaults.gather_generation_logits, defaults.gather_context_logits) == (None, None)
    assert options.without_build_options() == RuntimeOptions(flavor=None, dtype="auto")


def write_engine(directory: Path, **build: Any) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(engine_config(tp=1, **build)))
    (directory / "rank0.engine").write_bytes(b"engine")
    return directory


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            RuntimeOptions(max_beam_width=4),
            r"--max-beam-width is fixed when an engine is built: this engine has max_beam_width = 2 ",
        ),
        (RuntimeOptions(max_input_len=100), "--max-input-len is fixed .* max_input_len = 1024 "),
        (
            RuntimeOptions(gather_generation_logits=True),
            "--gather-generation-logits is fixed .* gather_generation_logits = false",
        ),
        (
            RuntimeOptions(gather_context_logits=False),
            "--no-gather-context-logits is fixed .* gather_context_logits = true",
        ),
    ],
)
def test_build_options_refused_for_a_prebuilt_engine(
    tmp_path: Path, options: RuntimeOptions, message: str
) -> None:
    engine = read_engine_dir(write_engine(tmp_path / "e", max_beam_width=2, gather_context_logits=True))
    with pytest.raises(PackError, match=message):
        options.template_values(engine)


@pytest.mark.parametrize(
    ("options", "flag"),
    [
        (RuntimeOptions(max_input_len=100), "--max-input-len"),
        (RuntimeOptions(max_beam_width=2, flavor="ensemble"), "--max-beam-width"),
        (RuntimeOptions(gather_generation_logits=False), "--no-gather-generation-logits"),
        (RuntimeOptions(gather_context_logits=True), "--gather-context-logits"),
        (RuntimeOptions(gather_context_logits=True, flavor="ensemble"), "--gather-context-logits"),
    ],
)
def test_build_options_refused_without_a_build(options: RuntimeOptions, flag: str) -> None:
    with pytest.raises(
        PackError, match=f"^{flag} is an engine build option: it goes with --hf-model DIR --build-engine"
    ):
        options.template_values(checkpoint())


def test_max_beam_width_of_a_checkpoint_is_the_llm_apis() -> None:
    """Served by the LLM API (the default for a checkpoint), --max-beam-width is model.yaml's
    max_beam_width: no build needed (issue 34)."""
    assert RuntimeOptions(max_beam_width=2).template_values(checkpoint())["max_beam_width"] == "2"


def test_refusals_are_one_line_from_the_command_line(
    tmp_path: Path, demo_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = write_engine(tmp_path / "e")
    code = pack_model.main(
        ["--engine-dir", str(engine), "--tokenizer", str(demo_model_dir), "--max-beam-width", "4"]
    )
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("pack_model: error: --max-beam-width is fixed when an engine is built")
    assert "rebuild it with trtllm-build" in err


def test_engine_capabilities_read_from_its_config(tmp_path: Path) -> None:
    plain = read_engine_dir(write_engine(tmp_path / "plain"))
    assert (plain.gather_generation_logits, plain.gather_context_logits, plain.logits_dtype) == (
        False,
        False,
        None,
    )
    assert plain.vocab_size == 128256
    both = read_engine_dir(write_engine(tmp_path / "all", gather_all_token_logits=True))
    assert (both.gather_generation_logits, both.gather_context_logits) == (True, True)
    generation = read_engine_dir(
        write_engine(tmp_path / "gen", gather_generation_logits=True, max_beam_width=4)
    )
    assert (generation.gather_generation_logits, generation.gather_context_logits) == (True, False)
    assert RuntimeOptions().template_values(generation)["max_beam_width"] == "4"
