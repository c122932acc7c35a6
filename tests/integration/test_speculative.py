"""NGram speculative decoding (issue 38) in a real tritonserver: the llmapi model on the demo model,
served twice, without and with model.yaml's `speculative_config` (TensorRT-LLM 1.2.1's
NGramDecodingConfig). Greedy output is the same tokens either way; drafts are accepted on a prompt
that repeats itself; the per-request perf outputs (total_draft_tokens, total_accepted_draft_tokens,
acceptance_rate) agree with each other, and stay 0 without speculation.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.llmapi_support import GREEDY, final, run
from tests.support import TritonServer, load_tokenizer, stopped_soon

NGRAM = """
speculative_config:
  decoding_type: NGram
  max_draft_len: 4
  max_matching_ngram_size: 3
  is_keep_all: true
  is_use_oldest: true
  is_public_pool: false
"""
PERF = ("total_draft_tokens", "total_accepted_draft_tokens", "acceptance_rate")
OUTPUTS = ("text_output", "output_ids", "num_output_tokens", *PERF)
REPEATED = "Repeat this list: apple, banana, cherry, date, elderberry, fig, grape. " * 3


def _server(root: Path, model_dir: Path, yaml_tail: str = "") -> TritonServer:
    server = TritonServer(root, engine_dir=model_dir, tokenizer_dir=model_dir, flavor="llmapi")
    if yaml_tail:
        model_yaml = server.repo / "tensorrt_llm" / "1" / "model.yaml"
        model_yaml.write_text(model_yaml.read_text() + yaml_tail)
    return server


@pytest.fixture(scope="module")
def servers(
    demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TritonServer, ...]]:
    plain = _server(tmp_path_factory.mktemp("plain"), demo_model_dir)
    ngram = _server(tmp_path_factory.mktemp("ngram"), demo_model_dir, NGRAM)
    with stopped_soon(plain), stopped_soon(ngram):
        yield plain, ngram


def _ids(result: object) -> list[int]:
    return [int(i) for output in result.outputs for i in output["output_ids"].reshape(-1)]  # type: ignore[attr-defined]  # a tritonclient result (typed object here)


@pytest.mark.box
def test_greedy_is_the_same_tokens_with_drafts(
    servers: tuple[TritonServer, ...], demo_model_dir: Path
) -> None:
    plain, ngram = servers
    tokenizer = load_tokenizer(str(demo_model_dir))
    prompts: list[str | list[int]] = [
        "The quick brown fox jumps over the lazy dog.",
        REPEATED,
        tokenizer.encode("def add(a, b):\n    return a + b\n\ndef add(a, b):\n", add_special_tokens=True),
        [7, 300, 41, 9, 77, 1020, 5, 5, 61],
    ]
    accepted = 0
    for prompt in prompts:
        for streaming in (False, True):
            params = {
                **GREEDY,
                "streaming": streaming,
                "sampling_param_max_tokens": 48,
                "sampling_param_end_id": -1,
                "sampling_param_logprobs": 1,  # output_ids: the tokens themselves
                "sampling_param_return_perf_metrics": True,
            }
            base = run(plain, prompt, outputs=OUTPUTS, **params)
            spec = run(ngram, prompt, outputs=OUTPUTS, **params)
            assert base.error is None and spec.error is None, (base.error, spec.error)
            assert _ids(spec) == _ids(base) and len(_ids(base)) == 48, prompt
            assert spec.text == base.text
            assert final(base, "total_draft_tokens") == final(base, "total_accepted_draft_tokens") == 0
            drafted, taken = final(spec, "total_draft_tokens"), final(spec, "total_accepted_draft_tokens")
            assert 0 <= taken <= drafted
            rate = final(spec, "acceptance_rate")
            assert rate == pytest.approx(taken / drafted if drafted else 0.0, rel=1e-6)
            if prompt == REPEATED:
                assert taken > 0, "no draft was accepted on a prompt that repeats itself"
            accepted += int(taken)
            # plain greedy (no log probs: the batched argmax path) is the same text too
            del params["sampling_param_logprobs"]
            assert run(ngram, prompt, **params).text == base.text
    assert accepted > 0


def test_stop_strings_and_seeded_sampling_end_and_draw_as_without_drafts(
    servers: tuple[TritonServer, ...],
) -> None:
    """A stop string inside an accepted run ends the text where it ends without drafts; a seeded
    sampled answer is the same text (each position is sampled from the model's distribution given
    the tokens before it, with the request's generator, as one-token steps sample it)."""
    plain, ngram = servers
    whole = run(plain, REPEATED, **GREEDY, sampling_param_max_tokens=64).text
    stop = whole[len(whole) // 2 : len(whole) // 2 + 4]
    assert stop.strip(), whole
    cases = [
        {**GREEDY, "sampling_param_max_tokens": 64, "sampling_param_stop": [stop]},
        {"sampling_param_temperature": 0.9, "sampling_param_top_p": 0.95, "sampling_param_seed": 7},
    ]
    for params in cases:
        for streaming in (False, True):
            outputs = ("text_output", "finish_reason")
            base = run(
                plain, REPEATED, outputs=outputs, streaming=streaming, return_finish_reason=True, **params
            )
            spec = run(
                ngram, REPEATED, outputs=outputs, streaming=streaming, return_finish_reason=True, **params
            )
            assert base.error is None and spec.error is None, (base.error, spec.error)
            assert spec.text == base.text and final(spec, "finish_reason") == final(base, "finish_reason")
            if "sampling_param_stop" in params:
                assert final(base, "finish_reason") == "stop" and len(base.text) < len(whole)


def test_the_log_says_how_it_drafts(servers: tuple[TritonServer, ...]) -> None:
    plain, ngram = servers
    assert "NGram speculative decoding (max_draft_len 4, max_matching_ngram_size 3)" in ngram.log()
    assert "Disable overlap scheduler for speculation mode NGRAM" in ngram.log()  # as the executor warns
    assert "speculative decoding" not in plain.log()


def test_non_ngram_speculative_config_fails_the_load(demo_model_dir: Path, tmp_path: Path) -> None:
    """Drafting with a draft model (Eagle, MTP, ...) is not served by the stand-in: the load fails
    saying so, never a silent fallback to plain decoding."""
    server = _server(
        tmp_path,
        demo_model_dir,
        "\nspeculative_config:\n  decoding_type: Eagle\n  max_draft_len: 3\n"
        "  speculative_model_dir: /models/eagle3-draft\n",
    )
    server.startup_timeout = 120
    try:
        with pytest.raises(RuntimeError, match="failed to load"):
            server.__enter__()
        assert "decoding_type 'Eagle' is not served by the stand-in engine" in server.log()
    finally:
        server.stop()
