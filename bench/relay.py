"""What the service costs on top of Triton: the same streamed requests, direct and through the service.

One command packs the demo model, serves it with `bentoml serve .` (cold start timed), and at each
concurrency sends the same streamed requests, one target after the other, to (a) Triton directly
over gRPC (`ensemble`, or with `--flavor llmapi` the LLM API model), (b) `/generate`, (c) `/v1/chat/completions` and (d) `/v1/completions`. It reports output
tokens/s, time to first token and inter-token latency (p50/p99, as the client sees chunks), tokens
per chunk, and CPU time per token of the service's processes and of Triton's (from /proc).

Scenario `synthetic` puts the token-source engine in the `tensorrt_llm` slot (tokens as fast as
Triton relays them: everything measured is the stack around the engine); `reference` runs the demo
model with the PyTorch reference engine. Results go to bench/results/relay-<label>.{json,md,png}.

    python bench/relay.py --label 2core
    python bench/relay.py --label h100-box --workers 4
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("engine", "direct", "generate", "chat", "completions", "floor", "floor-relay", "floor-push")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


class Service:
    """`bentoml serve .` on a freshly packed demo model, in its own process group."""

    def __init__(
        self,
        workdir: Path,
        engine: str,
        workers: int,
        max_batch_size: int,
        flavor: str,
        root: Path = ROOT,
        step_delay_ms: float = 0.0,
        demo: str = "tiny",
        pack_options: tuple[str, ...] = (),
        profiler: str = "py-spy",
        stream_interval_ms: float = 0.0,
    ) -> None:
        self.workdir = workdir
        self.root = root
        self.flavor = flavor
        self.home = workdir / "bentoml"
        self.run_dir = workdir / "run"
        self.profile_dir = workdir / "profiles"
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        self.profiler = profiler
        self.port = free_port()
        self.env = {
            **os.environ,
            "BENTOML_HOME": str(self.home),
            "BENTOML_DO_NOT_TRACK": "true",
            "TRTLLM_RUN_DIR": str(self.run_dir),
            "TRTLLM_WORKERS": str(workers),
            "TRTLLM_MAX_CONCURRENCY": "100000",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            # stacks on SIGUSR2 (bench/stacks/sitecustomize.py), for a run that stalls
            "BENCH_PROFILE_DIR": str(workdir / "profiles"),
            "TRTLLM_STREAM_INTERVAL_MS": str(stream_interval_ms),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT / "bench" / "stacks"), os.environ.get("PYTHONPATH")) if p
            ),
        }
        subprocess.run(
            [
                sys.executable,
                "pack_model.py",
                "--demo",
                demo,
                "--flavor",
                flavor,
                "--engine",
                engine,
                "--quiet",
                "--max-batch-size",
                str(max_batch_size),
                *(["--step-delay-ms", str(step_delay_ms)] if step_delay_ms else []),
                *pack_options,
            ],
            cwd=root,
            env=self.env,
            check=True,
            capture_output=True,
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.cold_start_s = 0.0

    def start(self, timeout_s: float = 600.0) -> None:
        started = time.monotonic()
        log = open(self.workdir / "serve.log", "wb")  # noqa: SIM115 (lives as long as the server)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bentoml", "serve", ".", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=self.root,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"bentoml serve exited:\n{(self.workdir / 'serve.log').read_text()[-3000:]}"
                )
            if ready(f"http://127.0.0.1:{self.port}/readyz"):
                self.cold_start_s = time.monotonic() - started
                return
            time.sleep(0.1)
        raise RuntimeError("bentoml serve was not ready in time")

    def triton(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "triton.json").read_text())

    def processes(self) -> tuple[list[psutil.Process], list[psutil.Process]]:
        """(the service's processes, Triton's processes)."""
        assert self.process is not None
        pgid = self.triton()["pgid"]
        tree = [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]
        service, triton = [], []
        for process in tree:
            with contextlib.suppress(ProcessLookupError, psutil.Error):
                (triton if os.getpgid(process.pid) == pgid else service).append(process)
        return service, triton

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


class Floor:
    """bench/asgi_floor.py in its own process: uvicorn's own cost per streamed chunk, alone or relaying
    from Triton (`triton`: its gRPC address)."""

    def __init__(
        self, triton: str | None = None, env: dict[str, str] | None = None, push: bool = False
    ) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "asgi_floor.py"),
                "--port",
                str(self.port),
                *(["--triton", triton] if triton else []),
                *(["--push"] if push else []),
            ],
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while not ready(f"http://127.0.0.1:{self.port}/readyz"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("bench/asgi_floor.py did not start")
            time.sleep(0.1)
        if triton:  # its first request imports the relay and connects: not a run's CPU per token
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            connection.request("POST", "/", json.dumps({"max_tokens": 2}))
            connection.getresponse().read()
            connection.close()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def kernel_seconds(processes: list[psutil.Process]) -> float:
    """System (kernel) CPU seconds: syscalls, and on loopback the receiving side's TCP work too."""
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            total += process.cpu_times().system
    return total


