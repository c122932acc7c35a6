"""Start tritonserver (or ``mpirun`` with one tritonserver per rank) and supervise it.

Unlike upstream's launcher, which spawns the server and returns at once, this one stays in the
foreground as the parent of the server:

* SIGTERM / SIGINT (and SIGHUP, sent on as SIGTERM) are forwarded to the child; if it has not
  exited after a grace period the child and all of its descendants are killed with SIGKILL;
* the launcher exits with the child's exit status (128 + N when the child died of signal N);
* the child is started with PR_SET_PDEATHSIG=SIGTERM, so it is told to shut down even when the
  launcher itself is killed with SIGKILL;
* the launcher is the child subreaper of its tree: when the server dies, its Python backend stubs
  are re-parented to the launcher instead of init, and the launcher kills and reaps them before
  it exits (a stub notices its parent's death by itself only most of the time).

For several ranks, ``mpirun`` starts each tritonserver through the launcher's script in its rank
mode (``--supervise_rank``), which supervises one rank the same way and adds two rules mpirun lacks:
the rank dies with mpirun (mpirun puts every rank in its own process group, so a SIGKILL to
mpirun's group would orphan them), and a tritonserver that exits when nobody asked it to fails the
rank even with status 0, so mpirun takes every rank down and the supervisor above restarts the
whole tree (Open MPI lets the other ranks run on after a clean exit).

Triton has no authentication, so gRPC, HTTP and metrics listen on ``--host`` (default 127.0.0.1)
unless told otherwise.

tritonserver is looked up in this order: ``--tritonserver``, ``$TRITONSERVER``, ``PATH``,
``/opt/tritonserver/bin/tritonserver``, the build inside the ``nvidia-pytriton`` wheel. The
pytriton build needs its libraries on LD_LIBRARY_PATH and a Python backend stub that matches the
Python its models run under; the launcher stages a per-launch backend directory for it and removes
it on exit. That Python is ``$TRITON_PYTHON`` (``STUB_PYTHON_ENV``: a virtual environment's
``python3``, whose version picks the stub and whose environment the models import from) or else
the running interpreter.

The logic of ``scripts/launch_triton_server.py`` (``LAUNCHER``), the entry point that users, the
service and mpirun's ranks run by path; the service imports this module. It imports only the standard
library, so any Python with this package runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from tensorrtllm_backend import LAUNCHER

__all__ = [
    "LauncherError",
    "TritonInstall",
    "build_command",
    "build_parser",
    "descendants",
    "find_llmapi_launch",
    "find_tritonserver",
    "main",
    "pid_alive",
    "stage_backends",
    "stop_targets",
]

PROG = "launch_triton_server"
OPT_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
MIN_KILL_GRACE_SECS = 15.0
RANK_MODE = "--supervise_rank"
"""First argument of the rank mode: ``--supervise_rank GRACE_SECS -- tritonserver ...``."""
SUPERVISE_HOLDING_SIGTERM_MODE = "--supervise_holding_sigterm"
"""First argument of ``--supervise_holding_sigterm GRACE_SECS -- COMMAND ...``: this process stays the
parent of COMMAND (a trtllm-llmapi-launch tree) with SIGTERM blocked, and stops it on SIGINT."""
LLMAPI_LAUNCH = "trtllm-llmapi-launch"
"""TensorRT-LLM's launcher for LLM API processes (installed beside its Python): NVIDIA starts Triton
for the llmapi model as ``trtllm-llmapi-launch tritonserver ...``, one rank or one per mpirun rank."""
LAUNCH_SUBSHELL_GRACE_SECS = 5.0
"""How long what a trtllm-llmapi-launch script leaves behind when it exits may take to end by itself:
its background subshell still runs the leader's stop request then (seconds on a loaded machine)."""
TRITONSERVER = "tritonserver"
HOLD_SIGTERM_MODE = "--exec_holding_sigterm"
"""First argument of ``--exec_holding_sigterm -- COMMAND ...``: COMMAND replaces this process (same
pid) with SIGTERM blocked, so only the signals its owner chose to send stop it."""
STAGING_PREFIX = "triton-launch-"
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


class LauncherError(Exception):
    """A problem reported as one line on stderr, exit status 2."""


