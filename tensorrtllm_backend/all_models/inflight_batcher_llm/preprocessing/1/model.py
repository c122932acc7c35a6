"""Triton `preprocessing` model: prompt and word lists -> token ids for the engine.

Runs on the Python backend. Besides tokenizing, it sends the end ids (the `end_ids` parameter,
filled from the checkpoint: Llama-3 ends a chat turn with <|eot_id|> while its config names
<|end_of_text|>, and every end token stops generation) and avoids a double BOS when the prompt
already carries one.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from config_params import param, tokenizer  # tensorrtllm_backend/config_params.py, copied beside


def _flag(value: str, default: bool) -> bool:
    if not value:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _optional(inputs: dict[str, Any], name: str) -> np.ndarray | None:
    tensor = inputs.get(name)
    return None if tensor is None else tensor.as_numpy()


def to_word_list(words: list[list[int]]) -> np.ndarray:
    """TRT-LLM word-list layout [2, N]: flat ids, then cumulative end offsets, padded with -1."""
    flat = [token for word in words for token in word]
    offsets = np.cumsum([len(word) for word in words]).tolist()
    width = max(len(flat), 1)
    out = np.full((2, width), -1, dtype=np.int32)
    out[0, :] = 0
    out[0, : len(flat)] = flat
    out[1, : len(offsets)] = offsets
    return out


def _stack_word_lists(lists: list[np.ndarray]) -> np.ndarray:
    width = max(item.shape[1] for item in lists)
    out = np.full((len(lists), 2, width), -1, dtype=np.int32)
    out[:, 0, :] = 0
    for row, item in enumerate(lists):
        out[row, :, : item.shape[1]] = item
    return out


class TritonPythonModel:
    """Tokenizes prompts, stop/bad words and embedding-bias words."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.tokenizer = tokenizer(config, "preprocessing")
        self.add_special_tokens = _flag(param(config, "add_special_tokens"), True)
        configured = [int(part) for part in param(config, "end_ids").split(",") if part.strip()]
        eos = self.tokenizer.eos_token_id
        self.end_ids = configured or ([int(eos)] if eos is not None else [])
        pad = self.tokenizer.pad_token_id
        self.default_pad_id = int(pad) if pad is not None else (self.end_ids[0] if self.end_ids else 0)
        self.vocab_size = len(self.tokenizer)

    def _encode_prompt(self, text: str) -> list[int]:
        bos = self.tokenizer.bos_token
        add = self.add_special_tokens and not (bos and text.startswith(bos))
        return self.tokenizer.encode(text, add_special_tokens=add)

    def _encode_words(self, row: np.ndarray | None) -> list[list[int]]:
        if row is None:
            return []
        words = [w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in row.reshape(-1)]
        encoded = [self.tokenizer.encode(w, add_special_tokens=False) for w in words if w]
        return [ids for ids in encoded if ids]

    def _preprocess(self, request: Any) -> pb_utils.InferenceResponse:
        inputs = {tensor.name(): tensor for tensor in request.inputs()}
        queries = inputs["QUERY"].as_numpy().reshape(-1)
        # An ensemble input declared required is not enforced by every Triton version: check it here.
        if _optional(inputs, "REQUEST_OUTPUT_LEN") is None:
            raise ValueError("max_tokens is required")
        bad = _optional(inputs, "BAD_WORDS_DICT")
        stop = _optional(inputs, "STOP_WORDS_DICT")
        bias_words = _optional(inputs, "EMBEDDING_BIAS_WORDS")
        bias_weights = _optional(inputs, "EMBEDDING_BIAS_WEIGHTS")
        end_in = _optional(inputs, "END_ID")
        pad_in = _optional(inputs, "PAD_ID")

        input_ids, bad_lists, stop_lists, biases, end_ids, pad_ids = [], [], [], [], [], []
        for row, raw in enumerate(queries):
            text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
            if not text:
                raise ValueError("text_input is empty: send a non-empty prompt")
            ids = self._encode_prompt(text)
            if not ids:
                raise ValueError("text_input encodes to no tokens")
            input_ids.append(ids)

            stop_words = self._encode_words(None if stop is None else stop[row])
            if end_in is not None:
                end_id = int(end_in.reshape(len(queries), -1)[row, 0])
            else:
                end_id = self.end_ids[0] if self.end_ids else -1
                stop_words += [[other] for other in self.end_ids[1:]]
            end_ids.append(end_id)
            pad_ids.append(
                int(pad_in.reshape(len(queries), -1)[row, 0]) if pad_in is not None else self.default_pad_id
            )
            stop_lists.append(to_word_list(stop_words))
            bad_lists.append(to_word_list(self._encode_words(None if bad is None else bad[row])))
            biases.append(self._embedding_bias(bias_words, bias_weights, row))

        width = max(len(ids) for ids in input_ids)
        ids_array = np.full((len(input_ids), width), self.default_pad_id, dtype=np.int32)
        for row, ids in enumerate(input_ids):
            ids_array[row, : len(ids)] = ids
        bias_width = max(len(b) for b in biases)
        bias_array = np.zeros((len(biases), bias_width), dtype=np.float32)
        for row, b in enumerate(biases):
            bias_array[row, : len(b)] = b
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("INPUT_ID", ids_array),
                pb_utils.Tensor("REQUEST_INPUT_LEN", np.array([[len(i)] for i in input_ids], np.int32)),
                pb_utils.Tensor("BAD_WORDS_IDS", _stack_word_lists(bad_lists)),
                pb_utils.Tensor("STOP_WORDS_IDS", _stack_word_lists(stop_lists)),
                pb_utils.Tensor("EMBEDDING_BIAS", bias_array),
                pb_utils.Tensor("OUT_END_ID", np.array([[e] for e in end_ids], np.int32)),
                pb_utils.Tensor("OUT_PAD_ID", np.array([[p] for p in pad_ids], np.int32)),
            ]
        )

    def _embedding_bias(self, words: np.ndarray | None, weights: np.ndarray | None, row: int) -> np.ndarray:
        """A vocab-sized additive logit bias; empty when the request has none."""
        if words is None and weights is None:
            return np.zeros(0, dtype=np.float32)
        if words is None or weights is None:
            raise ValueError("embedding_bias_words and embedding_bias_weights must be sent together")
        word_row, weight_row = words[row].reshape(-1), weights[row].reshape(-1)
        if len(word_row) != len(weight_row):
            raise ValueError(
                f"embedding_bias_words has {len(word_row)} entries but embedding_bias_weights has {len(weight_row)}"
            )
        bias = np.zeros(self.vocab_size, dtype=np.float32)
        for raw, weight in zip(word_row, weight_row, strict=False):
            word = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
            for token_id in self.tokenizer.encode(word, add_special_tokens=False):
                bias[token_id] += float(weight)
        return bias

    def execute(self, requests: list[Any]) -> list[pb_utils.InferenceResponse]:
        responses = []
        for request in requests:
            try:
                responses.append(self._preprocess(request))
            except (ValueError, UnicodeDecodeError) as exc:
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(
                            f"invalid request: {exc}", pb_utils.TritonError.INVALID_ARG
                        )
                    )
                )
        return responses
