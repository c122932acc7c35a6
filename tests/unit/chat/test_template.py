"""PromptFormatter: chat templates and token counting, with a tiny Llama-3-like tokenizer built in the test."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from trtllm_service.chat.template import LLAMA3_CHAT_TEMPLATE, PromptFormatter

BOS = "<|begin_of_text|>"
SPECIALS = [BOS, "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
WORDS = ["[UNK]", "hello", "world", "system", "user", "assistant", "be", "brief", "hi"]


def make_tokenizer(*, with_bos: bool = True) -> PreTrainedTokenizerFast:
    """A word-level tokenizer with Llama-3's special tokens; adds BOS like Llama-3 when asked to."""
    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIALS)
    if with_bos:
        tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token=BOS, eos_token="<|eot_id|>", unk_token="[UNK]"
        )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eot_id|>", unk_token="[UNK]")


@pytest.fixture
def word_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh word-level Llama-3-like tokenizer per test (tests set its chat template); not the demo
    model's `tokenizer`."""
    return make_tokenizer()


def test_default_template_is_llama3_when_tokenizer_has_none(word_tokenizer: PreTrainedTokenizerFast) -> None:
    formatter = PromptFormatter(word_tokenizer)
    assert formatter.chat_template == LLAMA3_CHAT_TEMPLATE
    text = formatter.render(
        [{"role": "system", "content": "  be brief \n"}, {"role": "user", "content": "hello"}],
        add_generation_prompt=True,
    )
    assert text == (
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_without_generation_prompt(word_tokenizer: PreTrainedTokenizerFast) -> None:
    text = PromptFormatter(word_tokenizer).render(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        add_generation_prompt=False,
    )
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nhello<|eot_id|>"
    )


def test_tokenizer_template_is_used(word_tokenizer: PreTrainedTokenizerFast) -> None:
    word_tokenizer.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    assert PromptFormatter(word_tokenizer).render([{"role": "user", "content": "hi"}]) == "[user]hi"


def test_override_template_wins(word_tokenizer: PreTrainedTokenizerFast) -> None:
    word_tokenizer.chat_template = "{{ 'tokenizer' }}"
    formatter = PromptFormatter(word_tokenizer, chat_template="{{ messages[0]['content'] }}!")
    assert formatter.render([{"role": "user", "content": "hi"}]) == "hi!"


def test_unsupported_role_is_value_error(word_tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match="Unsupported role 'wizard'"):
        PromptFormatter(word_tokenizer).render([{"role": "wizard", "content": "x"}])


def test_template_raise_exception_is_value_error(word_tokenizer: PreTrainedTokenizerFast) -> None:
    template = (
        "{{ raise_exception('System role not supported') if messages[0]['role'] == 'system' else 'ok' }}"
    )
    formatter = PromptFormatter(word_tokenizer, chat_template=template)
    assert formatter.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ValueError, match="System role not supported"):
        formatter.render([{"role": "system", "content": "x"}])


def test_template_syntax_error_fails_at_construction(word_tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match="Invalid chat template"):
        PromptFormatter(word_tokenizer, chat_template="{% for m in messages %}")


def test_no_messages_is_value_error(word_tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match="At least one message"):
        PromptFormatter(word_tokenizer).render([])


def from_prompt(formatter: PromptFormatter, prompt: str, system_prompt: str | None) -> str:
    return formatter.render(formatter.messages_from_prompt(prompt, system_prompt))


def test_from_prompt_with_and_without_system(word_tokenizer: PreTrainedTokenizerFast) -> None:
    formatter = PromptFormatter(word_tokenizer)
    user_only = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    assert from_prompt(formatter, "hello", None) == user_only
    assert from_prompt(formatter, "hello", "") == user_only
    assert from_prompt(formatter, "hello", "be brief").startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|><|start_header_id|>user"
    )


def test_encode_adds_bos_once(word_tokenizer: PreTrainedTokenizerFast) -> None:
    formatter = PromptFormatter(word_tokenizer)
    # BOS + 2 words, as the preprocessing model encodes it
    assert formatter.encode("hello world") == word_tokenizer.encode("hello world", add_special_tokens=True)
    assert len(formatter.encode("hello world")) == 3
    rendered = from_prompt(formatter, "hello world", "be brief")
    ids = word_tokenizer.encode(rendered, add_special_tokens=False)
    assert ids.count(0) == 1 and ids[0] == 0
    assert formatter.encode(rendered) == ids  # no second BOS
    assert len(formatter.encode(BOS + "hello")) == 2


