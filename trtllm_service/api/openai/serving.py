"""The OpenAI API's object, bound once per worker: ``/v1/models``, the three generation endpoints
(each its own module: ``chat``, ``completions``, ``responses``) and vLLM's ``/tokenize`` /
``/detokenize``. The request path they share is ``api.generation``.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from trtllm_service.api.generation.serving import GenerationServing
from trtllm_service.api.openai.chat.protocol import ChatCompletionRequest
from trtllm_service.api.openai.chat.serving import serve_chat
from trtllm_service.api.openai.completions.protocol import CompletionRequest
from trtllm_service.api.openai.completions.serving import serve_completions
from trtllm_service.api.openai.protocol import (
    DetokenizeRequest,
    ModelCard,
    ModelList,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from trtllm_service.api.openai.responses.protocol import ResponsesRequest
from trtllm_service.api.openai.responses.serving import serve_responses
from trtllm_service.errors import APIError

INLINE_TOKENIZE_CHARS = 2048  # /tokenize: longer texts are tokenized in a worker thread


class OpenAIServing(GenerationServing):
    """Serves ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` and
    vLLM's ``/tokenize`` / ``/detokenize`` from a ``Runtime``."""

    # ---- models ----------------------------------------------------------------------------------------

    def model_card(self) -> ModelCard:
        return ModelCard(
            id=self.model_name,
            created=self._created,
            max_model_len=self.runtime.max_seq_len,
            engine=getattr(self.runtime, "engine", None),
            flavor=self.runtime.flavor.name,
        )

    def list_models(self) -> ModelList:
        """The base model, then each packed LoRA adapter (its `parent` is the base)."""
        cards = [self.model_card()]
        for name in getattr(self.runtime, "adapters", {}):
            cards.append(
                ModelCard(
                    id=name,
                    created=self._created,
                    max_model_len=self.runtime.max_seq_len,
                    parent=self.model_name,
                    root=self.model_name,
                )
            )
        return ModelList(data=cards)

    # ---- generation: one module per endpoint ------------------------------------------------------

    async def chat(self, request: ChatCompletionRequest, http_request: Request | None = None) -> Response:
        return await serve_chat(self, request, http_request)

    async def completions(self, request: CompletionRequest, http_request: Request | None = None) -> Response:
        return await serve_completions(self, request, http_request)

    async def responses(self, request: ResponsesRequest, http_request: Request | None = None) -> Response:
        return await serve_responses(self, request, http_request)

    # ---- tokenize / detokenize (vLLM's, at the root) ---------------------------------------------------

    async def tokenize(self, request: TokenizeCompletionRequest | TokenizeChatRequest) -> dict[str, Any]:
        """The token ids of a prompt, or of chat messages rendered with the chat template: by
        default exactly the ids the engine gets for the same prompt (`add_special_tokens` false:
        none added)."""
        self.runtime.adapter(request.model)
        formatter = self.runtime.formatter
        if isinstance(request, TokenizeChatRequest):
            messages = request.chat_messages()
            encode = functools.partial(
                formatter.encode_chat,
                messages,
                add_generation_prompt=request.add_generation_prompt,
                tools=request.functions() or None,
                add_special_tokens=request.add_special_tokens,
            )
            size = sum(len(m["content"]) for m in messages)
        else:
            encode = functools.partial(
                formatter.encode, request.prompt, add_special_tokens=request.add_special_tokens
            )
            size = len(request.prompt)
        try:
            ids = encode() if size <= INLINE_TOKENIZE_CHARS else await asyncio.to_thread(encode)
        except ValueError as exc:  # the chat template refused the messages
            raise APIError.bad_request(str(exc), param="messages") from None
        body: dict[str, Any] = {"count": len(ids), "max_model_len": self.runtime.max_seq_len, "tokens": ids}
        if request.return_token_strs:
            body["token_strs"] = formatter.token_strings(ids)
        return body

    def detokenize(self, request: DetokenizeRequest) -> dict[str, Any]:
        """The text of token ids (special tokens included), as a token-id prompt is echoed."""
        self.runtime.adapter(request.model)
        self.runtime.preparer.check_token_ids(request.tokens, "tokens")
        return {"prompt": self.runtime.formatter.decode(request.tokens)}
