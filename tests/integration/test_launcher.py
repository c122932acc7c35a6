"""launch_triton_server with a real tritonserver: serve, stream, stop the whole process tree."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import pytest

from tensorrtllm_backend import LAUNCHER
from tensorrtllm_backend.launcher import LauncherError, find_tritonserver
from tests.support import alive, free_ports

pytestmark = pytest.mark.integration

try:
    find_tritonserver()
    NO_TRITON = ""
except LauncherError as exc:  # pragma: no cover - depends on the machine
    NO_TRITON = str(exc)

requires_triton = pytest.mark.skipif(bool(NO_TRITON), reason=f"no tritonserver: {NO_TRITON}")

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

MODEL = """\
import numpy as np
import psutil  # noqa: F401  installed only in the virtualenv: proves the stub inherits it
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        {init}

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy().reshape(-1)[0])
            for i in range(count):
                out = pb_utils.Tensor("OUT", np.array([i * 10], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def make_repo(root: Path, name: str = "stream_ints", *, broken: bool = False) -> Path:
    model_dir = root / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(CONFIG.format(name=name))
    init = 'raise RuntimeError("broken on purpose")' if broken else "pass"
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(MODEL).replace("{init}", init))
    return root


@dataclass
class Launched:
    proc: subprocess.Popen
    grpc_port: int
    http_port: int
    metrics_port: int
    log: Path

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "<no log>"

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def tritonserver(self) -> psutil.Process:
        servers = [p for p in self.descendants() if p.name() == "tritonserver"]
        assert len(servers) == 1, [p.name() for p in self.descendants()]
        return servers[0]


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while True:
        remaining = alive(procs)
        if not remaining or time.monotonic() > deadline:
            return remaining
        time.sleep(0.1)


def staging_dirs(pid: int) -> list[Path]:
    return sorted(Path(tempfile.gettempdir()).glob(f"triton-launch-{pid}-*"))


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Launched]]:
    started: list[tuple[Launched, list[psutil.Process]]] = []

    def start(repo: Path, *extra: str) -> Launched:
        grpc_port, http_port, metrics_port = free_ports(3)
        log = tmp_path / f"launcher-{len(started)}.log"
        with open(log, "wb") as log_file:
            proc = subprocess.Popen(
                [
                    sys.executable, str(LAUNCHER),
                    "--model_repo", str(repo),
                    "--grpc_port", str(grpc_port),
                    "--http_port", str(http_port),
                    "--metrics_port", str(metrics_port),
                    "--exit_timeout_secs", "5",
                    *extra,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        launched = Launched(proc, grpc_port, http_port, metrics_port, log)
        started.append((launched, []))
        return launched

    def remember(launched: Launched) -> list[psutil.Process]:
        procs = launched.descendants()
        for entry, recorded in started:
            if entry is launched:
                recorded.extend(procs)
        return procs

    start.remember = remember  # type: ignore[attr-defined]  # an attribute on the function, for the test
    try:
        yield start
    finally:
        for launched, recorded in started:
            recorded.extend(launched.descendants())
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(launched.proc.pid, signal.SIGKILL)  # its session and process group
            for p in alive(recorded):
                with contextlib.suppress(psutil.Error):
                    p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                launched.proc.wait(timeout=10)
            for d in staging_dirs(launched.proc.pid):
                shutil.rmtree(d, ignore_errors=True)


def wait_ready(launched: Launched, timeout: float = READY_TIMEOUT) -> float:
    t0 = time.monotonic()
    url = f"http://127.0.0.1:{launched.http_port}/v2/health/ready"
    while time.monotonic() - t0 < timeout:
        if launched.proc.poll() is not None:
            pytest.fail(f"launcher exited with {launched.proc.returncode}:\n{launched.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    pytest.fail(f"not ready after {timeout} s:\n{launched.log_tail()}")


def stream_ints(grpc_port: int, count: int, model: str = "stream_ints") -> list[int]:
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        inp = grpcclient.InferInput("COUNT", [1], "INT32")
        inp.set_data_from_numpy(np.array([count], dtype=np.int32))
        client.async_stream_infer(model, [inp], request_id="req-1", enable_empty_final_response=True)
        values = []
        while True:
            result, error = results.get(timeout=30)
            assert error is None, error
            out = result.as_numpy("OUT")
            if out is not None:
                values.append(int(out[0]))
            if result.get_response().parameters["triton_final_response"].bool_param:
                return values
    finally:
        client.stop_stream()
        client.close()


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped  # gRPC listens on an IPv6 socket as [::ffff:127.0.0.1]
    return addr.is_loopback


@requires_triton
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_stream_and_stop(launch, tmp_path: Path, stop_signal: signal.Signals):
    launched = launch(make_repo(tmp_path / "repo"))
    ready_s = wait_ready(launched)
    print(f"ready after {ready_s:.1f} s")

    assert stream_ints(launched.grpc_port, 5) == [0, 10, 20, 30, 40]

    server = launched.tritonserver()
    listening = [c for c in server.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    ports = {c.laddr.port for c in listening}
    assert {launched.grpc_port, launched.http_port, launched.metrics_port} <= ports, listening
    assert all(is_loopback(c.laddr.ip) for c in listening), listening

    assert len(staging_dirs(launched.proc.pid)) == 1  # pytriton build: per-launch backend dir
    tree = launch.remember(launched)
    assert len(tree) >= 2, tree  # tritonserver + the Python backend stub

    t0 = time.monotonic()
    launched.proc.send_signal(stop_signal)
    rc = launched.proc.wait(timeout=STOP_TIMEOUT)
    stop_s = time.monotonic() - t0
    print(f"stopped after {stop_s:.1f} s")
    assert rc == 0, launched.log_tail()
    assert wait_gone(tree, 5) == []
    assert staging_dirs(launched.proc.pid) == []
    assert f"received {stop_signal.name}" in launched.log.read_text()


@requires_triton
def test_launcher_sigkill_takes_tritonserver_down(launch, tmp_path: Path):
    launched = launch(make_repo(tmp_path / "repo"))
    wait_ready(launched)
    tree = launch.remember(launched)
    server = launched.tritonserver()

    t0 = time.monotonic()
    launched.proc.kill()
    launched.proc.wait(timeout=10)
    assert wait_gone(tree, STOP_TIMEOUT) == [], launched.log_tail()
    print(f"tritonserver gone {time.monotonic() - t0:.1f} s after the launcher was SIGKILLed")
    assert "Signal (15) received" in launched.log.read_text()  # PDEATHSIG -> graceful shutdown
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE


@requires_triton
def test_tritonserver_failure_is_the_launcher_exit_status(launch, tmp_path: Path):
    launched = launch(make_repo(tmp_path / "repo", broken=True))
    try:
        rc = launched.proc.wait(timeout=READY_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"launcher still running with a broken model:\n{launched.log_tail()}")
    log = launched.log.read_text(errors="replace")
    assert rc != 0, log[-3000:]
    assert "broken on purpose" in log
    assert staging_dirs(launched.proc.pid) == []


@requires_triton
def test_two_servers_side_by_side(launch, tmp_path: Path):
    """Distinct ports and shared-memory prefixes: two launches on one host do not collide."""
    first = launch(make_repo(tmp_path / "a"))
    second = launch(make_repo(tmp_path / "b"))
    wait_ready(first)
    wait_ready(second)
    assert stream_ints(first.grpc_port, 2) == [0, 10]
    assert stream_ints(second.grpc_port, 3) == [0, 10, 20]
    for launched in (first, second):
        tree = launch.remember(launched)
        launched.proc.terminate()
        assert launched.proc.wait(timeout=STOP_TIMEOUT) == 0
        assert wait_gone(tree, 5) == []


def test_a_killed_server_leaves_no_child_behind(tmp_path: Path):
    """A tritonserver killed outright leaves its Python stubs to notice on their own (a stub polls
    its parent); one that does not is re-parented to the rank supervisor, which kills and reaps
    it. The fake server's child here never notices: it sleeps on, ignoring SIGTERM."""
    pidfile = tmp_path / "stub.pid"
    fake_server = f"(trap '' TERM INT HUP; exec sleep 300) & echo $! > {pidfile}; wait"
    proc = subprocess.Popen(
        [sys.executable, str(LAUNCHER), "--supervise_rank", "5", "--", "sh", "-c", fake_server],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        stub = psutil.Process(int(pidfile.read_text()))
        server = stub.parent()
        assert server is not None and server.parent().pid == proc.pid
        server.kill()
        _, err = proc.communicate(timeout=STOP_TIMEOUT)
        assert proc.returncode == 128 + signal.SIGKILL, err
        assert "exited unasked" in err and f"left behind by sh: [{stub.pid}]" in err, err
        assert alive([stub]) == []
        with pytest.raises(psutil.NoSuchProcess):  # reaped, not a zombie
            stub.status()
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_escalates_to_sigkill_and_kills_descendants(tmp_path: Path):
    """A child that ignores SIGTERM is SIGKILLed after the grace period, with its descendants."""
    pidfile = tmp_path / "grandchild.pid"
    fake_server = f"trap '' TERM INT; sleep 300 & echo $! > {pidfile}; wait"
    code = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from tensorrtllm_backend import launcher as lts
        sys.exit(lts.supervise(["sh", "-c", {fake_server!r}], dict(os.environ), kill_grace_secs=1.0))
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        grandchild = psutil.Process(int(pidfile.read_text()))
        tree = [*psutil.Process(proc.pid).children(recursive=True)]
        assert grandchild in tree
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=STOP_TIMEOUT)
        elapsed = time.monotonic() - t0
        assert proc.returncode == 128 + signal.SIGKILL, err
        assert 0.9 < elapsed < 10, elapsed
        assert "received SIGTERM" in err and "killing it" in err
        assert wait_gone(tree, 5) == []
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


# ---- several ranks under a real mpirun (Open MPI; .ci/run and dev.sh install it) -----------------------


def ranks_of(launched: Launched) -> tuple[psutil.Process, list[psutil.Process], list[psutil.Process]]:
    """mpirun, each rank's supervisor (this launcher in its rank mode) and each tritonserver,
    ordered by rank (rank 0 is the one that serves HTTP)."""
    tree = launched.descendants()
    mpirun = [p for p in tree if p.name() == "mpirun"]
    assert len(mpirun) == 1, [p.name() for p in tree]
    supervisors = [p for p in mpirun[0].children() if "--supervise_rank" in p.cmdline()]
    servers = sorted(
        (p for p in tree if p.name() == "tritonserver"), key=lambda p: "--allow-http=false" in p.cmdline()
    )
    return mpirun[0], supervisors, servers


def wait_for_ranks(launched: Launched, count: int, timeout: float = 30.0) -> None:
    """``count`` tritonservers up, each with its repository's one model loaded. Rank 0's readiness
    does not wait for rank 1 here (the test model loads on each rank alone, unlike an engine split
    over ranks), and a rank stopped while it loads dies of the signal: Triton traps SIGTERM only
    once its models are loaded."""
    deadline = time.monotonic() + timeout
    while (
        len(ranks_of(launched)[2]) < count
        or launched.log.read_text(errors="replace").count("successfully loaded '") < count
    ):
        assert time.monotonic() < deadline, f"{count} ranks did not start:\n{launched.log_tail()}"
        time.sleep(0.2)


@requires_triton
def test_two_ranks_start_serve_and_stop_gracefully(launch, tmp_path: Path):
    launched = launch(
        make_repo(tmp_path / "repo"), "--world_size", "2", "--tensorrt_llm_model_name", "stream_ints"
    )
    wait_ready(launched)
    wait_for_ranks(launched, 2)
    _, supervisors, servers = ranks_of(launched)
    assert len(supervisors) == 2
    assert sorted(s.parent().pid for s in servers) == sorted(s.pid for s in supervisors)
    # Rank 0 serves; rank 1 only hosts its share of the engine model, with no endpoints.
    assert stream_ints(launched.grpc_port, 3) == [0, 10, 20]
    assert not [c for c in servers[1].net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    tree = launch.remember(launched)

    launched.proc.send_signal(signal.SIGTERM)
    assert launched.proc.wait(timeout=STOP_TIMEOUT) == 0, launched.log_tail()
    assert wait_gone(tree, 5) == []
    log = launched.log.read_text(errors="replace")
    # Each rank drained and unloaded (mpirun's own stop would SIGKILL them a second after SIGTERM).
    assert log.count("successfully unloaded 'stream_ints'") == 2, log[-3000:]
    assert "exited unasked" not in log


@requires_triton
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["rank-killed", "rank-exits-cleanly"])
def test_a_rank_that_dies_or_leaves_takes_every_rank_down(launch, tmp_path: Path, how: signal.Signals):
    """Open MPI runs the other ranks on after one exits with status 0; the rank mode makes any
    unasked exit a failure, so mpirun ends the job and the supervisor above can restart it."""
    launched = launch(
        make_repo(tmp_path / "repo"), "--world_size", "2", "--tensorrt_llm_model_name", "stream_ints"
    )
    wait_ready(launched)
    wait_for_ranks(launched, 2)
    tree = launch.remember(launched)
    rank1 = ranks_of(launched)[2][1]

    t0 = time.monotonic()
    rank1.send_signal(how)
    rc = launched.proc.wait(timeout=STOP_TIMEOUT)
    print(f"launcher exited {time.monotonic() - t0:.1f} s after rank 1 got {how.name}")
    assert rc != 0, launched.log_tail()
    assert wait_gone(tree, 10) == [], [p.name() for p in alive(tree)]
    assert f"(pid {rank1.pid}) exited unasked" in launched.log.read_text(errors="replace")


@requires_triton
def test_mpirun_killed_leaves_no_rank_behind(launch, tmp_path: Path):
    """mpirun gives each rank a process group of its own, so a SIGKILL to its group would orphan
    them; each rank's supervisor dies with mpirun and stops its tritonserver."""
    launched = launch(
        make_repo(tmp_path / "repo"), "--world_size", "2", "--tensorrt_llm_model_name", "stream_ints"
    )
    wait_ready(launched)
    wait_for_ranks(launched, 2)
    tree = launch.remember(launched)
    mpirun, _, servers = ranks_of(launched)
    assert all(os.getpgid(s.pid) != os.getpgid(mpirun.pid) for s in servers)

    mpirun.kill()
    assert wait_gone(tree, STOP_TIMEOUT) == [], [p.name() for p in alive(tree)]