def io_calls(processes: list[psutil.Process]) -> tuple[int, int]:
    """(read, write) system calls made so far (/proc/PID/io: read/readv and write/writev, what
    uvloop reads and writes sockets with): reads per token show how many tokens a wake-up carries."""
    reads = writes = 0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            counters = process.io_counters()
            reads += counters.read_count
            writes += counters.write_count
    return reads, writes


def cpu_seconds(processes: list[psutil.Process]) -> float:
    return sum(cpu_by_process(processes).values())


def _role(process: psutil.Process) -> str:
    """tritonserver, a stub by its model name, or the service's process kind."""
    name = process.name()
    cmdline = process.cmdline()
    if name.startswith("triton_python"):
        return "stub:" + Path(cmdline[1]).parts[-3] if len(cmdline) > 1 else name
    if "_bentoml_impl.worker.service" in " ".join(cmdline):
        return "worker"
    return name


def cpu_by_process(processes: list[psutil.Process]) -> dict[str, float]:
    """CPU seconds (user + system) by role."""
    out: dict[str, float] = {}
    for process in processes:
        try:
            times = process.cpu_times()
            role = _role(process)
            out[role] = out.get(role, 0.0) + times.user + times.system
        except psutil.Error:
            pass
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Profiler:
    """py-spy on one service worker while a run lasts: a flame graph (SVG) and the collapsed stacks,
    from which `top_functions` ranks the per-token path by own time."""

    def __init__(self, pid: int, stem: Path) -> None:
        self.stem = stem
        spy = Path(sys.executable).with_name("py-spy")
        common = [
            str(spy) if spy.exists() else "py-spy",
            "record",
            "--pid",
            str(pid),
            "--rate",
            "1000",
            "--gil",
            "--nonblocking",  # never pauses the worker: the run is not slowed into coalescing more
        ]
        self.recorders = [
            subprocess.Popen(
                [*common, "--format", "flamegraph", "-o", f"{stem}.svg"], stdout=subprocess.DEVNULL
            ),
            subprocess.Popen(
                [*common, "--format", "raw", "--full-filenames", "-o", f"{stem}.txt"],
                stdout=subprocess.DEVNULL,
            ),
        ]
        time.sleep(1.0)  # py-spy attaches

    def stop(self) -> None:
        for recorder in self.recorders:
            recorder.send_signal(signal.SIGINT)
        for recorder in self.recorders:
            recorder.wait(timeout=60)
        collapsed = Path(f"{self.stem}.txt")
        if collapsed.exists():
            Path(f"{self.stem}.top.md").write_text(top_functions(collapsed))
        else:
            print(f"py-spy recorded nothing (exit {self.recorders[1].returncode})", flush=True)


