"""Helpers for the OpenAI API e2e tests: the packed model's files and an independent reference.

The reference runs plain `transformers` on the checkpoint and tokenizer that pack_model.py put into
the model store, and applies the chat template with the tokenizer's own `apply_chat_template`; none
of the service's code is involved.
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import prometheus_metric, stable_text

EOT = "<|eot_id|>"  # the tokenizer's eos: the engine's end id (ends the output, not part of it)
END_OF_TEXT = "<|end_of_text|>"  # also ends generation, as a counted stop token


def served_model_name(packed_model_dir: Path) -> str:
    """The name the service serves its model under: the model store name."""
    return packed_model_dir.parent.name


@dataclass(frozen=True)
class Expected:
    """What the service must answer for a greedy request."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


class Reference:
    """Greedy decoding with `transformers` on the packed checkpoint."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir / "tokenizer"))
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_dir / "engine"), dtype=torch.float32
        ).eval()
        self.end_id = self.tokenizer.convert_tokens_to_ids(EOT)
        self.stop_ids = [self.end_id, self.tokenizer.convert_tokens_to_ids(END_OF_TEXT)]

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of the chat-templated prompt (the template renders BOS itself)."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(self, prompt: str) -> list[int]:
        """Token ids of a raw completion prompt: BOS added by the tokenizer, no template."""
        return self.tokenizer.encode(prompt, add_special_tokens=True)

    @functools.lru_cache(maxsize=64)  # noqa: B019 (one instance per test session)
    def _generate(self, ids: tuple[int, ...], max_new_tokens: int) -> tuple[int, ...]:
        torch = self._torch
        with torch.inference_mode():
            out = self.model.generate(
                torch.tensor([list(ids)]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=self.stop_ids,
                pad_token_id=self.end_id,
            )
        return tuple(out[0, len(ids) :].tolist())

    def greedy(self, ids: list[int], max_new_tokens: int) -> Expected:
        """The text, counts and finish reason the service must produce for a greedy request."""
        generated = list(self._generate(tuple(ids), max_new_tokens))
        stopped = bool(generated) and generated[-1] in self.stop_ids
        if generated and generated[-1] == self.end_id:
            generated = generated[:-1]  # the end token is not an output token
        return Expected(
            text=stable_text(self.tokenizer, generated),
            prompt_tokens=len(ids),
            completion_tokens=len(generated),
            finish_reason="stop" if stopped else "length",
        )

    def generated_ids(self, ids: list[int], max_new_tokens: int) -> list[int]:
        """The greedy output tokens (without the end token)."""
        generated = list(self._generate(tuple(ids), max_new_tokens))
        return generated[:-1] if generated and generated[-1] == self.end_id else generated

    def log_softmax(self, prompt: list[int], generated: list[int]) -> Any:
        """One forward pass over prompt + generated: the log-softmax of the logits that predicted
        each generated token ([len(generated), vocab])."""
        torch = self._torch
        with torch.inference_mode():
            logits = self.model(torch.tensor([prompt + generated])).logits[0].float()
        return torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(generated)], -1)

    @functools.cached_property
    def ids_by_bytes(self) -> dict[bytes, int]:
        """Token bytes -> id, from the byte-level BPE vocabulary (transformers' own byte map)."""
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        to_byte = {c: b for b, c in bytes_to_unicode().items()}
        special = set(self.tokenizer.all_special_ids)
        out = {}
        for token, i in self.tokenizer.get_vocab().items():
            if i not in special and all(c in to_byte for c in token):
                out[bytes(to_byte[c] for c in token)] = i
        return out

    def token_texts(self, ids: list[int], max_new_tokens: int) -> list[str]:
        """The greedy text, split where the engine's responses split it: one piece per token
        (empty where a token ends inside a character)."""
        generated = list(self._generate(tuple(ids), max_new_tokens))
        if generated and generated[-1] == self.end_id:
            generated = generated[:-1]
        texts = [stable_text(self.tokenizer, generated[:k]) for k in range(len(generated) + 1)]
        return [b[len(a) :] for a, b in itertools.pairwise(texts)]


@functools.lru_cache(maxsize=2)
def reference_for(model_dir: Path) -> Reference:
    return Reference(model_dir)


TOKENS_METRIC = "trtllm_reference_generated_tokens_total"
REQUESTS_METRIC = "trtllm_reference_requests_total"


def wait_idle(metrics_url: str, quiet: float = 0.4, timeout: float = 30.0) -> bool:
    """Waits until the engine generated no token for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    last = prometheus_metric(metrics_url, TOKENS_METRIC)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = prometheus_metric(metrics_url, TOKENS_METRIC)
        if now == last:
            return True
        last = now
    return False


def ended_requests(metrics_url: str) -> float:
    """Engine requests that ended early: cancelled or stopped."""
    return sum(prometheus_metric(metrics_url, REQUESTS_METRIC, outcome=o) for o in ("cancelled", "stopped"))


def straddling_stop(deltas: list[str], min_index: int = 1) -> tuple[str, int]:
    """A stop string made of the end of one delta (a token's text) and the start of the next, that
    occurs first there.

    Returns the stop string and the position in the joined text where it starts.
    """
    text = "".join(deltas)
    offset = 0
    for i in range(len(deltas) - 1):
        offset += len(deltas[i])
        left, right = deltas[i], deltas[i + 1]
        if i < min_index or not left.strip() or not right.strip():
            continue
        stop = left[-2:] + right[:2]
        start = offset - len(left[-2:])
        if "\ufffd" not in stop and text.find(stop) == start:
            return stop, start
    raise AssertionError(f"no delta boundary gives a usable stop string in {deltas!r}")
