"""Triton's output reaches triton.log and the service log whatever it holds, and is always drained.

A Python-backend model once logged a 940 KB line (an engine error that echoed a client's grammar):
the service's copy of Triton's output read lines with asyncio's readline (64 KiB limit), died on it,
and from then on nobody read Triton's output. Triton blocked on its next log write, inside a stub's
log request, and the whole model froze. These run a real child process in place of Triton.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from trtllm_service.triton.process import LOG_LINE_LIMIT, LineCutter, TritonProcess


def test_line_cutter_splits_and_cuts_long_lines() -> None:
    cutter = LineCutter(limit=8)
    assert cutter.feed(b"short\nabcdefghij") == [b"short\n"]
    assert cutter.feed(b"klmnop") == []
    assert cutter.feed(b"q\nlast") == [b"abcdefgh ... (9 more bytes cut by the service)\n"]
    assert cutter.flush() == [b"last\n"]
    assert cutter.flush() == []


def test_line_cutter_keeps_lines_within_the_limit_whole() -> None:
    cutter = LineCutter(limit=5)
    assert cutter.feed(b"12345\n\n123") == [b"12345\n", b"\n"]
    assert cutter.feed(b"45\n") == [b"12345\n"]


def test_a_megabyte_line_neither_stops_the_copy_nor_blocks_the_child(tmp_path: Path) -> None:
    # 4 MB on one line is more than the socket between the two can hold: a child whose output
    # is not read blocks on it and never exits.
    script = (
        "import sys; sys.stdout.write('E1128 big ' + 'x' * 4_000_000 + '\\n'); "
        "sys.stdout.write('I1128 after the long line\\n'); sys.stdout.flush()"
    )

    async def run() -> TritonProcess:
        triton = TritonProcess([sys.executable, "-c", script], {}, tmp_path / "triton.log")
        await triton.start()
        code = await asyncio.wait_for(triton.exited(), 20)
        await triton.output_done()
        assert code == 0
        return triton

    triton = asyncio.run(run())
    assert triton.tail[-1] == "I1128 after the long line"
    long_line = triton.tail[-2]
    assert long_line.startswith("E1128 big xxx") and long_line.endswith("cut by the service)")
    assert len(long_line) < LOG_LINE_LIMIT + 100
    assert triton.errors[-1] == long_line  # still seen as Triton's error line
    text = (tmp_path / "triton.log").read_text()
    assert text.endswith("I1128 after the long line\n") and len(text) < LOG_LINE_LIMIT + 200
