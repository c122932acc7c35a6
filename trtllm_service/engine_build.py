"""`pack_model.py --hf-model DIR --build-engine`: a Hugging Face checkpoint -> a TensorRT engine.

Two steps, as TensorRT-LLM does it: convert the checkpoint to a TensorRT-LLM checkpoint (the
`tensorrt_llm.models` class for its architecture, `from_hugging_face`, one rank file per GPU), then
`trtllm-build` it into an engine with the pack options as build limits. The result is packed like
`--engine-dir`. Needs the `tensorrt_llm` package and the `trtllm-build` command (NVIDIA's TRT-LLM
image); where either is missing, PackError says so before anything is written.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from trtllm_service.packed_model import PackError
from trtllm_service.packing import ModelSource, RuntimeOptions


def _tensorrt_llm() -> Any:
    try:
        import tensorrt_llm
    except ImportError as exc:
        raise PackError(
            f"--build-engine needs TensorRT-LLM, which cannot be imported here ({exc}); run it in NVIDIA's "
            "Triton TRT-LLM image, or pack the checkpoint without --build-engine (LLM API flavour)"
        ) from None
    return tensorrt_llm


def trtllm_build_command(checkpoint: Path, output: Path, options: RuntimeOptions) -> list[str]:
    """The trtllm-build command line for a converted checkpoint and the pack options."""
    binary = shutil.which("trtllm-build")
    if binary is None:
        raise PackError("--build-engine needs the trtllm-build command, which is not on PATH")
    command = [binary, "--checkpoint_dir", str(checkpoint), "--output_dir", str(output)]
    if options.max_batch_size:
        command += ["--max_batch_size", str(options.max_batch_size)]
    if options.max_seq_len:
        command += ["--max_seq_len", str(options.max_seq_len)]
    if options.max_num_tokens:
        command += ["--max_num_tokens", str(options.max_num_tokens)]
    if options.enable_kv_cache_reuse or options.enable_chunked_context:
        command += ["--use_paged_context_fmha", "enable"]
    return command


def build_engine(source: ModelSource, options: RuntimeOptions, workdir: Path) -> Path:
    """Converts and builds `source` under `workdir`; returns the engine directory."""
    tensorrt_llm = _tensorrt_llm()
    output = workdir / "engine"
    checkpoint = workdir / "checkpoint"
    command = trtllm_build_command(checkpoint, output, options)
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
