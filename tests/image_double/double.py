"""A local double of NVIDIA's 26.07 trtllm image, built with podman, for testing the bento as an image.

No registry is reachable here, so the double is made from Debian's packages (mmdebstrap) and tagged
with the pinned image's name (tensorrtllm_backend/pinned.py: IMAGE) in a podman store of its own;
`bentoml containerize --backend podman` then builds the bento FROM it as it would FROM NVIDIA's.

What it models (NVIDIA's 2026 trtllm images, REFERENCE.md section 10):
- the image's Python is the virtual environment /opt/venv-tritonserver, first on PATH after
  /opt/tritonserver/bin; a venv made from its interpreter sees Debian's base Python, not it;
- openai 1.107.3 (the image's), too old for `tensorrt_llm.serve`;
- a `tensorrt_llm` 1.2.1 distribution whose metadata is 1.2.1's real Requires-Dist, whose LLM imports
  `tensorrt_llm.serve` while it loads a model and cannot spawn its worker unless the process was
  started by `trtllm-llmapi-launch` (in the venv's bin/, as the wheel installs it);
- tritonserver at /opt/tritonserver/bin (the real Triton 2.51 of nvidia-pytriton: CPU only).

Where it cannot be faithful: its Python is Debian bookworm's 3.11.2, not 3.12.3 (no Debian suite
ships 3.12; a CPython 3.12 of this machine's, pyenv's, sits beside it as `python3.12` on PATH, so
that BentoML's build finds the image's Python version, `pinned.IMAGE_PYTHON`, as in NVIDIA's image); torch is PyTorch 2.13.0's CPU wheel labelled 2.10.0a0 (the image's version, so pin checks
see the image's state); the double's LLM serves through our stand-in over the synthetic engine (no
model, no GPU); there is no C++ `tensorrtllm` backend, so the legacy flavour runs its Python-backend
engine.

Build: `python -m tests.image_double.double` (prints the image name); tests use `ensure_double()`;
`eval "$(python -m tests.image_double.double --env)"` sets podman up by hand for the same store.
Images are cached in the store by a hash of their inputs, so a second build costs seconds.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tensorrtllm_backend import pinned

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
ROOT = Path(os.environ.get("TRTLLM_DOUBLE_ROOT", "/var/tmp/trtllm-image-double"))
"""The podman store, its configuration and scratch space (outside the checkout: images are large)."""

DEBIAN_PACKAGES = (
    "python3",
    "python3-venv",
    "python3-pip",
    "python-is-python3",
    "libpython3.11",  # the Python backend stub links it
    "ca-certificates",
    # What BentoML's generated Dockerfile apt-get installs: here already, so its step installs nothing.
    "gnupg2",
    "bash",
    "build-essential",
    "git",
)
IMAGE_OPENAI = "openai==1.107.3"
"""The openai of NVIDIA's 26.07 image (too old for tensorrt_llm.serve: no PartReasoningText)."""

IMAGE_PACKAGES = (
    # TensorRT-LLM 1.2.1's pins for what the service also uses (constraints/tensorrt_llm-1.2.1.txt),
    # at versions the image may carry, and what the Python models import.
    "numpy==1.26.4",
    "transformers==4.57.3",
    "tokenizers==0.22.2",
    "pydantic==2.12.5",
    "fastapi==0.121.3",
    "starlette==0.50.0",
    "llguidance==0.7.29",
    "pyyaml",
    "setuptools<80",  # TensorRT-LLM's pin (torch's install takes a newer one)
    IMAGE_OPENAI,
)
DOUBLE_EXTRAS = {
    # Requires-Dist lines with the extras the constraints file had to drop (it says which).
    "nvidia-modelopt": "nvidia-modelopt[torch]",
    "pydantic-settings": "pydantic-settings[yaml]",
}


class DoubleError(RuntimeError):
    """The double could not be built or run: the message says which step and shows its output."""


