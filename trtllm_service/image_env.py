#!/usr/bin/env python3
"""Image build time: install the service into the image's own Python without moving TensorRT-LLM's pins.

bentofile.yaml's `docker.setup_script`. BentoML 1.4's image build makes `/app/.venv` from Python
`docker.python_version` and installs the requirements into it; this script runs right after that
(`python image_env.py`, no arguments) and puts the service where TensorRT-LLM is instead: NVIDIA's
2026 trtllm images keep Python, TensorRT-LLM, torch and their pins in the virtual environment
/opt/venv-tritonserver, which a venv made beside it cannot see. So the requirements go into that
Python (`TRTLLM_IMAGE_PYTHON` overrides it; else /opt/venv-tritonserver/bin/python, else the image's
`python3`), constrained by the installed TensorRT-LLM's own pins; the build fails, one line per
problem, unless that Python then imports what the service serves with and every pin still holds;
and `/app/.venv`, which BentoML's entrypoint activates, becomes that Python (the one BentoML made
is removed). Its steps, each run with the image's Python:

    python image_env.py constraints   TensorRT-LLM's own pins, read from the installed distribution's
                                      Requires-Dist (the image's truth, not our copy of it), as a
                                      constraints file for the install
    python image_env.py versions      the installed versions of TensorRT-LLM's requirements (before)
    python image_env.py check BEFORE  fails (exit 1, one line each) unless the service's Python imports
                                      what it serves with and the install moved no requirement of
                                      tensorrt_llm outside its pin (one the image broke itself is a
                                      warning: not ours to mend)

Standard library only (and `packaging`, which transformers requires): it runs before anything of
ours is in the image but this file.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used at run time: importing this file needs the standard library only
    from packaging.requirements import Requirement

REQUIRED_IMPORTS = ("tensorrt_llm", "tensorrt_llm.serve", "torch", "tritonclient.grpc", "bentoml")
"""What the service's Python must import in the image: the engine (and `tensorrt_llm.serve`, which the
PyTorch executor imports while it loads a model: it needs a recent openai), torch, and the service."""

TENSORRT_LLM = "tensorrt_llm"
IMAGE_VENV_PYTHON = "/opt/venv-tritonserver/bin/python"
"""NVIDIA's 2026 trtllm images' Python (the virtual environment TensorRT-LLM is installed in)."""
BENTO_VENV = Path("/app/.venv")
"""What BentoML's entrypoint activates (and its image build made, from another Python)."""
BENTO_PYTHONS = Path("/app/python")
"""Where BentoML's build puts a Python it had to download for its venv."""
REQUIREMENTS = Path("env/python/requirements.txt")
"""The bento's requirements (requirements.txt and bentoml), relative to the bento's directory."""


def _requirements(dist: str = TENSORRT_LLM) -> list[Requirement]:
    """The installed distribution's requirements that apply here (markers evaluated, no extras)."""
    from packaging.requirements import InvalidRequirement, Requirement

    found = []
    for line in importlib.metadata.requires(dist) or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        found.append(requirement)
    return found


def constraint_lines(dist: str = TENSORRT_LLM) -> list[str]:
    """`name<specifier>` for each pinned requirement of `dist` (unpinned names constrain nothing)."""
    return [f"{r.name}{r.specifier}" for r in _requirements(dist) if str(r.specifier)]


def versions(dist: str = TENSORRT_LLM) -> dict[str, str]:
    """name -> installed version of each requirement of `dist` that is installed."""
    found = {}
    for requirement in _requirements(dist):
        name = requirement.name
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # the image's business, not the service's install
    return found


def broken_pins(
    before: dict[str, str] | None = None, dist: str = TENSORRT_LLM
) -> tuple[list[str], list[str]]:
    """(requirements of `dist` the install moved outside their pin, those outside it already `before`),
    each as `name version (pin)`; with no `before`, every broken pin counts as moved."""
    moved: list[str] = []
    already: list[str] = []
    now = versions(dist)
    for requirement in _requirements(dist):
        name, specifier = requirement.name, requirement.specifier
        version = now.get(name)
        if version is None or not str(specifier) or specifier.contains(version, prereleases=True):
            continue
        line = f"{name} {version} (TensorRT-LLM pins {specifier})"
        (already if before is not None and before.get(name) == version else moved).append(line)
    return moved, already


