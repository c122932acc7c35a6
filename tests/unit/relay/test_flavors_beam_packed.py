"""A beam-packed LLM API model (issue 34, items 4-5): TensorRT-LLM 1.2.1's PyTorch executor refuses
every request whose beam width is not max_beam_width, so the service runs every request to such a
model as a beam search over the packed width, and refuses with a 400 naming the field what cannot
be served that way; log-prob counts beyond the PyTorch backend's limits are 400s too."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from trtllm_service.errors import APIError
from trtllm_service.relay.flavors import EnsembleFlavor, Flavor, LLMAPIFlavor
from trtllm_service.relay.request import SamplingParams

pytestmark = pytest.mark.unit


def _flavor(width: int, exact: bool = True, vocab: int = 100) -> Flavor:
    """An LLM API model packed with max_beam_width `width` (exact), else a C++ engine's limit."""
    kind = LLMAPIFlavor if exact else EnsembleFlavor
    return kind(max_beam_width=width, vocab_size=vocab)


def _refused(call: Any, *args: Any, **kwargs: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        call(*args, **kwargs)
    assert caught.value.status == 400
    return caught.value


def test_every_request_to_a_beam_packed_model_is_a_beam_search() -> None:
    flavor = _flavor(4)
    assert flavor.beam_packed == 4
    filled = flavor.fill_beam_search(SamplingParams(max_tokens=8, temperature=1.0, top_k=0))
    assert (filled.beam_width, filled.temperature, filled.top_p, filled.top_k) == (4, None, None, None)
    flavor.check_engine_features(filled, stream=True, n=1)  # one beam streams (as one chunk)
    flavor.check_engine_features(filled, n=4)  # up to `width` choices: the best beams
    assert _refused(flavor.check_engine_features, filled, n=5).param == "n"
    assert _refused(flavor.check_engine_features, filled, stream=True, n=2).param == "stream"
    for name, value in (("temperature", 0.7), ("top_p", 0.9), ("top_k", 40)):
        error = _refused(flavor.fill_beam_search, SamplingParams(**{name: value}))
        assert error.param == name and "--max-beam-width 4" in error.message
    explicit = SamplingParams(beam_width=4)
    assert flavor.fill_beam_search(explicit) is explicit


def test_log_probs_with_beams_are_refused_naming_the_field() -> None:
    flavor = _flavor(4)
    many = flavor.fill_beam_search(SamplingParams(logprobs=2))
    error = _refused(flavor.check_engine_features, many, logprobs_param="top_logprobs")
    assert error.param == "top_logprobs" and "Beam search does not support multiple logprobs" in error.message
    one = flavor.fill_beam_search(SamplingParams(logprobs=0))
    assert _refused(flavor.check_engine_features, one).param == "logprobs"
    guided = flavor.fill_beam_search(SamplingParams(guide=("regex", "a+")))
    assert _refused(flavor.check_engine_features, guided).param == "response_format"


def test_other_models_keep_their_requests() -> None:
    for flavor in (_flavor(1), _flavor(4, exact=False)):  # llmapi without beams; a C++ engine's limit
        params = SamplingParams(temperature=0.7)
        assert flavor.beam_packed is None and flavor.fill_beam_search(params) is params
        flavor.check_engine_features(params, stream=True)


def test_top_logprobs_beyond_the_vocabulary_are_refused_before_the_engine() -> None:
    flavor = _flavor(1, vocab=10)
    flavor.check_logprobs(SamplingParams(logprobs=10), "top_logprobs")
    error = _refused(flavor.check_logprobs, SamplingParams(logprobs=11), "top_logprobs")
    assert error.param == "top_logprobs" and "the vocabulary has 10" in error.message
    assert _refused(flavor.check_logprobs, SamplingParams(prompt_logprobs=11), "logprobs").param == "logprobs"


def test_the_doctor_probes_a_beam_packed_model_as_the_service_serves_it() -> None:
    import asyncio

    from trtllm_service.doctor import BEAM_PACKED, UNSUPPORTED, FeatureProbe

    probe = FeatureProbe(SimpleNamespace(flavor=_flavor(4)))
    (check,) = asyncio.run(probe.run(["logprobs"]))
    assert check.status == UNSUPPORTED and "Beam search does not support multiple logprobs" in check.detail
    line = BEAM_PACKED.format(width=4)
    assert "every request runs as a beam search over 4 beams" in line and "\n" not in line