STUB_PYTHON_ENV = "TRITON_PYTHON"
"""The Python whose environment pytriton's Python-backend stub runs models in (default: the running one)."""


@dataclass(frozen=True)
class StubPython:
    """The Python a pytriton build's stub must match: its version, its bin directory (first on the
    server's PATH: the stub's embedded interpreter takes its environment from the `python3` there)
    and its libpython directory (first on LD_LIBRARY_PATH)."""

    version: str
    bin_dir: str
    lib_dir: str | None

    @classmethod
    def of(cls, environ: Mapping[str, str]) -> StubPython:
        chosen = environ.get(STUB_PYTHON_ENV)
        if not chosen:
            version = f"{sys.version_info.major}.{sys.version_info.minor}"
            return cls(version, os.path.dirname(sys.executable), sysconfig.get_config_var("LIBDIR"))
        python = Path(chosen).expanduser()
        if not (python.is_file() and os.access(python, os.X_OK)):
            raise LauncherError(f"${STUB_PYTHON_ENV} {chosen!r} is not an executable file")
        if not (python.parent / "python3").is_file():
            raise LauncherError(
                f"${STUB_PYTHON_ENV} {chosen!r} has no python3 beside it (use a virtual environment's python3)"
            )
        ask = "import sys, sysconfig; print('%d.%d' % sys.version_info[:2]); print(sysconfig.get_config_var('LIBDIR'))"
        try:
            found = subprocess.run(
                [str(python), "-I", "-c", ask], capture_output=True, text=True, timeout=60, check=True
            )
            version, lib_dir = found.stdout.split()[:2]
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            raise LauncherError(f"${STUB_PYTHON_ENV} {chosen!r} does not run: {exc}") from None
        return cls(version, str(python.parent), lib_dir)


@dataclass(frozen=True)
class TritonInstall:
    """A tritonserver binary and what it needs to run.

    binary:       path of the tritonserver executable.
    env:          environment variables to set (override) for the server process; values are
                  complete (LD_LIBRARY_PATH and PATH already include the existing value).
    backend_dir:  value for ``--backend-directory``, or None for tritonserver's default.
    source:       where it was found ("--tritonserver", "$TRITONSERVER", "PATH",
                  "/opt/tritonserver", "nvidia-pytriton").
    python_backend, python_stub: for the nvidia-pytriton build, the directory of its Python
                  backend and the stub for the running interpreter; ``stage_backends`` turns them
                  into a ``backend_dir``.
    """

    binary: str
    env: dict[str, str] = field(default_factory=dict)
    backend_dir: str | None = None
    source: str = ""
    python_backend: str | None = None
    python_stub: str | None = None

    @property
    def needs_staging(self) -> bool:
        return self.python_backend is not None and self.backend_dir is None

    def child_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: os.environ) with this install's variables applied."""
        env = dict(os.environ if base is None else base)
        env.update(self.env)
        return env


# --------------------------------------------------------------------------- discovery


def _join_paths(*parts: str | None) -> str:
    out: list[str] = []
    for part in parts:
        for item in (part or "").split(os.pathsep):
            if item and item not in out:
                out.append(item)
    return os.pathsep.join(out)


def _pytriton_binary() -> Path | None:
    """tritonserver inside the nvidia-pytriton wheel of the running interpreter, if installed."""
    try:
        spec = importlib.util.find_spec("pytriton")  # does not import the package
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        binary = Path(location) / "tritonserver" / "bin" / "tritonserver"
        if binary.is_file():
            return binary
    return None


def _describe(binary: Path, source: str, environ: Mapping[str, str]) -> TritonInstall:
    """Build a TritonInstall for ``binary``, recognising the nvidia-pytriton layout."""
    root = Path(os.path.realpath(binary)).parent.parent  # <prefix>/bin/tritonserver -> <prefix>
    python_backend = root / "backends" / "python"
    stubs = root / "python_backend_stubs"
    if stubs.is_dir() and (python_backend / "libtriton_python.so").is_file():
        # nvidia-pytriton: <site-packages>/pytriton/tritonserver/{bin,backends,python_backend_stubs}
        site_packages = root.parent.parent
        python = StubPython.of(environ)
        ld_path = _join_paths(
            # The interpreter's own libpython first: otherwise the stub may load a system
            # libpython of the same soname and fail on C extensions such as _ssl.
            python.lib_dir,
            str(site_packages / "nvidia_pytriton.libs"),
            environ.get("LD_LIBRARY_PATH"),
        )
        path = _join_paths(python.bin_dir, environ.get("PATH", os.defpath))
        return TritonInstall(
            binary=str(binary),
            env={"LD_LIBRARY_PATH": ld_path, "PATH": path},
            backend_dir=None,
            source=source,
            python_backend=str(python_backend),
            python_stub=str(stubs / python.version / "triton_python_backend_stub"),
        )
    backends = root / "backends"
    return TritonInstall(
        binary=str(binary),
        env={},
        backend_dir=str(backends) if backends.is_dir() else None,
        source=source,
    )


