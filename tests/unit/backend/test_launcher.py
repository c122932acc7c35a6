"""launch_triton_server: discovery order and the command lines it builds (nothing is started)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tensorrtllm_backend import LAUNCHER
from tensorrtllm_backend import launcher as lts
from tensorrtllm_backend.launcher import (
    LauncherError,
    TritonInstall,
    build_command,
    build_parser,
    find_tritonserver,
    stage_backends,
)

pytestmark = pytest.mark.unit

PLAIN = TritonInstall(binary="/opt/tritonserver/bin/tritonserver", source="test")


def parse(*argv: str):
    return build_parser().parse_args(["--model_repo", "/models", *argv])


def fake_exe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def fake_pytriton(site: Path) -> Path:
    """The nvidia-pytriton layout under ``site`` (a fake site-packages)."""
    root = site / "pytriton" / "tritonserver"
    binary = fake_exe(root / "bin" / "tritonserver")
    (root / "backends" / "python").mkdir(parents=True)
    (root / "backends" / "python" / "libtriton_python.so").write_bytes(b"\x7fELF")
    (root / "backends" / "python" / "triton_python_backend_utils.py").write_text("# utils\n")
    (root / "backends" / "python" / "__pycache__").mkdir()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    fake_exe(root / "python_backend_stubs" / version / "triton_python_backend_stub")
    (site / "nvidia_pytriton.libs").mkdir()
    return binary


@pytest.fixture
def no_fallbacks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """No /opt install and no nvidia-pytriton, whatever this machine has."""
    monkeypatch.setattr(lts, "OPT_TRITONSERVER", str(tmp_path / "no-opt" / "tritonserver"))
    monkeypatch.setattr(lts, "_pytriton_binary", lambda: None)


def flag_values(cmd: list[str], flag: str) -> list[str]:
    prefix = flag + "="
    return [a[len(prefix) :] for a in cmd if a.startswith(prefix)]


# --------------------------------------------------------------------------- single rank


def test_defaults_single_rank():
    cmd = build_command(parse(), PLAIN, unique=4242)
    assert cmd[0] == PLAIN.binary
    assert flag_values(cmd, "--model-repository") == ["/models"]
    assert flag_values(cmd, "--grpc-port") == ["8001"]
    assert flag_values(cmd, "--http-port") == ["8000"]
    assert flag_values(cmd, "--metrics-port") == ["8002"]
    for flag in ("--grpc-address", "--http-address", "--metrics-address"):
        assert flag_values(cmd, flag) == ["127.0.0.1"]
    assert "--disable-auto-complete-config" in cmd
    assert flag_values(cmd, "--backend-config") == ["python,shm-region-prefix-name=prefix0_4242_"]
    assert flag_values(cmd, "--exit-timeout-secs") == ["10"]
    assert not any(
        a.startswith(("--log", "--model-control-mode", "--load-model", "--backend-directory")) for a in cmd
    )
    assert "mpirun" not in cmd


def test_ports_host_exit_timeout():
    args = parse(
        "--grpc_port", "9001", "--http_port", "9000", "--metrics_port", "9002",
        "--host", "0.0.0.0", "--exit_timeout_secs", "3",
    )  # fmt: skip
    cmd = build_command(args, PLAIN, unique=1)
    assert flag_values(cmd, "--grpc-port") == ["9001"]
    assert flag_values(cmd, "--http-port") == ["9000"]
    assert flag_values(cmd, "--metrics-port") == ["9002"]
    for flag in ("--grpc-address", "--http-address", "--metrics-address"):
        assert flag_values(cmd, flag) == ["0.0.0.0"]
    assert flag_values(cmd, "--exit-timeout-secs") == ["3"]


def test_server_id_is_triton_id_and_absent_by_default():
    assert flag_values(build_command(parse("--server_id", "svc-12-ab"), PLAIN, unique=1), "--id") == [
        "svc-12-ab"
    ]
    assert not any(a.startswith("--id") for a in build_command(parse(), PLAIN, unique=1))


def test_model_repo_made_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["--model_repo", "repo"])
    assert flag_values(build_command(args, PLAIN), "--model-repository") == [str(tmp_path / "repo")]


def test_unique_defaults_to_pid():
    cmd = build_command(parse(), PLAIN)
    assert flag_values(cmd, "--backend-config") == [f"python,shm-region-prefix-name=prefix0_{os.getpid()}_"]


def test_log_flags():
    cmd = build_command(parse("--log", "--log-file", "/var/log/triton.log"), PLAIN, unique=1)
    assert "--log-verbose=1" in cmd
    assert flag_values(cmd, "--log-file") == ["/var/log/triton.log"]
    cmd = build_command(parse("--log_file", "/x.log"), PLAIN, unique=1)
    assert flag_values(cmd, "--log-file") == ["/x.log"]
    assert "--log-verbose=1" not in cmd


def test_backend_directory_passed():
    install = TritonInstall(binary="/t/bin/tritonserver", backend_dir="/t/backends", source="test")
    assert flag_values(build_command(parse(), install, unique=1), "--backend-directory") == ["/t/backends"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--world_size", "0"],
        ["--grpc_port", "0"],
        ["--http_port", "70000"],
        ["--exit_timeout_secs", "-1"],
        ["--server_id", ""],
        ["--server_id", "two words"],
    ],
)
def test_invalid_values(argv: list[str]):
    with pytest.raises(LauncherError):
        build_command(parse(*argv), PLAIN)


# --------------------------------------------------------------------------- world_size > 1


def split_ranks(cmd: list[str]) -> list[list[str]]:
    """Each rank's tritonserver argv, checking what wraps it: one process, run by the launcher's
    rank mode with the grace that the server's exit timeout needs."""
    # --noprefix: an absolute mpirun path must not put <prefix>/bin and /lib first on the ranks'
    # PATH and LD_LIBRARY_PATH (the stub would embed the system's Python).
    assert cmd[1:3] == ["--allow-run-as-root", "--noprefix"]
    ranks, current = [], []
    for arg in cmd[3:]:
        if arg == ":":
            ranks.append(current)
            current = []
        else:
            current.append(arg)
    ranks.append(current)
    for rank in ranks:
        assert rank[:2] == ["-n", "1"]
        assert rank[2:4] == [sys.executable, str(LAUNCHER)]
        assert rank[4] == "--supervise_rank" and float(rank[5]) >= 15 and rank[6] == "--"
    return [rank[7:] for rank in ranks]


