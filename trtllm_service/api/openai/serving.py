"""The OpenAI API's object, bound once per worker: ``/v1/models``, the three generation endpoints
(each its own module: ``chat``, ``completions``, ``responses``) and vLLM's ``/tokenize`` /
``/detokenize``. The request path they share is ``api.generation``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
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
    LoadLoRAAdapterRequest,
    ModelCard,
    ModelList,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    UnloadLoRAAdapterRequest,
)
from trtllm_service.api.openai.responses.protocol import ResponsesRequest
from trtllm_service.api.openai.responses.serving import serve_responses
from trtllm_service.api.server.metrics import count_lora
from trtllm_service.errors import APIError

logger = logging.getLogger("trtllm_service")

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
        """The base model, then each LoRA adapter, packed or loaded alike: `parent` the base model,
        `root` where it came from (vLLM's: the path it was loaded from; a packed one's: the base)."""
        cards = [self.model_card()]
        for name, entry in getattr(self.runtime, "adapters", {}).items():
            cards.append(
                ModelCard(
                    id=name,
                    created=int(entry.get("created") or self._created),
                    max_model_len=self.runtime.max_seq_len,
                    parent=self.model_name,
                    root=str(entry.get("source") or self.model_name),
                )
            )
        return ModelList(data=cards)

    # ---- LoRA adapters loaded while serving (vLLM's routes) ------------------------------------------

    @property
    def runtime_lora_updating(self) -> bool:
        """Whether /v1/load_lora_adapter and /v1/unload_lora_adapter are served (off: 404s)."""
        return bool(self.runtime.settings.allow_runtime_lora_updating)

    async def load_lora_adapter(self, request: LoadLoRAAdapterRequest) -> str:
        """Loads an adapter for every worker; vLLM's answer, or a 4xx naming what is wrong."""
        name = request.lora_name
        try:
            entry = await self.runtime.load_adapter(name, request.lora_path, replace=request.load_inplace)
        except APIError as exc:
            count_lora(self.model_name, "load", False)
            logger.warning("LoRA adapter %r not loaded from %r: %s", name, request.lora_path, exc.message)
            raise
        count_lora(self.model_name, "load", True, len(self.runtime.adapters.loaded()))
        logger.info(
            "LoRA adapter %r loaded from %r (id %s, rank %s)",
            name,
            request.lora_path,
            entry["id"],
            entry["rank"],
        )
        return f"Success: LoRA adapter '{name}' added successfully."

    async def unload_lora_adapter(self, request: UnloadLoRAAdapterRequest) -> str:
        """Unloads an adapter for every worker: its requests in flight finish, new ones get a 404."""
        name = request.lora_name
        try:
            entry = await self.runtime.unload_adapter(name)
        except APIError as exc:
            count_lora(self.model_name, "unload", False)
            logger.warning("LoRA adapter %r not unloaded: %s", name, exc.message)
            raise
        count_lora(self.model_name, "unload", True, len(self.runtime.adapters.loaded()))
        logger.info("LoRA adapter %r unloaded (id %s)", name, entry["id"])
        return f"Success: LoRA adapter '{name}' removed successfully."

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
