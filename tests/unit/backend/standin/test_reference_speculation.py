"""NGram speculative decoding in the reference engine, without Triton: the real engine loop and token
source on the demo model (tests/unit/backend/standin/engine_harness.py runs them), one source without
drafts and one with.

Greedy output is the same tokens with drafts as without, alone and under load, and drafts are
accepted where the text repeats itself; seeded sampling, penalties, bad words and min_tokens give
the same tokens too (each position is decoded as a one-token step would decode it); an end id, a stop
word or max_new inside an accepted run ends the request where it would end without drafts; a streamed
request gets the tokens of one pass in one response; the per-request and engine-wide counts agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from contract import EngineRequest
from reference import ReferenceSource

from tests.unit.backend.standin.engine_harness import Sink, ids_and_log_probs, request, run

NGRAM = {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 3}
PERF = frozenset({"total_draft_tokens", "total_accepted_draft_tokens", "acceptance_rate"})


@pytest.fixture(scope="module")
def sources(demo_model_dir: Path) -> tuple[ReferenceSource, ReferenceSource]:
    plain = ReferenceSource(str(demo_model_dir), "cpu", "float32", slots=4, max_len=2048)
    ngram = ReferenceSource(str(demo_model_dir), "cpu", "float32", slots=4, max_len=2048)
    assert ngram.speculate(NGRAM) is None
    return plain, ngram


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    random = [torch.randint(0, 1000, (n,), generator=generator).tolist() for n in (5, 20, 40)]
    return [*random, list(range(100, 130)) * 4]  # the last one repeats itself


def with_perf(req: EngineRequest) -> EngineRequest:
    req.outputs = req.outputs | PERF
    req.return_perf_metrics = True
    return req


def test_greedy_is_the_same_tokens_alone_and_under_load(sources: tuple[ReferenceSource, ...]) -> None:
    plain, ngram = sources
    inputs = prompts()
    before = ngram.speculative_counters()
    solo = [ids_and_log_probs(run(plain, [request(p, 80)])[0])[0] for p in inputs]
    finals = [run(ngram, [with_perf(request(p, 80))])[0] for p in inputs]
    assert [ids_and_log_probs(f)[0] for f in finals] == solo
    drafted = [int(f["total_draft_tokens"].reshape(-1)[0]) for f in finals]
    accepted = [int(f["total_accepted_draft_tokens"].reshape(-1)[0]) for f in finals]
    assert all(0 <= a <= d for a, d in zip(accepted, drafted, strict=True))
    assert accepted[-1] > 0, "no draft accepted on the repeated prompt"
    for f, a, d in zip(finals, accepted, drafted, strict=True):
        assert float(f["acceptance_rate"].reshape(-1)[0]) == pytest.approx(a / d if d else 0.0, rel=1e-6)
    after = ngram.speculative_counters()
    assert after["draft_tokens"] - before["draft_tokens"] == sum(drafted)
    assert after["accepted_draft_tokens"] - before["accepted_draft_tokens"] == sum(accepted)
    assert after["verify_passes"] > before["verify_passes"]
    # all at once, more requests than slots, arriving together and finishing at different steps
    lengths = [80, 23, 61, 80, 7, 44]
    loaded = run(ngram, [request(p, n) for p, n in zip(inputs + inputs[:2], lengths, strict=True)])
    expected = [s[:n] for s, n in zip(solo + solo[:2], lengths, strict=True)]
    assert [ids_and_log_probs(f)[0] for f in loaded] == expected


@pytest.mark.parametrize(
    "sampling",
    [
        {"greedy": False, "temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 11},
        {"greedy": False, "temperature": 1.2, "seed": 5, "return_log_probs": True},
        {"repetition_penalty": 1.3, "return_log_probs": True},
        {"presence_penalty": 0.5, "frequency_penalty": 0.4},
        {"bad_words": [[105]], "min_tokens": 30, "return_log_probs": True},
    ],
)
def test_sampling_and_penalties_are_the_same_tokens(
    sources: tuple[ReferenceSource, ...], sampling: Any
) -> None:
    plain, ngram = sources
    for prompt in prompts()[1:]:
        ids, log_probs = ids_and_log_probs(run(plain, [request(prompt, 60, **sampling)])[0])
        spec_ids, spec_log_probs = ids_and_log_probs(run(ngram, [request(prompt, 60, **sampling)])[0])
        assert spec_ids == ids
        # the pass computes several positions at once: the same log probs up to float32 rounding
        np.testing.assert_allclose(spec_log_probs, log_probs, atol=1e-5)


@pytest.mark.parametrize("guide", [("regex", "(ab|cd)+x{3,9}"), ("json", "")])
def test_guided_decoding_is_the_same_tokens(
    sources: tuple[ReferenceSource, ...], guide: tuple[str, str]
) -> None:
    """The grammar masks each position of a pass in turn, as it masks one-token steps."""
    plain, ngram = sources
    before = ngram.speculative_counters()["accepted_draft_tokens"]
    results = []
    for source in (plain, ngram):
        req = request(prompts()[-1], 40, guide=guide)
        req.end_id = 0
        results.append(ids_and_log_probs(run(source, [req])[0])[0])
    assert results[1] == results[0] and results[0]
    assert ngram.speculative_counters()["accepted_draft_tokens"] > before


def test_a_lora_request_among_plain_ones_is_the_same_tokens(
    sources: tuple[ReferenceSource, ...], demo_model_dir: Path, tmp_path: Path
) -> None:
    """An adapter applies to its own rows of a pass (every position of its slot), as in one-token steps."""
    import json

    from tensorrtllm_backend.lora import read_peft
    from tests.lora_support import make_adapter

    config = json.loads((demo_model_dir / "config.json").read_text())
    factors = read_peft(make_adapter(tmp_path / "a", config, seed=5, rank=4, alpha=16), config).factors
    results = []
    for source in sources:
        lora = request(prompts()[-1], 40)
        lora.lora = source.prepare_lora(factors)
        finals = run(source, [lora, request(prompts()[-1], 40), request(prompts()[1], 40)])
        results.append([ids_and_log_probs(f)[0] for f in finals])
    assert results[1] == results[0]
    assert results[0][0] != results[0][1], "the adapter changed nothing"


def test_the_end_inside_an_accepted_run_ends_it_there(sources: tuple[ReferenceSource, ...]) -> None:
    plain, ngram = sources
    prompt = prompts()[-1]
    free = ids_and_log_probs(run(plain, [request(prompt, 60)])[0])[0]
    end = free[17]
    word = free[25:27]
    cases: list[dict[str, Any]] = [{"end_id": end}, {"stop_words": [word]}, {"max_new": 13}]
    for case in cases:
        max_new = case.pop("max_new", 60)
        results = []
        for source in (plain, ngram):
            req = request(prompt, max_new)
            for key, value in case.items():
                setattr(req, key, value)
            results.append(ids_and_log_probs(run(source, [req])[0])[0])
        assert results[1] == results[0], case
        assert len(results[0]) < 60


class Chunks(Sink):
    """A streamed request's responses, each one's new tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[list[int]] = []

    def send(self, response: Any, final: bool) -> None:
        if "output_ids" in response:
            ids = response["output_ids"].reshape(-1).tolist()
            if ids:
                self.chunks.append(ids)
        super().send(response, final)