LAYERS = (  # (name, substring of a frame's file path): own time by layer of the stack
    ("uvicorn", "/uvicorn/"),
    ("starlette / fastapi", "/starlette/"),
    ("starlette / fastapi", "/fastapi/"),
    ("bentoml", "/bentoml/"),
    ("bentoml", "/_bentoml_impl/"),
    ("opentelemetry", "/opentelemetry/"),
    ("prometheus_client", "/prometheus_client/"),
    ("pydantic", "/pydantic"),
    ("tokenizer (transformers, tokenizers)", "/transformers/"),
    ("tokenizer (transformers, tokenizers)", "/tokenizers/"),
    ("protobuf", "/google/protobuf/"),
    ("ours: api (HTTP, SSE)", "/trtllm_service/api/"),
    ("ours: relay (gRPC, streams)", "/trtllm_service/relay/"),
    ("ours: other", "/trtllm_service/"),
    ("ours: detokenizer", "/tensorrtllm_backend/"),
    ("asyncio, event loop", "/asyncio/"),
)


def _layer(frame: str) -> str:
    for name, marker in LAYERS:
        if marker in frame:
            return name
    return "other (stdlib, C)"


class BuiltinProfiler:
    """The sampler of bench/stacks/sitecustomize.py inside one service worker, for machines where
    py-spy cannot attach: collapsed stacks (py-spy's raw format) and the top functions, no SVG."""

    def __init__(self, pid: int, stem: Path, profile_dir: Path) -> None:
        self.pid, self.stem = pid, stem
        self.path = profile_dir / f"{pid}.txt"
        self.path.unlink(missing_ok=True)
        os.kill(pid, signal.SIGRTMIN + 5)

    def stop(self) -> None:
        os.kill(self.pid, signal.SIGRTMIN + 6)
        deadline = time.monotonic() + 30
        while not self.path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not self.path.exists():
            print("the builtin profiler wrote nothing", flush=True)
            return
        collapsed = Path(f"{self.stem}.txt")
        collapsed.write_text(self.path.read_text())
        Path(f"{self.stem}.top.md").write_text(top_functions(collapsed))


