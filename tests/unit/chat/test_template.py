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
def tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer()


def test_default_template_is_llama3_when_tokenizer_has_none(tokenizer: PreTrainedTokenizerFast) -> None:
    formatter = PromptFormatter(tokenizer)
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


def test_without_generation_prompt(tokenizer: PreTrainedTokenizerFast) -> None:
    text = PromptFormatter(tokenizer).render(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        add_generation_prompt=False,
    )
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nhello<|eot_id|>"
    )


def test_tokenizer_template_is_used(tokenizer: PreTrainedTokenizerFast) -> None:
    tokenizer.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    assert PromptFormatter(tokenizer).render([{"role": "user", "content": "hi"}]) == "[user]hi"


def test_override_template_wins(tokenizer: PreTrainedTokenizerFast) -> None:
    tokenizer.chat_template = "{{ 'tokenizer' }}"
    formatter = PromptFormatter(tokenizer, chat_template="{{ messages[0]['content'] }}!")
    assert formatter.render([{"role": "user", "content": "hi"}]) == "hi!"


def test_unsupported_role_is_value_error(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match="Unsupported role 'wizard'"):
        PromptFormatter(tokenizer).render([{"role": "wizard", "content": "x"}])


def test_template_raise_exception_is_value_error(tokenizer: PreTrainedTokenizerFast) -> None:
    template = (
        "{{ raise_exception('System role not supported') if messages[0]['role'] == 'system' else 'ok' }}"
    )
    formatter = PromptFormatter(tokenizer, chat_template=template)
    assert formatter.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ValueError, match="System role not supported"):
        formatter.render([{"role": "system", "content": "x"}])


def test_template_syntax_error_fails_at_construction(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match="Invalid chat template"):
        PromptFormatter(tokenizer, chat_template="{% for m in messages %}")


def test_no_messages_is_value_error(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match="At least one message"):
        PromptFormatter(tokenizer).render([])


def from_prompt(formatter: PromptFormatter, prompt: str, system_prompt: str | None) -> str:
    return formatter.render(formatter.messages_from_prompt(prompt, system_prompt))


def test_from_prompt_with_and_without_system(tokenizer: PreTrainedTokenizerFast) -> None:
    formatter = PromptFormatter(tokenizer)
    user_only = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    assert from_prompt(formatter, "hello", None) == user_only
    assert from_prompt(formatter, "hello", "") == user_only
    assert from_prompt(formatter, "hello", "be brief").startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|><|start_header_id|>user"
    )


def test_encode_adds_bos_once(tokenizer: PreTrainedTokenizerFast) -> None:
    formatter = PromptFormatter(tokenizer)
    # BOS + 2 words, as the preprocessing model encodes it
    assert formatter.encode("hello world") == tokenizer.encode("hello world", add_special_tokens=True)
    assert len(formatter.encode("hello world")) == 3
    rendered = from_prompt(formatter, "hello world", "be brief")
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    assert ids.count(0) == 1 and ids[0] == 0
    assert formatter.encode(rendered) == ids  # no second BOS
    assert len(formatter.encode(BOS + "hello")) == 2


def test_encode_without_bos_token() -> None:
    tokenizer = make_tokenizer(with_bos=False)
    assert len(PromptFormatter(tokenizer).encode("hello world")) == 2


def test_name_is_passed_to_template(tokenizer: PreTrainedTokenizerFast) -> None:
    formatter = PromptFormatter(tokenizer, chat_template="{{ messages[0]['name'] }}")
    assert formatter.render([{"role": "user", "content": "x", "name": "ann"}]) == "ann"