def test_a_streamed_request_gets_a_pass_s_tokens_together(sources: tuple[ReferenceSource, ...]) -> None:
    plain, ngram = sources
    prompt = prompts()[-1]
    whole = ids_and_log_probs(run(plain, [request(prompt, 50)])[0])[0]
    streamed = request(prompt, 50)
    streamed.streaming = True
    sink = Chunks()
    run(ngram, [streamed], [sink])
    assert [t for chunk in sink.chunks for t in chunk] == whole
    assert max(len(chunk) for chunk in sink.chunks) > 1, "no pass accepted a draft"


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SmolLM2 demo checkpoint (pack_model.py --demo; dev.sh installs its GGUF package, so a
    missing one fails here rather than skipping)."""
    from trtllm_service.packing.smollm2 import build_smollm2_model

    return build_smollm2_model(tmp_path_factory.mktemp("smollm2") / "model")


def test_smollm2_greedy_is_the_same_tokens(smollm2_dir: Path) -> None:
    """A real chat model: a prompt whose answer quotes it (drafts accepted) and one whose answer
    does not; greedy tokens are the same with drafts, in float32 as the engine runs on CPU."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    plain = ReferenceSource(str(smollm2_dir), "cpu", "float32", slots=2, max_len=1024)
    ngram = ReferenceSource(str(smollm2_dir), "cpu", "float32", slots=2, max_len=1024)
    ngram.speculate(NGRAM)
    cities = "Lisbon, Madrid, Paris, Berlin, Vienna, Prague, Warsaw, Budapest, Rome, Athens, Oslo, Dublin"
    questions = [
        f"Repeat this list of cities exactly, separated by commas:\n\n{cities}",
        "Why is the sky blue?",
    ]
    for question in questions:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True
        )
        expected = ids_and_log_probs(run(plain, [request(ids, 40)])[0])[0]
        assert ids_and_log_probs(run(ngram, [request(ids, 40)])[0])[0] == expected, question
    assert ngram.speculative_counters()["accepted_draft_tokens"] > 0
