"""Cold start: a fresh clone to the first streamed token of `./dev.sh serve`.

    .venv/bin/python bench/cold_start.py --label after-cold              # HEAD, empty caches
    .venv/bin/python bench/cold_start.py --label after-warm --cache DIR  # caches kept from a run

Clones this repository (its committed HEAD, or --ref) into a temporary directory, runs
`./dev.sh serve` there on a free PORT with a fresh venv (the clone's own .venv) and a fresh
BENTOML_HOME, and sends one streamed `/generate` request every half second until a token comes
back. Times, from the clone's start: each line `dev.sh` and the service print for a phase
(installing, packing, Triton starting, ready), the first byte of the answer, and the whole.

Caches: pip's and uv's (PIP_CACHE_DIR, UV_CACHE_DIR) point at --cache, an empty temporary
directory unless given: a cold cache is a new machine, the same directory on a second run is a
machine that installed once before (the realistic second clone). The clone, its venv and its
model store are removed afterwards; the cache directory is kept only when --cache names it.

Writes bench/results/cold-start-<label>.json and .md. Needs nothing beyond the standard library,
so any Python runs it; the clone installs everything itself.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
REQUEST = {"prompt": "What is the capital of France?", "max_tokens": 16, "temperature": 0}

# The lines that mark a phase, first match wins; older checkouts print only the service's own.
PHASES = [
    ("installing", re.compile(r"dev\.sh: installing")),
    ("installed", re.compile(r"dev\.sh: installed")),
    ("packing", re.compile(r"dev\.sh: packing")),
    ("packed", re.compile(r"Packed |packed .* into|dev\.sh: packed")),
    ("starting", re.compile(r"dev\.sh: starting|dev\.sh: serving")),
    ("triton_starting", re.compile(r"Triton starting")),
    ("triton_ready", re.compile(r"Triton is ready for")),
    ("serving", re.compile(r"serving \S+ on http")),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def first_token(port: int, timeout: float) -> tuple[float, str] | None:
    """One streamed /generate; the time its first non-empty body chunk arrived, and the text."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/generate", json.dumps(REQUEST), {"content-type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            resp.read()
            return None
        chunk = resp.read1(65536)
        if not chunk:
            return None
        at = time.monotonic()
        rest = resp.read()
        return at, (chunk + rest).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="cold-start-"))
    cache = Path(args.cache) if args.cache else work / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    cache_was_empty = not any(cache.iterdir())
    clone = work / "repo"
    port = free_port()
    env = dict(os.environ)
    for name in ("VENV", "TRTLLM_MODEL", "VIRTUAL_ENV", "BENTOML_CONFIG"):
        env.pop(name, None)
    env.update(
        PORT=str(port),
        BENTOML_HOME=str(work / "bentoml"),
        PIP_CACHE_DIR=str(cache / "pip"),
        UV_CACHE_DIR=str(cache / "uv"),
        PYTHONUNBUFFERED="1",
    )
    log_path = work / "serve.log"
    marks: dict[str, float] = {}
    lines: list[tuple[float, str]] = []

    t0 = time.monotonic()
    subprocess.run(["git", "clone", "--quiet", str(args.repo), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", args.ref], check=True)
    commit = subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    marks["cloned"] = time.monotonic() - t0

    proc = subprocess.Popen(
        ["./dev.sh", "serve"],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stopped whole below, nothing else
    )

    def read_log() -> None:
        with log_path.open("w") as log:
            for raw in proc.stdout:  # type: ignore[union-attr]  # stdout=PIPE: set
                at = time.monotonic() - t0
                line = raw.decode("utf-8", "replace").rstrip()
                log.write(f"{at:8.1f} {line}\n")
                log.flush()
                lines.append((at, line))
                for name, pattern in PHASES:
                    if name not in marks and pattern.search(line):
                        marks[name] = at
                        break

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    answer = ""
    try:
        deadline = t0 + args.timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"./dev.sh serve exited with {proc.returncode}; log: {log_path}")
            got = first_token(port, timeout=max(1.0, deadline - time.monotonic()))
            if got:
                marks["first_token"] = got[0] - t0
                answer = got[1]
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"no token within {args.timeout} s; log: {log_path}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        reader.join(timeout=10)
        if args.keep_log:
            shutil.copy(log_path, args.keep_log)

    venv = clone / ".venv"
    result = {
        "label": args.label,
        "ref": args.ref,
        "commit": commit,
        "cache": "empty" if cache_was_empty else "warm (kept from an earlier run)",
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
        "load_before": os.getloadavg(),
        "seconds": {name: round(value, 1) for name, value in sorted(marks.items(), key=lambda kv: kv[1])},
        "total_s": round(marks["first_token"], 1),
        "answer": answer.strip()[:200],
        "venv_mb": round(sum(f.stat().st_size for f in venv.rglob("*") if f.is_file()) / 2**20)
        if venv.is_dir()
        else None,
        "progress_lines": [f"{at:.1f} {line}" for at, line in lines if line.startswith("dev.sh:")],
    }
    shutil.rmtree(work, ignore_errors=True)
    return result


def markdown(result: dict) -> str:
    rows = "\n".join(f"| {name} | {value} |" for name, value in result["seconds"].items())
    progress = "\n".join(result["progress_lines"]) or "(none)"
    return f"""# Cold start: {result["label"]}

`{result["command"]}`

commit {result["commit"]} ({result["ref"]}); pip/uv cache: {result["cache"]}; {result["machine"]};
load average before: {", ".join(f"{x:.2f}" for x in result["load_before"])}

**{result["total_s"]} s from `git clone` to the first streamed token** of `/generate`
({result["answer"]!r}); the venv: {result["venv_mb"]} MB.

| phase (seconds since the clone started) | s |
|---|---|
{rows}

dev.sh's progress lines:

```text
{progress}
```
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True, help="results go to bench/results/cold-start-LABEL.*")
    parser.add_argument("--repo", default=str(ROOT), help="what to clone (default: this repository)")
    parser.add_argument("--ref", default="HEAD", help="commit to check out in the clone")
    parser.add_argument("--cache", help="pip/uv cache directory to use and keep (default: a new empty one)")
    parser.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    parser.add_argument("--keep-log", help="copy the serve log (timestamped lines) here")
    args = parser.parse_args()
    result = run(args)
    result["command"] = "python bench/cold_start.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"cold-start-{args.label}.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / f"cold-start-{args.label}.md").write_text(markdown(result))
    print(f"{args.label}: {result['total_s']} s to the first token; {json.dumps(result['seconds'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
