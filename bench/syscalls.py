#!/usr/bin/env python3
"""System calls per request of one worker, counted by strace: a deterministic figure where CPU time
on a shared machine is not (the write of each chunk to a client's loopback socket also runs the
client's side of TCP, in the writer's time).

    python bench/syscalls.py [--before OLDER_CHECKOUT] [--route chat] [--tokens 1,256]

Serves each checkout (the synthetic engine, one worker), attaches strace to the worker's threads,
sends `--requests` streamed requests per token count, and prints calls per request by syscall.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.relay import Service  # noqa: E402
from bench.ttft_breakdown import one_request  # noqa: E402

CALLS = "write,writev,sendto,sendmsg,read,recvfrom,recvmsg,epoll_wait,epoll_ctl,futex"


def count(service: Service, route: str, tokens: int, requests: int) -> dict[str, float]:
    """Calls per request of the worker's threads while `requests` requests are served."""
    worker = psutil.Process(service.triton()["pgid"]).ppid()  # the worker that owns Triton: the one
    threads = [f"-p{tid}" for tid in os.listdir(f"/proc/{worker}/task")]
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        tracer = subprocess.Popen(["strace", "-c", "-f", "-e", f"trace={CALLS}", "-o", out.name, *threads])
        time.sleep(1.0)  # attached
        for _ in range(requests):
            one_request(service.port, route, tokens)
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=30)
        table = out.read()
    calls = {}
    for line in table.splitlines():
        match = re.match(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
        if match:
            calls[match.group(2)] = int(match.group(1)) / requests
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="an older checkout, counted first")
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--route", choices=("chat", "generate"), default="chat")
    parser.add_argument("--tokens", default="1,256")
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args()
    sides = ([("before", args.before)] if args.before else []) + [("after", args.after)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-syscalls-") as tmp:
        for side, root in sides:
            service = Service(Path(tmp) / side, "synthetic", 1, 64, "ensemble", root=root)
            service.start()
            try:
                for tokens in (int(t) for t in args.tokens.split(",")):
                    for _ in range(10):  # warm up
                        one_request(service.port, args.route, tokens)
                    rows.append((side, tokens, count(service, args.route, tokens, args.requests)))
            finally:
                service.stop()
    names = sorted({name for *_, calls in rows for name in calls})
    print(f"{args.route}: system calls per request of one worker ({args.requests} requests each)")
    print("| side | tokens | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for side, tokens, calls in rows:
        print(f"| {side} | {tokens} | " + " | ".join(f"{calls.get(n, 0):.1f}" for n in names) + " |")


if __name__ == "__main__":
    main()
