"""The reference engine's batching, without Triton: the real engine loop and token source on the demo
model, with a recording stand-in for Triton's response side.

Under load (more requests than batch slots, arriving and finishing at different steps, spans that
cross attention blocks) every request gets exactly the token ids and log probs of its solo run; the
solo run equals `transformers` generate. Requests beyond the slots wait, and can be cancelled while
they wait.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from reference import SPAN_BLOCK, ReferenceSource

from tests.unit.backend.standin.engine_harness import Sink, ids_and_log_probs, request, run


class CountingSource(ReferenceSource):
    """The reference source, noting which requests it started and the most it ran at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started: list[str] = []
        self.widest = 0

    def start(self, seq: Any) -> None:
        self.started.append(seq.request.request_id)
        super().start(seq)

    def step(self, seqs: list[Any]) -> list[Any]:
        self.widest = max(self.widest, len(seqs))
        return super().step(seqs)


@pytest.fixture(scope="module")
def source(demo_model_dir: Path) -> CountingSource:
    return CountingSource(str(demo_model_dir), "cpu", "float32", slots=4, max_len=2048)


def prompts(count: int, seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 60, (count,), generator=generator).tolist()
    return [torch.randint(0, 1000, (n,), generator=generator).tolist() for n in lengths]


def test_greedy_under_load_equals_each_solo_run_and_transformers(
    source: CountingSource, demo_model_dir: Path
) -> None:
    # Ten requests over four slots, finishing at different steps; two run past the first
    # attention block while short ones come and go.
    inputs = prompts(10)
    lengths = [12, 30, SPAN_BLOCK + 40, 7, 55, 19, SPAN_BLOCK + 5, 3, 41, 26]
    requests = [request(p, n) for p, n in zip(inputs, lengths, strict=True)]
    solo = [ids_and_log_probs(run(source, [r])[0])[0] for r in requests]
    source.widest = 0
    loaded = [ids_and_log_probs(final)[0] for final in run(source, requests)]
    assert source.widest == 4, "the loop did not fill the batch slots"
    for i, (alone, together) in enumerate(zip(solo, loaded, strict=True)):
        assert len(together) == lengths[i]
        assert together == alone, f"request {i} differs under load"

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32).eval()
    for i in (2, 4):
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([inputs[i]]),
                attention_mask=torch.ones(1, len(inputs[i]), dtype=torch.long),
                do_sample=False,
                max_new_tokens=lengths[i],
                eos_token_id=None,
                pad_token_id=0,
            )
        assert out[0, len(inputs[i]) :].tolist() == solo[i], f"request {i} differs from transformers"


def test_sampling_penalties_and_log_probs_under_load_equal_each_solo_run(source: CountingSource) -> None:
    inputs = prompts(8, seed=2)
    settings: list[dict[str, Any]] = [
        {"greedy": False, "temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 11},
        {"return_log_probs": True},
        {"repetition_penalty": 1.3, "return_log_probs": True},
        {"greedy": False, "temperature": 1.2, "seed": 5, "return_log_probs": True},
        {"presence_penalty": 0.5, "frequency_penalty": 0.4},
        {"bad_words": [[inputs[5][0]]], "min_tokens": 30, "return_log_probs": True},
        {"greedy": False, "top_p": 0.5, "seed": 99},
        {},
    ]
    requests = [request(p, 30 + 9 * i, **s) for i, (p, s) in enumerate(zip(inputs, settings, strict=True))]
    solo = [ids_and_log_probs(run(source, [r])[0]) for r in requests]
    loaded = [ids_and_log_probs(final) for final in run(source, requests)]
    for i, (alone, together) in enumerate(zip(solo, loaded, strict=True)):
        assert together == alone, f"request {i} ({settings[i]}) differs under load"
    assert any(log_prob != 0.0 for log_prob in loaded[1][1]), "log probs were not computed"


def test_requests_beyond_the_slots_wait_and_can_be_cancelled_while_waiting(source: CountingSource) -> None:
    inputs = prompts(7, seed=3)
    requests = [request(p, 40) for p in inputs]
    sinks = [Sink(cancelled=i == 6) for i in range(7)]  # the last one is queued behind six others
    source.started.clear()
    source.widest = 0
    finals = run(source, requests, sinks)
    assert source.widest <= 4
    assert requests[6].request_id not in source.started, "a cancelled waiting request took a slot"
    assert finals[6]["output_ids"].size == 0
    assert all(finals[i]["num_output_tokens"].item() == 40 for i in range(6))


def test_a_sliding_window_model_decodes_one_sequence_at_a_time(demo_model_dir: Path, tmp_path: Path) -> None:
    """The slot cache's mask is full causal attention: a sliding-window model (the demo's weights
    as a Mistral with a 16-token window) gets its own cache per request and still decodes exactly
    as `transformers` does."""
    import json
    import shutil

    from transformers import AutoModelForCausalLM

    model_dir = tmp_path / "windowed"
    shutil.copytree(demo_model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=16)
    (model_dir / "config.json").write_text(json.dumps(config))
    windowed = ReferenceSource(str(model_dir), "cpu", "float32", slots=4)
    assert windowed.capacity is None and "one sequence per forward" in windowed.describe()

    inputs = prompts(3, seed=4)
    loaded = [ids_and_log_probs(final)[0] for final in run(windowed, [request(p, 40) for p in inputs])]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    full = ReferenceSource(str(demo_model_dir), "cpu", "float32", slots=4)
    unwindowed = [ids_and_log_probs(final)[0] for final in run(full, [request(p, 40) for p in inputs])]
    assert loaded != unwindowed, "the window made no difference: this test proves nothing"
    for prompt, ids in zip(inputs, loaded, strict=True):
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=40,
                eos_token_id=None,
                pad_token_id=0,
            )
        assert out[0, len(prompt) :].tolist() == ids
