"""The OpenAI surface's one table (api/openai/fields.py): complete, true to the engines' tables and
the LLM API's names, and the table docs/api.md shows."""

from __future__ import annotations

import re
from dataclasses import fields

import llmapi_contract

from tensorrtllm_backend import nvidia_llmapi
from tests.support import REPO_ROOT
from trtllm_service.api.openai.chat.protocol import ChatCompletionRequest
from trtllm_service.api.openai.completions.protocol import CompletionRequest
from trtllm_service.api.openai.fields import OPENAI_FIELDS, RESPONSE_ONLY, llmapi_keyword, markdown
from trtllm_service.api.openai.responses.protocol import ResponsesRequest
from trtllm_service.relay.request import ENGINE_INPUTS, LLMAPI_INPUTS, GenerationRequest

API_DOC = REPO_ROOT / "docs" / "api.md"


def test_every_request_field_has_a_row() -> None:
    named = {name for row in OPENAI_FIELDS for name in re.findall(r"`([a-z_]+)", row.fields)}
    for request in (ChatCompletionRequest, CompletionRequest, ResponsesRequest):
        for name in request.model_fields:
            assert name in named or name in RESPONSE_ONLY, f"{request.__name__}.{name} has no row"


def test_rows_settle_into_request_fields_that_reach_an_engine() -> None:
    attributes = {f.name for f in fields(GenerationRequest)} | {
        name for name in dir(GenerationRequest) if isinstance(getattr(GenerationRequest, name), property)
    }
    settled = set()
    for row in OPENAI_FIELDS:
        for name in row.settles:
            assert name in attributes, name
            assert name in ENGINE_INPUTS or name in LLMAPI_INPUTS, f"{name} reaches no engine"
            settled.add(name)
    assert set(ENGINE_INPUTS) | set(LLMAPI_INPUTS) <= settled, "an engine input without a row"


def test_llmapi_inputs_name_the_llm_apis_own_arguments() -> None:
    upstream = {**nvidia_llmapi.SAMPLING_INPUTS, **llmapi_contract.OURS}
    for spec in LLMAPI_INPUTS.values():
        keyword = llmapi_keyword(spec.name)
        if spec.name.startswith("sampling_param_"):
            assert keyword in nvidia_llmapi.SAMPLING_DEFAULTS, f"SamplingParams has no {keyword}"
            assert upstream.get(spec.name, keyword) == keyword, spec.name


def test_the_api_doc_shows_the_table() -> None:
    shown = "\n".join(line.lstrip() for line in API_DOC.read_text().splitlines())  # it sits in a list item
    assert markdown() in shown, "docs/api.md's OpenAI table: python -m trtllm_service.api.openai.fields"
