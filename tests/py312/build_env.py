"""The image's Python (3.12.3) for Triton's Python models, on a machine whose own Python is 3.11.

NVIDIA's 26.07 image runs Triton's Python backend under Ubuntu 24.04's Python 3.12.3; CI runs Debian 12
(Python 3.11.7, glibc 2.36), where a model that passed every test once crashed the image's Python on
its first request. This builds, in `.cache/py312/` of the checkout:

- `root/`: Ubuntu noble's own python3.12 packages (3.12.3, the image's build of it) with the glibc
  they need (2.39) and a few libraries, unpacked from archive.ubuntu.com, never installed (the
  machine's own stay as they are); each .deb's SHA256 is checked against the archive's index;
- `venv/`: a virtual environment over it holding what our Triton models import, for cp312
  (numpy < 2, transformers, tokenizers, pydantic, llguidance, ...: the versions of requirements.txt;
  no torch: CPU wheels of torch for 3.12 come only from PyTorch's index, which these machines do not
  reach, so only the synthetic engine serves here);
- `triton/`: nvidia-pytriton's tritonserver (the binary copied, the rest linked) whose Python 3.12
  backend stub starts through noble's loader, so stub and libpython run on the glibc they were
  built for.

`environment()` builds what is missing and returns `TRITONSERVER` and `TRITON_PYTHON`: with both in
its environment, every Triton the launcher starts runs its Python models under 3.12.3.
Run `python -m tests.py312.build_env` to build it and print them.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import lzma
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / ".cache" / "py312"
ARCHIVE = "http://archive.ubuntu.com/ubuntu"
SUITES = ("noble-updates", "noble")
"""Where each package is taken from: the newest of noble's updates, else noble's release."""
PACKAGES = (
    "python3.12-minimal",
    "libpython3.12-minimal",
    "libpython3.12-stdlib",
    "libpython3.12t64",
    "libc6",
    "libexpat1",
    "zlib1g",
    "libffi8",
    "libssl3t64",
    "libcrypt1",
    "liblzma5",
    "libbz2-1.0",
)
PYTHON_VERSION = "3.12.3"
"""The image's Python (NVIDIA's 26.07 trtllm image: Ubuntu 24.04's python3.12)."""
REQUIREMENTS = (
    "numpy",
    "transformers",
    "tokenizers",
    "safetensors",
    "pydantic",
    "annotated-types",
    "llguidance",
)
"""What our Triton models import, at requirements.txt's versions (and pyyaml, which transformers takes)."""
LIB = "usr/lib/x86_64-linux-gnu"
STUB = "triton_python_backend_stub"


def environment(root: Path = ROOT) -> dict[str, str]:
    """TRITONSERVER and TRITON_PYTHON for Triton's models to run under Python 3.12.3 (built once).

    Under a lock: of the test processes that ask at once (pytest-xdist's workers), one builds and
    the others wait for it. Each one used to build again from scratch (its recipe, with tuples,
    never equalled the stamp it read back, with lists), deleting the files another one's Triton was
    importing."""
    stamp = root / "built.json"
    want = json.loads(json.dumps(_recipe()))  # as the stamp reads back (tuples become lists)
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (stamp.is_file() and json.loads(stamp.read_text()) == want):
            _build(root)
            stamp.write_text(json.dumps(want))
    return {
        "TRITONSERVER": str(root / "triton" / "pytriton" / "tritonserver" / "bin" / "tritonserver"),
        "TRITON_PYTHON": str(root / "venv" / "bin" / "python3"),
    }


def _recipe() -> dict[str, object]:
    """What the build depends on: when it changes, the build is made again."""
    return {
        "packages": PACKAGES,
        "python": PYTHON_VERSION,
        "pins": _pins(),
        "pytriton": str(_pytriton_root()),
        "builder": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    }


def _pins() -> list[str]:
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        name, _, version = line.partition("==")
        if version and name.strip().lower() in REQUIREMENTS:
            pins[name.strip().lower()] = f"{name.strip()}=={version.split()[0]}"
    missing = set(REQUIREMENTS) - set(pins)
    if missing:
        raise RuntimeError(f"requirements.txt pins none of {sorted(missing)}")
    return sorted(pins.values())


def _pytriton_root() -> Path:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("nvidia-pytriton is not installed (./dev.sh installs it)")
    return Path(next(iter(spec.submodule_search_locations)))


