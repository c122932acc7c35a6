"""The tests' own layout (issue 45, item 6: tests mirror the product).

- tests/unit mirrors the product: each folder is a room of it (`api/openai/` tests
  trtllm_service/api/openai/, `backend/` tensorrtllm_backend/, `bench/` bench/, `repo/` the
  repository as a whole), and each module is named after the module it tests (`test_<module>.py`,
  or `test_<module>_<aspect>.py`).
- tests/unit is packages all the way down, so rooms may share a module name
  (`api/openai/test_protocol.py`, `api/anthropic/test_protocol.py`); a test module outside a package
  is imported by its basename, and pytest stops the whole run at collection when two share one
  (this happened twice in one session): those basenames are unique.
- One fixture per concept: a fixture's name is defined once (a conftest.py holds what several
  modules share), but for the deliberate overrides listed in OVERRIDES.
- No test module imports another: what tests share lives in a support module (tests/*_support.py,
  tests/support.py) or a conftest.py.
"""

from __future__ import annotations

import ast
from collections import Counter, defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[2]
ROOT = TESTS.parent

ROOMS = {"backend": ROOT / "tensorrtllm_backend", "bench": ROOT / "bench", "repo": None}
"""tests/unit's top folders that are not trtllm_service's (None: the repository as a whole)."""

SEVERAL_MODULES = {
    "api/test_priority.py": "priority on every route: the protocols' fields, the answers' echoes, "
    "the queue's refusals in each API's shape and its gauge",
    "api/openai/test_official_client.py": "the /v1 app read by the official openai client: "
    "/v1/responses, reasoning models' think blocks and /tokenize across openai's packages",
    "api/server/test_request_guards.py": "what the door refuses, across limits, shutdown, openapi30 "
    "and the relay's checks of text and numbers",
    "backend/standin/test_llmapi_executor_rules.py": "the PyTorch executor's rules (nvidia_llmapi.py) "
    "held against the stand-in LLM API (llm_standin.py)",
    "backend/standin/test_nvidia_contract.py": "NVIDIA's C++ backend contract (nvidia_backend.py) "
    "held against our configs, the service and the stand-in",
    "backend/standin/test_nvidia_llmapi.py": "NVIDIA's LLM API contract (nvidia_llmapi.py) held "
    "against the llmapi model and the stand-in LLM API",
}
"""tests/unit modules that test what several modules do together (path under tests/unit: why)."""

OVERRIDES = {
    ("client", "e2e/test_real_language.py"): "e2e/conftest.py's OpenAI client, on this module's own "
    "SmolLM2 service instead of the shared demo service",
    ("http", "e2e/test_beam_packed.py"): "e2e/conftest.py's httpx client, on this module's own "
    "beam-packed service instead of the shared demo service",
}
"""Fixtures deliberately defined again below a conftest.py that defines them ((name, path under
tests): why): the same concept, pointed at what the module serves."""


def python_files(root: Path, pattern: str = "*.py") -> list[Path]:
    return sorted(path for path in root.rglob(pattern) if "__pycache__" not in path.parts)


def in_a_package(path: Path) -> bool:
    return (path.parent / "__init__.py").is_file()


def test_every_test_module_outside_a_package_has_a_unique_basename() -> None:
    names = Counter(path.name for path in python_files(TESTS, "test_*.py") if not in_a_package(path))
    assert not [name for name, count in names.items() if count > 1]


def test_every_folder_of_the_unit_tests_is_a_package() -> None:
    folders = {path.parent for path in python_files(TESTS / "unit")}
    assert not [
        str(folder.relative_to(TESTS)) for folder in sorted(folders) if not in_a_package(folder / "x")
    ]


# tests/unit mirrors the product


def product_folder(folder: Path) -> Path | None:
    """The product folder a folder of tests/unit tests (None: the repository as a whole)."""
    parts = folder.relative_to(TESTS / "unit").parts
    if parts and parts[0] in ROOMS:
        base = ROOMS[parts[0]]
        return None if base is None else base.joinpath(*parts[1:])
    return ROOT.joinpath("trtllm_service", *parts)