def top_functions(collapsed: Path, count: int = 40) -> str:
    """Own (self) and total samples per function and own samples per layer, from py-spy's collapsed
    stacks (frames `function (path:line)`), as Markdown tables."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    layers: dict[str, int] = {}
    samples = 0
    for line in collapsed.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        if not stack:
            continue
        n = int(number)
        samples += n
        frames = [frame.rsplit(":", 1)[0] + ")" for frame in stack.split(";")]  # per function
        own[frames[-1]] = own.get(frames[-1], 0) + n
        layers[_layer(frames[-1])] = layers.get(_layer(frames[-1]), 0) + n
        for frame in set(frames):
            total[frame] = total.get(frame, 0) + n
    short = str(Path(sys.prefix))
    lines = [f"{samples} samples of one worker", "", "| layer | own % |", "|---|---|"]
    for name, n in sorted(layers.items(), key=lambda item: -item[1]):
        lines.append(f"| {name} | {100 * n / samples:.1f} |")
    lines += ["", "| own % | total % | function (file) |", "|---|---|---|"]
    for frame, n in sorted(own.items(), key=lambda item: -item[1])[:count]:
        name = frame.replace(short, "<venv>").replace(str(ROOT), ".")
        lines.append(f"| {100 * n / samples:.1f} | {100 * total[frame] / samples:.1f} | `{name}` |")
    return "\n".join(lines) + "\n"


def run_load(
    service: Service,
    target: str,
    concurrency: int,
    requests: int,
    max_tokens: int,
    procs: int,
    profile: Path | None = None,
    stall_s: float = 180.0,
    floors: dict[str, Floor] | None = None,
    stagger_s: float = 0.0,
) -> dict[str, Any]:
    floors = floors or {}
    address = (
        f"127.0.0.1:{service.triton()['grpc_port']}"
        if target in ("engine", "direct")
        else f"127.0.0.1:{floors[target].port}"
        if target in floors
        else f"127.0.0.1:{service.port}"
    )
    service_procs, triton_procs = service.processes()
    if target in floors:  # the floor server's CPU counts as the service's
        service_procs = [psutil.Process(floors[target].process.pid)]
    procs = max(1, min(procs, concurrency))
    cpu_before = (cpu_seconds(service_procs), cpu_seconds(triton_procs))
    kernel_before = kernel_seconds(service_procs)
    calls_before = io_calls(service_procs)
    triton_before = cpu_by_process(triton_procs)
    workers = [p.pid for p in service_procs if _role(p) == "worker"]
    profiler: Profiler | BuiltinProfiler | None = None
    if profile is not None and workers:
        profiler = (
            Profiler(workers[0], profile)
            if service.profiler == "py-spy"
            else BuiltinProfiler(workers[0], profile, service.profile_dir)
        )
    loads = [
        subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "loadgen.py"),
                "--target",
                "generate" if target.startswith("floor") else target,
                "--address",
                address,
                "--concurrency",
                str(concurrency // procs + (i < concurrency % procs)),
                "--requests",
                str(requests // procs + (i < requests % procs)),
                "--max-tokens",
                str(max_tokens),
                "--flavor",
                service.flavor,
                "--seed",
                str(i * 1000),
                "--stagger-s",
                str(stagger_s),
            ],
            stdout=subprocess.PIPE,
            env=service.env,
        )
        for i in range(procs)
    ]
    try:
        outputs = [json.loads(load.communicate(timeout=stall_s)[0]) for load in loads]
    except subprocess.TimeoutExpired:
        stalled(service, target, concurrency, loads, stall_s)
        raise
    cpu_after = (cpu_seconds(service_procs), cpu_seconds(triton_procs))
    kernel_after = kernel_seconds(service_procs)
    calls_after = io_calls(service_procs)
    triton_after = cpu_by_process(triton_procs)
    if profiler is not None:
        profiler.stop()
    records = [r for out in outputs for r in out["requests"]]
    tokens = sum(r["tokens"] for r in records)
    chunks = sum(r["chunks"] for r in records)
    gaps = [g for r in records for g in r["gaps"]]
    ttfts = [r["ttft"] for r in records]
    wall = max(out["wall"] for out in outputs)
    per_token = 1e6 / max(tokens, 1)
    return {
        "target": target,
        "concurrency": concurrency,
        "requests": len(records),
        "errors": sum(out["error_count"] for out in outputs),
        "error_samples": [e for out in outputs for e in out["errors"]][:3],
        "tokens": tokens,
        "tokens_per_s": tokens / wall if wall else 0.0,
        "ttft_p50_ms": 1000 * percentile(ttfts, 0.5),
        "ttft_p99_ms": 1000 * percentile(ttfts, 0.99),
        "itl_p50_ms": 1000 * percentile(gaps, 0.5),
        "itl_p99_ms": 1000 * percentile(gaps, 0.99),
        "tokens_per_chunk": tokens / max(chunks, 1),
        "service_cpu_us_per_token": (cpu_after[0] - cpu_before[0]) * per_token,
        "service_kernel_us_per_token": (kernel_after - kernel_before) * per_token,
        "service_reads_per_token": (calls_after[0] - calls_before[0]) / max(tokens, 1),
        "service_writes_per_token": (calls_after[1] - calls_before[1]) / max(tokens, 1),
        "loadgen_cpu_us_per_token": sum(out["cpu"] for out in outputs) * per_token,
        "triton_cpu_us_per_token": (cpu_after[1] - cpu_before[1]) * per_token,
        "triton_cpu_us_per_token_by_process": {
            role: round((triton_after[role] - triton_before.get(role, 0.0)) * per_token, 1)
            for role in triton_after
        },
    }


def stalled(
    service: Service, target: str, concurrency: int, loads: list[subprocess.Popen[bytes]], stall_s: float
) -> None:
    """A run that did not finish in time: every service process and load generator prints its stacks
    (SIGUSR2, bench/stacks), the process table and the server log's end go to stdout, the load
    generators are stopped. The caller gives up on the scenario (its state is unknown)."""
    print(f"STALLED: {target} c={concurrency} did not finish in {stall_s:.0f} s", flush=True)
    service_procs, triton_procs = service.processes()
    for process in [*service_procs, *[psutil.Process(load.pid) for load in loads if load.poll() is None]]:
        with contextlib.suppress(psutil.Error):
            if "python" in process.name():
                process.send_signal(signal.SIGUSR2)
    time.sleep(2.0)
    for process in [*service_procs, *triton_procs]:
        with contextlib.suppress(psutil.Error):
            print(
                f"  pid {process.pid} {process.status():<9} cpu {sum(process.cpu_times()[:2]):7.2f} s "
                f"threads {process.num_threads():3}  {' '.join(process.cmdline())[:150]}",
                flush=True,
            )
    for load in loads:
        if load.poll() is None:
            load.kill()
        load.wait()
    log = (service.workdir / "serve.log").read_text(errors="replace")
    print(f"--- serve.log, last 20000 characters:\n{log[-20000:]}\n--- end of serve.log", flush=True)


def scenario(args: argparse.Namespace, engine: str, levels: list[int], max_tokens: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"bench-relay-{engine}-") as tmp:
        service = Service(
            Path(tmp),
            engine,
            args.workers,
            args.max_batch_size,
            args.flavor,
            args.service_root,
            args.step_delay_ms if engine == "synthetic" else 0.0,
            pack_options=(
                ("--engine-instances", str(args.engine_instances))
                if engine == "synthetic" and args.engine_instances > 1
                else ()
            ),
            profiler=args.profiler,
            stream_interval_ms=args.stream_interval_ms,
        )
        floors: dict[str, Floor] = {}
        try:
            service.start()
            if engine == "synthetic" and "floor" in args.targets.split(","):
                floors["floor"] = Floor()
            if engine == "synthetic" and "floor-relay" in args.targets.split(","):
                floors["floor-relay"] = Floor(f"127.0.0.1:{service.triton()['grpc_port']}", service.env)
            if engine == "synthetic" and "floor-push" in args.targets.split(","):
                floors["floor-push"] = Floor(
                    f"127.0.0.1:{service.triton()['grpc_port']}", service.env, push=True
                )
            print(f"[{engine}] cold start {service.cold_start_s:.1f} s", flush=True)
            runs: list[dict[str, Any]] = []
            stalled_at = None
            for concurrency in levels:
                if stalled_at:
                    break
                requests = max(concurrency * args.requests_per_stream, args.min_requests)
                procs = max(1, min(args.loadgen_procs, concurrency // 32 or 1))
                for target in args.targets.split(","):
                    if target.startswith("floor") and target not in floors:
                        continue
                    profile = (
                        args.out / f"relay-{args.label}-profile-{target}-c{concurrency}"
                        if args.profile == f"{target}:{concurrency}" and engine == "synthetic"
                        else None
                    )
                    try:
                        row = run_load(
                            service,
                            target,
                            concurrency,
                            requests,
                            max_tokens,
                            procs,
                            profile,
                            args.stall_timeout,
                            floors,
                            concurrency * args.stagger_ms_per_stream / 1000.0,
                        )
                    except subprocess.TimeoutExpired:
                        stalled_at = f"{target} c={concurrency}"
                        break
                    runs.append(row)
                    print(
                        f"[{engine}] c={concurrency:<4} {target:<12} {row['tokens_per_s']:8.0f} tok/s  "
                        f"ttft p50 {row['ttft_p50_ms']:7.1f} ms  itl p50 {row['itl_p50_ms']:6.2f} ms  "
                        f"service {row['service_cpu_us_per_token']:6.1f} us/tok (kernel {row['service_kernel_us_per_token']:5.1f}, reads/writes per token {row['service_reads_per_token']:.2f}/{row['service_writes_per_token']:.2f})  loadgen {row['loadgen_cpu_us_per_token']:5.1f} us/tok  triton {row['triton_cpu_us_per_token']:6.1f} us/tok  "
                        f"{row['tokens_per_chunk']:.2f} tok/chunk  errors {row['errors']}  "
                        f"{ {k: v for k, v in row['triton_cpu_us_per_token_by_process'].items() if v >= 1} }",
                        flush=True,
                    )
            return {
                "engine": engine,
                "cold_start_s": service.cold_start_s,
                "max_tokens": max_tokens,
                "runs": runs,
                **({"stalled": stalled_at} if stalled_at else {}),
            }
        finally:
            service.stop()
            for floor in floors.values():
                floor.stop()


def checks(result: dict[str, Any]) -> list[tuple[str, float, str, bool]]:
    """Issue 25's targets, as ratios of the synthetic scenario's runs to the engine read directly
    (`engine`: the very requests the service sends; `direct`, the ensemble, where it was not run)."""
    runs = {(r["target"], r["concurrency"]): r for r in result["runs"]}
    base = "engine" if any(target == "engine" for target, _ in runs) else "direct"
    out: list[tuple[str, float, str, bool]] = []
    levels = sorted({r["concurrency"] for r in result["runs"]})
    for target in ("generate", "chat", "completions"):
        if (target, 32) in runs:
            value = runs[(target, 32)]["service_cpu_us_per_token"]
            out.append((f"service CPU per token, {target}, c=32 (us)", value, "<= 30", value <= 30))
    for target in ("generate", "chat", "completions"):
        if (target, 1) in runs and (base, 1) in runs:
            extra = runs[(target, 1)]["ttft_p50_ms"] - runs[(base, 1)]["ttft_p50_ms"]
            out.append((f"TTFT p50 - {base}, {target}, c=1 (ms)", extra, "<= 2", extra <= 2))
        for level in (32, 128):
            if (target, level) in runs and (base, level) in runs:
                ratio = runs[(target, level)]["ttft_p50_ms"] / runs[(base, level)]["ttft_p50_ms"]
                out.append((f"TTFT p50 / {base}, {target}, c={level}", ratio, "<= 1.3", ratio <= 1.3))
        for level in levels:
            if (target, level) in runs and (base, level) in runs:
                ratio = runs[(target, level)]["tokens_per_s"] / runs[(base, level)]["tokens_per_s"]
                out.append((f"tokens/s / {base}, {target}, c={level}", ratio, ">= 0.97", ratio >= 0.97))
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Relay benchmark: {report['label']}", "", f"`{report['command']}`", ""]
    lines += [f"- machine: {report['machine']}", f"- workers: {report['workers']}"]
    if report.get("service_root", str(ROOT)) != str(ROOT):
        lines.append(f"- service served from: {report['service_root']}")
    if report.get("stream_interval_ms"):
        lines.append(f"- TRTLLM_STREAM_INTERVAL_MS: {report['stream_interval_ms']}")
    if report.get("stagger_ms_per_stream"):
        lines.append(f"- streams started over {report['stagger_ms_per_stream']} ms per stream (staggered)")
    if report.get("loaded_stream_interval_ms") is not None:
        lines.append(f"- TRTLLM_LOADED_STREAM_INTERVAL_MS: {report['loaded_stream_interval_ms']}")
    if report.get("engine_instances", 1) > 1:
        lines.append(f"- synthetic engine: {report['engine_instances']} instances (Triton model instances)")
    if report.get("step_delay_ms"):
        lines.append(f"- synthetic engine step: {report['step_delay_ms']} ms")
    lines.append("")
    for result in report["scenarios"]:
        lines += [f"## {result['engine']} engine ({result['max_tokens']} tokens per request)", ""]
        lines += [f"Cold start (`bentoml serve` to ready): {result['cold_start_s']:.1f} s", ""]
        if result.get("stalled"):
            lines += [
                f"**Stalled at {result['stalled']}**: later runs were not made (stacks in the log).",
                "",
            ]
        lines += [
            "| c | target | tokens/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | tokens/chunk | service us/token | of it kernel | reads / writes per token | Triton us/token | load generator us/token | errors |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in result["runs"]:
            lines.append(
                f"| {r['concurrency']} | {r['target']} | {r['tokens_per_s']:.0f} | {r['ttft_p50_ms']:.1f} / {r['ttft_p99_ms']:.1f} | "
                f"{r['itl_p50_ms']:.2f} / {r['itl_p99_ms']:.2f} | {r['tokens_per_chunk']:.2f} | "
                f"{r['service_cpu_us_per_token']:.1f} | {r.get('service_kernel_us_per_token', float('nan')):.1f} | "
                f"{r.get('service_reads_per_token', float('nan')):.2f} / {r.get('service_writes_per_token', float('nan')):.2f} | "
                f"{r['triton_cpu_us_per_token']:.1f} | "
                f"{r.get('loadgen_cpu_us_per_token', float('nan')):.1f} | {r['errors']} |"
            )
        lines.append("")
        if result["engine"] == "synthetic":
            lines += ["### Targets", "", "| target | measured | goal | met |", "|---|---|---|---|"]
            for name, value, goal, met in checks(result):
                lines.append(f"| {name} | {value:.2f} | {goal} | {'yes' if met else 'NO'} |")
            lines.append("")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = report["scenarios"]
    fig, axes = plt.subplots(len(scenarios), 3, figsize=(15, 4.2 * len(scenarios)), squeeze=False)
    for row, result in enumerate(scenarios):
        for target, color in zip(
            TARGETS,
            (
                "tab:purple",
                "tab:blue",
                "tab:orange",
                "tab:green",
                "tab:red",
                "tab:gray",
                "tab:brown",
                "tab:pink",
            ),
            strict=True,
        ):
            runs = [r for r in result["runs"] if r["target"] == target]
            levels = [r["concurrency"] for r in runs]
            style = {"marker": "o", "label": target, "color": color}
            axes[row][0].plot(levels, [r["tokens_per_s"] for r in runs], **style)
            axes[row][1].plot(levels, [r["ttft_p50_ms"] for r in runs], **style)
            if target not in ("engine", "direct"):
                axes[row][2].plot(levels, [r["service_cpu_us_per_token"] for r in runs], **style)
        titles = ("output tokens/s", "TTFT p50 (ms)", "service CPU per token (us)")
        for axis, title in zip(axes[row], titles, strict=True):
            axis.set_xscale("log", base=2)
            axis.set_xlabel("concurrent streams")
            axis.set_title(f"{result['engine']}: {title}")
            axis.grid(True, alpha=0.3)
            axis.legend()
    fig.suptitle(f"relay benchmark, {report['label']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def replot(json_path: Path) -> None:
    """Draws the PNG again from a result file (python -c "from bench.relay import replot; ...")."""
    plot(json.loads(json_path.read_text()), json_path.with_suffix(".png"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--label", default=platform.node() or "local", help="names the result files")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--scenario", choices=("synthetic", "reference", "both"), default="both")
    parser.add_argument("--concurrency", default="1,8,32,128,256", help="synthetic scenario levels")
    parser.add_argument("--reference-concurrency", default="1,8,32")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--reference-max-tokens", type=int, default=64)
    parser.add_argument("--requests-per-stream", type=int, default=2, help="requests per concurrent stream")
    parser.add_argument("--min-requests", type=int, default=16)
    parser.add_argument("--workers", type=int, default=None, help="TRTLLM_WORKERS (default: the service's)")
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument(
        "--stagger-ms-per-stream",
        type=float,
        default=0.0,
        help="start a level's streams evenly over this many ms per stream (0: all at once). Streams of "
        "one length that start together keep finishing together, so each round arrives as a burst "
        "and TTFT measures where a request falls in it; about one stream's time over the level's "
        "concurrency spreads the arrivals over a round instead",
    )
    parser.add_argument(
        "--flavor",
        choices=("ensemble", "llmapi"),
        default="ensemble",
        help="repository flavour; target (a) is its direct gRPC entry: `ensemble`, or the llmapi "
        "`tensorrt_llm` model (text in, text out, as upstream's clients call it)",
    )
    parser.add_argument("--loadgen-procs", type=int, default=4, help="load generator processes at c >= 128")
    parser.add_argument(
        "--targets", default=",".join(TARGETS), help="comma-separated subset of " + ",".join(TARGETS)
    )
    parser.add_argument(
        "--service-root",
        type=Path,
        default=ROOT,
        help="serve the service from this checkout (e.g. an older commit's, for a before/after in one "
        "run); the load generator stays this one",
    )
    parser.add_argument(
        "--step-delay-ms",
        type=float,
        default=0.0,
        help="the synthetic engine's time per step (an engine's iteration time; 0: as fast as Triton relays)",
    )
    parser.add_argument(
        "--profile",
        metavar="TARGET:C",
        help="record one service worker with py-spy during that run (e.g. chat:32): a flame graph "
        "(SVG) and the top functions by own time go next to the results",
    )
    parser.add_argument(
        "--stream-interval-ms",
        type=float,
        default=0.0,
        help="the service's TRTLLM_STREAM_INTERVAL_MS (0: every token as it arrives)",
    )
    parser.add_argument(
        "--profiler",
        choices=("py-spy", "builtin"),
        default="py-spy",
        help="what --profile records with: py-spy (flame graph too), or the sampler in "
        "bench/stacks/sitecustomize.py where py-spy cannot attach",
    )
    parser.add_argument(
        "--engine-instances",
        type=int,
        default=1,
        help="synthetic engine: token sources side by side in Triton (pack_model.py --engine-instances), "
        "for more tokens per second than one stub process relays",
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=180.0,
        help="seconds one run may take before it counts as stalled (stacks and server log printed, "
        "scenario abandoned)",
    )
    args = parser.parse_args()
    # SIGTERM (`timeout`, a box call running out) unwinds like Ctrl-C: the services and Tritons this
    # run started are stopped, not left serving beside the next run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.workers is None:
        from trtllm_service.settings import default_workers

        args.workers = default_workers()
    report: dict[str, Any] = {
        "label": args.label,
        "command": " ".join(["python", "bench/relay.py", *sys.argv[1:]]),
        "machine": f"{platform.machine()}, {psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}",
        "workers": args.workers,
        "flavor": args.flavor,
        "service_root": str(args.service_root),
        "step_delay_ms": args.step_delay_ms,
        "engine_instances": args.engine_instances,
        "stream_interval_ms": args.stream_interval_ms,
        "stagger_ms_per_stream": args.stagger_ms_per_stream,
        "loaded_stream_interval_ms": os.environ.get("TRTLLM_LOADED_STREAM_INTERVAL_MS"),
        "date": time.strftime("%Y-%m-%d"),
        "scenarios": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    if args.scenario in ("synthetic", "both"):
        levels = [int(c) for c in args.concurrency.split(",")]
        report["scenarios"].append(scenario(args, "synthetic", levels, args.max_tokens))
    if args.scenario in ("reference", "both"):
        levels = [int(c) for c in args.reference_concurrency.split(",")]
        report["scenarios"].append(scenario(args, "reference", levels, args.reference_max_tokens))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"relay-{args.label}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(report) + "\n")
    try:
        plot(report, stem.with_suffix(".png"))
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
    print(f"wrote {stem}.json, .md, .png", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