def test_world_size_two_via_mpirun():
    args = parse("--world_size", "2", "--log", "--log-file", "/l.log", "--grpc_port", "7001")
    cmd = build_command(args, PLAIN, unique=77, mpirun="/usr/bin/mpirun")
    assert cmd[0] == "/usr/bin/mpirun"
    rank0, rank1 = split_ranks(cmd)
    assert rank0[0] == rank1[0] == PLAIN.binary
    assert flag_values(rank0, "--backend-config") == ["python,shm-region-prefix-name=prefix0_77_"]
    assert flag_values(rank1, "--backend-config") == ["python,shm-region-prefix-name=prefix1_77_"]
    for rank in (rank0, rank1):
        assert flag_values(rank, "--model-repository") == ["/models"]
        assert "--disable-auto-complete-config" in rank
        assert flag_values(rank, "--grpc-port") == ["7001"]
    # rank 0 serves and logs; rank 1 loads only the engine model and opens no endpoints
    assert "--log-verbose=1" in rank0 and flag_values(rank0, "--log-file") == ["/l.log"]
    assert not any(a.startswith(("--model-control-mode", "--load-model", "--allow-")) for a in rank0)
    assert "--model-control-mode=explicit" in rank1
    assert flag_values(rank1, "--load-model") == ["tensorrt_llm"]
    assert {"--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"} <= set(rank1)
    assert not any(a.startswith("--log") for a in rank1)


def test_world_size_four_custom_model_names():
    args = parse("--world_size", "4", "--tensorrt_llm_model_name", "tensorrt_llm,tensorrt_llm_draft")
    ranks = split_ranks(build_command(args, PLAIN, unique=5, mpirun="mpirun"))
    assert len(ranks) == 4
    for i, rank in enumerate(ranks):
        assert flag_values(rank, "--backend-config") == [f"python,shm-region-prefix-name=prefix{i}_5_"]
        if i:
            assert flag_values(rank, "--load-model") == ["tensorrt_llm", "tensorrt_llm_draft"]


