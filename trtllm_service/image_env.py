"""Image build time: install the service into the image's own Python without moving TensorRT-LLM's pins.

Run by bento_setup.sh with the image's Python (NVIDIA's 2026 trtllm images: the virtual environment
/opt/venv-tritonserver, where TensorRT-LLM, torch and their pins live), before and after the service's
requirements are installed:

    python image_env.py constraints   TensorRT-LLM's own pins, read from the installed distribution's
                                      Requires-Dist (the image's truth, not our copy of it), as a
                                      constraints file for the install
    python image_env.py versions      the installed versions of TensorRT-LLM's requirements (before)
    python image_env.py check BEFORE  fails (exit 1, one line each) unless the service's Python imports
                                      what it serves with and the install moved no requirement of
                                      tensorrt_llm outside its pin (one the image broke itself is a
                                      warning: not ours to mend)

Standard library only (and `packaging`, which transformers requires): it runs before anything of
ours is installed.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from collections.abc import Iterable
from pathlib import Path

REQUIRED_IMPORTS = ("tensorrt_llm", "tensorrt_llm.serve", "torch", "tritonclient.grpc", "bentoml")
"""What the service's Python must import in the image: the engine (and `tensorrt_llm.serve`, which the
PyTorch executor imports while it loads a model: it needs a recent openai), torch, and the service."""

TENSORRT_LLM = "tensorrt_llm"


def _requirements(dist: str = TENSORRT_LLM) -> list[object]:
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
    return [f"{r.name}{r.specifier}" for r in _requirements(dist) if str(r.specifier)]  # type: ignore[attr-defined]


def versions(dist: str = TENSORRT_LLM) -> dict[str, str]:
    """name -> installed version of each requirement of `dist` that is installed."""
    found = {}
    for requirement in _requirements(dist):
        name = requirement.name  # type: ignore[attr-defined]
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
    moved, already = [], []
    now = versions(dist)
    for requirement in _requirements(dist):
        name, specifier = requirement.name, requirement.specifier  # type: ignore[attr-defined]
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


def main(argv: list[str]) -> int:
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
    print("usage: image_env.py constraints | versions | check [BEFORE]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
