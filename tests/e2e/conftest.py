"""End-to-end fixtures: the demo model packed into a temp model store, and `bentoml serve .`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.openai_support import Reference, reference_for, served_model_name
from tests.support import defer_stop, free_ports, http_ok, prometheus_metric

REPO_ROOT = Path(__file__).resolve().parents[2]


FLAVORS = ("llmapi", "ensemble")
"""Every e2e test runs on both repository flavours, unless its module sets FLAVORS to fewer."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselects the flavours a test does not run on: those its `flavors` marker leaves out, else
    those its module's FLAVORS tuple does (for what does not depend on the repository flavour)."""
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        flavor = callspec.params.get("flavor") if callspec is not None else None
        marker = item.get_closest_marker("flavors")
        allowed = marker.args if marker is not None else getattr(item.module, "FLAVORS", FLAVORS)
        (drop if flavor is not None and flavor not in allowed else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session", params=FLAVORS)
def flavor(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def bentoml_home(flavor: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model store holding the demo model, packed by pack_model.py as a user would."""
    return pack_demo(tmp_path_factory.mktemp(f"bentoml_home_{flavor}"), flavor)


PACK_STDERR = "pack_model.stderr"
"""Where `pack_demo(..., quiet=False)` leaves what pack_model.py said (under the home)."""


def pack_demo(home: Path, flavor: str, *options: str, demo: str = "tiny", quiet: bool = True) -> Path:
    """Packs a demo model (the tiny random one, or smollm2) into the model store under `home` with
    pack_model.py, as a user does (not quiet: its stderr is kept in `home / PACK_STDERR`)."""
    env = {**os.environ, "BENTOML_HOME": str(home), "BENTOML_DO_NOT_TRACK": "true"}
    done = subprocess.run(
        [sys.executable, "pack_model.py", "--demo", demo, "--flavor", flavor, *options]
        + (["--quiet"] if quiet else []),
        cwd=REPO_ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if not quiet:
        (home / PACK_STDERR).write_text(done.stderr)
    return home


SPAWNED: list[BentoService] = []
"""Every service a test started, so that a failing test's report carries the logs they wrote."""
LOG_TAIL = 6000


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """A failing e2e test's report ends with the log of each service that wrote to its log while
    the test ran: a flaky failure is understood from its first occurrence (CI keeps nothing else)."""
    report = yield
    if report.when == "call" and report.failed:
        for server in SPAWNED:
            path = server.log_path
            if path.exists() and path.stat().st_mtime >= call.start:
                report.sections.append(
                    (f"bentoml serve on {server.url}, its log's end", server.log()[-LOG_TAIL:])
                )
    return report


class BentoService:
    """`bentoml serve .` on free ports (service and Triton), stopped like a user stops it."""

    def __init__(self, home: Path, workdir: Path, extra_env: dict[str, str] | None = None) -> None:
        self.port, self.triton_grpc_port, self.triton_http_port, self.triton_metrics_port = free_ports(4)
        self.log_path = workdir / f"bentoml-{self.port}.log"
        # A home of its own, sharing the model store: `bentoml serve` empties the Prometheus
        # directory under BENTOML_HOME when it starts, which would wipe another service's metrics.
        self.home = workdir / f"home-{self.port}"
        self.home.mkdir(parents=True)
        (self.home / "models").symlink_to(home / "models", target_is_directory=True)
        self.env = {
            **os.environ,
            "BENTOML_HOME": str(self.home),
            "BENTOML_DO_NOT_TRACK": "true",
            "TRITON_GRPC_PORT": str(self.triton_grpc_port),
            "TRITON_HTTP_PORT": str(self.triton_http_port),
            "TRITON_METRICS_PORT": str(self.triton_metrics_port),
            "TRTLLM_RUN_DIR": str(workdir / f"run-{self.port}"),
            **(extra_env or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.triton_metrics_port}/metrics"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def metric(self, name: str, **labels: str) -> float:
        """Sum of one of Triton's Prometheus metrics (the reference engine's counters), by labels."""
        return prometheus_metric(self.metrics_url, name, **labels)

    def spawn(self) -> BentoService:
        """Starts `bentoml serve .` without waiting for readiness (for services meant to fail)."""
        SPAWNED.append(self)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bentoml",
                    "serve",
                    ".",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                ],
                cwd=REPO_ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def start(self, timeout: float = 240.0) -> BentoService:
        self.spawn()
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"bentoml serve exited:\n{self.log()[-5000:]}")
            if http_ok(f"{self.url}/readyz"):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"bentoml serve was not ready in {timeout} s:\n{self.log()[-5000:]}")

    def descendants(self) -> list[psutil.Process]:
        if self.process is None:
            return []
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def tritonserver_pids(self) -> list[int]:
        return [p.pid for p in self.descendants() if _name(p) == "tritonserver"]

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 60.0) -> None:
        """Signals `bentoml serve` itself (as Ctrl-C or a container stop would), then cleans up:
        what of its tree outlives it (a worker runs in a session of its own, its Triton in a group
        of its own) is killed and named on stderr, rather than left running after the suite."""
        if self.process is None:
            return
        tree = self.descendants()
        if self.process.poll() is None:
            self.process.send_signal(sig)
        self._finish_stop(tree, timeout)

    def stop_soon(self) -> None:
        """`stop`, but not waited for: SIGTERM now, the rest once two more services are stopping
        or at the session's end (tests/support.DEFERRED_STOPS). For fixtures whose stop no test
        looks at: a stop takes 3-5 s, mostly Triton waiting on itself, and the next tests run
        meanwhile."""
        if self.process is None or self.process.poll() is not None:
            self.stop()
            return
        tree = self.descendants()
        self.process.send_signal(signal.SIGTERM)
        defer_stop(lambda: self._finish_stop(tree, 60.0))

    def _finish_stop(self, tree: list[psutil.Process], timeout: float) -> None:
        assert self.process is not None
        if self.process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        left = [p for p in tree if _lingers(p)]
        for process in left:
            with contextlib.suppress(psutil.Error):
                process.kill()
        if left:
            names = ", ".join(f"{_name(p)} ({p.pid})" for p in left)
            print(
                f"bentoml serve on {self.url} left {names} running after it stopped: killed", file=sys.stderr
            )


