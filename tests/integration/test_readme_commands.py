"""The commands of the README and the docs work as written in a new shell after the two quick-start
commands (issue 44: "Serving your own model" assumed an activated .venv: `bentoml: command not found`, and
`python -m trtllm_service.packing.demo_model` failed with "No module named 'safetensors'").

Each section is run in a clean shell (`env -i`, the system's PATH, a HOME of its own), from the
project's directory, its commands in order. A command that would pack a model that is not here,
serve, build or deploy runs as `--help` instead (the program and module it names must be there);
the demo checkpoint is made for real, into a temp dir.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = (
    ("README.md", "## Serving your own model"),
    ("docs/own-models.md", None),
    ("docs/architecture.md", "## The Triton side on its own"),
)
RUN_AS_WRITTEN = "trtllm_service.packing.demo_model"


def bash_commands(page: str, heading: str | None) -> list[str]:
    """The commands of the ```bash blocks under `heading` in `page` (to the next heading of its level
    or above; the whole page when None), continuations joined, comments dropped."""
    body = (ROOT / page).read_text()
    if heading:
        level = heading.split(" ", 1)[0]
        body = body.split(f"\n{heading}\n", 1)[1]
        body = re.split(rf"\n#{{1,{len(level)}}} ", body, maxsplit=1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", body, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def probe(command: str, scratch: Path) -> str:
    """What the test runs for one README command (see the module docstring)."""
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words.pop(0)  # TRTLLM_MODEL=... : the environment of the command, not the command
    program = words[0]
    if program == "source":
        return command
    if program == "python" and words[1:3] == ["-m", RUN_AS_WRITTEN]:
        return shlex.join([*words[:3], str(scratch / "demo")])
    if program == "python" and words[1] == "-m":
        return shlex.join([*words[:3], "--help"])
    if program == "python" and words[1] == "-c":
        return "python -c 'import tensorrtllm_backend.repository'"
    if program == "python":
        return shlex.join([*words[:2], "--help"])
    if program == "bentoml":
        sub = [w for w in words[1:4] if re.fullmatch(r"[a-z][a-z-]*", w)]
        return shlex.join([program, *sub, "--help"])
    return f"command -v {shlex.quote(program)}"


@pytest.mark.parametrize(("page", "heading"), SECTIONS)
def test_each_command_runs_in_a_new_shell(page: str, heading: str | None, tmp_path: Path) -> None:
    commands = bash_commands(page, heading)
    assert commands and commands[0] == "source .venv/bin/activate", commands[:2]
    script = ["set -u"]
    for command in commands:
        script.append(
            f"{probe(command, tmp_path)} >/dev/null 2>{tmp_path}/err || "
            f"{{ echo {shlex.quote('FAILED: ' + command)}; cat {tmp_path}/err; exit 1; }}"
        )
    clean = {"HOME": str(tmp_path), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    clean["BENTOML_DO_NOT_TRACK"] = "true"  # no usage report from `--help`
    done = subprocess.run(
        ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in clean.items()), "bash", "--noprofile", "--norc"],
        input="\n".join(script),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
