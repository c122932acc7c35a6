"""The shared memory of a stopped Triton's Python backend, removed.

Each Python-backend model instance talks to its stub process through a POSIX shared-memory region,
`/dev/shm/<prefix><pid>_<uuid>` (the prefix is the `shm-region-prefix-name` on tritonserver's
command line: the launcher makes it one per service worker and rank). A Triton that is killed (a
crash, a stall, a stop past its timeout) never unlinks its regions: 1-3 MB each, kept until the
machine restarts, one more with every restart. Once a run has stopped, its owner removes what is
left under that run's own prefixes, and nothing else.

An owner that is itself killed (SIGKILL, the OOM killer) removes nothing. So each owner's prefix
carries its pid namespace and pid (`owner_tag`), and the next owner to start, in any service on the
host, removes the regions whose owner was of its own pid namespace and is gone, once no process it
can see maps or holds them (`sweep_orphaned_regions`). The namespace is what makes this safe where
containers share /dev/shm (`--ipc=host`, common for Triton): a pid only means something in its own
namespace, and regions of another namespace are never touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from tensorrtllm_backend import launcher

logger = logging.getLogger("trtllm_service.triton")

SHM_DIR = Path("/dev/shm")
PROC_DIR = Path("/proc")
PREFIX_OPTION = "shm-region-prefix-name="
_OWNED = re.compile(r"prefix\d+_(\d+)-(\d+)_")
"""A region under the launcher's prefix (`prefix<rank>_<unique>_`) whose `unique` is an `owner_tag`."""


def region_prefixes(command: Sequence[str]) -> list[str]:
    """The Python backend's shared-memory prefixes a Triton command line sets (one per rank)."""
    found = []
    for arg in command:
        if PREFIX_OPTION in arg:
            prefix = arg.split(PREFIX_OPTION, 1)[1].split(",", 1)[0]
            if prefix and "/" not in prefix:
                found.append(prefix)
    return found


def remove_regions(command: Sequence[str], shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlinks the shared-memory regions left by the stopped Triton that `command` started; the
    names removed. A process that still maps one keeps its memory until it exits."""
    removed = []
    for prefix in region_prefixes(command):
        for region in shm_dir.glob(f"{prefix}*"):
            with contextlib.suppress(OSError):
                region.unlink()
                removed.append(region.name)
    if removed:
        logger.debug("removed %d shared-memory regions of a stopped Triton: %s", len(removed), removed)
    return removed


def owner_tag(pid: int | None = None) -> str:
    """What goes into the prefix of the regions of the Triton this process owns (the launcher's
    `unique`): `<pid namespace inode>-<pid>` (the namespace 0 where /proc does not show it)."""
    return f"{_pid_namespace()}-{os.getpid() if pid is None else pid}"


def _pid_namespace() -> int:
    try:
        return os.stat(PROC_DIR / "self" / "ns" / "pid").st_ino
    except OSError:
        return 0


class Sweep(NamedTuple):
    """What a sweep removed, and the orphans it left because a process still maps or holds them
    (the stubs of a killed Triton outlive it for a few seconds)."""

    removed: list[str]
    in_use: list[str]


def sweep_orphaned_regions(shm_dir: Path = SHM_DIR, proc_dir: Path = PROC_DIR) -> Sweep:
    """Unlinks the regions of Tritons whose owner was killed: tagged with this process's pid
    namespace (`owner_tag`), their owner's pid gone, and mapped or held open by no process this one
    can see."""
    namespace = _pid_namespace()
    if not namespace:
        return Sweep([], [])
    orphans = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(shm_dir):
            owned = _OWNED.match(entry.name)
            if owned and int(owned.group(1)) == namespace and not _alive(int(owned.group(2))):
                orphans.append(entry.name)
    if not orphans:
        return Sweep([], [])
    used = _regions_in_use(shm_dir, proc_dir)
    removed, in_use = [], []
    for name in orphans:
        if name in used:
            in_use.append(name)
            continue
        with contextlib.suppress(OSError):
            (shm_dir / name).unlink()
            removed.append(name)
    if removed:
        logger.info(
            "removed %d shared-memory regions in %s that Tritons of killed owners left (their owners' "
            "pids are gone and nothing maps them)",
            len(removed),
            shm_dir,
        )
    return Sweep(removed, in_use)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: a killed owner stays one until its parent reaps it)."""
    if pid <= 0:
        return True  # not a pid: leave its regions alone
    if not launcher.pid_alive(pid):
        return False
    fields = launcher.proc_stat(pid)
    return fields is None or not fields or fields[0] not in (b"Z", b"X")


def _regions_in_use(shm_dir: Path, proc_dir: Path) -> set[str]:
    """The names in `shm_dir` that a process this one can read maps or holds open."""
    where = f"{shm_dir}/"
    mapped = os.fsencode(where)
    used: set[str] = set()
    pids: list[str] = []
    with contextlib.suppress(OSError):
        pids = [entry.name for entry in os.scandir(proc_dir) if entry.name.isdigit()]
    for pid in pids:
        maps = b""
        with contextlib.suppress(OSError):
            maps = (proc_dir / pid / "maps").read_bytes()
        if mapped in maps:  # most processes map nothing there: one search of the whole file
            for line in maps.splitlines():
                at = line.find(mapped)
                if at >= 0:
                    used.add(os.fsdecode(line[at + len(mapped) :].split(b" ", 1)[0]))
        with contextlib.suppress(OSError):
            for fd in os.scandir(proc_dir / pid / "fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target.startswith(where):
                        used.add(target[len(where) :].split(" ", 1)[0])
    return used
