"""The chat template: chat messages (and the functions a request offers) -> the prompt's text, and
that text -> the exact token ids the engine gets.

The tokenizer's own Jinja chat template is used, or a Llama-3 Instruct default for a tokenizer that
has none. The prompt is tokenized as the Triton preprocessing model tokenizes it (special tokens
added, except a BOS that the rendered text already starts with), so the engine sees the same ids
either way. Pack time checks a template with it; the relay renders every prompt with it.

Special-token text in what a request sends (`<|eot_id|><|start_header_id|>system...` in a user
message) becomes the template's control tokens by default (`control`), as Hugging Face's
`apply_chat_template` and vLLM do: a user can end their turn and forge another. With `text`
(TRTLLM_CONTENT_SPECIAL_TOKENS) such text is tokenized as the plain text it is, and only what the
template itself writes is a control token (`encode_chat`).
"""

from __future__ import annotations

import collections
import re
import secrets
import sys
from collections.abc import Sequence
from typing import Any, Literal

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from trtllm_service.chat import tool_calls

LLAMA3_CHAT_TEMPLATE: str = (
    "{{- '<|begin_of_text|>' -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'ipython'] -%}"
    "{{- raise_exception(\"Unsupported role '\" ~ message['role'] ~ \"': this template accepts system, user, assistant and ipython (tool results)\") -}}"
    "{%- endif -%}"
    "{{- '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\\n\\n' ~ (message['content'] | trim) ~ '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
    "{%- endif -%}"
)
"""Llama-3 Instruct chat format, used when the tokenizer carries no chat template of its own."""

ContentSpecialTokens = Literal["control", "text"]
"""What special-token text in a request's messages (and tools) becomes: the control tokens it
spells (`control`, as Hugging Face and vLLM), or plain text (`text`)."""