def podman_env() -> dict[str, str]:
    """The environment for podman here (REFERENCE.md section 11): runc, a store under ROOT, ulimits
    within what the sandbox allows."""
    for sub in ("storage", "run", "tmp"):
        (ROOT / sub).mkdir(parents=True, exist_ok=True)
    storage = ROOT / "storage.conf"
    storage.write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{ROOT / "storage"}"\nrunroot = "{ROOT / "run"}"\n'
    )
    containers = ROOT / "containers.conf"
    containers.write_text(
        '[engine]\nruntime = "runc"\n[containers]\n'
        'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
    )
    return {
        **os.environ,
        "CONTAINERS_STORAGE_CONF": str(storage),
        "CONTAINERS_CONF": str(containers),
        "TMPDIR": str(ROOT / "tmp"),
    }


def run(cmd: list[str], *, env: dict[str, str], timeout: float = 900, cwd: Path | None = None) -> str:
    """Runs a build step; a failure raises DoubleError with the step's last output."""
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-4000:]
        raise DoubleError(f"{' '.join(cmd[:3])} ... exited {done.returncode}:\n{tail}")
    return done.stdout


def image_exists(name: str, env: dict[str, str]) -> bool:
    return subprocess.run(["podman", "image", "exists", name], env=env, check=False).returncode == 0


