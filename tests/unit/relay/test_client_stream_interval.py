"""TRTLLM_STREAM_INTERVAL_MS: after the first text, a stream's text goes out at most once per interval,
and what arrived meanwhile goes out together; 0 writes each token as it comes. Engine responses are
fed to the stream as Triton's bytes (tests.support.engine_response), on a real event loop."""

from __future__ import annotations

import asyncio
import itertools
from array import array
from typing import Any

import pytest
from tritonclient.grpc import service_pb2

from tensorrtllm_backend.detokenizer import IncrementalDetokenizer
from tests.support import timed_reads
from trtllm_service.relay.client import EngineStream
from trtllm_service.relay.readers import TokenIdReader
from trtllm_service.relay.request import GenerationRequest
from trtllm_service.settings import Settings, SettingsError


def _stream(tokenizer: Any, interval_s: float) -> EngineStream:
    request = GenerationRequest(prompt_ids=array("i", [1]), max_tokens=100)
    reader = TokenIdReader(request, IncrementalDetokenizer(tokenizer))
    stream = EngineStream(request, reader, "id", lambda _: None, interval_s=interval_s)
    return stream


def _reads(tokenizer: Any, interval_s: float, ids: list[int], gap_s: float) -> list[tuple[float, str]]:
    """Feeds one id per `gap_s`, then the final response; returns (time, text) of each read."""
    return timed_reads(_stream(tokenizer, interval_s), ids, gap_s)


def test_without_an_interval_each_token_is_read_as_it_arrives(tokenizer: Any) -> None:
    ids = tokenizer.encode(" one two three four five six seven eight", add_special_tokens=False)
    reads = [text for _, text in _reads(tokenizer, 0.0, ids, 0.005) if text]
    assert len(reads) == len(ids)
    assert "".join(reads) == tokenizer.decode(ids)


def test_with_an_interval_the_first_text_is_immediate_and_the_rest_comes_in_fewer_chunks(
    tokenizer: Any,
) -> None:
    ids = tokenizer.encode(" one two three four five six seven eight", add_special_tokens=False)
    reads = [(at, text) for at, text in _reads(tokenizer, 0.05, ids, 0.005) if text]
    assert reads[0][0] < 0.03, "the first text is never held back"
    assert "".join(text for _, text in reads) == tokenizer.decode(ids)
    assert len(reads) < len(ids) / 2, reads
    gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(reads)]
    assert all(gap >= 0.045 for gap in gaps), gaps


def test_an_engine_slower_than_the_interval_is_never_held_back(tokenizer: Any) -> None:
    ids = tokenizer.encode(" one two three four", add_special_tokens=False)
    reads = [text for _, text in _reads(tokenizer, 0.005, ids, 0.03) if text]
    assert len(reads) == len(ids)


def test_output_ids_found_wherever_the_engine_puts_them(tokenizer: Any) -> None:
    ids = tokenizer.encode(" hello", add_special_tokens=False)
    response = service_pb2.ModelStreamInferResponse()
    result = response.infer_response
    for name, raw in (("sequence_length", array("i", [len(ids)])), ("output_ids", array("i", ids))):
        output = result.outputs.add()
        output.name, output.datatype = name, "INT32"
        result.raw_output_contents.append(raw.tobytes())
    result.parameters["triton_final_response"].bool_param = True

    async def scenario() -> str:
        stream = _stream(tokenizer, 0.0)
        stream.on_message(response.SerializeToString())
        return await stream.read()

    assert asyncio.run(scenario()) == " hello"


def test_the_setting_is_read_and_bounded() -> None:
    assert Settings.from_env({}).stream_interval_ms == 0
    assert Settings.from_env({"TRTLLM_STREAM_INTERVAL_MS": "20"}).stream_interval_ms == 20
    with pytest.raises(SettingsError, match="TRTLLM_STREAM_INTERVAL_MS"):
        Settings.from_env({"TRTLLM_STREAM_INTERVAL_MS": "-1"})
