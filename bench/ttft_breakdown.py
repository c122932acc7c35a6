#!/usr/bin/env python3
"""Where a request's time to first token goes inside the service, step by step, at one stream.

Packs the demo model with the synthetic engine, serves it with `bentoml serve .` (one worker) and
sends streamed requests one after another: chat completions and /generate, asking for 1 token and
for 256. The worker runs with $BENCH_TIMELINE (bench/stacks/timeline.py): it timestamps each request
where it enters the ASGI app, at each middleware BentoML and the service stack around it, at the
handler, after parsing, after the prompt is rendered and tokenized, when the request is written to
Triton, when Triton's first response arrives, when the first text is read, when the response starts
and when its first chunk is written. The report gives the median of each step and the client's
own TTFT (median), in bench/results/ttft-<label>.md.

    python bench/ttft_breakdown.py --label mymachine [--service-root OLDER_CHECKOUT]

The client is the standard library's (http.client), so it runs wherever the service does.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.relay import Service, _role  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper."


def one_request(port: int, route: str, tokens: int) -> float:
    """Sends one streamed request; the seconds until its first generated text arrived."""
    if route == "chat":
        path = "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens, "stream": True}
    else:
        path, body = "/generate", {"prompt": PROMPT, "max_tokens": tokens}
    body["ignore_eos"] = True
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        started = time.perf_counter()
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{path}: {response.status} {response.read()[:300]!r}")
        first = None
        seen = b""
        while chunk := response.read1(65536):
            if first is None:
                seen += chunk
                if route != "chat" or b'"content":"' in seen.replace(b'"content":""', b""):
                    first = time.perf_counter() - started
        if first is None:
            raise RuntimeError(f"{path}: no text in {seen[:300]!r}")
        return first
    finally:
        connection.close()


def run(
    service: Service, worker: int, timeline: Path, route: str, tokens: int, count: int, pause_s: float = 0.0
) -> dict:
    for _ in range(5):
        one_request(service.port, route, tokens)
    os.kill(worker, signal.SIGRTMIN + 7)  # drop the warm-up's
    time.sleep(0.2)
    ttfts = []
    for _ in range(count):
        ttfts.append(one_request(service.port, route, tokens))
        time.sleep(pause_s)
    report = timeline / f"{worker}.txt"
    lines_before = len(report.read_text().splitlines()) if report.exists() else 0
    os.kill(worker, signal.SIGRTMIN + 7)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = report.read_text().splitlines() if report.exists() else []
        if len(lines) > lines_before:
            break
        time.sleep(0.05)
    groups = [json.loads(line) for line in lines[lines_before:]]
    main = max(groups, key=lambda g: g["requests"])
    return {"route": route, "tokens": tokens, "ttft_ms": statistics.median(ttfts) * 1e3, **main}


def markdown(label: str, command: str, results: list[dict]) -> str:
    out = [f"# TTFT breakdown: {label}", "", f"`{command}`", ""]
    out.append("One worker, synthetic engine, one stream; medians in ms (each step's own median, so")
    out.append("the steps need not add up to the client's TTFT exactly).")
    for route in dict.fromkeys(r["route"] for r in results):
        runs = [r for r in results if r["route"] == route]
        out += ["", f"## {route}", ""]
        out.append(
            "| step | " + " | ".join(f"{r['tokens']} token(s), {r['requests']} requests" for r in runs) + " |"
        )
        out.append("|---|" + "---|" * len(runs))
        steps = [f"{a} -> {b}" for a, b, _ in runs[0]["steps"]]
        for step in steps:
            cells = []
            for r in runs:
                match = [ms for a, b, ms in r["steps"] if f"{a} -> {b}" == step]
                cells.append(f"{match[0]:.3f}" if match else "-")
            out.append(f"| {step} | " + " | ".join(cells) + " |")
        out.append("| **client TTFT** | " + " | ".join(f"**{r['ttft_ms']:.2f}**" for r in runs) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--service-root", type=Path, default=ROOT, help="the checkout to serve")
    parser.add_argument("--routes", default="chat,generate")
    parser.add_argument("--requests", type=int, default=300, help="requests of one token per route")
    parser.add_argument("--long-requests", type=int, default=40, help="requests of 256 tokens per route")
    parser.add_argument(
        "--pause-ms",
        type=float,
        default=0.0,
        help="idle time after each request (0: back to back, as bench/relay.py's streams send them)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ttft-") as tmp:
        timeline = Path(tmp) / "timeline"
        timeline.mkdir()
        os.environ["BENCH_TIMELINE"] = str(timeline)
        service = Service(Path(tmp), "synthetic", 1, 64, "ensemble", root=args.service_root)
        try:
            service.start()
            workers = [p.pid for p in service.processes()[0] if _role(p) == "worker"]
            if len(workers) != 1:
                raise RuntimeError(f"expected one worker, found {workers}")
            results = []
            for route in args.routes.split(","):
                for tokens, count in ((1, args.requests), (256, args.long_requests)):
                    result = run(service, workers[0], timeline, route, tokens, count, args.pause_ms / 1e3)
                    print(
                        f"{route} {tokens:3} tokens: client TTFT p50 {result['ttft_ms']:.2f} ms", flush=True
                    )
                    results.append(result)
            calls = timeline / f"{workers[0]}.calls"  # $BENCH_TIMELINE_CALLS: calls per step, per run
            if calls.exists():
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / f"calls-{args.label}.jsonl").write_text(calls.read_text())
        finally:
            service.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"ttft-{args.label}.md"
    path.write_text(markdown(args.label, " ".join(["python", *sys.argv]), results))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
