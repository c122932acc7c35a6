"""LoRA adapters loaded while serving (vLLM's /v1/load_lora_adapter): where one may come from, the
checks made before anything changes, and the one set every worker sees.

The set lives in the run directory, which every worker shares and which outlives a Triton restart:
`loras/registry.json` (name -> id and files), changed under an exclusive flock and replaced whole
(os.replace), and read again by a worker whenever it was replaced (one stat per lookup of a name that is
not packed). A loaded adapter's PEFT files are copied into `loras/<id>/` with its TensorRT-LLM rows
before it is listed, so the engine reads the files that were checked, never ones changed since, and a
refused load leaves nothing behind. Ids are never reused (the engines cache adapters by id), so a
replacement (`load_inplace`) gets a new one. An unloaded adapter's files stay until no request can still
use them (the stream timeout): requests in flight finish, and their weights can be sent again.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorrtllm_backend.lora import (
    HF_TO_TRTLLM,
    NAME,
    Adapter,
    LoraError,
    check_limits,
    read_peft,
    write_adapter,
)
from tensorrtllm_backend.repository import FLAVORS
from trtllm_service.packed_model import LORA_DIR, PackInfo, engine_config, llm_args, lora_base_config

REGISTRY = "registry.json"
LLM_API_MAX_LORA_RANK = 64
"""LoraConfig's max_lora_rank when model.yaml does not say (TensorRT-LLM's default)."""
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z0-9_.-]+)?$")
"""A BentoML model tag, name[:version]."""


@dataclass(frozen=True)
class LoraLimits:
    """What a loaded adapter must fit: the packed model's shape, its LoRA set-up as the packed model
    itself records it (`max_lora_rank` and target modules: model.yaml's lora_config for the LLM API, a
    C++ engine's build_config) and the dtype its rows are sent in. `unavailable`: why none can be
    loaded (None: they can)."""

    base_config: dict[str, Any]
    max_rank: int
    modules: tuple[str, ...]
    dtype: str
    unavailable: str | None = None

    @classmethod
    def of_pack(cls, model_path: Path, info: PackInfo) -> LoraLimits:
        config = engine_config(model_path)
        python = info.backend == "python"
        base = lora_base_config(config, python)
        if not python:
            lora = (config.get("build_config") or {}).get("lora_config") or {}
            plugin = ((config.get("build_config") or {}).get("plugin_config") or {}).get("lora_plugin")
            modules = tuple(lora.get("lora_target_modules") or ())
            why = (
                None if plugin else "this engine was built without LoRA support (trtllm-build --lora_plugin)"
            )
            return cls(base, int(lora.get("max_lora_rank") or 0), modules, info.dtype, why)
        if FLAVORS[info.flavor].llm_api:
            lora = llm_args(model_path).get("lora_config")
            if not isinstance(lora, dict):
                why = (
                    "this model was packed without LoRA support; pack it with --max-lora-rank R (the "
                    "largest rank loaded adapters may have), or with adapters (--lora NAME=DIR)"
                )
                return cls(base, 0, (), info.dtype, why)
            rank = int(lora.get("max_lora_rank") or LLM_API_MAX_LORA_RANK)
            return cls(base, rank, tuple(lora.get("lora_target_modules") or ()), info.dtype)
        # the ensemble's reference engine on a checkpoint stands in for an engine built with the packed
        # adapters (trtllm-build --lora_dir): their largest rank, their modules
        if not info.loras:
            why = (
                "this model was packed without LoRA adapters; pack at least one (pack_model.py --lora "
                "NAME=DIR): their largest rank and their modules are what loaded adapters may use"
            )
            return cls(base, 0, (), info.dtype, why)
        rank = max(int(entry.get("rank") or 0) for entry in info.loras.values())
        packed = {HF_TO_TRTLLM[m] for entry in info.loras.values() for m in entry.get("target_modules") or ()}
        return cls(base, rank, tuple(sorted(packed)), info.dtype)

    def check(self, directory: Path) -> Adapter:
        """The adapter in `directory`, read and checked (LoraError naming what does not fit)."""
        if self.unavailable:
            raise LoraError(self.unavailable)
        adapter = read_peft(directory, self.base_config)
        check_limits(adapter, self.max_rank, self.modules)
        return adapter


def resolve_source(lora_path: str, root: Path | None) -> Path:
    """The adapter directory `lora_path` names: a directory under `root` (relative to it, or absolute;
    no `..`, and no symlink that leads out of it), else a BentoML model tag; LoraError otherwise."""
    if not lora_path:
        raise LoraError("lora_path is empty")
    given = Path(lora_path)
    if ".." in given.parts:
        raise LoraError(f"lora_path {lora_path!r}: '..' is not allowed")
    if root is not None:
        base = root.resolve()
        candidate = (given if given.is_absolute() else base / given).resolve()
        if not candidate.is_relative_to(base):
            raise LoraError(f"lora_path {lora_path!r} is outside TRTLLM_LORA_ROOT")
        if candidate.is_dir():
            return candidate
        if candidate.exists():
            raise LoraError(f"lora_path {lora_path!r} is not a directory")
    if not given.is_absolute() and _TAG.match(lora_path):
        found = _model_store_path(lora_path)
        if found is not None:
            return found
    if root is None:
        raise LoraError(
            f"lora_path {lora_path!r}: no BentoML model has that tag, and directories are taken only "
            "under TRTLLM_LORA_ROOT (unset)"
        )
    raise LoraError(f"lora_path {lora_path!r}: no such directory under TRTLLM_LORA_ROOT, nor BentoML model")


def _model_store_path(tag: str) -> Path | None:
    import bentoml
    from bentoml.exceptions import BentoMLException

    try:
        return Path(bentoml.models.get(tag).path).resolve()
    except (BentoMLException, ValueError):
        return None


class LoadRefused(LoraError):
    """A load the set itself refuses (the name is taken), as vLLM words it."""


class NotLoaded(LoraError):
    """An unload of a name that is not loaded, as vLLM words it."""


class SharedAdapters(Mapping[str, Mapping[str, Any]]):
    """Every adapter a request may name: the packed ones (fixed) and the loaded ones (the run
    directory's registry, shared by the workers). An entry: `id` (the engine's cache key), `dir` (its
    files), `loaded` (True for a loaded one), rank and target modules."""

    def __init__(self, packed: Mapping[str, Mapping[str, Any]], model_path: Path, run_dir: Path) -> None:
        self._packed = {
            name: {**entry, "dir": str(model_path / LORA_DIR / name)} for name, entry in packed.items()
        }
        self.directory = run_dir / LORA_DIR
        self._first_id = max((int(entry["id"]) for entry in packed.values()), default=0) + 1
        self._loaded: dict[str, dict[str, Any]] = {}
        self._seen: tuple[int, int, int] | None = None

    # ---- reading: every worker, per request ----------------------------------------------------------

    def _refresh(self) -> None:
        try:
            stat = os.stat(self.directory / REGISTRY)
        except FileNotFoundError:
            self._loaded, self._seen = {}, None
            return
        seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if seen != self._seen:
            self._loaded = dict(self._read()["adapters"])
            self._seen = seen

    def _read(self) -> dict[str, Any]:
        try:
            state = json.loads((self.directory / REGISTRY).read_text())
        except FileNotFoundError:
            state = {}
        state.setdefault("next_id", self._first_id)
        state.setdefault("adapters", {})
        state.setdefault("unloaded", {})
        return state

    def loaded(self) -> dict[str, dict[str, Any]]:
        """The loaded adapters now, by name."""
        self._refresh()
        return dict(self._loaded)

    def is_packed(self, name: str) -> bool:
        return name in self._packed

    def __getitem__(self, name: str) -> Mapping[str, Any]:
        if name in self._packed:
            return self._packed[name]
        self._refresh()
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        self._refresh()
        return iter([*self._packed, *(n for n in self._loaded if n not in self._packed)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    # ---- changing: one worker at a time, under the lock ----------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "registry.lock", "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield self._read()
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _write(self, state: dict[str, Any]) -> None:
        staged = self.directory / f".{REGISTRY}.{os.getpid()}"
        staged.write_text(json.dumps(state, indent=1))
        os.replace(staged, self.directory / REGISTRY)
        self._seen = None

    def load(
        self,
        name: str,
        source: Path,
        adapter: Adapter,
        dtype: str,
        *,
        given: str,
        replace: bool,
        keep_s: float,
    ) -> dict[str, Any]:
        """Lists `adapter` (checked, from `source`, which the client named `given`) under `name` with
        its files copied, and returns its entry; LoadRefused when the name is loaded already and
        `replace` is false. Blocking: run it in a thread."""
        with self._locked() as state:
            if name in state["adapters"] and not replace:
                raise LoadRefused(already_loaded(name))
            new_id = int(state["next_id"])
            state["next_id"] = new_id + 1
            target = self.directory / str(new_id)
            staged = self.directory / f".{new_id}.staged"
            shutil.rmtree(staged, ignore_errors=True)
            staged.mkdir()
            try:
                write_adapter(adapter, source, staged, dtype)
                os.rename(staged, target)
            except BaseException:
                shutil.rmtree(staged, ignore_errors=True)
                raise
            old = state["adapters"].get(name)
            if old is not None:
                state["unloaded"][str(old["id"])] = time.time()
            entry = {
                "id": new_id,
                "dir": str(target),
                "loaded": True,
                "created": int(time.time()),
                "source": given,  # as the client named it: /v1/models' root (vLLM's)
                **adapter.describe(),
            }
            state["adapters"][name] = entry
            self._purge(state, keep_s)
            self._write(state)
            return entry

    def unload(self, name: str, *, keep_s: float) -> dict[str, Any]:
        """Drops the loaded adapter `name` (NotLoaded: none is) and returns its entry; its files stay
        for `keep_s` seconds, for the requests in flight."""
        with self._locked() as state:
            entry = state["adapters"].pop(name, None)
            if entry is None:
                raise NotLoaded(f"The lora adapter '{name}' cannot be found.")
            state["unloaded"][str(entry["id"])] = time.time()
            self._purge(state, keep_s)
            self._write(state)
            return dict(entry)

    def _purge(self, state: dict[str, Any], keep_s: float) -> None:
        """Removes the files of adapters unloaded more than `keep_s` seconds ago."""
        now = time.time()
        for key, when in list(state["unloaded"].items()):
            if now - float(when) > keep_s:
                shutil.rmtree(self.directory / key, ignore_errors=True)
                del state["unloaded"][key]


def already_loaded(name: str) -> str:
    """vLLM's answer to a second load under a loaded name without `load_inplace`."""
    return (
        f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, "
        "set 'load_inplace' to True."
    )


def check_name(name: str) -> None:
    """A name clients can send as `model` (LoraError otherwise)."""
    if not NAME.match(name):
        raise LoraError(f"lora_name {name!r}: use letters, digits, '.', '_' and '-' (at most 64)")
