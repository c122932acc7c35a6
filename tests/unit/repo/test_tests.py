"""Test modules need unique basenames: the test folders are not packages, so pytest imports each
module by its basename and stops the whole run at collection when two share one (this happened
twice in one session)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_basename_is_unique() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py") if "__pycache__" not in path.parts)
    assert not [name for name, count in names.items() if count > 1]
