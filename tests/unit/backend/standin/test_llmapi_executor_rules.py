"""The PyTorch executor's rules at TensorRT-LLM 1.2.1 in the stand-in LLM API (issue 34, items 4-6).

Beam width equal to max_beam_width for every request, beam search without multiple log probs, a
top-logprobs count within the vocabulary, the max_num_tokens check of generate_async, max_tokens
clamped (not refused) to what max_seq_len leaves, and a KV cache that queues what does not fit: each
with NVIDIA's message (nvidia_llmapi), delivered as NVIDIA delivers it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llm_standin
import numpy as np
import nvidia_llmapi as nv
import pytest
from llm_engine import LLMEngine
from llmapi_contract import TextLimits, parse_text_request

from tensorrtllm_backend import LLMAPI_TEMPLATES_DIR

pytestmark = pytest.mark.unit

SamplingParams = llm_standin.SamplingParams


def _make_source(kind: str, model_dir: str, tokenizer_dir: str, **options: Any) -> tuple[Any, int, int]:
    from reference import ReferenceSource

    source = ReferenceSource(
        model_dir, options["device"], options["dtype"], slots=options["slots"] or 4,
        max_len=options["max_seq_len"], tokenizer_dir=tokenizer_dir,
    )  # fmt: skip
    return source, source.vocab_size, source.max_len


@pytest.fixture(scope="module")
def make_llm(demo_model_dir: Path, tokenizer: Any) -> Iterator[Any]:
    made: list[Any] = []
    logs: list[str] = []

    def make(**args: Any) -> Any:
        api = llm_standin.StandIn("reference", tokenizer, _make_source, log=logs.append)
        llm = api.LLM(**api.update_llm_args_with_extra_dict({}, {"model": str(demo_model_dir), **args}))
        llm.logs = logs
        made.append(llm)
        return llm

    yield make
    for llm in made:
        llm.shutdown()


async def _run(result: Any) -> Any:
    async for _ in result:
        pass
    return result


def _generate(loop: Any, llm: Any, ids: list[int], **params: Any) -> Any:
    async def go() -> Any:
        return await _run(llm.generate_async(ids, sampling_params=SamplingParams(**params)))

    return loop.run_until_complete(go())


def test_every_request_must_search_max_beam_width_beams(make_llm: Any, loop: Any) -> None:
    """1.2.1's executor refuses every request whose beam width differs from max_beam_width, an
    ordinary width-1 request included; the caller sees a request error while iterating."""
    beams = make_llm(max_beam_width=2)
    for params, width in (({"top_k": 1}, 1), ({"use_beam_search": True, "best_of": 3, "n": 1}, 3)):
        with pytest.raises(llm_standin.ExecutorRequestError) as caught:
            _generate(loop, beams, [1, 2, 3], max_tokens=4, **params)
        assert str(caught.value) == nv.BEAM_WIDTH_NOT_MAX.format(bw=width, mbw=2)
        assert str(caught.value).endswith("This is not supported!")
    served = _generate(loop, beams, [1, 2, 3], max_tokens=4, use_beam_search=True, best_of=2, n=2)
    assert len(served.outputs) == 2
    plain = make_llm()  # max_beam_width unset: 1, and a beam request is the one refused
    with pytest.raises(
        llm_standin.ExecutorRequestError, match=r"beam width 2 is not equal to max_beam_width 1"
    ):
        _generate(loop, plain, [1, 2, 3], max_tokens=4, use_beam_search=True, best_of=2)
    assert _generate(loop, plain, [1, 2, 3], max_tokens=4, top_k=1).finished


def test_logprob_limits_of_the_pytorch_backend(make_llm: Any, loop: Any) -> None:
    beams = make_llm(max_beam_width=2)
    with pytest.raises(llm_standin.ExecutorRequestError, match=nv.BEAM_MULTIPLE_LOGPROBS):
        _generate(loop, beams, [1, 2, 3], max_tokens=4, use_beam_search=True, best_of=2, logprobs=2)
    plain = make_llm()
    vocab = plain.vocab_size
    for name in ("logprobs", "prompt_logprobs"):
        with pytest.raises(llm_standin.ExecutorRequestError, match=nv.TOPK_OUT_OF_RANGE):
            _generate(loop, plain, [1, 2, 3], max_tokens=2, top_k=1, **{name: vocab + 1})
    done = _generate(loop, plain, [1, 2, 3], max_tokens=2, top_k=1, logprobs=20)
    assert all(len(entry) >= 20 for entry in done.outputs[0].logprobs)


def test_prompt_over_max_num_tokens_is_refused_by_generate_async(make_llm: Any, loop: Any) -> None:
    llm = make_llm(max_num_tokens=8)

    async def call(ids: list[int]) -> Any:
        return llm.generate_async(ids, sampling_params=SamplingParams(max_tokens=2, top_k=1))

    with pytest.raises(ValueError) as caught:
        loop.run_until_complete(call(list(range(1, 10))))
    assert str(caught.value) == (
        "The sum of prompt length (9.0), query length (0) should not exceed max_num_tokens (8)"
    )
    assert _generate(loop, llm, list(range(1, 9)), max_tokens=2, top_k=1).finished  # 8 fits
    chunked = make_llm(max_num_tokens=8, enable_chunked_prefill=True)  # the check is off
    assert _generate(loop, chunked, list(range(1, 10)), max_tokens=2, top_k=1).finished


def test_max_tokens_beyond_max_seq_len_is_clamped_with_a_warning(make_llm: Any, loop: Any) -> None:
    llm = make_llm(max_seq_len=16)
    done = _generate(loop, llm, [1, 2, 3, 4, 5, 6], max_tokens=100, top_k=1, ignore_eos=True)
    assert len(done.outputs[0].token_ids) == 10 and done.outputs[0].finish_reason == "length"
    assert nv.MAX_TOKENS_CLAMPED.format(max_tokens=100, default_max_tokens=10) in llm.logs


def test_kv_cache_full_queues_and_what_never_fits_fails_the_executors_way(make_llm: Any, loop: Any) -> None:
    llm = make_llm(kv_cache_config={"max_tokens": 20})

    async def go() -> tuple[Any, Any, list[str]]:
        order: list[str] = []

        async def one(name: str, max_tokens: int) -> Any:
            result = llm.generate_async(
                [1, 2, 3, 4], sampling_params=SamplingParams(max_tokens=max_tokens, top_k=1, ignore_eos=True)
            )
            await _run(result)
            order.append(name)
            return result

        first = asyncio.ensure_future(one("first", 12))  # 16 of 20 tokens reserved
        await asyncio.sleep(0)
        second = asyncio.ensure_future(one("second", 4))  # 8 more: waits for the first
        await asyncio.sleep(0)
        assert len(llm._kv_queue) == 1
        return await first, await second, order

    _, second, order = loop.run_until_complete(go())
    assert order == ["first", "second"] and second.finished and llm._kv_used == 0
    with pytest.raises(llm_standin.ExecutorRequestError) as caught:
        _generate(loop, llm, [1, 2, 3, 4], max_tokens=17, top_k=1)  # 21 tokens: never fits
    assert str(caught.value) == nv.NOTHING_SCHEDULABLE
    assert _generate(loop, llm, [1, 2, 3, 4], max_tokens=2, top_k=1).finished  # and it serves on


class _Responder:
    def response(self, arrays: Any) -> Any:
        return arrays

    def error(self, message: str) -> dict[str, str]:
        return {"error": message}

    def invalid(self, message: str) -> dict[str, str]:
        return {"invalid": message}

    def log(self, message: str) -> None:
        pass


class _Counters:
    def finished(self, outcome: str) -> None:
        pass

    def tokens(self, count: int) -> None:
        pass


class _Sink:
    def __init__(self) -> None:
        import threading

        self.responses: list[Any] = []
        self.done = threading.Event()

    def send(self, response: Any, final: bool) -> None:
        self.responses.append(response)
        if final:
            self.done.set()

    def is_cancelled(self) -> bool:
        return False


def test_llm_engine_sends_executor_errors_as_upstreams_model_does(
    demo_model_dir: Path, tokenizer: Any
) -> None:
    """Upstream's model: every failure of generate_async or of the results is
    "Error generating request: <text>" (our model too: llm_engine, the production path)."""
    api = llm_standin.StandIn("reference", tokenizer, _make_source, log=lambda _: None)
    args = api.update_llm_args_with_extra_dict(
        {}, {"model": str(demo_model_dir), "max_beam_width": 2, "max_num_tokens": 8}
    )
    engine = LLMEngine(api, args, _Responder(), _Counters(), cancel_check_s=0.05)
    limits = TextLimits(vocab_size=1 << 20, max_seq_len=2048, end_ids=(1,))
    try:
        for text, message in (
            (b"The sea", nv.BEAM_WIDTH_NOT_MAX.format(bw=1, mbw=2)),
            (b"The sea is blue and the sky is grey", "should not exceed max_num_tokens (8)"),
        ):
            arrays = {"text_input": np.array([text], dtype=np.object_)}
            request = parse_text_request(arrays.get, "r", limits, tokenizer.encode, lambda ids: "")
            sink = _Sink()
            engine.submit_text(request, sink)
            assert sink.done.wait(60)
            assert sink.responses[-1]["error"].startswith(nv.GENERATE_ERROR)
            assert message in sink.responses[-1]["error"]
    finally:
        engine.shutdown()


def test_model_yaml_keeps_a_null_cuda_graph_config() -> None:
    """cuda_graph_config: null turns CUDA graphs off (its default is CudaGraphConfig()): kept, while
    any other null is left out (the LLM API's default)."""
    config = {
        "cuda_graph_config": None,
        "max_beam_width": None,
        "kv_cache_config": {"cuda_graph_config": None},
    }
    assert nv.drop_nulls(config) == {"cuda_graph_config": None, "kv_cache_config": {}}
    args = nv.validate_llm_args({"model": "m", **nv.drop_nulls(config)})
    assert args.cuda_graph_config is None and "cuda_graph_config" in args.model_fields_set


def _model_yaml(tmp_path: Path, demo_model_dir: Path, **overrides: str) -> dict[str, Any]:
    import yaml

    from tensorrtllm_backend.repository import repository_values
    from tensorrtllm_backend.tools.fill_template import fill_text, placeholders

    values = repository_values(
        engine_dir=demo_model_dir, tokenizer_dir=demo_model_dir, overrides={"end_ids": "1", **overrides}
    )
    text = (LLMAPI_TEMPLATES_DIR / "tensorrt_llm" / "1" / "model.yaml").read_text()
    data = yaml.safe_load(fill_text(text, {k: values[k] for k in placeholders(text)}, source="model.yaml"))
    data.pop("triton_config")
    return data


def test_beam_packing_sets_what_beam_search_needs_at_1_2(tmp_path: Path, demo_model_dir: Path) -> None:
    """--max-beam-width N: max_beam_width N, the overlap scheduler off, CUDA graphs off (NVIDIA's
    1.2.0rc6 sampling docs); both keys are TorchLlmArgs fields. Without beams: the LLM API's defaults."""
    beams = nv.drop_nulls(_model_yaml(tmp_path, demo_model_dir, max_beam_width="4"))
    assert beams["max_beam_width"] == 4 and beams["disable_overlap_scheduler"] is True
    assert "cuda_graph_config" in beams and beams["cuda_graph_config"] is None
    assert nv.unknown_keys(beams) == []
    args = nv.validate_llm_args(beams)
    assert args.disable_overlap_scheduler is True and args.cuda_graph_config is None
    plain = nv.drop_nulls(_model_yaml(tmp_path, demo_model_dir))
    assert "max_beam_width" not in plain and "disable_overlap_scheduler" not in plain
    assert plain["cuda_graph_config"] == {}  # CudaGraphConfig() as the LLM API's default builds it
    assert nv.unknown_keys(plain) == []