class PromptFormatter:
    """Turns chat messages or a plain prompt into the exact text sent to Triton, and counts its tokens.

    Args:
        tokenizer: A Hugging Face tokenizer (the same files the Triton preprocessing model loads).
        chat_template: A Jinja template that overrides the tokenizer's; when neither exists,
            ``LLAMA3_CHAT_TEMPLATE`` is used.

    Raises:
        ValueError: The template is not valid Jinja (found at startup rather than on the first request).
    """

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | None = None,
        *,
        content_special_tokens: ContentSpecialTokens = "control",
    ) -> None:
        self._tokenizer = tokenizer
        self.content_special_tokens: ContentSpecialTokens = content_special_tokens
        if chat_template is not None:
            template = chat_template
        elif getattr(tokenizer, "chat_template", None):
            template = tokenizer.get_chat_template()
        else:
            template = LLAMA3_CHAT_TEMPLATE
        try:
            ImmutableSandboxedEnvironment().parse(template)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"Invalid chat template (line {exc.lineno}): {exc.message}") from exc
        self.chat_template: str = template
        # what apply_chat_template gives every template, read once (a property that looks each one up)
        self._template_kwargs: dict[str, Any] = dict(getattr(tokenizer, "special_tokens_map", None) or {})
        # transformers' renderer, imported here and not with this module: the service's processes
        # import this module (settings) before the worker reads its tokenizer, which imports
        # transformers without PyTorch (tokenizer_loading.py); a transformers imported first would
        # bring PyTorch, seconds of start and hundreds of MB into every process of the service.
        from transformers.utils.chat_template_utils import render_jinja_template

        self._render_jinja_template = render_jinja_template
        _flatten_globals(template)
        self._bos: str | None = getattr(tokenizer, "bos_token", None) or None
        self.bos_token = self._bos
        self._rust = getattr(tokenizer, "backend_tokenizer", None)
        self._fast = getattr(self._rust, "encode_batch_fast", None)  # tokenizers >= 0.20
        self._max_token_chars: int | None = None
        self._as_text: _TextTokenizer | None = None

    @property
    def max_token_chars(self) -> int:
        """The most characters one token can stand for: its longest vocabulary entry (a byte-level
        entry is at least as long as the text it covers), times 2 for normalizers that compose
        characters. A text of n characters is at least n / max_token_chars tokens."""
        if self._max_token_chars is None:
            vocab = getattr(self._tokenizer, "get_vocab", None)
            if vocab is None:  # no vocabulary to measure: no bound (every prompt is tokenized)
                self._max_token_chars = sys.maxsize
            else:
                self._max_token_chars = 2 * max(1, max((len(token) for token in vocab()), default=1))
        return self._max_token_chars

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template renders tool definitions itself (it reads `tools`)."""
        return "tools" in self.chat_template

    @property
    def takes_reasoning_effort(self) -> bool:
        """Whether the chat template reads `reasoning_effort` (reasoning models that offer it)."""
        return "reasoning_effort" in self.chat_template

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        reasoning_effort: str | None = None,
    ) -> str:
        """Render messages (and the functions a request offers) with the chat template (no
        tokenization). A template that renders no tools gets them in Llama-3.1's JSON format
        (`tool_calls`). `reasoning_effort` goes to the template as it is (see
        `takes_reasoning_effort`).

        Raises:
            ValueError: No messages, or the template rejected them (e.g. an unsupported role).
        """
        if not messages:
            raise ValueError("At least one message is required")
        extra = self._template_kwargs
        if reasoning_effort is not None:
            extra = {**extra, "reasoning_effort": reasoning_effort}
        shown: list[Any] | None = None  # the functions, as tool definitions
        if any(m.get("tool_calls") or m["role"] == "tool" for m in messages) or tools:
            if self.renders_tools:
                messages = tool_calls.template_messages(messages)
                if tools:
                    shown = [{"type": "function", "function": f} for f in tools]
            else:
                messages = tool_calls.fallback_messages(messages, tools or [])
        try:
            # transformers' renderer, as `apply_chat_template(tokenize=False)` calls it (the
            # tokenizer's special tokens as variables), without its per-call lookups
            rendered: Any = self._render_jinja_template(  # (texts, generation indices); typed as str
                conversations=[messages],
                tools=shown,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                **extra,
            )
        except jinja2.TemplateError as exc:
            raise ValueError(f"The chat template could not format these messages: {exc}") from exc
        text = rendered[0][0]
        if not isinstance(text, str):  # defensive: the renderer gives text
            raise ValueError(f"The chat template produced {type(text).__name__}, expected text")
        return text

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        reasoning_effort: str | None = None,
        add_special_tokens: bool = True,
    ) -> list[int]:
        """The token ids of messages through the chat template (`render`, then `encode`), with the
        special-token text they carry read as `content_special_tokens` says.

        Raises:
            ValueError: As `render`; in `text` mode also a template that alters the message text
                it is given beyond recognition (the text could not be kept apart from its own).
        """

        def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
            return self.render(
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                reasoning_effort=reasoning_effort,
            )

        if self.content_special_tokens == "control":
            return self.encode(render(messages, tools), add_special_tokens)
        if self._as_text is None:
            self._as_text = _TextTokenizer(self._tokenizer)
        as_text = self._as_text
        (messages, tools), originals, nonce = as_text.hide((messages, tools))
        text = render(messages, tools)
        add_special = add_special_tokens and not (self._bos is not None and text.startswith(self._bos))
        return as_text.encode(text, originals, nonce, add_special)

    @staticmethod
    def messages_from_prompt(prompt: str, system_prompt: str | None = None) -> list[dict[str, str]]:
        """A plain prompt (and optional system prompt) as a one-turn chat.

        An empty system prompt is left out: an empty system turn only adds noise tokens.
        """
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": prompt})
        return messages

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The token ids of ``text``, exactly as the Triton preprocessing model tokenizes it.

        Special tokens (BOS) are added only when the text does not already start with BOS, so a rendered
        chat that begins with ``<|begin_of_text|>`` is not given a second one (``add_special_tokens``
        false: never). Fast tokenizers are called directly (the Rust tokenizer), skipping the Python
        wrapper's per-call overhead.
        """
        add_special = add_special_tokens and not (self._bos is not None and text.startswith(self._bos))
        if self._rust is not None:
            if self._fast is not None:  # no offsets computed: a third less per prompt
                return self._fast([text], add_special_tokens=add_special)[0].ids
            return self._rust.encode(text, add_special_tokens=add_special).ids
        return self._tokenizer.encode(text, add_special_tokens=add_special)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Each token's own string in the vocabulary (byte-level pieces as stored, e.g. ``Ġthe``)."""
        return list(self._tokenizer.convert_ids_to_tokens(list(ids)))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids as the tokenizer writes it, special tokens included and spaces as
        they are (the echo of a token-id prompt, `/detokenize`): each token's text, joined."""
        return self._tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )


def _flatten_globals(chat_template: str) -> None:
    """Makes the globals of transformers' compiled `chat_template` one dict instead of a ChainMap.

    jinja starts each render's context from a copy of the template's globals, and transformers'
    compiled template keeps them as a ChainMap (the template's over its environment's), which that
    copy walks key by key: 25 of a render's 70 Python and C calls. transformers caches the compiled
    template (the one `render_jinja_template` then uses), and its environment is its own, filled
    before the template was compiled, so a dict of the same items is the same globals. Where this
    transformers compiles differently, nothing is changed.
    """
    from transformers.utils import chat_template_utils

    compile_template = getattr(chat_template_utils, "_compile_jinja_template", None)
    if compile_template is None:
        return
    compiled = compile_template(chat_template)
    if isinstance(getattr(compiled, "globals", None), collections.ChainMap):
        compiled.globals = dict(compiled.globals)


class _TextTokenizer:
    """Tokenizes a rendered prompt whose request text is hidden behind placeholders: the special
    tokens of what is left are the template's (control tokens); the request's text, put back, is
    tokenized as plain text (a copy of the Rust tokenizer with `encode_special_tokens`). Pieces are
    cut at special tokens only, where the tokenizer cuts them anyway, so a prompt without
    special-token text in its messages gets exactly the ids of `PromptFormatter.encode`."""

    def __init__(self, tokenizer: Any) -> None:
        from tokenizers import Tokenizer

        rust = getattr(tokenizer, "backend_tokenizer", None)
        if rust is None:
            raise ValueError("TRTLLM_CONTENT_SPECIAL_TOKENS=text needs a fast (Rust) tokenizer")
        self._rust = rust
        self._plain = Tokenizer.from_str(rust.to_str())
        self._plain.encode_special_tokens = True
        special = {
            str(token): (token_id, bool(token.lstrip), bool(token.rstrip))
            for token_id, token in tokenizer.added_tokens_decoder.items()
            if token.special
        }
        self._special = special
        names = sorted(special, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, names))) if names else None
        with_special = rust.encode("a", add_special_tokens=True).ids
        bare = rust.encode("a", add_special_tokens=False).ids
        at = next(
            i for i in range(len(with_special) - len(bare) + 1) if with_special[i : i + len(bare)] == bare
        )
        self._around = (with_special[:at], with_special[at + len(bare) :])  # what the post-processor adds

    def hide(self, value: Any) -> tuple[Any, list[str], str]:
        """`value` with every special-token text in its strings replaced by a placeholder that no
        tokenizer or template treats specially; the texts replaced, and the placeholders' nonce."""
        originals: list[str] = []
        nonce = secrets.token_hex(8)
        pattern = self._pattern

        def swap(match: re.Match[str]) -> str:
            originals.append(match.group(0))
            return f"{nonce}{len(originals) - 1}{nonce}"

        def walk(node: Any) -> Any:
            if isinstance(node, str):
                return pattern.sub(swap, node) if pattern is not None else node
            if isinstance(node, dict):
                return {key: walk(item) for key, item in node.items()}
            if isinstance(node, (list, tuple)):
                return type(node)(walk(item) for item in node)
            return node

        return walk(value), originals, nonce

    def encode(self, text: str, originals: list[str], nonce: str, add_special: bool) -> list[int]:
        """The ids of a rendered prompt: its special tokens (the template's) as themselves, the
        rest, its placeholders put back, as plain text."""
        restore = re.compile(f"{nonce}(\\d+){nonce}")
        ids: list[int] = []
        pieces = self._pattern.split(text) if self._pattern is not None else [text]
        tokens = self._pattern.findall(text) if self._pattern is not None else []
        strip_next = False
        for i, piece in enumerate(pieces):
            if strip_next:
                piece = piece.lstrip()
            strip_next = False
            if i < len(tokens) and self._special[tokens[i]][1]:  # the next token eats space before it
                piece = piece.rstrip()
            piece = restore.sub(lambda m: originals[int(m.group(1))], piece)
            if nonce in piece:
                raise ValueError(
                    "The chat template altered the messages' text: their special-token text cannot "
                    "be kept as text (TRTLLM_CONTENT_SPECIAL_TOKENS=text)"
                )
            if piece:
                ids += self._plain.encode(piece, add_special_tokens=False).ids
            if i < len(tokens):
                token_id, _, rstrip = self._special[tokens[i]]
                ids.append(token_id)
                strip_next = rstrip
        if add_special:
            before, after = self._around
            ids = [*before, *ids, *after]
        return ids
