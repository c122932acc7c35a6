"""The stand-ins' room (tensorrtllm_backend/standin/) and production: imports point one way.

Production is what runs in NVIDIA's image: the llmapi model (all_models/llmapi/tensorrt_llm/1/:
model.py, llm_engine.py, llmapi_contract.py), the ensemble's preprocessing, postprocessing and BLS
models, and the modules the repository builder copies beside them from tensorrtllm_backend/
(triton_adapter, shared_contract, engine_metrics, ...). None of them imports a stand-in module, except
the llmapi model where it falls back to one (ALLOWED: model.py's `_standin`, imported there and only
there). The stand-ins import production modules, never the other way round. The ensemble's
tensorrt_llm/1/model.py is a stand-in itself (NVIDIA's C++ backend fills that slot in production).

The repository builder copies the stand-ins only into a version dir that a stand-in serves or may
serve, and every module a version dir's code imports lies beside it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tensorrtllm_backend import ALL_MODELS_DIR, LLMAPI_TEMPLATES_DIR, STANDIN_DIR, TEMPLATES_DIR
from tensorrtllm_backend.repository import FLAVORS, build_repository, repository_values

BACKEND_DIR = STANDIN_DIR.parent
STANDINS = frozenset(path.stem for path in STANDIN_DIR.glob("*.py"))
STANDIN_MODEL = TEMPLATES_DIR / "tensorrt_llm" / "1" / "model.py"
"""The ensemble's stand-in adapter in the tensorrt_llm slot."""
PRODUCTION_MODELS = sorted(path for path in ALL_MODELS_DIR.glob("*/*/1/*.py") if path != STANDIN_MODEL)
PRODUCTION_SHARED = sorted(
    {path for flavor in FLAVORS.values() for paths in flavor.shared_modules.values() for path in paths}
)
ALLOWED = {(LLMAPI_TEMPLATES_DIR / "tensorrt_llm" / "1" / "model.py", "_standin")}
"""(file, function): where a production file may import the stand-ins: the llmapi model's fallback."""
OURS = frozenset(
    path.stem
    for folder in (BACKEND_DIR, STANDIN_DIR, *ALL_MODELS_DIR.glob("*/*/1"))
    for path in folder.glob("*.py")
    if path.stem != "__init__"
)
"""Every module a version dir may import by its bare name (the files copied into version dirs)."""


def imports(source: str) -> list[tuple[str, str | None, int]]:
    """(top-level module, enclosing function or None, line) of every absolute import in `source`."""
    found: list[tuple[str, str | None, int]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name.split(".")[0], function, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                found.append((child.module.split(".")[0], function, child.lineno))
            visit(child, function)

    visit(ast.parse(source), None)
    return found


def standin_imports(path: Path, source: str | None = None) -> list[str]:
    """The stand-in imports of production file `path` that ALLOWED does not let through."""
    source = path.read_text() if source is None else source
    return [
        f"{path.name}:{line} imports {module}" + (f" in {function}()" if function else "")
        for module, function, line in imports(source)
        if module in STANDINS and (path, function) not in ALLOWED
    ]


def test_the_rooms_hold_what_they_should() -> None:
    assert {
        "llm_standin",
        "text_engine",
        "reference",
        "synthetic",
        "engine",
        "contract",
        "sources",
    } <= STANDINS
    assert {p.name for p in PRODUCTION_MODELS} >= {"model.py", "llm_engine.py", "llmapi_contract.py"}
    assert not STANDINS & {p.stem for p in (*PRODUCTION_MODELS, *PRODUCTION_SHARED)}
    assert all(path.parent == BACKEND_DIR for path in PRODUCTION_SHARED), PRODUCTION_SHARED


@pytest.mark.parametrize(
    "path", [*PRODUCTION_MODELS, *PRODUCTION_SHARED], ids=lambda p: str(p.relative_to(BACKEND_DIR))
)
def test_production_imports_no_standin(path: Path) -> None:
    assert not standin_imports(path)


def test_the_llmapi_model_imports_the_standin_only_where_it_falls_back() -> None:
    model = LLMAPI_TEMPLATES_DIR / "tensorrt_llm" / "1" / "model.py"
    found = {(module, function) for module, function, _ in imports(model.read_text()) if module in STANDINS}
    assert found == {("llm_standin", "_standin"), ("sources", "_standin")}


@pytest.mark.parametrize(
    "source",
    [
        "from engine import EngineLoop\n",
        "import reference\n",
        "def serve():\n    from contract import parse_request\n",
        "class M:\n    def _api(self):\n        from llm_standin import StandIn\n",
        "try:\n    import synthetic\nexcept ImportError:\n    pass\n",
    ],
)
def test_the_check_finds_a_production_file_that_imports_a_standin(source: str) -> None:
    for path in (
        LLMAPI_TEMPLATES_DIR / "tensorrt_llm" / "1" / "llm_engine.py",
        BACKEND_DIR / "triton_adapter.py",
    ):
        assert standin_imports(path, source), (path.name, source)
    model = LLMAPI_TEMPLATES_DIR / "tensorrt_llm" / "1" / "model.py"
    assert standin_imports(model, source)  # outside _standin, the llmapi model.py may not either
    assert not standin_imports(model, "def _standin(self):\n    from llm_standin import StandIn\n")


CASES = {
    "ensemble, NVIDIA's C++ backend": ("ensemble", "tensorrtllm", {}),
    "ensemble, reference stand-in": ("ensemble", "python", {"python_engine": "reference"}),
    "ensemble, synthetic stand-in": ("ensemble", "python", {"python_engine": "synthetic"}),
    "llmapi, tensorrt_llm": ("llmapi", "python", {"llmapi_engine": "tensorrt_llm"}),
    "llmapi, reference": ("llmapi", "python", {"llmapi_engine": "reference"}),
    "llmapi, synthetic": ("llmapi", "python", {"llmapi_engine": "synthetic"}),
}


@pytest.fixture(scope="module", params=list(CASES))
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    flavor, backend, overrides = CASES[request.param]
    root = tmp_path_factory.mktemp("repo")
    values = repository_values(
        engine_dir=root, tokenizer_dir=root, backend=backend, overrides={"end_ids": "7", **overrides}
    )
    return request.param, build_repository(root / "repository", values, flavor=flavor)


def test_standins_lie_only_where_a_standin_serves_or_may(built: tuple[str, Path]) -> None:
    case, repository = built
    flavor, backend, _ = CASES[case]
    for version_dir in sorted(repository.glob("*/1")):
        model = version_dir.parent.name
        present = {path.stem for path in version_dir.glob("*.py")} & STANDINS
        serves = model == "tensorrt_llm" and (flavor == "llmapi" or backend == "python")
        wanted = {path.stem for path in FLAVORS[flavor].standin_modules.get(model, ())}
        assert present == (wanted if serves else set()), (model, sorted(present))
        if serves:
            assert wanted >= {"reference", "synthetic", "engine", "contract", "sources"}
            assert ("llm_standin" in present) == (flavor == "llmapi")
    if backend == "tensorrtllm":
        assert not list((repository / "tensorrt_llm" / "1").iterdir())  # the C++ backend: no Python


def test_every_module_a_version_dir_imports_lies_beside_it(built: tuple[str, Path]) -> None:
    _, repository = built
    for version_dir in sorted(repository.glob("*/1")):
        beside = {path.stem for path in version_dir.glob("*.py")}
        for path in version_dir.glob("*.py"):
            wanted = {module for module, _, _ in imports(path.read_text()) if module in OURS}
            assert wanted <= beside, (version_dir.parent.name, path.name, sorted(wanted - beside))
