"""Triton `postprocessing` model: engine token ids -> text.

Every request that has a request id keeps an incremental detokenizer (detokenizer.py, shared with
the service): it emits only text that is final, so the deltas concatenate to exactly the text of
the same tokens decoded in one response. A request without an id is decoded per response with a
fresh one, which gives the same text for a non-streamed request.

"Final" text ends on a complete character: a trailing incomplete UTF-8 sequence (a model that
stops in the middle of a character) is never emitted, streamed or not, so both paths agree
without knowing which response is the last. The engine's empty last response of a stream drops
the state; abandoned states (cancelled requests) expire.

Every token of an ensemble stream passes through here, so the per-response work is kept small:
one pass over the request's inputs (pb_utils.get_input_tensor_by_name rebuilds the input list on
every call) and one detokenizer step.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from config_params import param, tokenizer  # tensorrtllm_backend/config_params.py, copied beside
from detokenizer import IncrementalDetokenizer  # tensorrtllm_backend/detokenizer.py, copied beside

MAX_STATES = 65536
STATE_TTL_S = 600.0

# Inputs passed through as OUT_<name> when the engine sent them (it does when the request asked).
PASSTHROUGH = frozenset(
    {
        "CUM_LOG_PROBS",
        "OUTPUT_LOG_PROBS",
        "CONTEXT_LOGITS",
        "GENERATION_LOGITS",
        "NUM_INPUT_TOKENS",
        "NUM_OUTPUT_TOKENS",
    }
)


class TritonPythonModel:
    """Detokenizes engine responses; passes log probs and logits through."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.tokenizer = tokenizer(config, "postprocessing")
        self.skip_special = param(config, "skip_special_tokens", "true").lower() in {"1", "true", "yes"}
        IncrementalDetokenizer(self.tokenizer, self.skip_special)  # its byte table, built at load time
        self.states: OrderedDict[tuple[str, int], IncrementalDetokenizer] = OrderedDict()

    def _decoder(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer, self.skip_special)

    def _expire(self) -> None:
        now = time.monotonic()
        while self.states:
            key, state = next(iter(self.states.items()))
            if len(self.states) <= MAX_STATES and now - state.last_used < STATE_TTL_S:
                break
            del self.states[key]

    def _postprocess(self, request: Any) -> pb_utils.InferenceResponse:
        tokens = lengths = None
        outputs = []
        for tensor in request.inputs():
            name = tensor.name()
            if name == "TOKENS_BATCH":
                tokens = tensor.as_numpy()
            elif name == "SEQUENCE_LENGTH":
                lengths = tensor.as_numpy()
            elif name in PASSTHROUGH:
                outputs.append(pb_utils.Tensor(f"OUT_{name}", tensor.as_numpy()))
        if tokens is None or lengths is None:
            raise ValueError("TOKENS_BATCH and SEQUENCE_LENGTH are required")
        batch, beams = tokens.shape[0], tokens.shape[1]
        request_id = request.request_id()
        if batch == 1 and beams == 1 and request_id:  # a streamed engine response: the hot path
            texts = [self._push(request_id, 0, tokens[0, 0, : int(lengths.reshape(-1)[0])].tolist())]
        else:
            lengths = lengths.reshape(batch, beams)
            # Without a request id nothing ties the responses of one stream together: decode each alone.
            incremental = bool(request_id) and batch == 1
            texts = []
            for row in range(batch):
                for beam in range(beams):
                    ids = tokens[row, beam, : int(lengths[row, beam])].tolist()
                    if incremental:
                        texts.append(self._push(request_id, beam, ids))
                    else:
                        texts.append(self._decoder().push(ids).encode("utf-8"))
        outputs.append(pb_utils.Tensor("OUTPUT", np.array(texts, dtype=np.object_)))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def _push(self, request_id: str, beam: int, ids: list[int]) -> bytes:
        """The new text of one stream's response; its decoder lives until the stream's empty last one."""
        key = (request_id, beam)
        state = self.states.pop(key, None) or self._decoder()
        text = state.push(ids).encode("utf-8")
        if ids:  # the engine's last response of a stream carries no tokens: the state goes then
            self.states[key] = state
        return text

    def _oldest_expired(self) -> bool:
        oldest = next(iter(self.states.values()))
        return time.monotonic() - oldest.last_used >= STATE_TTL_S

    def execute(self, requests: list[Any]) -> list[pb_utils.InferenceResponse]:
        responses = []
        if len(self.states) > MAX_STATES or (self.states and self._oldest_expired()):
            self._expire()
        for request in requests:
            try:
                responses.append(self._postprocess(request))
            except (ValueError, IndexError) as exc:
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"postprocessing: {exc}"))
                )
        return responses