def test_mpirun_defaults_to_bare_name_without_mpirun(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("PATH", str(tmp_path))
    cmd = build_command(parse("--world_size", "2"), PLAIN, unique=1)
    assert cmd[0] == "mpirun"


# --------------------------------------------------------------------------- discovery


def test_discovery_explicit_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_fallbacks):
    explicit = fake_exe(tmp_path / "explicit" / "bin" / "tritonserver")
    from_env = fake_exe(tmp_path / "env" / "bin" / "tritonserver")
    on_path = fake_exe(tmp_path / "path" / "bin" / "tritonserver")
    monkeypatch.setenv("TRITONSERVER", str(from_env))
    monkeypatch.setenv("PATH", str(on_path.parent))
    install = find_tritonserver(str(explicit))
    assert (install.binary, install.source) == (str(explicit), "--tritonserver")


def test_discovery_env_before_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_fallbacks):
    from_env = fake_exe(tmp_path / "env" / "bin" / "tritonserver")
    on_path = fake_exe(tmp_path / "path" / "bin" / "tritonserver")
    monkeypatch.setenv("TRITONSERVER", str(from_env))
    monkeypatch.setenv("PATH", str(on_path.parent))
    install = find_tritonserver()
    assert (install.binary, install.source) == (str(from_env), "$TRITONSERVER")


def test_discovery_path_before_opt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_fallbacks):
    on_path = fake_exe(tmp_path / "path" / "bin" / "tritonserver")
    opt = fake_exe(tmp_path / "opt" / "bin" / "tritonserver")
    monkeypatch.setattr(lts, "OPT_TRITONSERVER", str(opt))
    monkeypatch.delenv("TRITONSERVER", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path / 'empty'}{os.pathsep}{on_path.parent}")
    install = find_tritonserver()
    assert (install.binary, install.source) == (str(on_path), "PATH")


