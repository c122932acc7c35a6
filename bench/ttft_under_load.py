#!/usr/bin/env python3
"""Where the time to first token goes under load: bench/ttft_breakdown.py's steps, many streams.

Packs the demo model with the synthetic engine, serves it with `bentoml serve .` and, at each
concurrency, sends bench/loadgen.py's streamed requests first to Triton directly (`engine`: the
client's TTFT without the service) and then to each route. Every worker runs with $BENCH_TIMELINE
(bench/stacks/timeline.py), which timestamps each request from the ASGI entry through the
middlewares, parsing, the prompt, the engine request written to Triton, Triton's first response as
the worker reads it, and the first chunk written; the report gives, per worker, each step's median.
The service's own work is every step but "request sent -> first response" (the engine's wait, and
Triton's, plus the time the worker's loop takes to read the response).

    python bench/ttft_under_load.py --label 2core --workers 1 --levels 1,8
    python bench/ttft_under_load.py --label h200 --workers 2 --engine-instances 4 --levels 1,32,128 \\
        --stagger-ms-per-stream 5

Results: bench/results/ttft-under-load-<label>.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.relay import Service, _role, percentile  # noqa: E402

ENGINE_WAIT = "first response"
"""The step whose time is the engine's and Triton's (it ends when the worker reads the response)."""


def load(service: Service, target: str, concurrency: int, requests: int, stagger_s: float) -> dict[str, Any]:
    """bench/loadgen.py at one concurrency (several processes from 128 streams); TTFTs and tokens/s."""
    address = f"127.0.0.1:{service.triton()['grpc_port'] if target == 'engine' else service.port}"
    procs = 4 if concurrency >= 128 else 1
    loads = [
        subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "loadgen.py"),
                *("--target", target, "--address", address, "--flavor", service.flavor),
                *("--concurrency", str(concurrency // procs), "--requests", str(requests // procs)),
                *("--max-tokens", "256", "--seed", str(i * 1000), "--stagger-s", str(stagger_s)),
            ],
            stdout=subprocess.PIPE,
            env=service.env,
        )
        for i in range(procs)
    ]
    outputs = [json.loads(process.communicate(timeout=300)[0]) for process in loads]
    records = [r for out in outputs for r in out["requests"]]
    ttfts = [r["ttft"] for r in records]
    wall = max(out["wall"] for out in outputs)
    return {
        "ttft_ms": [1000 * percentile(ttfts, q) for q in (0.1, 0.5, 0.9)],
        "tokens_per_s": sum(r["tokens"] for r in records) / wall,
        "errors": sum(out["error_count"] for out in outputs),
    }


def steps(workers: list[int], timeline: Path) -> dict[int, dict[str, Any]]:
    """Each worker's step medians since the last call (its largest group of requests)."""
    for pid in workers:
        os.kill(pid, signal.SIGRTMIN + 7)
    time.sleep(1.0)
    out: dict[int, dict[str, Any]] = {}
    for pid in workers:
        report = timeline / f"{pid}.txt"
        groups = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
        report.unlink(missing_ok=True)
        if groups:
            out[pid] = max(groups, key=lambda g: g["requests"])
    return out


def markdown(label: str, command: str, rows: list[dict[str, Any]]) -> str:
    lines = [f"# TTFT under load: {label}", "", f"`{command}`", ""]
    lines += [
        "Client TTFT p10 / p50 / p90 in ms; then, per worker, the medians of the service's own steps",
        "summed (ASGI entry to the engine request written, and the first response read to the first",
        "chunk written) and of the wait for Triton's first response.",
        "",
        "| c | target | tok/s | TTFT p10 / p50 / p90 | worker: requests, service's own steps, waiting for Triton |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        workers = "; ".join(
            f"{g['requests']} req, {g['own_ms']:.2f} ms, {g['wait_ms']:.1f} ms" for g in row["workers"]
        )
        p10, p50, p90 = row["ttft_ms"]
        lines.append(
            f"| {row['c']} | {row['target']} | {row['tokens_per_s']:.0f} | {p10:.1f} / {p50:.1f} / {p90:.1f} "
            f"| {workers or '-'} |"
        )
    lines += ["", "Each step's median (ms), per worker:", ""]
    for row in rows:
        for g in row["workers"]:
            detail = ", ".join(f"{b} {ms:.2f}" for _, b, ms in g["steps"])
            lines.append(f"- c={row['c']} {row['target']}, {g['requests']} requests: {detail}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--flavor", choices=("ensemble", "llmapi"), default="ensemble")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--engine-instances", type=int, default=1)
    parser.add_argument("--levels", default="1,32")
    parser.add_argument("--routes", default="generate,chat")
    parser.add_argument("--requests-per-stream", type=int, default=4)
    parser.add_argument("--stagger-ms-per-stream", type=float, default=0.0, help="as bench/relay.py's")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ttft-load-") as tmp:
        timeline = Path(tmp) / "timeline"
        timeline.mkdir()
        os.environ["BENCH_TIMELINE"] = str(timeline)
        instances = ("--engine-instances", str(args.engine_instances)) if args.engine_instances > 1 else ()
        service = Service(Path(tmp), "synthetic", args.workers, 256, args.flavor, pack_options=instances)
        try:
            service.start()
            workers = [p.pid for p in service.processes()[0] if _role(p) == "worker"]
            for concurrency in (int(level) for level in args.levels.split(",")):
                requests = 40 if concurrency == 1 else concurrency * args.requests_per_stream
                stagger_s = concurrency * args.stagger_ms_per_stream / 1000.0
                for target in ["engine", *args.routes.split(",")]:
                    steps(workers, timeline)  # drops what earlier runs left
                    row = {
                        "c": concurrency,
                        "target": target,
                        **load(service, target, concurrency, requests, stagger_s),
                    }
                    row["workers"] = []
                    if target != "engine":
                        for group in steps(workers, timeline).values():
                            wait = sum(ms for _, b, ms in group["steps"] if b == ENGINE_WAIT)
                            own = sum(ms for _, b, ms in group["steps"] if b != ENGINE_WAIT)
                            row["workers"].append({**group, "own_ms": own, "wait_ms": wait})
                    rows.append(row)
                    print(
                        f"c={concurrency} {target}: TTFT p50 {row['ttft_ms'][1]:.1f} ms, "
                        f"{row['tokens_per_s']:.0f} tok/s, errors {row['errors']}",
                        flush=True,
                    )
        finally:
            service.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"ttft-under-load-{args.label}.md"
    path.write_text(markdown(args.label, " ".join(["python", *sys.argv]), rows))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
