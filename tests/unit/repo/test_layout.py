"""The package layout by phase, and imports that point one way: api -> runtime -> relay -> triton;
packing apart.

Shared modules (the top-level ones and `chat/`) import no phase; a phase imports only itself, the
shared modules and the phases below it. `runtime` (the assembly of one serving runtime) sits between
the HTTP layer and the phases it puts together. `tensorrtllm_backend` (the Triton side) is below them all.

Inside `api`, by role: `server` (the HTTP plumbing, which knows no endpoint) -> `generation` (the path
every endpoint shares, and the common protocol) -> one package per endpoint family (`openai`,
`anthropic`, `generate`), which never import each other; the modules at the root of `api` (`app`,
`openapi`) assemble them.
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


API_ROOMS = ("server", "generation")
"""api's rooms below the endpoints, lowest first."""
ENDPOINTS = ("openai", "anthropic", "generate")
"""api's endpoint packages, one per API family."""
API_ASSEMBLY = "assembly"
"""The modules at api's root, which put the rooms and the endpoints together (`api.app`, `api.openapi`)."""
API_ALLOWED: dict[str, set[str]] = {
    "server": {"server"},
    "generation": {"server", "generation"},
    **{endpoint: {"server", "generation", endpoint} for endpoint in ENDPOINTS},
    API_ASSEMBLY: {*API_ROOMS, *ENDPOINTS, API_ASSEMBLY},
}
"""The api rooms each api room may import: an endpoint only itself, generation and server."""


def phase_of(module: str) -> str:
    """The phase of `trtllm_service.<...>`: its first package below trtllm_service, else shared."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in (*PHASES, ASSEMBLY):
        return parts[1]
    return "tool" if len(parts) > 1 and parts[1] in TOOLS else "shared"


def api_room_of(module: str) -> str | None:
    """The room of a `trtllm_service.api...` module (None: not in api)."""
    parts = module.split(".")
    if parts[:2] != ["trtllm_service", "api"]:
        return None
    if len(parts) > 2 and parts[2] in (*API_ROOMS, *ENDPOINTS):
        return parts[2]
    return API_ASSEMBLY


def api_violations(module: str, targets: set[str]) -> list[str]:
    """The imports of `module` (of the known modules `targets`) that api's rooms do not allow."""
    own = api_room_of(module)
    if own is None:
        return []
    found = []
    for target in sorted(targets):
        room = api_room_of(target)
        if room is not None and room not in API_ALLOWED[own]:
            found.append(f"{module} ({own}) imports {target} ({room})")
    return found


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
    for room in (*API_ROOMS, *ENDPOINTS):
        init = PACKAGE / "api" / room / "__init__.py"
        assert init.is_file() and ast.get_docstring(ast.parse(init.read_text())), room


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


def targets_of(path: Path, module: str) -> set[str]:
    """The known trtllm_service modules `path` imports (a function imported from a module: the module)."""
    known = {name for name, _ in modules()}
    targets = set()
    for name in imported(path, module):
        target = name if name in known else name.rsplit(".", 1)[0]
        if target in known:
            targets.add(target)
    return targets


API_MODULES = [(module, path) for module, path in modules() if api_room_of(module) is not None]


@pytest.mark.parametrize(("module", "path"), API_MODULES, ids=[m for m, _ in API_MODULES])
def test_api_rooms_import_one_way_and_endpoints_never_each_other(module: str, path: Path) -> None:
    assert not api_violations(module, targets_of(path, module))


def test_the_api_rule_refuses_an_endpoint_importing_another_and_the_server_an_endpoint() -> None:
    for endpoint in ENDPOINTS:
        for other in ENDPOINTS:
            found = api_violations(
                f"trtllm_service.api.{endpoint}.serving", {f"trtllm_service.api.{other}.x"}
            )
            assert bool(found) == (other != endpoint), (endpoint, other)
    assert api_violations(
        "trtllm_service.api.openai.chat.protocol", {"trtllm_service.api.anthropic.protocol"}
    )
    assert api_violations("trtllm_service.api.server.error_shape", {"trtllm_service.api.anthropic.errors"})
    assert api_violations("trtllm_service.api.generation.serving", {"trtllm_service.api.openai.protocol"})
    assert api_violations("trtllm_service.api.server.early", {"trtllm_service.api.app"})
    assert not api_violations("trtllm_service.api.app", {"trtllm_service.api.openai.routes"})
    assert not api_violations(
        "trtllm_service.api.anthropic.protocol", {"trtllm_service.api.generation.protocol"}
    )