def test_encode_without_bos_token() -> None:
    tokenizer = make_tokenizer(with_bos=False)
    assert len(PromptFormatter(tokenizer).encode("hello world")) == 2


def test_name_is_passed_to_template(word_tokenizer: PreTrainedTokenizerFast) -> None:
    formatter = PromptFormatter(word_tokenizer, chat_template="{{ messages[0]['name'] }}")
    assert formatter.render([{"role": "user", "content": "x", "name": "ann"}]) == "ann"


# A template that reads what apply_chat_template gives it: the tokenizer's special tokens as
# variables, `tools`, `add_generation_prompt` and any other keyword (reasoning_effort).
READS_EVERYTHING = (
    "{{ bos_token }}[{{ eos_token }}|{{ unk_token }}]"
    "{% if tools %}tools:{{ tools | tojson }};{% endif %}"
    "{% if reasoning_effort is defined %}effort={{ reasoning_effort }};{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% if m.tool_calls %}"
    "{{ m.tool_calls | tojson }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.mark.parametrize("template", [READS_EVERYTHING, LLAMA3_CHAT_TEMPLATE])
@pytest.mark.parametrize(
    "case",
    [
        {"messages": [{"role": "user", "content": "hi"}]},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False},
        {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low"},
        {
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [{"name": "get_weather", "parameters": {"type": "object", "properties": {}}}],
        },
    ],
)
def test_render_is_what_apply_chat_template_renders(
    word_tokenizer: PreTrainedTokenizerFast, template: str, case: dict
) -> None:
    """render() calls transformers' renderer itself (not apply_chat_template, which looks up the
    special tokens on every call): the text must be exactly apply_chat_template's."""
    formatter = PromptFormatter(word_tokenizer, chat_template=template)
    generation = case.get("add_generation_prompt", True)
    tools = case.get("tools")
    extra = {"reasoning_effort": case["reasoning_effort"]} if "reasoning_effort" in case else {}
    expected = word_tokenizer.apply_chat_template(
        case["messages"],
        chat_template=template,
        add_generation_prompt=generation,
        tokenize=False,
        tools=[{"type": "function", "function": f} for f in tools] if tools else None,
        **extra,
    )
    text = formatter.render(case["messages"], add_generation_prompt=generation, tools=tools, **extra)
    if tools and not formatter.renders_tools:  # this template shows no tools: they go in a message
        assert "get_weather" in text
        return
    assert text == expected
    if template is READS_EVERYTHING:
        assert text.startswith(f"{BOS}[<|eot_id|>|[UNK]]"), "the special tokens reach the template"


def test_flat_globals_render_as_transformers_own_compiled_template(
    word_tokenizer: PreTrainedTokenizerFast,
) -> None:
    """The formatter flattens the globals of transformers' cached template (a ChainMap of the
    template's over its environment's) into one dict: each of them still renders as in a template
    freshly compiled by transformers, left as it is (raise_exception, strftime_now, tojson)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    template = (
        "{{ strftime_now('%Y') | length }}{{ messages | tojson }}{{ bos_token }}"
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}"
    )
    formatter = PromptFormatter(word_tokenizer, chat_template=template)
    cached, fresh = _compile_jinja_template(template), _compile_jinja_template.__wrapped__(template)
    assert type(cached.globals) is dict and type(fresh.globals) is not dict  # flattened; the reference not
    assert set(cached.globals) == set(fresh.globals) >= {"raise_exception", "strftime_now"}
    messages = [{"role": "user", "content": "a <b> & é"}]
    assert formatter.render(messages) == fresh.render(
        messages=messages,
        tools=None,
        documents=None,
        add_generation_prompt=True,
        **word_tokenizer.special_tokens_map,
    )
    with pytest.raises(ValueError, match="no system"):
        formatter.render([{"role": "system", "content": "x"}])
