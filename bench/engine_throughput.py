"""Throughput of the reference engine through Triton's ensemble: 1 stream vs N concurrent streams.

Builds a random Llama of the requested shape with the demo tokenizer, fills our model
repository, starts tritonserver through our launcher and streams greedy requests over gRPC.
Reports tokens/s and time to first token for each concurrency, measured side by side in one run,
as JSON and markdown. Then checks batching does not change answers: greedy token ids of N
concurrent requests to the engine model against each one's solo run (`--check-tokens`), and,
with `--transformers-cb`, measures transformers' own continuous batching (`generate_batch`, in
process, no Triton) on the same prompts for comparison, and with `--guided`, tokens/s of the same
concurrent engine requests with a grammar against without. Runs on CPU, or on CUDA where present
(the device tool lends an H100; an 8B-shaped Llama is `--hidden 4096 --layers 32`).

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
from trtllm_service.packing.demo_model import build_demo_model  # noqa: E402


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
    device = "cuda" if torch.cuda.is_available() else "cpu"
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))  # initialise in place: 8B in float32 is 32 GB
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default_dtype)
    out = workdir / "model"
    model.save_pretrained(out)
    del model
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


GUIDE = ("regex", "[a-z ]{4000}")
"""The guide of the guided-decoding measurement: never complete within the token budget, so
guided and plain requests generate the same number of tokens."""


def engine_ids(
    url: str, input_ids: list[int], max_tokens: int, guide: tuple[str, str] | None = None
) -> list[int]:
    """Greedy token ids from the `tensorrt_llm` model itself (one non-streamed request)."""
    import tritonclient.grpc as grpcclient

    def tensor(name: str, array: np.ndarray, dtype: str) -> grpcclient.InferInput:
        item = grpcclient.InferInput(name, list(array.shape), dtype)
        item.set_data_from_numpy(array)
        return item

    inputs = [
        tensor("input_ids", np.array([input_ids], dtype=np.int32), "INT32"),
        tensor("input_lengths", np.array([[len(input_ids)]], dtype=np.int32), "INT32"),
        tensor("request_output_len", np.array([[max_tokens]], dtype=np.int32), "INT32"),
        tensor("end_id", np.array([[-1]], dtype=np.int32), "INT32"),
        tensor("streaming", np.array([[False]]), "BOOL"),
    ]
    if guide is not None:
        inputs += [
            tensor("guided_decoding_guide_type", np.array([[guide[0].encode()]], dtype=np.object_), "BYTES"),
            tensor("guided_decoding_guide", np.array([[guide[1].encode()]], dtype=np.object_), "BYTES"),
        ]
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("tensorrt_llm", inputs, request_id=f"check-{time.time_ns()}")
    ids: list[int] = []
    while True:
        result, error = responses.get(timeout=600)
        if error is not None:
            raise RuntimeError(str(error))
        out = result.as_numpy("output_ids")
        if out is not None:
            ids += out.reshape(-1).tolist()
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    return ids


def check_prompts(tokenizer_dir: Path, streams: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    # Lengths differ, so the requests finish prefill and reach each position at different steps.
    return [tokenizer.encode(f"Story number {i}:" + " and then" * (i % 7)) for i in range(streams)]


def guided_throughput(url: str, prompts: list[list[int]], max_tokens: int) -> dict:
    """tokens/s of the same concurrent requests to the engine, without and with a grammar."""
    out: dict[str, object] = {"streams": len(prompts), "tokens": max_tokens, "guide": list(GUIDE)}
    for name, guide in (("plain", None), ("guided", GUIDE)):
        counts = [0] * len(prompts)

        def worker(i: int, guide: tuple[str, str] | None = guide, counts: list[int] = counts) -> None:
            counts[i] = len(engine_ids(url, prompts[i], max_tokens, guide))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        out[f"{name}_tokens_per_s"] = round(sum(counts) / (time.perf_counter() - started), 1)
    out["guided_vs_plain"] = round(out["guided_tokens_per_s"] / out["plain_tokens_per_s"], 2)  # type: ignore[operator]  # both set by the loop above
    return out


def check_greedy(url: str, prompts: list[list[int]], max_tokens: int) -> dict:
    """Each prompt alone, then all at once: the token ids must be the same."""
    solo = [engine_ids(url, p, max_tokens) for p in prompts]
    loaded: list[list[int]] = [[] for _ in prompts]

    def worker(i: int) -> None:
        loaded[i] = engine_ids(url, prompts[i], max_tokens)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    same = [a == b for a, b in zip(solo, loaded, strict=True)]
    return {"requests": len(prompts), "tokens": max_tokens, "identical": sum(same), "solo_ids": solo}


def transformers_cb(
    model_dir: Path, prompts: list[list[int]], max_tokens: int, solo: list[list[int]]
) -> dict:
    """transformers' continuous batching (`generate_batch`) on the same prompts, in process."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto").to(device).eval()
    config = GenerationConfig(
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    try:
        model.generate_batch([prompts[0]], generation_config=config)  # warm-up (graphs, caches)
        started = time.perf_counter()
        outputs = model.generate_batch(prompts, generation_config=config)
        wall = time.perf_counter() - started
    except Exception as exc:  # an API that moved between versions is a result too
        return {"transformers": transformers.__version__, "error": f"{type(exc).__name__}: {exc}"}
    ordered = sorted(outputs.values(), key=lambda out: prompts.index(list(out.prompt_ids)))
    generated = [list(out.generated_tokens) for out in ordered]
    tokens = sum(len(ids) for ids in generated)
    return {
        "transformers": transformers.__version__,
        "tokens_per_s": round(tokens / wall, 1),
        "identical_to_our_solo": sum(a == b for a, b in zip(generated, solo, strict=True)),
        "requests": len(prompts),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--hidden", type=int, default=0, help="0: the demo model's shape")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--max-batch-size", type=int, default=32, help="the engine's batch slots")
    parser.add_argument("--check-tokens", type=int, default=48, help="greedy ids check: tokens per request")
    parser.add_argument("--check-streams", type=int, default=0, help="default: the highest concurrency")
    parser.add_argument("--transformers-cb", action="store_true", help="also measure generate_batch")
    parser.add_argument("--guided", action="store_true", help="also tokens/s with a grammar vs without")
    parser.add_argument("--name", default="engine_throughput", help="file name of the results")
    args = parser.parse_args()

    import torch

    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    model = build_model(workdir, args.hidden, args.layers, args.dtype)
    values = repository_values(
        engine_dir=model, tokenizer_dir=model, overrides={"triton_max_batch_size": str(args.max_batch_size)}
    )
    repo = build_repository(workdir / "repo", values)
    concurrency = [int(n) for n in args.concurrency.split(",")]
    prompts = check_prompts(model, args.check_streams or max(concurrency))
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
        levels = [run_level(url, n, args.tokens) for n in concurrency]
        check = check_greedy(url, prompts, args.check_tokens) if args.check_tokens else None
        guided = guided_throughput(url, prompts, args.tokens) if args.guided else None
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"
    cb = None
    if args.transformers_cb and check is not None:
        cb = transformers_cb(model, prompts, args.check_tokens, check["solo_ids"])
    report = {
        "device": device,
        "model": {"hidden": args.hidden or "demo", "layers": args.layers if args.hidden else "demo"},
        "dtype": args.dtype,
        "max_tokens": args.tokens,
        "batch_slots": args.max_batch_size,
        "levels": levels,
        "speedup_vs_1_stream": {
            str(level["streams"]): round(level["tokens_per_s"] / levels[0]["tokens_per_s"], 2)
            for level in levels
        },
        "greedy_check": {k: v for k, v in (check or {}).items() if k != "solo_ids"} or None,
        "transformers_continuous_batching": cb,
        "guided_decoding": guided,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    shape = f"hidden {args.hidden}, {args.layers} layers, {args.dtype}" if args.hidden else "demo model"
    lines = [
        f"# Reference engine through the ensemble on {device}",
        "",
        f"{shape}; {args.tokens} tokens per stream; {args.max_batch_size} batch slots.",
        "",
        "| streams | tokens/s | x 1 stream | per-stream tokens/s | TTFT p50 (s) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {lv['streams']} | {lv['tokens_per_s']} | {report['speedup_vs_1_stream'][str(lv['streams'])]} "
        f"| {lv['per_stream_tokens_per_s']} | {lv['ttft_p50_s']} |"
        for lv in levels
    ]
    if check:
        lines += [
            "",
            f"Greedy ids, {check['requests']} concurrent requests x {check['tokens']} tokens vs each "
            f"one's solo run: {check['identical']} of {check['requests']} identical.",
        ]
    if cb:
        lines += ["", f"transformers continuous batching (generate_batch, in process): {json.dumps(cb)}"]
    if guided:
        lines += [
            "",
            f"Guided decoding ({guided['streams']} concurrent engine requests x {guided['tokens']} tokens, "
            f"regex guide): {guided['plain_tokens_per_s']} tokens/s without, {guided['guided_tokens_per_s']} "
            f"with ({guided['guided_vs_plain']}x).",
        ]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