def _explicit(value: str, source: str, environ: Mapping[str, str]) -> TritonInstall:
    if os.sep not in value:  # a bare name: look it up on PATH
        found = shutil.which(value, path=environ.get("PATH", os.defpath))
        if found is None:
            raise LauncherError(f"tritonserver {value!r} given by {source} not found on PATH")
        value = found
    path = Path(value).expanduser()
    if not path.is_file():
        raise LauncherError(f"tritonserver {str(path)!r} given by {source} does not exist")
    if not os.access(path, os.X_OK):
        raise LauncherError(f"tritonserver {str(path)!r} given by {source} is not executable")
    return _describe(path, source, environ)


def find_tritonserver(
    explicit: str | None = None, *, environ: Mapping[str, str] | None = None
) -> TritonInstall:
    """Find tritonserver: ``explicit``, $TRITONSERVER, PATH, /opt/tritonserver, nvidia-pytriton.

    An explicit path (argument or $TRITONSERVER) that does not exist raises LauncherError; so
    does finding none at all (the message lists what was tried).
    """
    environ = os.environ if environ is None else environ
    if explicit:
        return _explicit(explicit, "--tritonserver", environ)
    from_env = environ.get("TRITONSERVER")
    if from_env:
        return _explicit(from_env, "$TRITONSERVER", environ)
    on_path = shutil.which("tritonserver", path=environ.get("PATH", os.defpath))
    if on_path:
        return _describe(Path(on_path), "PATH", environ)
    opt = Path(OPT_TRITONSERVER)
    if opt.is_file() and os.access(opt, os.X_OK):
        return _describe(opt, "/opt/tritonserver", environ)
    bundled = _pytriton_binary()
    if bundled is not None:
        return _describe(bundled, "nvidia-pytriton", environ)
    raise LauncherError(
        "tritonserver not found (tried --tritonserver, $TRITONSERVER, PATH, "
        f"{OPT_TRITONSERVER}, the nvidia-pytriton package)"
    )


# --------------------------------------------------------------------------- staging


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts; a zombie too, until reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_stale_staging(tmp_root: str | None = None) -> None:
    """Remove staging directories left behind by launchers that were SIGKILLed."""
    tmp_root = tmp_root or tempfile.gettempdir()
    pattern = re.compile(re.escape(STAGING_PREFIX) + r"(\d+)-")
    try:
        entries = list(os.scandir(tmp_root))
    except OSError:
        return
    for entry in entries:
        match = pattern.match(entry.name)
        if not match or int(match.group(1)) == os.getpid():
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if not pid_alive(int(match.group(1))):
            shutil.rmtree(entry.path, ignore_errors=True)


def stage_backends(install: TritonInstall, workdir: str | os.PathLike[str]) -> TritonInstall:
    """Create ``<workdir>/backends/python`` for an install that needs it; return the install
    with ``backend_dir`` set. Installs that need no staging are returned unchanged.

    The directory holds symlinks to the bundled Python backend's files and a copy of the stub
    that matches the running interpreter.
    """
    if not install.needs_staging:
        return install
    assert install.python_backend is not None and install.python_stub is not None
    stub = Path(install.python_stub)
    if not stub.is_file():
        raise LauncherError(
            f"{install.source} has no Python backend stub for Python {stub.parent.name} (looked for {stub})"
        )
    check_stub_numpy(install)
    backends = Path(workdir) / "backends"
    target = backends / "python"
    target.mkdir(parents=True, exist_ok=True)
    for entry in Path(install.python_backend).iterdir():
        if entry.name == "__pycache__" or entry.name == stub.name:
            continue
        link = target / entry.name
        if not link.exists():
            link.symlink_to(entry)
    shutil.copy2(stub, target / stub.name)
    return dataclasses.replace(install, backend_dir=str(backends))