def module_named(test_name: str, folder: Path) -> str | None:
    """The module of `folder` (a product folder) that `test_<name>.py` names: the longest `_`-cut
    prefix of <name> that is a module or a package there, or the folder itself; else None."""
    words = test_name.removeprefix("test_").split("_")
    for cut in range(len(words), 0, -1):
        name = "_".join(words[:cut])
        if (folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file():
            return name
        if name == folder.name:
            return name
    return None


UNIT_TESTS = python_files(TESTS / "unit", "test_*.py")


def test_every_folder_of_the_unit_tests_is_a_room_of_the_product() -> None:
    missing = []
    for folder in sorted({path.parent for path in UNIT_TESTS}):
        product = product_folder(folder)
        if product is not None and not product.is_dir():
            missing.append(f"{folder.relative_to(TESTS)} (no {product.relative_to(ROOT)})")
    assert not missing


def test_every_unit_test_module_is_named_after_the_module_it_tests() -> None:
    unnamed = []
    for path in UNIT_TESTS:
        where = path.relative_to(TESTS / "unit").as_posix()
        product = product_folder(path.parent)
        if product is None or where in SEVERAL_MODULES:
            continue
        if module_named(path.stem, product) is None:
            unnamed.append(f"{where}: no module of {product.relative_to(ROOT)} named by it")
    assert not unnamed


def test_the_modules_said_to_test_several_are_there() -> None:
    assert not [where for where in SEVERAL_MODULES if not (TESTS / "unit" / where).is_file()]


def test_the_naming_rule_reads_names_as_modules() -> None:
    relay = ROOT / "trtllm_service" / "relay"
    assert module_named("test_flavors_beam_packed", relay) == "flavors"
    assert module_named("test_response_shape", relay) == "response_shape"
    assert module_named("test_relay", relay) == "relay"
    assert module_named("test_beam_packed_requests", relay) is None
    assert product_folder(TESTS / "unit" / "backend" / "standin") == ROOT / "tensorrtllm_backend" / "standin"
    assert product_folder(TESTS / "unit" / "api" / "openai") == ROOT / "trtllm_service" / "api" / "openai"
    assert product_folder(TESTS / "unit" / "repo") is None


# No test module imports another


def imported_test_modules(source: str) -> list[str]:
    """The test modules (`test_*`) that `source` imports, wherever and however it does."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[-1].startswith("test_")]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if (node.module or "").split(".")[-1].startswith("test_"):
                found.append(module)
            else:
                found += [f"{module}.{a.name}" for a in node.names if a.name.startswith("test_")]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).split(".")[-1].startswith("test_")
        ):
            found.append(str(node.args[0].value))
    return found


def test_no_test_module_imports_another() -> None:
    found = {
        str(path.relative_to(TESTS)): imported
        for path in python_files(TESTS, "test_*.py")
        if (imported := imported_test_modules(path.read_text()))
    }
    assert not found, "move what they share into a support module (tests/*_support.py) or a conftest.py"


def test_the_import_rule_finds_every_way_of_importing_a_test_module() -> None:
    for source in (
        "from tests.e2e.test_faults import alive",
        "import tests.unit.api.openai.test_serving",
        "import tests.unit.api.openai.test_serving as serving",
        "from .test_serving import post",
        "from tests.e2e import test_faults",
        "def f():\n    from tests.integration.test_llmapi import run\n",
        "import importlib\nimportlib.import_module('tests.e2e.test_faults')",
    ):
        assert imported_test_modules(source), source
    for source in (
        "from tests.faults_support import alive",
        "from tests.e2e.conftest import BentoService",
        "import pytest\nfrom tests.support import HARD_TEXT",
    ):
        assert not imported_test_modules(source), source


# One fixture per concept


def defined_fixtures(source: str) -> list[str]:
    """The names of the fixtures `source` defines (`@pytest.fixture`, `@fixture`, with or without
    arguments; `name=` gives the name)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            target = call.func if call is not None else decorator
            if ast.unparse(target).split(".")[-1] != "fixture":
                continue
            named = [k.value for k in (call.keywords if call else []) if k.arg == "name"]
            names.append(named[0].value if named and isinstance(named[0], ast.Constant) else node.name)
    return names


def fixture_definitions() -> dict[str, list[str]]:
    """Each fixture name defined under tests/, and where (paths under tests/)."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in python_files(TESTS):
        for name in defined_fixtures(path.read_text()):
            where[name].append(path.relative_to(TESTS).as_posix())
    return dict(where)


def defined_more_than_once(
    definitions: dict[str, list[str]], overrides: dict[tuple[str, str], str]
) -> dict[str, list[str]]:
    """The fixture names defined in more than one place, leaving out the listed overrides, and the
    overrides that override nothing (a stale entry is an error too)."""
    found = {}
    for name, places in definitions.items():
        kept = [place for place in places if (name, place) not in overrides]
        if len(kept) > 1:
            found[name] = kept
    for name, place in overrides:
        places = definitions.get(name, [])
        if place not in places or not any(p.endswith("conftest.py") for p in places if p != place):
            found[name] = [f"{place} (listed as an override of a conftest.py's fixture)"]
    return found


def test_each_fixture_is_defined_once() -> None:
    assert not defined_more_than_once(fixture_definitions(), OVERRIDES), (
        "define a shared fixture once in the nearest common conftest.py; a fixture of another concept "
        "takes another name"
    )


def test_the_fixture_rule_finds_fixtures_and_refuses_a_second_definition() -> None:
    source = (
        "import pytest\nfrom pytest import fixture\n\n"
        "@pytest.fixture\ndef a(): ...\n\n"
        "@pytest.fixture(scope='module', name='b')\ndef _b(): ...\n\n"
        "@fixture\nasync def c(): ...\n\n"
        "def d(): ...\n\n"
        "class TestX:\n    @pytest.fixture(autouse=True)\n    def e(self): ...\n"
    )
    assert defined_fixtures(source) == ["a", "b", "c", "e"]
    twice = {"tokenizer": ["conftest.py", "unit/test_x.py"], "once": ["conftest.py"]}
    assert defined_more_than_once(twice, {}) == {"tokenizer": ["conftest.py", "unit/test_x.py"]}
    assert defined_more_than_once(twice, {("tokenizer", "unit/test_x.py"): "why"}) == {}
    assert defined_more_than_once({"x": ["unit/a/test_a.py", "unit/b/test_b.py"]}, {}) == {
        "x": ["unit/a/test_a.py", "unit/b/test_b.py"]
    }
    assert "gone" in defined_more_than_once(twice, {("gone", "unit/test_x.py"): "stale"})
    assert "x" in defined_more_than_once(  # an override of no conftest's fixture
        {"x": ["unit/a/test_a.py", "unit/b/test_b.py"]}, {("x", "unit/b/test_b.py"): "why"}
    )