def _build(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    (root / "debs").mkdir(parents=True)
    _unpack_packages(root)
    _make_venv(root)
    _make_triton(root)
    check = "import numpy, transformers, yaml, pydantic, llguidance, sys; print(sys.version.split()[0], numpy.__version__)"
    found = subprocess.run(
        [str(root / "venv" / "bin" / "python3"), "-c", check], capture_output=True, text=True, check=True
    ).stdout.split()
    if found[0] != PYTHON_VERSION or not found[1].startswith("1."):
        raise RuntimeError(f"the 3.12 environment runs Python {found[0]} with numpy {found[1]}")


def _index() -> dict[str, dict[str, str]]:
    """Package -> its entry (Filename, SHA256, Version) in the first suite that has it."""
    entries: dict[str, dict[str, str]] = {}
    for suite in SUITES:
        url = f"{ARCHIVE}/dists/{suite}/main/binary-amd64/Packages.xz"
        with urllib.request.urlopen(url, timeout=120) as response:
            text = lzma.decompress(response.read()).decode()
        for block in text.split("\n\n"):
            fields = dict(
                line.split(": ", 1) for line in block.splitlines() if ": " in line and line[0] != " "
            )
            if fields.get("Package") in PACKAGES and fields["Package"] not in entries:
                entries[fields["Package"]] = fields
    missing = set(PACKAGES) - set(entries)
    if missing:
        raise RuntimeError(f"{ARCHIVE} has none of {sorted(missing)} in {', '.join(SUITES)}")
    return entries


def _unpack_packages(root: Path) -> None:
    for name, entry in _index().items():
        if name == "python3.12-minimal" and not entry["Version"].startswith(PYTHON_VERSION + "-"):
            raise RuntimeError(f"noble's python3.12 is {entry['Version']} now, not {PYTHON_VERSION}")
        deb = root / "debs" / Path(entry["Filename"]).name
        with urllib.request.urlopen(f"{ARCHIVE}/{entry['Filename']}", timeout=300) as response:
            data = response.read()
        if hashlib.sha256(data).hexdigest() != entry["SHA256"]:
            raise RuntimeError(f"{deb.name}: its SHA256 is not the one the archive's index gives")
        deb.write_bytes(data)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root / "root")], check=True)


def _loader_line(root: Path, program: str, libraries: str = "") -> str:
    """A shell line that runs `program` on noble's glibc (its loader, its libraries first)."""
    lib = root / "root" / LIB
    path = ":".join(filter(None, [str(lib), libraries, "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"]))
    return f'exec {lib}/ld-linux-x86-64.so.2 --library-path {path} --argv0 "$0" {program} "$@"\n'


def _make_venv(root: Path) -> None:
    venv = root / "venv"
    site = venv / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "pyvenv.cfg").write_text(
        f"home = {root / 'root' / 'usr' / 'bin'}\ninclude-system-site-packages = false\nversion = {PYTHON_VERSION}\n"
    )
    python = venv / "bin" / "python3"
    python.write_text("#!/bin/sh\n" + _loader_line(root, str(root / "root" / "usr" / "bin" / "python3.12")))
    python.chmod(0o755)
    (venv / "bin" / "python").symlink_to("python3")
    uv = Path(sys.executable).parent / "uv"
    subprocess.run(
        [
            str(uv),
            "pip",
            "install",
            "--quiet",
            "--python-version",
            "3.12",
            "--python-platform",
            "x86_64-manylinux_2_28",
            "--only-binary",
            ":all:",
            "--target",
            str(site),
            "-c",
            str(REPO / "requirements.txt"),
            *_pins(),
        ],
        check=True,
    )


def _make_triton(root: Path) -> None:
    """pytriton's tree with the 3.12 stub behind noble's loader. The binary is a copy: the launcher
    finds the stubs beside the binary's real path."""
    source = _pytriton_root()
    server = source / "tritonserver"
    tree = root / "triton" / "pytriton" / "tritonserver"
    (tree / "bin").mkdir(parents=True)
    shutil.copy2(server / "bin" / "tritonserver", tree / "bin" / "tritonserver")
    (tree / "backends").symlink_to(server / "backends")
    libs = source.parent / "nvidia_pytriton.libs"
    (root / "triton" / "nvidia_pytriton.libs").symlink_to(libs)
    stub_dir = tree / "python_backend_stubs" / "3.12"
    stub_dir.mkdir(parents=True)
    real = root / "triton" / f"{STUB}-3.12"
    shutil.copy2(server / "python_backend_stubs" / "3.12" / STUB, real)
    wrapper = stub_dir / STUB
    wrapper.write_text("#!/bin/sh\n" + _loader_line(root, str(real), str(libs)))
    wrapper.chmod(0o755)


if __name__ == "__main__":
    for key, value in environment().items():
        print(f"export {key}={value}")
