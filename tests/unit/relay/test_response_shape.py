"""ResponseShape (relay/response_shape.py): whenever it reads a response's contents without protobuf,
they are exactly what protobuf parses from the same bytes; whatever differs in more than the
contents is left to protobuf."""

from __future__ import annotations

import random
from array import array
from pathlib import Path

import pytest
from tritonclient.grpc import service_pb2

from tensorrtllm_backend.detokenizer import IncrementalDetokenizer
from tests.support import load_tokenizer
from trtllm_service.relay import client
from trtllm_service.relay.readers import TokenIdReader
from trtllm_service.relay.request import GenerationRequest
from trtllm_service.relay.response_shape import ResponseShape

parse = service_pb2.ModelStreamInferResponse.FromString


def response(
    contents: list[bytes],
    *,
    names: tuple[str, ...] = ("output_ids", "sequence_length"),
    request_id: str = "req-1",
    final: bool = False,
    error: str = "",
    dims: tuple[int, ...] = (1, 1, 1),
) -> bytes:
    message = service_pb2.ModelStreamInferResponse(error_message=error)
    if not error:
        result = message.infer_response
        result.model_name, result.model_version, result.id = "tensorrt_llm", "1", request_id
        result.parameters["triton_final_response"].bool_param = final
        for name in names:
            output = result.outputs.add()
            output.name, output.datatype = name, "INT32"
            output.shape.extend(dims)
        result.raw_output_contents.extend(contents)
    return message.SerializeToString()


def ids(*values: int) -> bytes:
    return array("i", values).tobytes()


def learned(data: bytes, *names: str) -> ResponseShape:
    shape = ResponseShape.learn(data, parse(data).infer_response, *names)
    assert shape is not None
    return shape


def test_the_next_token_is_read_from_the_bytes() -> None:
    shape = learned(response([ids(17), ids(1)]), "output_ids")
    assert shape.at == (0,)
    assert shape.contents(response([ids(123456), ids(1)])) == [ids(123456), ids(1)]


def test_positions_follow_the_outputs_order() -> None:
    first = response([b"\x01\x00\x00\x00a", ids(3)], names=("text_output", "num_output_tokens"))
    assert learned(first, "num_output_tokens", "text_output").at == (1, 0)
    assert ResponseShape.learn(first, parse(first).infer_response, "output_ids") is None  # not in it


def test_anything_but_other_contents_is_left_to_protobuf() -> None:
    shape = learned(response([ids(17), ids(1)]), "output_ids")
    for other in (
        response([ids(18), ids(1)], final=True),  # the final response (its flag is in the head)
        response([], error="boom"),  # an error
        response([ids(18), ids(1)], request_id="req-2"),  # another request
        response([ids(18, 19), ids(2)], dims=(1, 1, 2)),  # two tokens: the shape says so
        response([ids(18)], names=("output_ids",)),  # fewer outputs
        response([ids(18), ids(1), ids(5)]),  # a content more than outputs, the same head
        response([ids(18), ids(1), ids(0)], names=("output_ids", "sequence_length", "x")),
        b"",
        b"\x12",
        response([ids(18), ids(1)])[:-1],  # cut short
        response([ids(18), ids(1)]) + b"\x00",
    ):
        assert shape.contents(other) is None, other


def test_long_contents_and_long_responses_use_multi_byte_lengths() -> None:
    """Lengths of 128 bytes and more take two varint bytes, in the entries and around the response."""
    names = ("text_output", "num_output_tokens")
    first = response([b"\x05\x00\x00\x00hello", ids(1)], names=names, request_id="r" * 200)
    shape = learned(first, *names)
    text = "x" * 300
    long = response(
        [len(text).to_bytes(4, "little") + text.encode(), ids(2)], names=names, request_id="r" * 200
    )
    assert shape.contents(long) == list(parse(long).infer_response.raw_output_contents)
    text = "y" * 20000  # three varint bytes: the entry's length and the response's
    longer = response(
        [len(text).to_bytes(4, "little") + text.encode(), ids(3)], names=names, request_id="r" * 200
    )
    assert shape.contents(longer) == list(parse(longer).infer_response.raw_output_contents)


def test_whatever_it_reads_is_what_protobuf_parses() -> None:
    """Random responses against shapes learned from random responses: a read is either refused or
    equal to protobuf's parse of the same bytes, with the head's fields equal to the shape's."""
    rng = random.Random(7)

    def random_response() -> bytes:
        names = rng.choice([("output_ids", "sequence_length"), ("text_output", "num_output_tokens")])
        count = rng.choice([1, 1, 1, 2, 40])
        contents = [bytes(rng.getrandbits(8) for _ in range(4 * count)), ids(count)]
        return response(
            contents,
            names=names,
            request_id=rng.choice(["a", "b", "c" * 130]),
            final=rng.random() < 0.2,
            dims=(1, 1, count),
            error="failed" if rng.random() < 0.05 else "",
        )

    samples = [random_response() for _ in range(300)]
    hits = 0
    for first in samples[:30]:
        parsed = parse(first)
        if parsed.error_message or parsed.infer_response.parameters["triton_final_response"].bool_param:
            continue
        names = tuple(output.name for output in parsed.infer_response.outputs)
        shape = learned(first, names[0])
        for other in samples:
            contents = shape.contents(other)
            if contents is None:
                continue
            hits += 1
            expected = parse(other)
            assert not expected.error_message
            assert contents == list(expected.infer_response.raw_output_contents)
            head, expected_head = parsed.infer_response, expected.infer_response
            del head.raw_output_contents[:], expected_head.raw_output_contents[:]
            assert head == expected_head
            parsed = parse(first)  # restored for the next comparison
    assert hits > 100  # most same-shaped pairs were read from their bytes


def test_a_stream_reads_every_token_whatever_its_responses_shapes(
    demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An EngineStream fed responses of one token, then two, then one again: every id is read, and
    protobuf parses only the first two responses (the shape is learnt from the second, off the first
    token's way) and where the shape changed (the stream learns it anew, up to three times)."""
    tokenizer = load_tokenizer(str(demo_model_dir))
    words = tokenizer.encode(" one two three four five six seven eight nine", add_special_tokens=False)[:9]
    assert len(words) == 9
    batches = [words[0:1], words[1:2], words[2:3], words[3:5], words[5:7], words[7:8], words[8:9]]
    parsed: list[bytes] = []
    protobuf = client._parse_response
    monkeypatch.setattr(client, "_parse_response", lambda data: parsed.append(data) or protobuf(data))
    request = GenerationRequest(prompt_ids=array("i", [1]), max_tokens=100)
    stream = client.EngineStream(
        request, TokenIdReader(request, IncrementalDetokenizer(tokenizer)), "id", lambda _: None
    )
    for batch in batches:
        count = len(batch)
        stream.on_message(response([ids(*batch), ids(count)], request_id="id", dims=(1, 1, count)))
    stream.on_message(response([ids(), ids(0)], request_id="id", final=True, dims=(1, 1, 0)))
    text = ""
    while stream.finish_reason is None:
        text += stream.poll() or ""
    assert text == tokenizer.decode(words) and stream.completion_tokens == len(words)
    # parsed: the first two, the first of two tokens, the first of one again, the final
    assert len(parsed) == 5
