"""Every `# type: ignore` in the repository names its error codes and says why on its line (issue 45:
types checked in CI), e.g. `# type: ignore[attr-defined]  # bentoml's stub lacks X`. mypy itself
(`./dev.sh types`) refuses an ignore without a code (ignore-without-code) and one no longer needed
(warn_unused_ignores) in what it checks; this test adds the reason, everywhere, tests and bench too."""

from __future__ import annotations

import io
import os
import re
import tokenize
from pathlib import Path

from tests.support import REPO_ROOT

ROOT = REPO_ROOT
SKIPPED = {"build", "dist", "bentoml_home", "__pycache__", "node_modules"}
"""Folders of generated or installed files (as .gitignore lists them), besides hidden ones (.venv)."""

IGNORE = re.compile(r"type:\s*ignore", re.IGNORECASE)
EXPLAINED = re.compile(r"type: ignore\[[a-z0-9-]+(?:, ?[a-z0-9-]+)*\]  # \S")
"""The one accepted form: the codes, two spaces, then the reason as its own comment."""


def source_files() -> list[Path]:
    files = []
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = sorted(
            name for name in subfolders if not name.startswith(".") and name not in SKIPPED
        )
        files += [Path(folder, name) for name in sorted(names) if name.endswith((".py", ".pyi"))]
    return files


def unexplained_ignores(source: str) -> list[tuple[int, str]]:
    """(line, comment) of each `type: ignore` comment in `source` without codes or a reason (comments
    only: a string that mentions one is not one)."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        match = IGNORE.search(token.string)
        if match is not None and not EXPLAINED.match(token.string, match.start()):
            found.append((token.start[0], token.string))
    return found


def test_the_check_finds_bare_and_unexplained_ignores() -> None:
    source = (
        "a = 1  # type: ignore\n"
        "b = 2  # type: ignore[attr-defined]\n"
        "c = 3  # type:ignore[attr-defined]  # spelled otherwise\n"
        "d = 4  # type: ignore[attr-defined] (a reason, not as a comment)\n"
        "e = 5  # noqa: E501  # type: ignore[arg-type]\n"
        "f = 6  # type: ignore[union-attr,index]  # two codes, one reason\n"
        "g = 7  # type: ignore[arg-type]  # the reason\n"
        "h = '# type: ignore'\n"
    )
    assert [line for line, _ in unexplained_ignores(source)] == [1, 2, 3, 4, 5]


def test_every_type_ignore_names_its_codes_and_why() -> None:
    files = source_files()
    assert ROOT / "service.py" in files and ROOT / "stubs" / "triton_python_backend_utils.pyi" in files
    assert any(path.name == "model.py" for path in files), "the Triton models are scanned too"
    bare = [
        f"{path.relative_to(ROOT)}:{line}: {comment}"
        for path in files
        for line, comment in unexplained_ignores(path.read_text(encoding="utf-8"))
    ]
    assert not bare, (
        "a type: ignore needs its codes and a reason (`# type: ignore[code]  # why`):\n" + "\n".join(bare)
    )


def test_mypy_refuses_ignores_without_codes_and_unneeded_ones() -> None:
    config = (
        (ROOT / "pyproject.toml").read_text().split("\n[tool.mypy]\n", 1)[1].split("\n[[tool.mypy.", 1)[0]
    )
    assert re.search(r"^warn_unused_ignores = true$", config, re.MULTILINE), config
    assert re.search(r'^enable_error_code = \[[^]]*"ignore-without-code"', config, re.MULTILINE), config
