"""A beam-packed LLM API model (issue 34, items 4-5): TensorRT-LLM 1.2.1's PyTorch executor refuses
every request whose beam width is not max_beam_width, so the service runs every request to such a
model as a beam search over the packed width, and refuses with a 400 naming the field what cannot
be served that way; log-prob counts beyond the PyTorch backend's limits are 400s too."""

from __future__ import annotations

from typing import Any

import pytest

from trtllm_service.errors import APIError
from trtllm_service.relay.request import EngineLimits, SamplingParams
from trtllm_service.runtime import Runtime

pytestmark = pytest.mark.unit


def _runtime(width: int, exact: bool = True, vocab: int = 100) -> Any:
    runtime = object.__new__(Runtime)
    runtime.beam_limit = (width, exact)
    runtime.flavor = "llmapi" if exact else "ensemble"
    runtime.limits = EngineLimits(max_seq_len=64, max_input_len=64, vocab_size=vocab)
    runtime.no_top_logprobs = None
    runtime.no_prompt_logprobs = None
    runtime.no_top_logprobs = None
    return runtime


def _refused(call: Any, *args: Any, **kwargs: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        call(*args, **kwargs)
    assert caught.value.status == 400
    return caught.value


def test_every_request_to_a_beam_packed_model_is_a_beam_search() -> None:
    runtime = _runtime(4)
    assert runtime.beam_packed == 4
    filled = runtime.fill_beam_search(SamplingParams(max_tokens=8, temperature=1.0, top_k=0))
    assert (filled.beam_width, filled.temperature, filled.top_p, filled.top_k) == (4, None, None, None)
    runtime.check_engine_features(filled, stream=True, n=1)  # one beam streams (as one chunk)
    runtime.check_engine_features(filled, n=4)  # up to `width` choices: the best beams
    assert _refused(runtime.check_engine_features, filled, n=5).param == "n"
    assert _refused(runtime.check_engine_features, filled, stream=True, n=2).param == "stream"
    for name, value in (("temperature", 0.7), ("top_p", 0.9), ("top_k", 40)):
        error = _refused(runtime.fill_beam_search, SamplingParams(**{name: value}))
        assert error.param == name and "--max-beam-width 4" in error.message
    explicit = SamplingParams(beam_width=4)
    assert runtime.fill_beam_search(explicit) is explicit


def test_log_probs_with_beams_are_refused_naming_the_field() -> None:
    runtime = _runtime(4)
    many = runtime.fill_beam_search(SamplingParams(logprobs=2))
    error = _refused(runtime.check_engine_features, many, logprobs_param="top_logprobs")
    assert error.param == "top_logprobs" and "Beam search does not support multiple logprobs" in error.message
    one = runtime.fill_beam_search(SamplingParams(logprobs=0))
    assert _refused(runtime.check_engine_features, one).param == "logprobs"
    guided = runtime.fill_beam_search(SamplingParams(guide=("regex", "a+")))
    assert _refused(runtime.check_engine_features, guided).param == "response_format"


def test_other_models_keep_their_requests() -> None:
    for runtime in (_runtime(1), _runtime(4, exact=False)):  # llmapi without beams; a C++ engine's limit
        params = SamplingParams(temperature=0.7)
        assert runtime.beam_packed is None and runtime.fill_beam_search(params) is params
        runtime.check_engine_features(params, stream=True)


def test_top_logprobs_beyond_the_vocabulary_are_refused_before_the_engine() -> None:
    runtime = _runtime(1, vocab=10)
    runtime.check_logprobs(SamplingParams(logprobs=10), "top_logprobs")
    error = _refused(runtime.check_logprobs, SamplingParams(logprobs=11), "top_logprobs")
    assert error.param == "top_logprobs" and "the vocabulary has 10" in error.message
    assert (
        _refused(runtime.check_logprobs, SamplingParams(prompt_logprobs=11), "logprobs").param == "logprobs"
    )


def test_the_doctor_probes_a_beam_packed_model_as_the_service_serves_it() -> None:
    import asyncio

    from trtllm_service.doctor import BEAM_PACKED, UNSUPPORTED, FeatureProbe

    probe = FeatureProbe(_runtime(4))
    (check,) = asyncio.run(_run(probe, [("logprobs", probe.logprobs)]))
    assert check.status == UNSUPPORTED and "Beam search does not support multiple logprobs" in check.detail
    line = BEAM_PACKED.format(width=4)
    assert "every request runs as a beam search over 4 beams" in line and "\n" not in line


async def _run(probe: Any, probes: list[Any]) -> list[Any]:
    probe.probes = lambda: probes
    return await probe.run()
