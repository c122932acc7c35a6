"""Engine-neutral sampling parameters.

Both the plain ``generate`` API and the OpenAI API reduce a request to one ``SamplingParams``, so the code
that builds the Triton request has a single input shape and no knowledge of either HTTP API.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one completion.

    ``None`` means "leave it to the engine's default": the Triton request then omits the input, instead of
    guessing a value that might differ from what the engine was built or configured with.

    Attributes:
        max_tokens: Most tokens to generate.
        temperature: Softmax temperature; 0 means greedy.
        top_p: Nucleus sampling mass.
        top_k: Sample from the k most likely tokens.
        repetition_penalty: Multiplicative penalty on tokens already present (1.0 = off).
        presence_penalty: Additive penalty on tokens already generated.
        frequency_penalty: Additive penalty scaled by how often a token was generated.
        seed: Random seed, for reproducible sampling.
        min_tokens: Fewest tokens to generate before end-of-sequence is allowed.
        stop: Stop strings, matched on the generated text (never sent to the engine as token ids, since
            the string -> token mapping is not unique).
        ignore_eos: Keep generating past end-of-sequence tokens (benchmarking).
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    min_tokens: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
