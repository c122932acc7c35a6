"""Copying the source files into the model: chunked, with a progress bar, once the disk has room."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtllm_service.packed_model import PackError

_COPY_CHUNK = 16 * 1024 * 1024


class Progress:
    """A progress bar on stderr (tqdm), of bytes unless `unit` says what it counts; silent when
    disabled or stderr is not a terminal."""

    def __init__(self, total: int, enabled: bool, *, unit: str = "B", desc: str = "packing") -> None:
        self._bar: Any = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            scale: dict[str, Any] = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
            self._bar = tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, **scale)

    def update(self, count: int) -> None:
        if self._bar is not None:
            self._bar.update(count)

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _copy_one(source: Path, target: Path, progress: Progress) -> None:
    """Chunked copy (so the progress bar moves within multi-GB engine files)."""
    progress.describe(source.name)
    with open(source, "rb") as reader, open(target, "wb") as writer:
        while chunk := reader.read(_COPY_CHUNK):
            writer.write(chunk)
            progress.update(len(chunk))


def copy_files(copies: Sequence[tuple[Path, Path]], progress: Progress) -> None:
    for source, target in copies:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            _copy_one(source, target, progress)
        except OSError as exc:
            raise PackError(f"copying {str(source)!r}: {exc.strerror or exc}") from exc


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_space(total: int, store_dir: Path) -> None:
    """BentoML writes the model to a temp dir, then copies it into the store: both need room."""
    tmp = Path(tempfile.gettempdir())
    store = _nearest_existing(store_dir)
    need = {tmp: total, store: total}
    if tmp.stat().st_dev == store.stat().st_dev:
        need = {store: 2 * total}
    for path, size in need.items():
        free = shutil.disk_usage(path).free
        if free < size:
            raise PackError(
                f"not enough disk space on {str(path)!r}: {readable_size(size)} needed, {readable_size(free)} free "
                "(BentoML stages the model in $TMPDIR, then copies it into $BENTOML_HOME)"
            )


def readable_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.1f} TiB"


def directory_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
