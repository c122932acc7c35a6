"""Throughput of the reference engine through Triton's ensemble: 1 stream vs N concurrent streams.

Builds a random Llama of the requested shape with the demo tokenizer, fills our model
repository, starts tritonserver through our launcher and streams greedy requests over gRPC.
Reports tokens/s and time to first token for each concurrency, measured side by side in one run,
as JSON and markdown. Runs on CPU, or on CUDA where present (the device tool lends an H100).

    python bench/engine_throughput.py --out bench/results --hidden 2048 --layers 16 --tokens 128
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tensorrtllm_backend import LAUNCHER  # noqa: E402
from tensorrtllm_backend.repository import build_repository, repository_values  # noqa: E402
from trtllm_service.demo_model import build_demo_model  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_model(workdir: Path, hidden: int, layers: int, dtype: str) -> Path:
    """The demo tokenizer with a random Llama of the given shape (demo shape when hidden is 0)."""
    demo = build_demo_model(workdir / "demo")
    if not hidden:
        return demo
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(demo)
    config.hidden_size = hidden
    config.intermediate_size = hidden * 4 // 3 * 2 // 64 * 64
    config.num_hidden_layers = layers
    config.num_attention_heads = max(hidden // 128, 1)
    config.num_key_value_heads = max(hidden // 512, 1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    out = workdir / "model"
    model.save_pretrained(out)
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    ):
        (out / name).write_bytes((demo / name).read_bytes())
    return out


def stream_once(url: str, prompt: str, max_tokens: int, results: list[dict], index: int) -> None:
    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error, time.perf_counter())))

    def tensor(name: str, array: np.ndarray, dtype: str) -> grpcclient.InferInput:
        item = grpcclient.InferInput(name, list(array.shape), dtype)
        item.set_data_from_numpy(array)
        return item

    inputs = [
        tensor("text_input", np.array([[prompt.encode()]], dtype=np.object_), "BYTES"),
        tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
        tensor("stream", np.array([[True]]), "BOOL"),
        tensor("end_id", np.array([[-1]], dtype=np.int32), "INT32"),
        tensor("return_num_output_tokens", np.array([[True]]), "BOOL"),
    ]
    started = time.perf_counter()
    client.async_stream_infer("ensemble", inputs, request_id=f"bench-{index}-{time.time_ns()}")
    first = None
    tokens = 0
    while True:
        result, error, at = responses.get(timeout=600)
        if error is not None:
            raise RuntimeError(str(error))
        if first is None:
            first = at
        counts = result.as_numpy("num_output_tokens")
        if counts is not None:
            tokens = int(counts.reshape(-1)[0])
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    results[index] = {"ttft_s": first - started, "total_s": at - started, "tokens": tokens}


def run_level(url: str, streams: int, max_tokens: int) -> dict:
    results: list[dict] = [{} for _ in range(streams)]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            stream_once(url, f"Story number {i}:", max_tokens, results, i)
        except BaseException as exc:  # reported after the join
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(streams)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} of {streams} streams failed: {errors[0]}")
    tokens = sum(r["tokens"] for r in results)
    return {
        "streams": streams,
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "ttft_p50_s": round(float(np.median([r["ttft_s"] for r in results])), 4),
        "per_stream_tokens_per_s": round(float(np.median([r["tokens"] / r["total_s"] for r in results])), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--hidden", type=int, default=0, help="0: the demo model's shape")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--concurrency", default="1,4,16")
    args = parser.parse_args()

    import torch

    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    model = build_model(workdir, args.hidden, args.layers, args.dtype)
    repo = build_repository(workdir / "repo", repository_values(engine_dir=model, tokenizer_dir=model))
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    with open(workdir / "triton.log", "wb") as log:
        launcher = subprocess.Popen(
            [sys.executable, str(LAUNCHER), "--model_repo", str(repo), "--grpc_port", str(grpc_port),
             "--http_port", str(http_port), "--metrics_port", str(metrics_port)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/ensemble/ready", timeout=2)
                break
            except OSError:
                if launcher.poll() is not None or time.monotonic() > deadline:
                    print((workdir / "triton.log").read_text()[-3000:], file=sys.stderr)
                    return 1
                time.sleep(1)
        url = f"127.0.0.1:{grpc_port}"
        run_level(url, 1, 8)  # warm-up
        levels = [run_level(url, int(n), args.tokens) for n in args.concurrency.split(",")]
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"
    report = {
        "device": device,
        "model": {"hidden": args.hidden or "demo", "layers": args.layers if args.hidden else "demo"},
        "max_tokens": args.tokens,
        "levels": levels,
        "speedup_vs_1_stream": {
            str(level["streams"]): round(level["tokens_per_s"] / levels[0]["tokens_per_s"], 2)
            for level in levels
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine_throughput.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Reference engine through the ensemble on {device}",
        "",
        "| streams | tokens/s | per-stream tokens/s | TTFT p50 (s) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {lv['streams']} | {lv['tokens_per_s']} | {lv['per_stream_tokens_per_s']} | {lv['ttft_p50_s']} |"
        for lv in levels
    ]
    (args.out / "engine_throughput.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
