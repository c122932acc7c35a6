#!/usr/bin/env python3
"""Two checkouts side by side at one stream, alternating: a worker's CPU per request and per token
(user and kernel apart, context switches) and the client's TTFT, from /proc and the clock.

Both services run at once (the synthetic engine, `--workers` each); every round sends the same
requests to one, then the other, so a machine whose speed drifts (the GPU box, a shared VM) drifts
under both. Per round and side: 1-token requests (a request's own cost) and 256-token requests.

    python bench/alternate.py --before OLDER_CHECKOUT [--after .] [--rounds 4] [--route chat]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.relay import Service  # noqa: E402
from bench.ttft_breakdown import one_request  # noqa: E402


def counters(processes: list[psutil.Process]) -> tuple[float, float, int, int]:
    """(user s, kernel s, voluntary, involuntary context switches) summed over the processes."""
    user = kernel = voluntary = involuntary = 0
    for process in processes:
        times, switches = process.cpu_times(), process.num_ctx_switches()
        user += times.user
        kernel += times.system
        voluntary += switches.voluntary
        involuntary += switches.involuntary
    return user, kernel, voluntary, involuntary


def measure(service: Service, route: str, tokens: int, count: int) -> dict[str, float]:
    processes = service.processes()[0]
    before = counters(processes)
    ttfts = [one_request(service.port, route, tokens) for _ in range(count)]
    after = counters(processes)
    user, kernel, voluntary, involuntary = (b - a for a, b in zip(before, after, strict=True))
    per = count * (tokens if tokens > 1 else 1)  # per token for streams, per request for 1 token
    return {
        "ttft_ms": statistics.median(ttfts) * 1e3,
        "user_us": user / per * 1e6,
        "kernel_us": kernel / per * 1e6,
        "voluntary": voluntary / per,
        "involuntary": involuntary / per,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the older checkout")
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--route", choices=("chat", "generate"), default="chat")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--requests", type=int, default=200, help="1-token requests per round and side")
    parser.add_argument("--long-requests", type=int, default=20, help="256-token requests per round and side")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-alternate-") as tmp:
        services = {}
        try:
            for side, root in (("before", args.before), ("after", args.after)):
                services[side] = Service(
                    Path(tmp) / side, "synthetic", args.workers, 64, "ensemble", root=root
                )
                services[side].start()
            for service in services.values():  # warm up
                for tokens in (1, 256):
                    measure(service, args.route, tokens, 10)
            print(
                f"{args.route}, {args.workers} worker(s); 1 token: CPU per request; 256 tokens: CPU per token"
            )
            print(
                "| round | side | 1 token: TTFT ms | user us | kernel us "
                "| 256 tokens: TTFT ms | user us | kernel us | switches (involuntary) |"
            )
            print("|---|---|---|---|---|---|---|---|---|")
            for round_ in range(1, args.rounds + 1):
                for side, service in services.items():
                    one = measure(service, args.route, 1, args.requests)
                    long = measure(service, args.route, 256, args.long_requests)
                    print(
                        f"| {round_} | {side} | {one['ttft_ms']:.2f} | {one['user_us']:.0f} | {one['kernel_us']:.0f} |"
                        f" {long['ttft_ms']:.2f} | {long['user_us']:.1f} | {long['kernel_us']:.1f} |"
                        f" {long['voluntary'] + long['involuntary']:.2f} ({long['involuntary']:.2f}) |",
                        flush=True,
                    )
                    time.sleep(0.5)
        finally:
            for service in services.values():
                service.stop()


if __name__ == "__main__":
    main()
