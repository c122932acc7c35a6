"""Incremental detokenization in the `postprocessing` model, fed token ids of hard text directly.

Upstream decodes every streamed response on its own, which turns characters split across byte tokens
into U+FFFD. Here the deltas of one request id must concatenate to exactly the text of all ids.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests.support import (
    HARD_TEXT,
    TritonServer,
    postprocess,
    stable_text,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def hard_ids(tokenizer: Any) -> list[int]:
    ids = tokenizer.encode(HARD_TEXT, add_special_tokens=False)
    assert tokenizer.decode(ids) == HARD_TEXT
    return ids


@pytest.fixture
def grpc_client(triton: TritonServer) -> Iterator[grpcclient.InferenceServerClient]:
    """tritonclient's gRPC client to the shared Triton (for its postprocessing model)."""
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        yield client


def split(ids: list[int], sizes: Iterator[int]) -> list[list[int]]:
    chunks, start = [], 0
    while start < len(ids):
        size = next(sizes)
        chunks.append(ids[start : start + size])
        start += size
    return chunks


def ones() -> Iterator[int]:
    while True:
        yield 1


def random_sizes(seed: int) -> Iterator[int]:
    rng = random.Random(seed)
    while True:
        yield rng.randint(1, 6)


def stream_through_postprocessing(
    client: grpcclient.InferenceServerClient, chunks: list[list[int]]
) -> list[str]:
    """Sends the chunks as the engine would (then its empty final chunk); returns the text deltas."""
    request_id = uuid.uuid4().hex
    deltas = [postprocess(client, chunk, request_id) for chunk in [*chunks, []]]
    return [delta.decode("utf-8") for delta in deltas]


def naive(tokenizer: Any, chunks: list[list[int]]) -> str:
    """What upstream's postprocessing does: each response decoded on its own."""
    return "".join(tokenizer.decode(chunk, skip_special_tokens=True) for chunk in chunks)


@pytest.mark.parametrize("sizes", ["one_token", "random_seed_0", "random_seed_1", "random_seed_2"])
def test_deltas_concatenate_to_the_text(
    grpc_client: grpcclient.InferenceServerClient, tokenizer: Any, hard_ids: list[int], sizes: str
) -> None:
    size_iter = ones() if sizes == "one_token" else random_sizes(int(sizes.rsplit("_", 1)[1]))
    chunks = split(hard_ids, size_iter)
    assert len(chunks) > 10

    # The text is hard: decoding each chunk alone, as upstream does, gets it wrong.
    assert naive(tokenizer, chunks) != HARD_TEXT

    deltas = stream_through_postprocessing(grpc_client, chunks)
    assert len(deltas) == len(chunks) + 1
    assert "".join(deltas) == tokenizer.decode(hard_ids) == HARD_TEXT
    for delta in deltas:
        assert "\ufffd" not in delta, f"a streamed delta carries U+FFFD: {delta!r}"
    # Text is released as soon as it is whole, not all at the end.
    assert sum(1 for delta in deltas[:-1] if delta) > len(chunks) // 3


def test_special_tokens_are_skipped_in_deltas(
    grpc_client: grpcclient.InferenceServerClient, tokenizer: Any, hard_ids: list[int]
) -> None:
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    bos = tokenizer.bos_token_id
    ids = [bos, *hard_ids[:20], eot, *hard_ids[20:40]]
    deltas = stream_through_postprocessing(grpc_client, [[i] for i in ids])
    assert "".join(deltas) == stable_text(tokenizer, ids)
    assert "<|" not in "".join(deltas)


def test_without_request_id_each_response_is_decoded_alone(
    grpc_client: grpcclient.InferenceServerClient, tokenizer: Any, hard_ids: list[int]
) -> None:
    """No request id: nothing ties responses together; a whole text still decodes exactly."""
    assert postprocess(grpc_client, hard_ids, "").decode("utf-8") == HARD_TEXT
    assert postprocess(grpc_client, hard_ids, "").decode("utf-8") == HARD_TEXT


def test_interleaved_requests_keep_separate_state(
    grpc_client: grpcclient.InferenceServerClient, tokenizer: Any, hard_ids: list[int]
) -> None:
    """Two request ids fed in alternation (as concurrent streams arrive) do not mix their text."""
    first, second = hard_ids, list(reversed(hard_ids))
    ids_a, ids_b = uuid.uuid4().hex, uuid.uuid4().hex
    out_a, out_b = [], []
    for index in range(max(len(first), len(second)) + 1):
        chunk_a = first[index : index + 1]
        chunk_b = second[index : index + 1]
        if index <= len(first):
            out_a.append(postprocess(grpc_client, chunk_a, ids_a))
        if index <= len(second):
            out_b.append(postprocess(grpc_client, chunk_b, ids_b))
    assert b"".join(out_a).decode("utf-8") == tokenizer.decode(first)
    assert b"".join(out_b).decode("utf-8") == tokenizer.decode(second)
