"""What pack_model.py says while it works: one line on stderr per phase, and a bar where it counts.

Packing SmolLM2 printed nothing for 81 s on a loaded machine (reading its GGUF file, converting its
tensors, importing transformers for the tokenizer). Each phase now starts with a line
(`pack_model: reading ...`), the GGUF conversion counts its tensors on a progress bar when stderr is a
terminal (as the copy into the model store counts bytes), and the pack ends with `packed in N s`.
`--quiet` turns the lines and bars off.
"""

from __future__ import annotations

import sys
import time

PROG = "pack_model"
"""The name the command's lines start with."""

_on: list[float] = []  # the pack's start, while phases are said


def start(enabled: bool) -> None:
    """Phases are said from here on (unless `enabled` is false: `--quiet`)."""
    _on[:] = [time.monotonic()] if enabled else []


def enabled() -> bool:
    return bool(_on)


def say(what: str) -> None:
    """One line on stderr: `pack_model: <what>`."""
    if _on:
        print(f"{PROG}: {what}", file=sys.stderr, flush=True)


def done(what: str) -> None:
    """The last line: `pack_model: <what> in N s` (time since `start`)."""
    if _on:
        say(f"{what} in {time.monotonic() - _on[0]:.0f} s")
