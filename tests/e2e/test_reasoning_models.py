"""A reasoning model through `bentoml serve .`: the demo packed with `--reasoning-parser deepseek-r1`
and a chat template that opens `<think>` (as DeepSeek-R1's does) and takes `reasoning_effort`.

How the stand-in thinks: the demo model has random weights and would never write `</think>`, so
the tests ask for `guided_regex` `[a-z ]{4,16}</think>[a-z ]{4,16}`: the engine's grammar (llguidance
in the reference engine) lets it write nothing else, a think block closed by `</think>` and an answer.
The tag is several tokens, so a stream brings it split across chunks. Without a guide the model
never closes the block: the answer is all reasoning, as a real model's cut off while thinking.

One flavour (llmapi, the one `--hf-model` checkpoints of reasoning models get): the parser works on
the text the service relays, which both flavours stream token by token (tests/unit/api/openai/test_official_client.py
runs on both), and a second packed model per flavour costs ~30 s of start-up.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.e2e.conftest import BentoService, pack_demo

THINK_TEMPLATE = (
    "{{- '<|begin_of_text|>' -}}"
    "{%- if reasoning_effort -%}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nReasoning effort: ' ~ reasoning_effort ~ '<|eot_id|>' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\\n\\n' ~ (message['content'] | trim) ~ '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n<think>\\n' -}}"
    "{%- endif -%}"
)
"""Llama-3's format, plus DeepSeek-R1's opened think block and a reasoning_effort line."""

THOUGHT, ANSWER = "[a-z ]{4,16}", "[a-z ]{4,16}"
GUIDE = {"guided_regex": f"{THOUGHT}</think>{ANSWER}"}
MESSAGES = [{"role": "user", "content": "What is two and two?"}]
FLAVORS = ("llmapi",)


@pytest.fixture(scope="module")
def reasoning_service(flavor: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BentoService]:
    work = tmp_path_factory.mktemp(f"reasoning_{flavor}")
    template = work / "think.jinja"
    template.write_text(THINK_TEMPLATE)
    home = pack_demo(
        work / "home", flavor, "--reasoning-parser", "deepseek-r1", "--chat-template", str(template)
    )
    server = BentoService(home, work).start()
    try:
        yield server
    finally:
        server.stop_soon()


@pytest.fixture(scope="module")
def thinker(reasoning_service: BentoService) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{reasoning_service.url}/v1", api_key="x", max_retries=0, timeout=120)


def chat(client: openai.OpenAI, **extra: Any) -> Any:
    params = {"model": "trtllm-demo", "messages": MESSAGES, "temperature": 0, **extra}
    return client.chat.completions.create(**params)


def test_the_think_block_is_reasoning_content_streamed_or_not(thinker: openai.OpenAI) -> None:
    message = chat(thinker, max_tokens=80, extra_body=GUIDE).choices[0].message
    thought, answer = message.reasoning_content, message.content
    assert re.fullmatch(THOUGHT, thought) and re.fullmatch(ANSWER, answer), message
    assert message.reasoning == thought  # vLLM's newer name, the same text

    chunks = list(chat(thinker, max_tokens=80, extra_body=GUIDE, stream=True))
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    thinking = [d.reasoning_content for d in deltas if getattr(d, "reasoning_content", None)]
    assert "".join(thinking) == thought
    # as it is generated: every piece of the thought before the answer's first (how many pieces
    # depends on how many tokens one socket read carries, which a loaded machine makes several); the
    # read that carries </think> may carry the thought's end and the answer's start in one delta
    said = [i for i, d in enumerate(deltas) if d.content]
    thought_at = [i for i, d in enumerate(deltas) if getattr(d, "reasoning_content", None)]
    assert said and max(thought_at) <= min(said), (thought_at, said)
    assert [
        getattr(d, "reasoning", None) for d in deltas if getattr(d, "reasoning_content", None)
    ] == thinking
    assert "".join(d.content or "" for d in deltas) == answer  # no piece of </think> leaked
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_an_answer_cut_off_while_thinking_is_all_reasoning(thinker: openai.OpenAI) -> None:
    choice = chat(thinker, max_tokens=6).choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content is None and choice.message.reasoning_content


def test_responses_return_a_reasoning_item(thinker: openai.OpenAI) -> None:
    params: dict[str, Any] = {"model": "trtllm-demo", "input": "Two and two?", "max_output_tokens": 6}
    whole = thinker.responses.create(temperature=0, **params)
    assert [item.type for item in whole.output] == ["reasoning", "message"]
    thought = whole.output[0].content[0].text  # type: ignore[union-attr,index]  # a reasoning item: asserted above
    assert thought and whole.output_text == "" and whole.status == "incomplete"

    events = list(thinker.responses.create(stream=True, temperature=0, **params))
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == thought and events[-1].type == "response.incomplete"


def test_reasoning_effort_reaches_the_template(thinker: openai.OpenAI) -> None:
    plain = chat(thinker, max_tokens=2).usage.prompt_tokens
    low = chat(thinker, max_tokens=2, reasoning_effort="low").usage.prompt_tokens
    assert low > plain  # the template's "Reasoning effort: low" line
    answer = thinker.responses.create(
        model="trtllm-demo", input="Two and two?", max_output_tokens=2, reasoning={"effort": "low"}
    )
    assert answer.reasoning is not None and answer.reasoning.effort == "low"
    assert answer.usage is not None and answer.usage.input_tokens > plain


def test_pack_json_names_the_parser(reasoning_service: BentoService) -> None:
    (pack,) = Path(reasoning_service.home, "models").glob("*/*/pack.json")
    assert '"reasoning_parser": "deepseek-r1"' in pack.read_text()


def test_messages_return_a_thinking_block_streamed_or_not(
    reasoning_service: BentoService, thinker: openai.OpenAI
) -> None:
    """Cut off while thinking (no guide here: Anthropic's requests take none of vLLM's), as the
    Responses test: the message is one thinking block, the chat completion's reasoning."""
    claude = anthropic.Anthropic(base_url=reasoning_service.url, api_key="x", max_retries=0, timeout=120)
    expected = chat(thinker, max_tokens=6).choices[0].message.reasoning_content
    assert expected
    params: dict[str, Any] = {
        "model": "trtllm-demo",
        "max_tokens": 6,
        "messages": MESSAGES,
        "extra_body": {"temperature": 0},
    }
    message = claude.messages.create(**params)
    assert [block.type for block in message.content] == ["thinking"]
    assert message.content[0].thinking == expected and message.stop_reason == "max_tokens"  # type: ignore[union-attr]  # a thinking block: asserted above

    with claude.messages.stream(**params) as stream:
        events = list(stream)
        final = stream.get_final_message()
    thinking = [
        e.delta.thinking
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "thinking_delta"
    ]
    assert "".join(thinking) == expected
    assert [block.model_dump() for block in final.content] == [
        block.model_dump() for block in message.content
    ]
    omitted = {"type": "enabled", "budget_tokens": 1024, "display": "omitted"}  # budget < max_tokens
    hidden = claude.messages.create(**{**params, "max_tokens": 1025}, thinking=omitted)  # type: ignore[arg-type]  # the options as a plain dict
    assert [block.type for block in hidden.content] == ["thinking"] and hidden.content[0].thinking == ""  # type: ignore[union-attr]  # a thinking block: asserted first