def _hash(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def _tree_bytes(root: Path) -> bytes:
    return b"".join(
        p.relative_to(root).as_posix().encode() + p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    )


def ensure_base(env: dict[str, str]) -> str:
    """Debian bookworm (minbase) with Python and this machine's CA certificates (the registries' TLS
    is re-signed by a local CA), imported as an image."""
    name = f"localhost/trtllm-double-base:{_hash(' '.join(DEBIAN_PACKAGES).encode(), _local_cas())}"
    if image_exists(name, env):
        return name
    with tempfile.TemporaryDirectory(dir=ROOT / "tmp") as scratch:
        rootfs = Path(scratch) / "rootfs.tar"
        cas = Path(scratch) / "cas"
        cas.mkdir()
        for cert in _local_ca_files():
            shutil.copy(cert, cas / cert.name)
        run(
            [
                "mmdebstrap",
                "--variant=minbase",
                f"--include={','.join(DEBIAN_PACKAGES)}",
                f"--customize-hook=copy-in {' '.join(str(p) for p in sorted(cas.iterdir()))} "
                "/usr/local/share/ca-certificates/"
                if any(cas.iterdir())
                else "--customize-hook=true",
                '--customize-hook=chroot "$1" update-ca-certificates',
                '--customize-hook=rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
                "bookworm",
                str(rootfs),
            ],
            env=env,
        )
        run(["podman", "import", str(rootfs), name], env=env)
    return name


def _local_ca_files() -> list[Path]:
    folder = Path("/usr/local/share/ca-certificates")
    return sorted(p for p in folder.glob("*.crt") if p.is_file()) if folder.is_dir() else []


def _local_cas() -> bytes:
    return b"".join(p.read_bytes() for p in _local_ca_files())


def write_wheel(
    folder: Path, name: str, version: str, source: Path, requires: list[str], scripts: Path | None
) -> Path:
    """A wheel of the package tree `source` (importable as source.name) with the given metadata:
    enough for pip, importlib.metadata and `pip check` to see it as that distribution."""
    dist = f"{name.replace('-', '_')}-{version}"
    wheel = folder / f"{dist}-py3-none-any.whl"
    files: dict[str, bytes] = {}
    for path in sorted(source.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            files[f"{source.name}/{path.relative_to(source).as_posix()}"] = path.read_bytes()
    if scripts is not None:
        for path in sorted(scripts.iterdir()):
            files[f"{dist}.data/scripts/{path.name}"] = path.read_bytes()
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {line}" for line in requires]
    files[f"{dist}.dist-info/METADATA"] = ("\n".join(metadata) + "\n").encode()
    files[f"{dist}.dist-info/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: trtllm-double\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for member, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{member},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(wheel, "w") as archive:
        for member, data in files.items():
            info = zipfile.ZipInfo(member, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o100755 if "/scripts/" in member else 0o100644) << 16
            archive.writestr(info, data)
    return wheel


def tensorrt_llm_requires() -> list[str]:
    """1.2.1's Requires-Dist, from constraints/tensorrt_llm-1.2.1.txt with the two extras restored."""
    lines = []
    for raw in (REPO_ROOT / pinned.CONSTRAINTS_FILE).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name = line.split(";")[0]
        for char in "<>=!~ ":
            name = name.split(char)[0]
        extra = DOUBLE_EXTRAS.get(name)
        lines.append(extra + line[len(name) :] if extra else line)
    return lines


def _stage(context: Path) -> None:
    """The build context: Containerfile, Triton from nvidia-pytriton, the two wheels, the pins."""
    shutil.copy(HERE / "Containerfile", context / "Containerfile")
    import pytriton

    tritonserver = Path(pytriton.__file__).parent / "tritonserver"
    libs = tritonserver.parent.parent / "nvidia_pytriton.libs"
    target = context / "tritonserver"
    shutil.copytree(tritonserver / "bin", target / "bin", symlinks=True)
    shutil.copytree(tritonserver / "backends", target / "backends", symlinks=True)
    shutil.copytree(libs, target / "lib", symlinks=True)
    python = "3.11"  # Debian bookworm's, the double's Python (see the module docstring)
    shutil.copy(
        tritonserver / "python_backend_stubs" / python / "triton_python_backend_stub",
        target / "backends" / "python" / "triton_python_backend_stub",
    )
    wheels = context / "wheels"
    wheels.mkdir()
    write_wheel(
        wheels,
        "tensorrt_llm",
        pinned.TENSORRT_LLM_VERSION,
        HERE / "dists" / "tensorrt_llm" / "tensorrt_llm",
        tensorrt_llm_requires(),
        HERE / "bin",
    )
    (context / "torch").mkdir()
    shutil.copy(torch_wheel(), context / "torch")
    shutil.copy(HERE / "relabel_dist.py", context / "torch")
    (context / "image-requirements.txt").write_text("\n".join(IMAGE_PACKAGES) + "\n")
    # its prefix is built into it (rpath): it goes to the same path in the double
    shutil.copytree(
        python312(),
        context / "python3.12",
        symlinks=True,
        ignore=shutil.ignore_patterns("test", "tests", "site-packages", "__pycache__", "idlelib", "tkinter"),
    )


TORCH_WHEELS = Path("/opt/wheels")
"""Where this kind of machine keeps PyTorch's CPU wheel (2.13.0, CPython 3.11: the double's Python)."""


def torch_wheel() -> Path:
    found = sorted(TORCH_WHEELS.glob("torch-2.13.0+cpu-cp311-*.whl"))
    if not found:
        raise DoubleError(f"no torch 2.13.0 CPU wheel for CPython 3.11 in {TORCH_WHEELS}")
    return found[-1]


def python312() -> Path:
    """The prefix of a CPython 3.12 built on this machine (pyenv's, or a `python3.12` on PATH): the
    double's `python3.12`, which BentoML's build makes its (then replaced) venv from."""
    candidates = sorted(Path.home().glob(".pyenv/versions/3.12.*/bin/python3.12"))
    found = shutil.which("python3.12")
    for binary in [*candidates, *([Path(found)] if found else [])]:
        done = subprocess.run(
            [str(binary), "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, check=False
        )
        prefix = Path(done.stdout.strip())
        if done.returncode == 0 and (prefix / "lib" / "python3.12").is_dir():
            return prefix
    raise DoubleError(
        "no CPython 3.12 on this machine (pyenv's or python3.12 on PATH) for the double's python3.12"
    )


def ensure_double(env: dict[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """The double, tagged as the pinned image; built when its inputs changed. Returns (name, env).
    One process at a time (pytest-xdist's workers): the others wait for its build."""
    env = env or podman_env()
    with open(ROOT / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_double(env)


def _ensure_double(env: dict[str, str]) -> tuple[str, dict[str, str]]:
    base = ensure_base(env)
    inputs = _hash(
        base.encode(),
        (HERE / "Containerfile").read_bytes(),
        _tree_bytes(HERE / "dists" / "tensorrt_llm" / "tensorrt_llm"),
        torch_wheel().name.encode(),
        (HERE / "relabel_dist.py").read_bytes(),
        _tree_bytes(HERE / "bin"),
        "\n".join(IMAGE_PACKAGES).encode(),
        (REPO_ROOT / pinned.CONSTRAINTS_FILE).read_bytes(),
        str(python312()).encode(),
    )
    built = f"localhost/trtllm-double:{inputs}"
    if not image_exists(built, env):
        with tempfile.TemporaryDirectory(dir=ROOT / "tmp") as scratch:
            context = Path(scratch)
            _stage(context)
            run(
                [
                    "podman",
                    "build",
                    "--network=host",
                    "--build-arg",
                    f"BASE={base}",
                    "--build-arg",
                    f"PYTHON312={python312()}",
                    "-t",
                    built,
                    str(context),
                ],
                env=env,
            )
    run(["podman", "tag", built, pinned.IMAGE], env=env)
    return pinned.IMAGE, env


def ensure_without_tensorrt_llm(env: dict[str, str]) -> str:
    """The double with its tensorrt_llm uninstalled: a base image whose Python cannot see
    TensorRT-LLM (for the image build's refusal)."""
    double = run(["podman", "image", "inspect", "--format", "{{.Id}}", pinned.IMAGE], env=env).strip()
    name = f"localhost/trtllm-double-no-trtllm:{double[:16]}"
    if not image_exists(name, env):
        with tempfile.TemporaryDirectory(dir=ROOT / "tmp") as scratch:
            (Path(scratch) / "Containerfile").write_text(
                f"FROM {pinned.IMAGE}\nRUN pip uninstall -y -q tensorrt_llm\n"
            )
            run(["podman", "build", "--pull=never", "-t", name, scratch], env=env)
    return name


if __name__ == "__main__":
    if sys.argv[1:] == ["--env"]:  # eval "$(python -m tests.image_double.double --env)": podman by hand
        for key in ("CONTAINERS_STORAGE_CONF", "CONTAINERS_CONF", "TMPDIR"):
            print(f"export {key}={podman_env()[key]}")
    else:
        name, _ = ensure_double()
        print(name, file=sys.stdout)


def containerize(bento: str, image: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`bentoml containerize --backend podman` of `bento` as `image` (host network: the registries),
    run from the project's directory as the README says (issue 44: a bento v1 with a Dockerfile
    template failed there; it worked only from /)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "bentoml",
            "containerize",
            bento,
            "--backend",
            "podman",
            "-t",
            image,
            "--opt",
            "network=host",
        ],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


class Container:
    """`podman run` of an image on the host network, stopped (SIGTERM, as a container stop) and
    removed when the block ends."""

    def __init__(
        self, image: str, env: dict[str, str], *args: str, environ: dict[str, str] | None = None
    ) -> None:
        self.name = f"trtllm-test-{os.getpid()}-{hashlib.sha256(os.urandom(8)).hexdigest()[:8]}"
        self.image, self.env, self.args = image, env, args
        self.environ = environ or {}

    def __enter__(self) -> Container:
        options = [f"--env={k}={v}" for k, v in self.environ.items()]
        cmd = [
            "podman",
            "run",
            "-d",
            "--pull=never",
            "--network=host",
            "--name",
            self.name,
            *options,
            self.image,
        ]
        run([*cmd, *self.args], env=self.env, timeout=120)
        return self

    def logs(self) -> str:
        done = subprocess.run(
            ["podman", "logs", self.name],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return done.stdout + done.stderr

    def exec(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", "exec", self.name, *cmd],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def running(self) -> bool:
        done = subprocess.run(
            ["podman", "inspect", "-f", "{{.State.Running}}", self.name],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return done.stdout.strip() == "true"

    def __exit__(self, *exc: object) -> None:
        subprocess.run(
            ["podman", "stop", "-t", "30", self.name],
            env=self.env,
            capture_output=True,
            timeout=90,
            check=False,
        )
        subprocess.run(
            ["podman", "rm", "-f", self.name], env=self.env, capture_output=True, timeout=60, check=False
        )


def run_image(image: str, env: dict[str, str], *cmd: str) -> subprocess.CompletedProcess[str]:
    """One command in a fresh container of `image`, through the bento's entrypoint (/app/.venv active)."""
    return subprocess.run(
        ["podman", "run", "--rm", "--pull=never", "--network=host", image, *cmd],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