def failed_imports(modules: Iterable[str] = REQUIRED_IMPORTS) -> list[str]:
    """`module: error` for each module that does not import."""
    failed = []
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # an import may fail with anything, not only ImportError
            failed.append(f"{module}: {type(exc).__name__}: {exc}")
    return failed


def image_python(environ: Mapping[str, str]) -> str:
    """The Python TensorRT-LLM lives in: TRTLLM_IMAGE_PYTHON, else NVIDIA's venv, else the image's
    `python3` (not the one of BentoML's venv, first on PATH while the image builds)."""
    if environ.get("TRTLLM_IMAGE_PYTHON"):
        return environ["TRTLLM_IMAGE_PYTHON"]
    if os.access(IMAGE_VENV_PYTHON, os.X_OK):
        return IMAGE_VENV_PYTHON
    path = os.pathsep.join(
        p for p in environ.get("PATH", os.defpath).split(os.pathsep) if not p.startswith(str(BENTO_VENV))
    )
    return shutil.which("python3", path=path) or "python3"


def _say(line: str) -> None:
    print(f"image_env: {line}", flush=True)


def setup(environ: Mapping[str, str]) -> int:
    """The image build's step (see the module docstring); its exit status."""
    python, me = image_python(environ), str(Path(__file__).resolve())

    def ask(*args: str) -> str:
        return subprocess.run([python, *args], check=True, capture_output=True, text=True).stdout.strip()

    prefix = ask("-c", "import sys; print(sys.prefix)")
    version = ask("-c", "import platform; print(platform.python_version())")
    _say(f"the image's Python: {python} ({version}, {prefix})")
    with tempfile.TemporaryDirectory() as scratch:
        constraints, before = Path(scratch, "constraints.txt"), Path(scratch, "before.txt")
        found = subprocess.run([python, me, "constraints"], capture_output=True, text=True)
        if found.returncode != 0:
            _say(f"error: {python} cannot see {TENSORRT_LLM}; is the base image NVIDIA's trtllm image?")
            return 1
        constraints.write_text(found.stdout)
        before.write_text(ask(me, "versions") + "\n")
        uv = ["uv", "pip", "install", "--python", python, "-r", str(REQUIREMENTS), "-c", str(constraints)]
        if (
            subprocess.run(uv).returncode != 0
            or subprocess.run([python, me, "check", str(before)]).returncode
        ):
            return 1
    shutil.rmtree(BENTO_VENV, ignore_errors=True)
    shutil.rmtree(BENTO_PYTHONS, ignore_errors=True)
    if ask("-c", "import sys; print(sys.prefix != sys.base_prefix)") == "True":
        BENTO_VENV.symlink_to(prefix)  # a virtual environment: the entrypoint activates it as it is
    else:
        subprocess.run(
            [python, "-m", "venv", "--system-site-packages", "--without-pip", str(BENTO_VENV)], check=True
        )
        subprocess.run(["chown", "-R", "bentoml:bentoml", str(BENTO_VENV)], check=True)
    _say(f"{BENTO_VENV} is {prefix}")
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        return setup(os.environ)
    if argv == ["constraints"]:
        try:
            print("\n".join(constraint_lines()))
        except importlib.metadata.PackageNotFoundError:
            print(
                f"image_env: {sys.executable} has no {TENSORRT_LLM}: not a TensorRT-LLM image",
                file=sys.stderr,
            )
            return 1
        return 0
    if argv == ["versions"]:
        print("\n".join(f"{name}=={version}" for name, version in versions().items()))
        return 0
    if argv[:1] == ["check"] and len(argv) <= 2:
        before = None
        if len(argv) == 2:
            before = dict(line.split("==", 1) for line in Path(argv[1]).read_text().split() if "==" in line)
        problems = [f"cannot import {line}" for line in failed_imports()]
        try:
            moved, already = broken_pins(before)
        except importlib.metadata.PackageNotFoundError:
            moved, already = [], []  # no tensorrt_llm: said above
        problems += [f"the install moved a TensorRT-LLM pin: {line}" for line in moved]
        for line in already:
            print(f"image_env: warning: the image itself has {line}", file=sys.stderr)
        for line in problems:
            print(f"image_env: {sys.executable}: {line}", file=sys.stderr)
        if not problems:
            print(
                f"image_env: {sys.executable} imports {', '.join(REQUIRED_IMPORTS)}; TensorRT-LLM's pins hold"
            )
        return 1 if problems else 0
    print("usage: image_env.py [constraints | versions | check [BEFORE]]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
