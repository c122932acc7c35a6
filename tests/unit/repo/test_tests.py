"""The tests' own layout. A test module outside a package is imported by its basename, and pytest
stops the whole run at collection when two share one (this happened twice in one session): those
basenames are unique. tests/unit is packages all the way down, so its modules may share names
across rooms (`api/openai/test_protocol.py`, `api/anthropic/test_protocol.py`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[2]


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
