"""What a stopped Triton leaves in /dev/shm is removed by prefix: its own regions, no other's; what
the Triton of a killed owner left is swept by the next owner: only those regions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

from tensorrtllm_backend import launcher
from tests.support import wait_for
from trtllm_service.triton.shm import owner_tag, region_prefixes, remove_regions, sweep_orphaned_regions


def test_the_launchers_prefixes_are_read_and_only_their_regions_removed(tmp_path: Path) -> None:
    args = launcher.build_parser().parse_args(["--model_repo", str(tmp_path), "--world_size", "2"])
    install = launcher.TritonInstall(binary="/bin/tritonserver", backend_dir=None)
    command = launcher.build_command(args, install, unique=77, mpirun="mpirun", python="python3")
    assert region_prefixes(command) == ["prefix0_77_", "prefix1_77_"]
    ours = ["prefix0_77_123_ab-cd", "prefix1_77_456_ef"]
    others = ["prefix0_771_9_x", "prefix0_7_77_y", "prefix2_77_z", "unrelated"]
    for name in ours + others:
        (tmp_path / name).write_bytes(b"\0" * 16)
    assert sorted(remove_regions(command, tmp_path)) == ours
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == sorted(others)


HOLDER = """
import mmap, os, sys, time
mapped, held = sys.argv[1], sys.argv[2]
with open(mapped, "r+b") as f:
    view = mmap.mmap(f.fileno(), 16)
fd = os.open(held, os.O_RDONLY)
print("holding", flush=True)
time.sleep(60)
"""


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(done.stdout)


def test_the_regions_of_a_killed_owner_are_swept_and_nothing_else(tmp_path: Path) -> None:
    """Real regions (files in a folder standing for /dev/shm), real processes: an owner that is gone
    leaves regions under its tag (`owner_tag`, the prefix the service gives the launcher), as does
    one killed but not yet reaped (a zombie); the next sweep removes them, unless a live process
    maps or holds one, or the tag is another namespace's, a live owner's, or not a tag."""
    namespace = os.stat("/proc/self/ns/pid").st_ino
    assert owner_tag() == f"{namespace}-{os.getpid()}"
    dead = _dead_pid()
    args = launcher.build_parser().parse_args(["--model_repo", str(tmp_path), "--world_size", "2"])
    install = launcher.TritonInstall(binary="/bin/tritonserver", backend_dir=None)
    command = launcher.build_command(args, install, unique=owner_tag(dead), mpirun="mpirun", python="python3")
    rank0, rank1 = region_prefixes(command)
    shm = tmp_path / "shm"
    shm.mkdir()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # killed, not yet reaped by its parent
    orphans = [f"{rank0}9f2c-aa", f"{rank1}77d1-bb", f"prefix0_{owner_tag(zombie.pid)}_zz"]
    kept = [
        f"{rank0}mapped",  # mapped by a live process
        f"{rank0}held",  # open in a live process
        f"prefix0_{owner_tag()}_live",  # its owner is alive
        f"prefix0_{namespace + 1}-{dead}_other",  # another pid namespace: its pids mean nothing here
        f"prefix0_{dead}_untagged",  # a prefix of before the tag
        "unrelated",
    ]
    for name in orphans + kept:
        (shm / name).write_bytes(b"\0" * 16)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(shm / f"{rank0}mapped"), str(shm / f"{rank0}held")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        assert wait_for(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, 10)
        swept = sweep_orphaned_regions(shm)
        assert sorted(swept.removed) == sorted(orphans)
        assert sorted(swept.in_use) == [f"{rank0}held", f"{rank0}mapped"]  # left for a later sweep
        assert sorted(p.name for p in shm.iterdir()) == sorted(kept)
    finally:
        holder.kill()
        holder.wait()
        zombie.wait()
    # their holder gone, the regions it mapped and held are orphans too
    swept = sweep_orphaned_regions(shm)
    assert (sorted(swept.removed), swept.in_use) == ([f"{rank0}held", f"{rank0}mapped"], [])
    assert sorted(p.name for p in shm.iterdir()) == sorted(kept[2:])