def check_stub_numpy(install: TritonInstall) -> None:
    """Refuse a pytriton build whose Python backend stub would run with numpy >= 2.

    pytriton 0.7's stub predates numpy 2: under it numeric tensors arrive corrupted (INT32 [7, 8, 9]
    as [7, 7, 7]) and BYTES tensors kill the stub, with no error anywhere. The stub's interpreter
    takes its packages from the first ``python3`` on the server's PATH, so that one is asked.
    """
    python = shutil.which("python3", path=install.env.get("PATH", os.environ.get("PATH", os.defpath)))
    if python is None:
        return
    probe = "import importlib.metadata as m; print(m.version('numpy'))"
    try:
        found = subprocess.run(
            [python, "-I", "-c", probe], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return
    version = found.stdout.strip()
    if found.returncode == 0 and version.split(".", 1)[0].isdigit() and int(version.split(".", 1)[0]) >= 2:
        raise LauncherError(
            f"the Python backend stub of {install.source} would run under {python} with numpy {version}, "
            "which silently corrupts tensors (pytriton 0.7's stub needs numpy < 2): "
            f"run `{python} -m pip install 'numpy<2'`, or use a Python environment with numpy 1.x"
        )


@contextlib.contextmanager
def staged(install: TritonInstall) -> Iterator[TritonInstall]:
    """Context manager: a staged copy of ``install`` in a fresh temp dir, removed on exit."""
    if not install.needs_staging:
        yield install
        return
    _sweep_stale_staging()
    workdir = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-")
    try:
        yield stage_backends(install, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- command line


class _OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise LauncherError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineErrorParser(
        prog=PROG,
        description="Start tritonserver (mpirun for world_size > 1) and supervise it in the foreground.",
    )
    p.add_argument("--world_size", type=int, default=1, help="number of ranks (tensor x pipeline parallel)")
    p.add_argument("--model_repo", required=True, help="Triton model repository")
    p.add_argument(
        "--tritonserver",
        default=None,
        help="tritonserver binary (default: $TRITONSERVER, PATH, "
        f"{OPT_TRITONSERVER}, then the one in nvidia-pytriton)",
    )
    p.add_argument("--grpc_port", type=int, default=8001)
    p.add_argument("--http_port", type=int, default=8000)
    p.add_argument("--metrics_port", type=int, default=8002)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address that gRPC, HTTP and metrics listen on (default 127.0.0.1: Triton has no authentication)",
    )
    p.add_argument(
        "--server_id",
        default=None,
        help="tritonserver --id: the name GET /v2 answers with, so that a client can tell this server "
        "from another one that answers on the same port (default: Triton's own, 'triton')",
    )
    p.add_argument("--log", action="store_true", help="verbose Triton logging (rank 0)")
    p.add_argument("--log-file", "--log_file", dest="log_file", default=None, help="Triton log file (rank 0)")
    p.add_argument(
        "--tensorrt_llm_model_name",
        default="tensorrt_llm",
        help="comma-separated models that ranks > 0 load (default tensorrt_llm)",
    )
    p.add_argument(
        "--trtllm_llmapi_launch",
        action="store_true",
        help=f"start each rank's tritonserver through {LLMAPI_LAUNCH} (TensorRT-LLM's LLM API spawns its "
        "worker through it; NVIDIA's way for the llmapi model). Found on PATH or beside this Python",
    )
    p.add_argument(
        "--exit_timeout_secs",
        type=int,
        default=10,
        help="tritonserver --exit-timeout-secs: how long it waits for in-flight requests on shutdown",
    )
    p.add_argument(
        "--print_command",
        action="store_true",
        help="print the command line that would run (shell-quoted, one line) and exit",
    )
    return p


def _validate(args: argparse.Namespace) -> None:
    if args.world_size < 1:
        raise LauncherError(f"--world_size must be >= 1, got {args.world_size}")
    for name in ("grpc_port", "http_port", "metrics_port"):
        port = getattr(args, name)
        if not 0 < port < 65536:
            raise LauncherError(f"--{name} must be in 1..65535, got {port}")
    if args.exit_timeout_secs < 0:
        raise LauncherError(f"--exit_timeout_secs must be >= 0, got {args.exit_timeout_secs}")
    if args.server_id is not None and (not args.server_id or any(c.isspace() for c in args.server_id)):
        raise LauncherError(f"--server_id must be one word, got {args.server_id!r}")
    if not args.host:
        raise LauncherError("--host must not be empty")


def find_llmapi_launch(environ: Mapping[str, str] | None = None) -> str | None:
    """trtllm-llmapi-launch on PATH, or beside the running Python (a venv's bin/), or None."""
    environ = os.environ if environ is None else environ
    found = shutil.which(LLMAPI_LAUNCH, path=environ.get("PATH", os.defpath))
    if found is None:
        found = shutil.which(LLMAPI_LAUNCH, path=os.path.dirname(sys.executable))
    return found


def _rank_command(args: argparse.Namespace, install: TritonInstall, rank: int, unique: str) -> list[str]:
    cmd = [
        install.binary,
        f"--model-repository={os.path.abspath(args.model_repo)}",
        f"--grpc-port={args.grpc_port}",
        f"--http-port={args.http_port}",
        f"--metrics-port={args.metrics_port}",
        f"--grpc-address={args.host}",
        f"--http-address={args.host}",
        f"--metrics-address={args.host}",
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name=prefix{rank}_{unique}_",
        f"--exit-timeout-secs={args.exit_timeout_secs}",
    ]
    if args.server_id:
        cmd.append(f"--id={args.server_id}")
    if install.backend_dir:
        cmd.append(f"--backend-directory={install.backend_dir}")
    if rank == 0:
        if args.log:
            cmd.append("--log-verbose=1")
        if args.log_file:
            cmd.append(f"--log-file={args.log_file}")
    else:
        # Ranks > 0 only host their shard of the engine: no endpoints, only the engine model.
        cmd += ["--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"]
        cmd.append("--model-control-mode=explicit")
        for name in args.tensorrt_llm_model_name.split(","):
            if name.strip():
                cmd.append(f"--load-model={name.strip()}")
    return cmd


def build_command(
    args: argparse.Namespace,
    install: TritonInstall,
    *,
    unique: str | int | None = None,
    mpirun: str | None = None,
    python: str | None = None,
    llmapi_launch: str | None = None,
) -> list[str]:
    """The argv that starts Triton for ``args`` (as parsed by ``build_parser``).

    ``unique`` goes into the Python backend's shared-memory prefix (default: this process's
    pid) so that two servers on one host do not collide. For world_size > 1 the command is
    ``mpirun --allow-run-as-root --noprefix -n 1 <rank 0> : -n 1 <rank 1> ...``, each rank this
    launcher's rank mode run by ``python`` (default: this interpreter) around its tritonserver;
    ``mpirun`` defaults to the one on PATH, or the bare name when there is none.

    With ``args.trtllm_llmapi_launch`` each rank's tritonserver runs as ``trtllm-llmapi-launch
    tritonserver ...`` (``llmapi_launch``, default: ``find_llmapi_launch``), as upstream's launcher
    and NVIDIA's guides at 1.2.1 start the llmapi model: the script runs the server on rank 0 and
    TensorRT-LLM's worker node on the other ranks.
    """
    _validate(args)
    prefix: list[str] = []
    if getattr(args, "trtllm_llmapi_launch", False):
        llmapi_launch = llmapi_launch or find_llmapi_launch()
        if llmapi_launch is None:
            raise LauncherError(
                f"--trtllm_llmapi_launch: {LLMAPI_LAUNCH} not found on PATH or beside {sys.executable} "
                "(it comes with TensorRT-LLM)"
            )
        prefix = [llmapi_launch]
    unique = str(os.getpid() if unique is None else unique)
    if install.needs_staging:
        # Not staged yet (e.g. --print_command): show where a launch would stage it.
        placeholder = os.path.join(tempfile.gettempdir(), f"{STAGING_PREFIX}{unique}-XXXXXXXX", "backends")
        install = dataclasses.replace(install, backend_dir=placeholder)
    if args.world_size == 1:
        return [*prefix, *_rank_command(args, install, 0, unique)]
    # --noprefix: Open MPI treats an absolute mpirun path as --prefix and puts <prefix>/bin and
    # <prefix>/lib first on every rank's PATH and LD_LIBRARY_PATH, so the Python backend's stub
    # would find the system's python3 and libpython instead of the launcher's.
    cmd = [mpirun or shutil.which("mpirun") or "mpirun", "--allow-run-as-root", "--noprefix"]
    wrapper = [
        python or sys.executable,
        str(LAUNCHER),
        RANK_MODE,
        f"{kill_grace(args.exit_timeout_secs):g}",
        "--",
    ]
    for rank in range(args.world_size):
        if rank:
            cmd.append(":")
        cmd += ["-n", "1", *wrapper, *prefix, *_rank_command(args, install, rank, unique)]
    return cmd


def kill_grace(exit_timeout_secs: float) -> float:
    """How long a stopping tritonserver gets before SIGKILL: its exit timeout and a margin."""
    return max(MIN_KILL_GRACE_SECS, exit_timeout_secs + 5.0)


# --------------------------------------------------------------------------- supervision


def _log(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _prctl() -> Callable[..., int] | None:
    """libc's prctl (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def _become_subreaper() -> bool:
    """Make orphaned descendants (a killed server's stubs) children of this process, not init's."""
    prctl = _prctl()
    return prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _pdeathsig_preexec(parent_pid: int) -> Callable[[], None] | None:
    """A preexec_fn that makes the child receive SIGTERM when the launcher dies (Linux)."""
    prctl = _prctl()
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:  # the launcher died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _children_by_parent() -> dict[int, list[int]]:
    """Every process's children, from /proc (empty where /proc is unavailable)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return children
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = proc_stat(entry)
        if fields is not None and len(fields) >= 2:
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def proc_stat(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ... start time at index
    19), or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid ..." where comm may contain spaces and parentheses
    return stat[stat.rfind(b")") + 2 :].split()


def children(pid: int) -> list[int]:
    """The direct children of ``pid``: under mpirun, its ranks (each one's supervisor)."""
    return sorted(_children_by_parent().get(pid, []))


def descendants(pid: int) -> list[int]:
    """All descendant pids of ``pid``, nearest first. Take them before killing anything: a
    process whose parent died is re-parented and no longer found here."""
    children = _children_by_parent()
    found: list[int] = []
    queue = [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            if child not in found:
                found.append(child)
                queue.append(child)
    return found


def _kill_tree(proc: subprocess.Popen) -> None:
    victims = [proc.pid, *descendants(proc.pid)]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _reap_leftovers(grace_secs: float) -> list[int]:
    """Wait for, then SIGKILL and reap, what is left below the launcher once its child exited:
    processes re-parented here (``_become_subreaper``). ``grace_secs`` is how long they may take
    to finish on their own (ranks that mpirun left stop gracefully: their mpirun-death signal);
    a dead server's Python stubs get none. Returns the pids killed."""
    deadline = time.monotonic() + grace_secs
    while children(os.getpid()) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        time.sleep(0.05)
    leftovers = descendants(os.getpid())
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for pid in leftovers:
        with contextlib.suppress(ChildProcessError):  # not ours: reaped by its own parent
            os.waitpid(pid, 0)
    return leftovers


def is_tritonserver(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().strip() == TRITONSERVER.encode()
    except OSError:
        return False


def servers(pid: int) -> list[int]:
    """The tritonserver processes of ``pid``'s tree (``pid`` itself when it is one): under
    trtllm-llmapi-launch the server is the launch script's grandchild."""
    return [p for p in (pid, *descendants(pid)) if is_tritonserver(p)]


def stop_targets(pid: int, ranks: bool) -> list[int]:
    """Who gets the stop signal: the server, or under mpirun each rank's supervisor. Not mpirun:
    stopping, it SIGTERMs every rank and SIGKILLs it a second later, too soon for tritonserver to
    drain and unload; ranks that all exit cleanly end mpirun cleanly. Not trtllm-llmapi-launch
    either: a shell waiting for its foreground leader node, it passes nothing on; the server, once
    drained and gone, makes the script stop its leader and exit. A rank without a server (a worker
    node under the script, which would not pass it on either) gets it in every process."""
    if ranks:
        return children(pid) or [pid]
    return servers(pid) or [pid, *descendants(pid)]


def supervise(
    cmd: Sequence[str],
    env: Mapping[str, str],
    *,
    kill_grace_secs: float,
    exit_is_failure: bool = False,
    ranks: bool = False,
    watch_server: bool = False,
) -> int:
    """Run ``cmd`` as a child, forward termination signals, escalate, return its exit status.

    ``exit_is_failure``: a child that exits before it was told to stop returns 1 even when its
    own status was 0 (a rank that leaves must end its whole job). ``ranks``: the child is
    mpirun; stop signals go to its ranks (``stop_targets``). ``watch_server``: the child is a
    trtllm-llmapi-launch script, whose leader node outlives a tritonserver that died (NVIDIA's script
    stops it only after a clean exit): once a server was seen and none is left, the tree is killed
    and the exit counts as a failure.
    """
    state: dict[str, object] = {"proc": None, "pending": None, "stopping": False}

    def forward(signum: int) -> None:
        proc = state["proc"]
        if not isinstance(proc, subprocess.Popen):
            state["pending"] = signum
            return
        sig = signal.SIGTERM if signum == signal.SIGHUP or ranks else signum
        for pid in stop_targets(proc.pid, ranks):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if not state["stopping"]:
            state["stopping"] = True
            _log(
                f"received {signal.Signals(signum).name}, stopping tritonserver "
                f"(SIGKILL after {kill_grace_secs:g} s)"
            )
            signal.setitimer(signal.ITIMER_REAL, kill_grace_secs)

    def on_signal(signum: int, _frame: object) -> None:
        forward(signum)

    def on_alarm(_signum: int, _frame: object) -> None:
        proc = state["proc"]
        if isinstance(proc, subprocess.Popen) and proc.poll() is None:
            _log(f"tritonserver still running {kill_grace_secs:g} s after the stop signal: killing it")
            _kill_tree(proc)

    handled = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
    previous = {sig: signal.signal(sig, on_signal) for sig in handled}
    previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, on_alarm)
    _become_subreaper()
    try:
        try:
            proc = subprocess.Popen(list(cmd), env=dict(env), preexec_fn=_pdeathsig_preexec(os.getpid()))
        except OSError as exc:
            raise LauncherError(f"cannot start {cmd[0]}: {exc.strerror or exc}") from exc
        state["proc"] = proc
        pending = state["pending"]
        if isinstance(pending, int):
            forward(pending)  # a signal arrived while the child was starting
        returncode = _wait_watching(proc, state) if watch_server else proc.wait()
        # mpirun's ranks stop on their own once it is gone; a trtllm-llmapi-launch script may exit
        # while its background subshell is still ending (the leader's stop request); a plain
        # server's leftovers are a dead server's Python stubs, which get no grace
        grace = kill_grace_secs + 2.0 if ranks else LAUNCH_SUBSHELL_GRACE_SECS if watch_server else 0.0
        leftovers = _reap_leftovers(grace)
        if leftovers:
            _log(
                f"killed {len(leftovers)} process(es) left behind by {os.path.basename(cmd[0])}: {leftovers}"
            )
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if returncode < 0:
        returncode = 128 - returncode
    if exit_is_failure and not state["stopping"]:
        _log(f"{os.path.basename(cmd[0])} (pid {proc.pid}) exited unasked with status {returncode}")
        return returncode or 1
    return returncode


def _wait_watching(proc: subprocess.Popen, state: dict[str, object], poll_secs: float = 0.5) -> int:
    """``proc.wait()``, but a tree whose tritonserver is gone (unasked) is killed: status 1."""
    seen = False
    while True:
        try:
            return proc.wait(timeout=poll_secs)
        except subprocess.TimeoutExpired:
            pass
        alive = bool(servers(proc.pid))
        seen = seen or alive
        if seen and not alive and not state["stopping"] and proc.poll() is None:
            _log(f"tritonserver exited under {LLMAPI_LAUNCH}; stopping the rest of its tree")
            state["stopping"] = True  # a stop of ours, yet a failure: the server went unasked
            _kill_tree(proc)
            proc.wait()
            return 1


def supervise_holding_sigterm(argv: Sequence[str]) -> int:
    """``GRACE_SECS -- COMMAND ...`` (a trtllm-llmapi-launch tree), supervised with SIGTERM blocked.

    As ``exec_holding_sigterm`` for a plain tritonserver, only the owner's SIGINT (or its death
    signal, set before exec) stops Triton; unlike it, this process stays: the script in between
    would pass no signal on, and would keep its leader node alive after the server died.
    """
    if len(argv) < 3 or argv[1] != "--":
        raise LauncherError(f"usage: {SUPERVISE_HOLDING_SIGTERM_MODE} GRACE_SECS -- COMMAND ...")
    try:
        grace = float(argv[0])
    except ValueError:
        raise LauncherError(
            f"{SUPERVISE_HOLDING_SIGTERM_MODE}: grace {argv[0]!r} is not a number of seconds"
        ) from None
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    return supervise(argv[2:], os.environ, kill_grace_secs=grace, watch_server=True)


def supervise_rank(argv: Sequence[str]) -> int:
    """The rank mode: ``GRACE_SECS -- tritonserver ...``, run by mpirun for each rank."""
    if len(argv) < 3 or argv[1] != "--":
        raise LauncherError(f"usage: {RANK_MODE} GRACE_SECS -- tritonserver ...")
    try:
        grace = float(argv[0])
    except ValueError:
        raise LauncherError(f"{RANK_MODE}: grace {argv[0]!r} is not a number of seconds") from None
    # The service execs mpirun with SIGTERM blocked (HOLD_SIGTERM_MODE) and a mask is inherited:
    # a rank takes SIGTERM again, from its own death signal or a stop.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    die_with_mpirun = _pdeathsig_preexec(os.getppid())
    if die_with_mpirun is not None:
        die_with_mpirun()  # on ourselves: SIGTERM when mpirun dies, handled as any stop
    watch = any(os.path.basename(part) == LLMAPI_LAUNCH for part in argv[2:3])
    return supervise(argv[2:], os.environ, kill_grace_secs=grace, exit_is_failure=True, watch_server=watch)


def exec_holding_sigterm(argv: Sequence[str]) -> int:
    """``-- COMMAND ...``: execs COMMAND with SIGTERM blocked.

    The mask survives exec and the handlers tritonserver installs, which a disposition would not;
    a parent's own preexec hook cannot set it, as uvloop's spawn (libuv) clears the mask just
    before exec. BentoML's process manager SIGTERMs a worker's children when it stops the worker;
    the service stops Triton itself, after its drain, with SIGINT.
    """
    if len(argv) < 2 or argv[0] != "--":
        raise LauncherError(f"usage: {HOLD_SIGTERM_MODE} -- COMMAND ...")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        os.execv(argv[1], list(argv[1:]))
    except OSError as exc:
        raise LauncherError(f"cannot start {argv[1]}: {exc.strerror or exc}") from exc
    return 0  # not reached


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == [RANK_MODE]:
            return supervise_rank(argv[1:])
        if argv[:1] == [HOLD_SIGTERM_MODE]:
            return exec_holding_sigterm(argv[1:])
        if argv[:1] == [SUPERVISE_HOLDING_SIGTERM_MODE]:
            return supervise_holding_sigterm(argv[1:])
        args = build_parser().parse_args(argv)
        _validate(args)
        try:
            install = find_tritonserver(args.tritonserver)
        except LauncherError as exc:
            if not args.print_command:
                raise
            # Showing a command for another machine: fall back to the path given, or upstream's.
            _log(f"warning: {exc}")
            install = TritonInstall(binary=args.tritonserver or OPT_TRITONSERVER, source="assumed")
        if args.print_command:
            print(shlex.join(build_command(args, install)))
            return 0
        if not os.path.isdir(args.model_repo):
            raise LauncherError(f"--model_repo {args.model_repo!r} is not a directory")
        mpirun = None
        if args.world_size > 1:
            mpirun = shutil.which("mpirun")
            if mpirun is None:
                raise LauncherError(f"--world_size {args.world_size} needs mpirun, which is not on PATH")
        with staged(install) as ready:
            cmd = build_command(args, ready, mpirun=mpirun)
            _log(f"tritonserver from {ready.source}: {shlex.join(cmd)}")
            return supervise(
                cmd,
                ready.child_env(),
                kill_grace_secs=kill_grace(args.exit_timeout_secs),
                ranks=args.world_size > 1,
                watch_server=args.trtllm_llmapi_launch and args.world_size == 1,
            )
    except LauncherError as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
