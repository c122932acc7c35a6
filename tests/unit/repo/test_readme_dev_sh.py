"""What docs/architecture.md says `./dev.sh test` installs is what dev.sh installs (issue 44: the README
the thirteen Debian packages), and how long the suite takes."""

from __future__ import annotations

import re

from tests.support import REPO_ROOT

ROOT = REPO_ROOT


def dev_sh_packages() -> set[str]:
    body = (ROOT / "dev.sh").read_text().split("ensure_system_packages() {", 1)[1].split("\n}\n", 1)[0]
    return {name for group in re.findall(r"missing\+=\(([^)]*)\)", body) for name in group.split()}


def readme_tests_section() -> str:
    return (ROOT / "docs" / "architecture.md").read_text().split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_names_every_package_dev_sh_installs() -> None:
    packages = dev_sh_packages()
    rows = [line for line in readme_tests_section().splitlines() if line.startswith("| `") and " | " in line]
    named = {name for row in rows for name in re.findall(r"`([a-z0-9-]+)`", row.split(" | ")[0])}
    assert packages <= named, packages - named


def test_the_readme_says_how_long_the_suite_runs_and_offers_less() -> None:
    section = readme_tests_section()
    assert re.search(r"whole suite takes \d+-\d+ minutes on 2 cores", section), section[:600]
    for subset in ("./dev.sh test tests/unit", '-m "not stress and not image"', "./dev.sh test -m image"):
        assert subset in section, subset
