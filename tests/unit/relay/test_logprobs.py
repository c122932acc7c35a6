"""Log-prob helpers: top N from raw logits, and each token's text and exact bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tests.support import load_tokenizer
from trtllm_service.relay.logprobs import (
    TokenLogprob,
    TokenTexts,
    chat_logprobs,
    completion_logprobs,
    top_from_logits,
)


def test_top_from_logits_equals_torch_log_softmax_topk() -> None:
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 4, size=(6, 1040)).astype(np.float32)
    logits[2, 17] = logits[2, 18] = 50.0  # a tie at the top stays in id order
    got = top_from_logits(logits, 7)
    expected = torch.log_softmax(torch.from_numpy(logits), -1).topk(7)
    for row, (ids, values) in enumerate(got):
        assert values == sorted(values, reverse=True)
        np.testing.assert_allclose(values, expected.values[row].numpy(), rtol=0, atol=1e-4)
        assert set(ids) == set(expected.indices[row].tolist())
    assert got[2][0][:2] == [17, 18]
    assert len(top_from_logits(logits[:1], 5000)[0][0]) == 1040  # n beyond the vocabulary: all of it


def test_token_bytes_are_exact_for_every_id(demo_model_dir: Path) -> None:
    tokenizer = load_tokenizer(str(demo_model_dir))
    texts = TokenTexts(tokenizer)
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    special = set(tokenizer.added_tokens_decoder)
    for token, i in tokenizer.get_vocab().items():
        expected = token.encode() if i in special else bytes(to_byte[c] for c in token)
        assert texts.token_bytes(i) == expected, (i, token)
    # Joined, the bytes of a tokenized text are the text.
    ids = tokenizer.encode("Grüße, 世界 — ok", add_special_tokens=False)
    assert b"".join(texts.token_bytes(i) for i in ids).decode() == "Grüße, 世界 — ok"


def test_openai_shapes(demo_model_dir: Path) -> None:
    tokenizer = load_tokenizer(str(demo_model_dir))
    texts = TokenTexts(tokenizer)
    ids = tokenizer.encode("the sea", add_special_tokens=False)
    entries = [TokenLogprob(i, -0.5, [i, 7], [-0.5, -1.0]) for i in ids]
    chat = chat_logprobs(entries, texts, 1)
    assert chat["refusal"] is None
    assert [e["token"] for e in chat["content"]] == [texts.text(i) for i in ids]
    assert all(
        len(e["top_logprobs"]) == 1 and e["top_logprobs"][0]["logprob"] == -0.5 for e in chat["content"]
    )
    body, end = completion_logprobs(entries, texts, 2, offset=4)
    assert "".join(body["tokens"]) == "the sea"
    assert body["text_offset"][0] == 4 and end == 4 + len("the sea")
    assert body["token_logprobs"] == [-0.5] * len(ids)
    assert all(len(top) == 2 for top in body["top_logprobs"])
    assert completion_logprobs(entries, texts, 0, offset=0)[0]["top_logprobs"] is None
