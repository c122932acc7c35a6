"""`pack_model.py --hf-model DIR --build-engine`: a Hugging Face checkpoint -> a TensorRT engine.

Two steps, as TensorRT-LLM does it: convert the checkpoint to a TensorRT-LLM checkpoint (the
`tensorrt_llm.models` class for its architecture, `from_hugging_face`, one rank file per GPU), then
`trtllm-build` it into an engine with the pack options as build limits. The result is packed like
`--engine-dir`. Needs the `tensorrt_llm` package and the `trtllm-build` command (NVIDIA's TRT-LLM
image); where either is missing, PackError says so before anything is written.

The engine is built for what the service offers, not trtllm-build's defaults (1.x: max_input_len
1024, max_beam_width 1, no gathered logits): prompts up to the model's context (max_seq_len - 1),
the generation logits that top log probs are computed from, and on request beams and the context
logits prompt log probs need.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from trtllm_service.packed_model import PackError
from trtllm_service.packing.options import RuntimeOptions
from trtllm_service.packing.sources import ModelSource

TRTLLM_BUILD = "trtllm-build"


def _tensorrt_llm() -> Any:
    try:
        import tensorrt_llm
    except ImportError as exc:
        raise PackError(
            f"--build-engine needs TensorRT-LLM, which cannot be imported here ({exc}); run it in NVIDIA's "
            "Triton TRT-LLM image, or pack the checkpoint without --build-engine (LLM API flavour)"
        ) from None
    return tensorrt_llm


def build_limits(source: ModelSource, options: RuntimeOptions) -> tuple[int | None, int]:
    """(max_seq_len, max_input_len) the engine is built for.

    max_seq_len: --max-seq-len, else the checkpoint's (max_position_embeddings); None leaves it to
    trtllm-build (it deduces the same from the model). max_input_len: --max-input-len, else
    max_seq_len - 1 (a prompt may fill the context but for one generated token).

    Raises:
        PackError: The context length is unknown and --max-input-len not given, or the prompt limit
            leaves no room for a generated token.
    """
    max_seq_len = options.max_seq_len or source.max_seq_len
    if options.max_seq_len and source.max_seq_len and options.max_seq_len > source.max_seq_len:
        raise PackError(
            f"--max-seq-len {options.max_seq_len} exceeds what the model was trained for ({source.max_seq_len})"
        )
    max_input_len = options.max_input_len
    if max_input_len is None:
        if max_seq_len is None:
            raise PackError(
                f"{str(source.directory)!r}: config.json does not say the context length "
                "(max_position_embeddings): pass --max-seq-len N (or --max-input-len N)"
            )
        max_input_len = max_seq_len - 1
    elif max_seq_len is not None and max_input_len >= max_seq_len:
        raise PackError(
            f"--max-input-len {max_input_len} must be below the max sequence length {max_seq_len} "
            "(prompt and generated tokens together)"
        )
    return max_seq_len, max_input_len


def trtllm_build_command(
    checkpoint: Path, output: Path, options: RuntimeOptions, source: ModelSource, *, binary: str | None = None
) -> list[str]:
    """The trtllm-build command line for a converted checkpoint of `source` and the pack options.

    `binary`: the trtllm-build to run (default: the one on PATH).

    Raises:
        PackError: No trtllm-build, or limits that cannot be built (see build_limits).
    """
    if binary is None:
        binary = shutil.which(TRTLLM_BUILD)
        if binary is None:
            raise PackError(f"--build-engine needs the {TRTLLM_BUILD} command, which is not on PATH")
    max_seq_len, max_input_len = build_limits(source, options)
    command = [binary, "--checkpoint_dir", str(checkpoint), "--output_dir", str(output)]
    if options.max_batch_size:
        command += ["--max_batch_size", str(options.max_batch_size)]
    if max_seq_len is not None:
        command += ["--max_seq_len", str(max_seq_len)]
    command += ["--max_input_len", str(max_input_len)]
    if options.max_num_tokens:
        command += ["--max_num_tokens", str(options.max_num_tokens)]
    command += ["--max_beam_width", str(options.max_beam_width or 1)]
    if options.gather_generation_logits is not False:  # default on: top log probs need them
        command.append("--gather_generation_logits")
    if options.gather_context_logits:  # default off: the whole prompt's logits cost memory
        command.append("--gather_context_logits")
    if options.enable_kv_cache_reuse or options.enable_chunked_context:
        command += ["--use_paged_context_fmha", "enable"]
    return command


def build_engine(source: ModelSource, options: RuntimeOptions, workdir: Path) -> Path:
    """Converts and builds `source` under `workdir`; returns the engine directory."""
    output = workdir / "engine"
    checkpoint = workdir / "checkpoint"
    tensorrt_llm = _tensorrt_llm()
    command = trtllm_build_command(checkpoint, output, options, source)  # before the long conversion
    from tensorrt_llm.models.automodel import AutoModelForCausalLM

    tp, pp = options.tp_size or 1, options.pp_size or 1
    dtype = "auto" if options.dtype == "auto" else options.dtype
    for rank in range(tp * pp):
        mapping = tensorrt_llm.Mapping(world_size=tp * pp, rank=rank, tp_size=tp, pp_size=pp)
        model = AutoModelForCausalLM.from_hugging_face(str(source.directory), dtype=dtype, mapping=mapping)
        model.save_checkpoint(str(checkpoint), save_config=rank == 0)
        del model
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PackError(f"trtllm-build failed (exit {result.returncode}): {last[0]}")
    return output
