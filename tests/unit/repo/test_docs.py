"""The documentation holds together: every relative link in README.md, docs/*.md and bench/README.md
points at a file of the repository, every `#anchor` at a heading of its page (by GitHub's rules),
bench/results keeps only the runs those pages cite, and the README stays a front page of at most
20 KB."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.support import REPO_ROOT

ROOT = REPO_ROOT
README_LIMIT = 20_000  # bytes
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def pages() -> list[Path]:
    """The Markdown pages whose links must resolve."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]


def prose_lines(text: str) -> list[str]:
    """The lines of `text` outside fenced code blocks, with inline code spans blanked."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(CODE_SPAN.sub("", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: markup dropped, lower case, punctuation dropped (letters,
    digits, `_`, `-` and spaces stay), each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").lower()
    text = "".join(c for c in text if c.isalnum() or c in "_- ")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor on a page, duplicates numbered -1, -2, ... in order as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[str]:
    """The targets of a page's inline and reference-style links and images, outside code."""
    targets = []
    for line in prose_lines(text):
        targets += INLINE_LINK.findall(line)
        reference = REFERENCE_LINK.match(line)
        if reference:
            targets.append(reference.group(1))
    return targets


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """What on `page` does not resolve: a relative link to no file of `root`, or an anchor that no
    heading of its target page makes."""
    problems = []
    for target in links(page.read_text()):
        if not target or SCHEME.match(target) or target.startswith("//"):
            continue  # an external address: not checked here
        path, _, anchor = target.partition("#")
        resolved = (page.parent / unquote(path)).resolve() if path else page
        if not resolved.is_relative_to(root.resolve()) or not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and (resolved.suffix != ".md" or unquote(anchor) not in anchors(resolved.read_text())):
            problems.append(f"{target}: no heading makes #{anchor}")
    return problems


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_every_result_kept_is_behind_a_cited_figure() -> None:
    """bench/results keeps only the runs a page links (a run's .json beside its linked .md counts)."""
    cited = set()
    for page in pages():
        for target in links(page.read_text()):
            path = (page.parent / unquote(target.partition("#")[0])).resolve()
            if path.parent == (ROOT / "bench" / "results").resolve():
                cited.add(path.stem)
    kept = {path.stem for path in (ROOT / "bench" / "results").iterdir()}
    assert kept - cited == set(), "results no page links: drop them, or cite the figure they hold"


def test_the_readme_is_a_front_page() -> None:
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_LIMIT, f"README.md is {size} bytes; move detail to docs/"


def test_the_docs_pages_exist_and_the_readme_links_each() -> None:
    readme = (ROOT / "README.md").read_text()
    for name in ("api", "own-models", "tuning", "operations", "architecture"):
        assert (ROOT / "docs" / f"{name}.md").is_file(), name
        assert f"(docs/{name}.md" in readme, name


def test_anchors_follow_githubs_rules() -> None:
    page = "# Under load, faults and hostile input\n## NVIDIA's contract\n## `bench/box/suite.sh`\n"
    page += "```\n# a comment, not a heading\n```\n## Tests\n## Tests\n### Tests\n## Snake_case and 1.2.1\n"
    assert anchors(page) == {
        "under-load-faults-and-hostile-input",
        "nvidias-contract",
        "benchboxsuitesh",
        "tests",
        "tests-1",
        "tests-2",
        "snake_case-and-121",
    }


def test_a_broken_link_or_anchor_is_caught(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## A section, at last\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# Title\n\n[fine](docs/other.md#a-section-at-last) [fine](#title) [web](https://example.com/x#y)\n"
        "[gone](docs/missing.md) [bad anchor](docs/other.md#a-section) [bad here](#nowhere)\n"
        "`[in code](docs/missing.md)`\n\n```\n[in a block](docs/missing.md)\n```\n\n[ref]: docs/gone.md\n"
    )
    assert broken_links(page, tmp_path) == [
        "docs/missing.md: no such file",
        "docs/other.md#a-section: no heading makes #a-section",
        "#nowhere: no heading makes #nowhere",
        "docs/gone.md: no such file",
    ]