def test_discovery_opt_before_pytriton(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    opt = fake_exe(tmp_path / "opt" / "bin" / "tritonserver")
    (tmp_path / "opt" / "backends").mkdir()
    bundled = fake_pytriton(tmp_path / "site")
    monkeypatch.setattr(lts, "OPT_TRITONSERVER", str(opt))
    monkeypatch.setattr(lts, "_pytriton_binary", lambda: bundled)
    monkeypatch.delenv("TRITONSERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    install = find_tritonserver()
    assert (install.binary, install.source) == (str(opt), "/opt/tritonserver")
    assert install.backend_dir == str(tmp_path / "opt" / "backends")
    assert install.env == {} and not install.needs_staging


def test_discovery_pytriton_last(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    bundled = fake_pytriton(tmp_path / "site")
    monkeypatch.setattr(lts, "OPT_TRITONSERVER", str(tmp_path / "no-opt"))
    monkeypatch.setattr(lts, "_pytriton_binary", lambda: bundled)
    monkeypatch.delenv("TRITONSERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/existing/lib")
    install = find_tritonserver()
    assert (install.binary, install.source) == (str(bundled), "nvidia-pytriton")
    assert install.needs_staging and install.backend_dir is None
    ld = install.env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert ld == [
        sysconfig.get_config_var("LIBDIR"),
        str(tmp_path / "site" / "nvidia_pytriton.libs"),
        "/existing/lib",
    ]
    assert install.env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    child = install.child_env({"HOME": "/h"})
    assert child["HOME"] == "/h" and child["LD_LIBRARY_PATH"] == install.env["LD_LIBRARY_PATH"]


def test_triton_python_picks_the_stub_and_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    # TRITON_PYTHON: the models run under another Python than the launcher's (a venv's python3):
    # its version picks the stub, its bin/ goes first on PATH, its libpython first on LD_LIBRARY_PATH.
    bundled = fake_pytriton(tmp_path / "site")
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    python = venv / "python3"
    python.write_text("#!/bin/sh\necho 3.12; echo /opt/py312/lib\n")
    python.chmod(0o755)
    monkeypatch.setenv("TRITON_PYTHON", str(python))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/existing/lib")
    install = find_tritonserver(str(bundled))
    assert install.python_stub is not None and Path(install.python_stub).parent.name == "3.12"
    assert install.env["PATH"].split(os.pathsep)[0] == str(venv)
    assert install.env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == "/opt/py312/lib"
    monkeypatch.setenv("TRITON_PYTHON", str(tmp_path / "nope"))
    with pytest.raises(LauncherError, match="TRITON_PYTHON"):
        find_tritonserver(str(bundled))
    alone = tmp_path / "alone" / "python3.12"
    alone.parent.mkdir()
    alone.write_bytes(python.read_bytes())
    alone.chmod(0o755)
    monkeypatch.setenv("TRITON_PYTHON", str(alone))
    with pytest.raises(LauncherError, match="no python3 beside it"):
        find_tritonserver(str(bundled))


def test_discovery_pytriton_layout_recognised_when_explicit(tmp_path: Path):
    bundled = fake_pytriton(tmp_path / "site")
    install = find_tritonserver(str(bundled))
    assert install.source == "--tritonserver" and install.needs_staging


def test_real_pytriton_is_found_by_import_spec():
    binary = lts._pytriton_binary()
    if binary is None:
        pytest.skip("nvidia-pytriton not installed")
    assert binary.parts[-4:] == ("pytriton", "tritonserver", "bin", "tritonserver")


def test_explicit_missing_is_error(tmp_path: Path):
    with pytest.raises(LauncherError, match="does not exist"):
        find_tritonserver(str(tmp_path / "nope" / "tritonserver"))


def test_env_missing_is_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("TRITONSERVER", str(tmp_path / "nope"))
    with pytest.raises(LauncherError, match=r"\$TRITONSERVER"):
        find_tritonserver()


def test_explicit_bare_name_uses_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    exe = fake_exe(tmp_path / "bin" / "my-triton")
    monkeypatch.setenv("PATH", str(exe.parent))
    assert find_tritonserver("my-triton").binary == str(exe)


def test_none_found_says_what_was_tried(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_fallbacks):
    monkeypatch.delenv("TRITONSERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(LauncherError) as info:
        find_tritonserver()
    msg = str(info.value)
    for tried in ("--tritonserver", "$TRITONSERVER", "PATH", "no-opt", "nvidia-pytriton"):
        assert tried in msg


# --------------------------------------------------------------------------- staging


def test_stage_backends(tmp_path: Path):
    bundled = fake_pytriton(tmp_path / "site")
    install = find_tritonserver(str(bundled))
    ready = stage_backends(install, tmp_path / "work")
    python_dir = tmp_path / "work" / "backends" / "python"
    assert ready.backend_dir == str(tmp_path / "work" / "backends")
    assert not ready.needs_staging
    assert (python_dir / "libtriton_python.so").is_symlink()
    assert (python_dir / "triton_python_backend_utils.py").is_symlink()
    stub = python_dir / "triton_python_backend_stub"
    assert stub.is_file() and not stub.is_symlink() and os.access(stub, os.X_OK)
    assert not (python_dir / "__pycache__").exists()
    cmd = build_command(parse(), ready, unique=1)
    assert flag_values(cmd, "--backend-directory") == [ready.backend_dir]


def test_stage_missing_stub_is_error(tmp_path: Path):
    bundled = fake_pytriton(tmp_path / "site")
    install = find_tritonserver(str(bundled))
    Path(install.python_stub).unlink()
    with pytest.raises(LauncherError, match="no Python backend stub"):
        stage_backends(install, tmp_path / "work")


def test_staged_context_removes_dir(tmp_path: Path):
    install = find_tritonserver(str(fake_pytriton(tmp_path / "site")))
    with lts.staged(install) as ready:
        work = Path(ready.backend_dir).parent
        assert work.name.startswith(f"triton-launch-{os.getpid()}-")
        assert (work / "backends" / "python" / "triton_python_backend_stub").is_file()
    assert not work.exists()


def test_sweep_removes_dirs_of_dead_launchers(tmp_path: Path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"triton-launch-{dead.pid}-abc" / "backends").mkdir(parents=True)
    (tmp_path / f"triton-launch-{os.getpid()}-mine").mkdir()
    (tmp_path / f"triton-launch-{os.getppid()}-alive").mkdir()
    (tmp_path / "unrelated-1-x").mkdir()
    lts._sweep_stale_staging(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"triton-launch-{os.getpid()}-mine", f"triton-launch-{os.getppid()}-alive", "unrelated-1-x"]
    )


# --------------------------------------------------------------------------- CLI (as a plain script)


def run_launcher(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LAUNCHER), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd="/",  # run by path from elsewhere, as users and mpirun's ranks run it
        check=False,
    )


def test_the_script_imports_its_own_tree_without_pythonpath():
    """The entry point puts the tree that holds it first on sys.path: nothing else need be set."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    proc = run_launcher("--help", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: launch_triton_server ") and "--model_repo" in proc.stdout


def test_print_command_is_one_quoted_line(tmp_path: Path):
    exe = fake_exe(tmp_path / "my dir" / "bin" / "tritonserver")
    proc = run_launcher(
        "--model_repo", str(tmp_path / "repo x"), "--tritonserver", str(exe), "--print_command"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1
    argv = shlex.split(proc.stdout)
    assert argv[0] == str(exe)
    assert f"--model-repository={tmp_path / 'repo x'}" in argv


def test_print_command_world_size_two_without_mpirun(tmp_path: Path):
    env = dict(os.environ, PATH=str(tmp_path / "empty"))
    proc = run_launcher(
        "--model_repo", "/m", "--world_size", "2", "--tritonserver", "/opt/tritonserver/bin/tritonserver",
        "--print_command",
        env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout)
    assert argv[:2] == ["mpirun", "--allow-run-as-root"]
    assert argv.count(":") == 1
    assert "--load-model=tensorrt_llm" in argv


def test_cli_explicit_missing_one_line_exit_2(tmp_path: Path):
    proc = run_launcher("--model_repo", str(tmp_path), "--tritonserver", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch_triton_server: error: ")
    assert "does not exist" in lines[0]


def test_cli_usage_error_one_line():
    proc = run_launcher("--world_size", "2")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "launch_triton_server: error: the following arguments are required: --model_repo"
    ]


def test_cli_missing_model_repo_dir(tmp_path: Path):
    exe = fake_exe(tmp_path / "bin" / "tritonserver")
    proc = run_launcher("--model_repo", str(tmp_path / "nope"), "--tritonserver", str(exe))
    assert proc.returncode == 2
    assert "is not a directory" in proc.stderr


def test_cli_world_size_two_needs_mpirun(tmp_path: Path):
    exe = fake_exe(tmp_path / "bin" / "tritonserver")
    env = dict(os.environ, PATH=str(tmp_path / "empty"))
    proc = run_launcher(
        "--model_repo", str(tmp_path), "--tritonserver", str(exe), "--world_size", "2", env=env
    )
    assert proc.returncode == 2
    assert "mpirun" in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_exit_status_of_child_is_returned(tmp_path: Path):
    """With a fake tritonserver that exits 3, the launcher exits 3 (and sees all its flags)."""
    exe = tmp_path / "bin" / "tritonserver"
    exe.parent.mkdir()
    exe.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\nexit 3\n')
    exe.chmod(0o755)
    proc = run_launcher("--model_repo", str(tmp_path), "--tritonserver", str(exe), "--grpc_port", "1234")
    assert proc.returncode == 3, proc.stderr
    assert "--grpc-port=1234" in (tmp_path / "args").read_text()


def test_print_command_tolerates_a_path_of_another_machine(tmp_path: Path):
    """--print_command shows a launch for elsewhere: a missing --tritonserver is printed as given."""
    proc = run_launcher(
        "--model_repo", "/m", "--tritonserver", "/opt/tritonserver/bin/tritonserver", "--print_command"
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert shlex.split(proc.stdout)[0] == "/opt/tritonserver/bin/tritonserver"
    if not Path("/opt/tritonserver/bin/tritonserver").exists():
        assert proc.stderr.startswith("launch_triton_server: warning: ")


def test_print_command_with_pytriton_shows_staging_dir(tmp_path: Path):
    exe = fake_pytriton(tmp_path / "site")
    proc = run_launcher("--model_repo", "/m", "--tritonserver", str(exe), "--print_command")
    assert proc.returncode == 0, proc.stderr
    (backend_dir,) = flag_values(shlex.split(proc.stdout), "--backend-directory")
    assert "triton-launch-" in backend_dir and backend_dir.endswith("/backends")
    assert not Path(backend_dir).exists()  # printing stages nothing