@contextlib.contextmanager
def serving(home: Path, workdir: Path, extra_env: dict[str, str] | None = None) -> Iterator[BentoService]:
    """`bentoml serve .` on the model store under `home`, ready, and stopped when the block ends."""
    server = BentoService(home, workdir, extra_env).start()
    try:
        yield server
    finally:
        server.stop_soon()


def _lingers(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.Error:
        return ""


@pytest.fixture(scope="session")
def packed_model_dir(bentoml_home: Path) -> Path:
    """The directory of the model pack_model.py --demo packed (engine/, tokenizer/, pack.json)."""
    found = sorted((bentoml_home / "models").glob("*/*/pack.json"))
    assert len(found) == 1, f"expected one packed model in {bentoml_home}: {found}"
    return found[0].parent


@pytest.fixture(scope="session")
def service(bentoml_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BentoService]:
    """One `bentoml serve .` on the demo model, shared by the e2e tests that do not break it.
    Browser pages from one other origin may call it (CORS; tests/e2e/test_request_id_cors.py)."""
    cors = {"TRTLLM_CORS_ALLOW_ORIGINS": f"http://localhost:{free_ports(1)[0]}"}
    server = BentoService(bentoml_home, tmp_path_factory.mktemp("serve"), cors).start()
    try:
        yield server
    finally:
        server.stop_soon()


@pytest.fixture(scope="session")
def synthetic_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model store holding the demo model packed with the synthetic token source (no model:
    tokens as fast as Triton relays them), for load and fuzzing."""
    return pack_demo(tmp_path_factory.mktemp("bentoml_home_synthetic"), "ensemble", "--engine", "synthetic")


@pytest.fixture(scope="session")
def synthetic_service(
    synthetic_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BentoService]:
    """`bentoml serve .` on the synthetic token source, shared by the load and hostile-input tests:
    hardened as a public deployment would be (short header and body read timeouts, special-token
    text in messages kept as text), which the hostile-input tests check."""
    hardened = {
        "TRTLLM_HEADER_TIMEOUT": "3",
        "TRTLLM_BODY_TIMEOUT": "3",
        "TRTLLM_CONTENT_SPECIAL_TOKENS": "text",
    }
    server = BentoService(synthetic_home, tmp_path_factory.mktemp("serve_synthetic"), hardened).start()
    try:
        yield server
    finally:
        server.stop_soon()


@pytest.fixture
def make_service(bentoml_home: Path, tmp_path: Path) -> Iterator[Callable[..., BentoService]]:
    """A private `bentoml serve .` per call (for fault tests and other settings), always stopped."""
    started: list[BentoService] = []

    def make(extra_env: dict[str, str] | None = None, *, wait_ready: bool = True) -> BentoService:
        server = BentoService(bentoml_home, tmp_path, extra_env)
        started.append(server)
        return server.start() if wait_ready else server.spawn()

    try:
        yield make
    finally:
        for server in started:
            server.stop_soon()


# ---- shared by the OpenAI API tests ------------------------------------------------------------------


@pytest.fixture(scope="module")
def ref(packed_model_dir: Path) -> Reference:
    """Greedy references computed with transformers on the packed model files."""
    return reference_for(packed_model_dir)


@pytest.fixture(scope="module")
def model_name(packed_model_dir: Path) -> str:
    return served_model_name(packed_model_dir)


@pytest.fixture(scope="module")
def client(service: BentoService) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.url}/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(service: BentoService) -> Iterator[httpx.Client]:
    """httpx on the shared service's root: what the SDKs do not send or do not show."""
    with httpx.Client(base_url=service.url, timeout=60) as client:
        yield client
