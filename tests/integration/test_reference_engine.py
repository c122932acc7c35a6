"""The reference engine behind a real tritonserver: exact greedy decoding, seeded sampling, stop/end ids.

The engine (`tensorrt_llm` model) is called directly with the TRT-LLM tensor contract and through the
ensemble; the expected token ids come from plain `transformers` generate on the same checkpoint.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import torch

from tests.support import (
    TritonServer,
    engine_inputs,
    output_ids,
    run_stream,
    stable_text,
    text_inputs,
)

pytestmark = pytest.mark.integration

GREEDY_TOKENS = 40
EOS_IDS = {1025, 1033}  # <|end_of_text|>, <|eot_id|>


def rid() -> str:
    return uuid.uuid4().hex


def reference_greedy(hf_model: Any, input_ids: list[int], max_new_tokens: int) -> list[int]:
    """`transformers` greedy decoding that never stops early."""
    with torch.inference_mode():
        out = hf_model.generate(
            torch.tensor([input_ids]),
            attention_mask=torch.ones(1, len(input_ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(input_ids) :].tolist()


def engine_greedy(triton: TritonServer, input_ids: list[int], max_tokens: int, streaming: bool) -> list[int]:
    result = run_stream(
        triton.grpc_url,
        engine_inputs(input_ids, max_tokens, end_id=-1, streaming=streaming),
        model="tensorrt_llm",
        request_id=rid(),
    )
    assert result.error is None, result.error
    return output_ids(result)


def ensemble_text(triton: TritonServer, prompt: str, max_tokens: int, **extra: Any) -> tuple[str, int]:
    result = run_stream(triton.grpc_url, text_inputs(prompt, max_tokens, **extra), request_id=rid())
    assert result.error is None, result.error
    return result.text, result.total("num_output_tokens")


@pytest.mark.parametrize("prompt", ["Hello", "The quick brown fox", "中文 café 👍"])
def test_greedy_equals_transformers(triton: TritonServer, tokenizer: Any, hf_model: Any, prompt: str) -> None:
    input_ids = tokenizer.encode(prompt)
    assert input_ids[0] == tokenizer.bos_token_id
    reference = reference_greedy(hf_model, input_ids, GREEDY_TOKENS)
    assert len(reference) == GREEDY_TOKENS

    for streaming in (False, True):
        assert engine_greedy(triton, input_ids, GREEDY_TOKENS, streaming) == reference, (
            f"streaming={streaming}"
        )

    expected_text = stable_text(tokenizer, reference)
    for stream in (False, True):
        text, count = ensemble_text(triton, prompt, GREEDY_TOKENS, end_id=-1, stream=stream)
        assert text == expected_text, f"stream={stream}"
        assert count == GREEDY_TOKENS


def test_streamed_engine_sends_one_token_per_response_then_an_empty_final(
    triton: TritonServer, tokenizer: Any
) -> None:
    input_ids = tokenizer.encode("Hello")
    result = run_stream(
        triton.grpc_url,
        engine_inputs(input_ids, 8, end_id=-1, streaming=True),
        model="tensorrt_llm",
        request_id=rid(),
    )
    assert result.error is None, result.error
    sizes = [out["output_ids"].shape[-1] for out in result.outputs]
    assert sizes == [1] * 8 + [0]
    lengths = [int(out["sequence_length"].reshape(-1)[0]) for out in result.outputs]
    assert lengths == sizes


SAMPLING = {
    "top_k_0_top_p_1": {"temperature": 1.0, "top_k": 0, "top_p": 1.0},
    "top_k_50": {"temperature": 1.0, "top_k": 50},
}


@pytest.mark.parametrize("params", list(SAMPLING.values()), ids=list(SAMPLING))
def test_seeded_sampling_is_reproducible(triton: TritonServer, params: dict[str, float]) -> None:
    prompt, max_tokens = "Once upon a time, in a small village", 30
    first, _ = ensemble_text(triton, prompt, max_tokens, seed=7, **params)
    again, _ = ensemble_text(triton, prompt, max_tokens, seed=7, **params)
    streamed, _ = ensemble_text(triton, prompt, max_tokens, seed=7, stream=True, **params)
    other, _ = ensemble_text(triton, prompt, max_tokens, seed=8, **params)
    largest, _ = ensemble_text(triton, prompt, max_tokens, seed=2**64 - 1, **params)
    greedy, _ = ensemble_text(triton, prompt, max_tokens)

    assert first == again == streamed
    assert other != first
    assert largest not in (first, other)
    assert first != greedy, "sampling parameters were ignored: the text is the greedy one"


@pytest.fixture(scope="module")
def greedy_fox(triton: TritonServer, tokenizer: Any) -> tuple[str, list[int]]:
    """A prompt and its greedy continuation (no end token in it, so the ensemble runs it all)."""
    prompt = "The quick brown fox"
    ids = engine_greedy(triton, tokenizer.encode(prompt), GREEDY_TOKENS, streaming=False)
    assert len(ids) == GREEDY_TOKENS
    assert not EOS_IDS & set(ids)
    return prompt, ids


def first_occurrences(ids: list[int]) -> list[int]:
    """Positions in the middle of `ids` whose token does not appear earlier."""
    return [k for k in range(3, len(ids) - 3) if ids[k] not in ids[:k]]


def test_stop_word_ends_the_output_after_it(
    triton: TritonServer, tokenizer: Any, greedy_fox: tuple[str, list[int]]
) -> None:
    prompt, ids = greedy_fox
    candidates = [
        k
        for k in first_occurrences(ids)
        if tokenizer.encode(tokenizer.decode([ids[k]]), add_special_tokens=False) == [ids[k]]
        and "\ufffd" not in tokenizer.decode([ids[k]])
    ]
    assert candidates, f"no usable stop token in {ids}"
    k = candidates[len(candidates) // 2]
    word = tokenizer.decode([ids[k]])

    for stream in (False, True):
        text, count = ensemble_text(triton, prompt, GREEDY_TOKENS, stop_words=[word], stream=stream)
        assert text == tokenizer.decode(ids[: k + 1], skip_special_tokens=True), f"stream={stream}"
        assert text.endswith(word)
        assert count == k + 1


def test_client_end_id_ends_the_output_before_it(
    triton: TritonServer, tokenizer: Any, greedy_fox: tuple[str, list[int]]
) -> None:
    prompt, ids = greedy_fox
    k = first_occurrences(ids)[0]
    for stream in (False, True):
        text, _ = ensemble_text(triton, prompt, GREEDY_TOKENS, end_id=ids[k], stream=stream)
        assert text == stable_text(tokenizer, ids[:k]), f"stream={stream}"

    direct = run_stream(
        triton.grpc_url,
        engine_inputs(tokenizer.encode(prompt), GREEDY_TOKENS, end_id=ids[k]),
        model="tensorrt_llm",
        request_id=rid(),
    )
    assert direct.error is None, direct.error
    assert output_ids(direct) == ids[:k]


def chat_prompt(tokenizer: Any) -> str:
    messages = [{"role": "user", "content": "Write one short sentence about the sea."}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_eot_id_ends_the_turn(triton: TritonServer, tokenizer: Any) -> None:
    """Llama-3 ends a turn with <|eot_id|>: the ensemble must stop there, not run to max_tokens."""
    prompt = chat_prompt(tokenizer)
    assert prompt.startswith("<|begin_of_text|>")
    bias = {"embedding_bias_words": ["<|eot_id|>"], "embedding_bias_weights": [100.0]}

    for stream in (False, True):
        text, count = ensemble_text(triton, prompt, 50, stream=stream, **bias)
        assert text == "", f"stream={stream}"
        # <|eot_id|> is the demo tokenizer's eos, so it is the end_id: as in TRT-LLM, the end token
        # ends the request without becoming part of the output (or of its count).
        assert count == 0, f"stream={stream}: the end token is not an output token"

    unbiased_text, unbiased_count = ensemble_text(triton, prompt, 50)
    assert unbiased_count > 1
    assert unbiased_text != ""


def test_end_of_text_also_ends_the_turn(triton: TritonServer, tokenizer: Any) -> None:
    """generation_config declares <|end_of_text|> too: it stops generation as well (as a stop word)."""
    prompt = chat_prompt(tokenizer)
    bias = {"embedding_bias_words": ["<|end_of_text|>"], "embedding_bias_weights": [100.0]}
    for stream in (False, True):
        text, count = ensemble_text(triton, prompt, 50, stream=stream, **bias)
        assert text == "", f"stream={stream}"
        assert count == 1, f"stream={stream}"


def test_a_guide_on_the_engine_contract_shapes_the_ids(triton: TritonServer, tokenizer: Any) -> None:
    """The C++ backend's guided_decoding_guide_type / _guide inputs, sent straight to the engine
    model: the ids decode to text the guide allows; an unknown guide type is a refused request."""
    import json
    import re

    prompt = tokenizer.encode("Hello")
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 50}, "ok": {"type": "boolean"}},
        "required": ["n", "ok"],
        "additionalProperties": False,
    }
    cases = [
        ("json_schema", json.dumps(schema), lambda text: _validates(json.loads(text), schema)),
        ("regex", "[a-f]{4}-[0-9]{2}", lambda text: re.fullmatch("[a-f]{4}-[0-9]{2}", text)),
        ("ebnf_grammar", 'root ::= "on" | "off"', lambda text: text in ("on", "off")),
    ]
    for guide_type, guide, accepts in cases:
        for streaming in (False, True):
            inputs = engine_inputs(
                prompt,
                200,
                end_id=1025,
                streaming=streaming,
                guided_decoding_guide_type=guide_type,
                guided_decoding_guide=guide,
            )
            result = run_stream(triton.grpc_url, inputs, model="tensorrt_llm", request_id=rid())
            assert result.error is None, result.error
            text = tokenizer.decode(output_ids(result))
            assert accepts(text), f"{guide_type}, streaming={streaming}: {text!r}"

    refused = run_stream(
        triton.grpc_url,
        engine_inputs(prompt, 5, guided_decoding_guide_type="yaml", guided_decoding_guide="x"),
        model="tensorrt_llm",
        request_id=rid(),
    )
    assert refused.error is not None and "invalid request" in refused.error and "yaml" in refused.error


def _validates(value: Any, schema: dict[str, Any]) -> bool:
    import jsonschema

    jsonschema.validate(value, schema)
    return True
