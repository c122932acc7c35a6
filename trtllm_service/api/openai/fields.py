"""The OpenAI surface's table: each request field -> what it settles into -> the engine's inputs.

A row names the OpenAI fields (chat, completions and responses share them: `SamplingFields`) and
the `GenerationRequest` attributes `settle` turns them into. The engines' columns are not written
here but looked up: the C++ backend's tensor in `request.ENGINE_INPUTS` (names from NVIDIA's
contract, `tensorrtllm_backend/nvidia_backend.py`), the llmapi model's tensor in
`request.LLMAPI_INPUTS`, and the `tensorrt_llm.SamplingParams` keyword that tensor fills in the LLM
API (`llmapi_keyword`; tests/unit/api/openai/test_fields.py holds it to the llmapi model's contract).
docs/api.md's table (OpenAI fields and the engine inputs) is `markdown()`
(`python -m trtllm_service.api.openai.fields`; a test keeps them equal).
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_service.relay.request import ENGINE_INPUTS, LLMAPI_INPUTS


@dataclass(frozen=True, slots=True)
class Row:
    """OpenAI request fields -> the `GenerationRequest` attributes they settle into (none: the
    service itself does it, as `note` says)."""

    fields: str
    settles: tuple[str, ...] = ()
    note: str = ""


OPENAI_FIELDS: tuple[Row, ...] = (
    Row(
        "`messages`, `prompt`, `input`, `instructions`, `tools`",
        ("prompt_ids",),
        "chat template (tools rendered into the prompt), tokenized in the service",
    ),
    Row(
        "`max_tokens`, `max_completion_tokens`, `max_output_tokens`",
        ("max_tokens",),
        "unset: what the context leaves",
    ),
    Row("`temperature`", ("temperature", "top_k"), "0: greedy, sent as top_k 1"),
    Row("`top_p`", ("top_p",), "sampling without top_k/top_p: 1"),
    Row("`top_k`", ("top_k",), "-1 / 0: unset"),
    Row("`repetition_penalty`", ("repetition_penalty",)),
    Row("`presence_penalty`", ("presence_penalty",)),
    Row("`frequency_penalty`", ("frequency_penalty",)),
    Row("`seed`", ("seed",), "choice i samples with seed + i; unset, a sampled request draws a random one"),
    Row("`min_tokens`", ("min_tokens",)),
    Row("`ignore_eos`", ("end_id",), "end id -1 (LLM API: ignore_eos)"),
    Row("`stop`", (), "matched on the text in the service, never sent"),
    Row("`stop_token_ids`", ("stop_token_ids",), "besides the model's own end ids"),
    Row("`logit_bias`", ("embedding_bias",), "a float32 bias over the vocabulary"),
    Row(
        "`logprobs`, `top_logprobs`",
        ("logprobs", "return_log_probs", "return_generation_logits"),
        "C++: the top N from the generation logits",
    ),
    Row(
        "`echo` with `logprobs`", ("prompt_logprobs", "return_context_logits"), "C++: from the context logits"
    ),
    Row("`n`", (), "one engine request per choice"),
    Row("`best_of`", (), "without beam search: candidates, one engine request each"),
    Row(
        "`use_beam_search` (`best_of` or `n` beams)",
        ("beam_width", "num_return", "use_beam_search"),
        "one request returns the n best",
    ),
    Row("`length_penalty`", ("length_penalty",), "beam search"),
    Row("`early_stopping`", ("early_stopping",), "beam search; C++: not sent, only true is served"),
    Row(
        "`response_format`, `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, `text.format`, "
        "forced `tool_choice`",
        ("guide_type", "guide"),
        "one guide, compiled by llguidance first",
    ),
    Row(
        "`model` naming a LoRA adapter",
        ("lora_name", "lora_id", "lora_path", "lora_task_id", "lora_weights", "lora_config"),
        "C++: weights with the first request only; LLM API: a loaded adapter by id and path",
    ),
    Row("`reasoning_effort`, `reasoning.effort`", (), "to a chat template that takes it"),
    Row(
        "`priority`, `service_tier`",
        (),
        "the service's queue: no engine at 1.2.1 takes a priority",
    ),
    Row("`stream`", (), "the engine always streams (beam search excepted)"),
)
"""Every OpenAI request field that reaches the engine, or that the service serves itself."""

RESPONSE_ONLY = ("stream_options", "parallel_tool_calls", "user")
"""Request fields that shape only the response (usage chunks, how many calls are returned), or
nothing (`user`)."""

_LLMAPI_OTHER = {
    "input_ids": "the prompt (`generate_async`)",
    "guided_decoding_guide_type": "guided_decoding",
    "guided_decoding_guide": "guided_decoding",
    "lora_name": "`LoRARequest`",
    "lora_id": "`LoRARequest`",
    "lora_path": "`LoRARequest`",
}


def llmapi_keyword(tensor: str) -> str:
    """The LLM API argument an llmapi model input fills: `sampling_param_<keyword>`, else the
    prompt, the guide (`GuidedDecodingParams`) or the adapter (`LoRARequest`)."""
    if tensor.startswith("sampling_param_"):
        return tensor.removeprefix("sampling_param_")
    return _LLMAPI_OTHER[tensor]


def engine_columns(row: Row) -> tuple[str, str, str]:
    """(C++ backend inputs, llmapi model inputs, LLM API arguments) of a row."""
    cpp = [ENGINE_INPUTS[name].name for name in row.settles if name in ENGINE_INPUTS]
    llmapi = [LLMAPI_INPUTS[name].name for name in row.settles if name in LLMAPI_INPUTS]
    keywords = dict.fromkeys(llmapi_keyword(name) for name in llmapi)
    return ", ".join(cpp), ", ".join(llmapi), ", ".join(keywords)


def markdown() -> str:
    """The table as docs/api.md shows it."""
    lines = [
        "| OpenAI field | request field | C++ backend (`tensorrt_llm` input) | llmapi model input "
        "| LLM API (`SamplingParams`) | notes |",
        "|---|---|---|---|---|---|",
    ]
    for row in OPENAI_FIELDS:
        cpp, llmapi, keywords = engine_columns(row)
        cells = [
            row.fields,
            _code(", ".join(row.settles)),
            _code(cpp),
            _code(llmapi),
            _code(keywords) if "`" not in keywords else keywords,
            row.note,
        ]
        lines.append("| " + " | ".join(cell or "-" for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def _code(names: str) -> str:
    return ", ".join(f"`{name}`" for name in names.split(", ")) if names else ""


if __name__ == "__main__":
    print(markdown(), end="")
