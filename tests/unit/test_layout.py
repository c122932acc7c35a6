"""The package layout by phase, and imports that point one way: api -> runtime -> relay -> triton;
packing apart.

Shared modules (the top-level ones and `chat/`) import no phase; a phase imports only itself, the
shared modules and the phases below it. `runtime` (the assembly of one serving runtime) sits between
the HTTP layer and the phases it puts together. `tensorrtllm_backend` (the Triton side) is below them all.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import trtllm_service

PACKAGE = Path(trtllm_service.__file__).resolve().parent
PHASES = ("packing", "triton", "relay", "api")
ALLOWED: dict[str, set[str]] = {
    "shared": {"shared"},
    "packing": {"shared", "packing"},
    "triton": {"shared", "triton"},
    "relay": {"shared", "triton", "relay"},
    "runtime": {"shared", "triton", "relay", "runtime"},
    "api": {"shared", "triton", "relay", "runtime", "api"},
}
ASSEMBLY = "runtime"
"""The top-level module that assembles the phases into the service's runtime."""
TOOLS = {"doctor"}
"""Top-level tools over the phases (not imported by any of them)."""


def phase_of(module: str) -> str:
    """The phase of `trtllm_service.<...>`: its first package below trtllm_service, else shared."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in (*PHASES, ASSEMBLY):
        return parts[1]
    return "tool" if len(parts) > 1 and parts[1] in TOOLS else "shared"


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        found.append((".".join(relative.parts).removesuffix(".__init__"), path))
    return found


def imported(path: Path, module: str) -> set[str]:
    """The trtllm_service modules `path` imports (module-level and inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trtllm_service"):
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("trtllm_service"))
    return {name for name in names if name != module}


def test_every_phase_is_a_package_with_a_docstring() -> None:
    for phase in PHASES:
        init = PACKAGE / phase / "__init__.py"
        assert init.is_file() and ast.get_docstring(ast.parse(init.read_text())), phase


@pytest.mark.parametrize(("module", "path"), modules(), ids=[m for m, _ in modules()])
def test_imports_point_one_way(module: str, path: Path) -> None:
    own = phase_of(module)
    if own == "tool":
        return
    known = {name for name, _ in modules()}
    for name in imported(path, module):
        target = name if name in known else name.rsplit(".", 1)[0]  # `from x import name` of a function
        if target not in known:
            continue
        assert phase_of(target) in ALLOWED[own], f"{module} ({own}) imports {target} ({phase_of(target)})"
