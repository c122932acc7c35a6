"""What both `tensorrt_llm` models read and refuse alike, production and stand-in.

Copied beside model.py (repository.py) for the llmapi model, which runs in NVIDIA's image, and for the
ensemble's stand-in; the stand-ins import it, never the other way round. Pure logic, no Triton:
- `RequestError`: a request refused on our own account (not as NVIDIA's code would refuse it), sent
  after INVALID_REQUEST as INVALID_ARG;
- the contract check (CONTRACT_CHECK_ENV, the tests set it): inputs that NVIDIA's code would ignore
  silently are refused loudly instead, so nothing the service sends relies on an input that does
  nothing in production;
- the C++ backend's guided-decoding inputs (`parse_guide`), which the llmapi model takes too.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import nvidia_backend as nv
from grammars import as_read_by

GetInput = Callable[[str], "np.ndarray | None"]

CONTRACT_CHECK_ENV = "TRTLLM_CONTRACT_CHECK"

INVALID_REQUEST = "invalid request: "
"""Prefix of the message of a request refused as ours (in-stream gRPC errors carry no status code,
so this marker is how clients tell our refusal from a server fault)."""


class RequestError(ValueError):
    """A request this model refuses on its own account (what NVIDIA's code serves and ours does not, or
    an input that would do nothing). Its message goes back after INVALID_REQUEST (INVALID_ARG)."""


def contract_check() -> bool:
    """Whether inputs NVIDIA would silently ignore are refused instead (tests)."""
    return os.environ.get(CONTRACT_CHECK_ENV, "").lower() in ("1", "true", "yes")


def text(get: GetInput, name: str) -> str | None:
    """A string input (BYTES [1] or [1, 1]) as text, None when absent or empty."""
    array = get(name)
    if array is None or array.size == 0:
        return None
    value = array.reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def parse_guide(get: GetInput) -> tuple[str, str] | None:
    """The guided-decoding request (type, guide text), as the C++ backend reads it, or None.

    NVIDIA's backend ignores a guide without a type and a type it does not know; so does this,
    except under CONTRACT_CHECK_ENV. It guides with xgrammar only (`CompileJSONSchema(guide)`, strict
    mode): a JSON schema comes back with that strictness written out (grammars.as_read_by)."""
    guide_type = text(get, "guided_decoding_guide_type")
    guide = text(get, "guided_decoding_guide")
    if guide_type is None or guide_type not in nv.GUIDE_TYPES:
        if contract_check() and (guide_type is not None or guide is not None):
            raise RequestError(
                f"guided_decoding_guide_type {guide_type!r} is ignored by NVIDIA's backend "
                f"(it maps only {', '.join(nv.GUIDE_TYPES)}): the guide would do nothing in production"
            )
        return None
    return guide_type, as_read_by("xgrammar", guide_type, guide or "")
