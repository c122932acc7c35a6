"""Which packed model `bentoml serve .`, `bentoml build` and the doctor take, and why.

The rule is `choose_served_model`'s. Pack time records the served model (trtllm_service.packing.cli),
serving reads it (service.py, through `default_model_tag`); both phases import this module.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


class ModelNotFoundError(RuntimeError):
    """No packed model to serve; the message says how to make one."""


SERVED_MODEL_FILE = Path("trtllm-service") / "served-model"
"""Under the BentoML home: the tag of the served model (one line), written by pack_model.py."""

CHOSEN: dict[str, str] = {}
"""Tag -> why it was chosen, for each choice `default_model_tag` made in this process."""


def served_model_file() -> Path:
    """Where the served model is recorded: $BENTOML_HOME/trtllm-service/served-model."""
    from bentoml._internal.configuration.containers import BentoMLContainer

    return Path(BentoMLContainer.bentoml_home.get()).expanduser() / SERVED_MODEL_FILE


def packed_models() -> list[Any]:
    """The models pack_model.py packed into the model store, oldest first."""
    import bentoml

    packed = [model for model in bentoml.models.list() if model.info.labels.get("packed_by") == "pack_model"]
    return sorted(packed, key=lambda model: model.info.creation_time)


def recorded_model() -> str | None:
    """The tag recorded as the served model, when it is still in the model store (else None)."""
    import bentoml

    try:
        tag = served_model_file().read_text().strip()
    except OSError:
        return None
    if not tag:
        return None
    try:
        return str(bentoml.models.get(tag).tag)
    except (bentoml.exceptions.BentoMLException, ValueError):  # deleted since, or not a tag
        return None


def record_served_model(tag: str) -> Path:
    """Records `tag` (an exact name:version) as the served model; returns the file written."""
    path = served_model_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(f"{tag}\n")
    partial.replace(path)  # whole or not at all, for a `bentoml serve` reading it now
    return path


def choose_served_model(explicit: str | None) -> tuple[str, str]:
    """The model `bentoml serve .`, `bentoml build` and the doctor take, and why (tag, reason).

    The rule, first match wins:

    1. ``TRTLLM_MODEL`` (``explicit``) when set: a tag, or a name for its latest version.
    2. The served model recorded in ``$BENTOML_HOME/trtllm-service/served-model``. pack_model.py
       records it only when told to (``--serve``, or ``--set-served TAG`` for a model already
       packed), and when nothing was served before the pack (the first pack into a store). Packing
       anything else never changes it.
    3. No record (a built bento's container, a store packed before the record existed, a recorded
       model since deleted): the only model pack_model.py packed into the store. Several and none
       recorded is an error naming them; none is `ModelNotFoundError`.
    """
    import bentoml

    if explicit:
        try:
            return str(bentoml.models.get(explicit).tag), f"TRTLLM_MODEL={explicit}"
        except bentoml.exceptions.NotFound:
            raise ModelNotFoundError(
                f"TRTLLM_MODEL={explicit!r} is not in the BentoML model store; see `bentoml models list`"
            ) from None
        except (bentoml.exceptions.BentoMLException, ValueError) as exc:
            raise ModelNotFoundError(f"TRTLLM_MODEL={explicit!r} is not a model tag: {exc}") from None
    recorded = recorded_model()
    if recorded is not None:
        return recorded, (
            f"the served model recorded in {served_model_file()}; TRTLLM_MODEL=TAG serves another, "
            "`python pack_model.py --set-served TAG` records another"
        )
    packed = packed_models()
    if len(packed) == 1:
        return str(packed[0].tag), "the only model pack_model.py packed into the model store"
    if not packed:
        raise ModelNotFoundError(
            "no packed model in the BentoML model store: run `python pack_model.py --demo` "
            "(or pack an engine with --engine-dir / --hf-model) first"
        )
    tags = ", ".join(str(model.tag) for model in packed)
    raise ModelNotFoundError(
        f"{len(packed)} packed models ({tags}) and none recorded as the served one: pick one with "
        "TRTLLM_MODEL=TAG, or record it with `python pack_model.py --set-served TAG`"
    )


def default_model_tag(explicit: str | None, *, announce: bool = False) -> str:
    """The tag to serve (`choose_served_model` says by which rule). With `announce`, one line on
    stderr names it and why, in a process that is not one of BentoML's workers: once for
    `bentoml build`, once for `bentoml serve` (its workers each import service.py too)."""
    tag, why = choose_served_model(explicit)
    CHOSEN[tag] = why
    if announce:
        from bentoml._internal.context import server_context

        if server_context.worker_index is None:
            print(f"trtllm_service: model {tag} ({why})", file=sys.stderr, flush=True)
    return tag
