"""``POST /v1/responses``: the answer as output items, a JSON response object or OpenAI's events
(see ``protocol`` for the request; the events' order is described there)."""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any, Literal

from starlette.requests import Request
from starlette.responses import Response

from trtllm_service.api.generation.choices import Result, cached_tokens
from trtllm_service.api.generation.serving import EventAnswer, split_reasoning
from trtllm_service.api.openai.responses.protocol import RESPONSES_ROUTE, FunctionToolChoice, ResponsesRequest
from trtllm_service.chat import tool_calls
from trtllm_service.errors import APIError

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

Item = dict[str, Any]


def _hex_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _TextItem:
    """An output item made of one text part: the answer's `message`, or its `reasoning`."""

    __slots__ = ("delta_head", "id", "index", "kind", "parts")

    def __init__(self, kind: Literal["message", "reasoning"], index: int) -> None:
        self.kind = kind
        self.id = _hex_id("msg" if kind == "message" else "rs")
        self.index = index
        self.parts: list[str] = []
        event = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        self.delta_head = (
            f'event: {event}\ndata: {{"type":"{event}","item_id":"{self.id}",'
            f'"output_index":{index},"content_index":0,"delta":'
        )

    @property
    def done_event(self) -> str:
        return "response.output_text.done" if self.kind == "message" else "response.reasoning_text.done"

    def part(self, text: str) -> Item:
        if self.kind == "message":
            return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return {"type": "reasoning_text", "text": text}

    def item(self, status: str, text: str | None = None) -> Item:
        """The item; `text` None: the one being streamed, without its part yet."""
        content = [] if text is None else [self.part(text)]
        if self.kind == "message":
            return {
                "id": self.id,
                "type": "message",
                "status": status,
                "role": "assistant",
                "content": content,
            }
        return {"id": self.id, "type": "reasoning", "summary": [], "content": content, "status": status}


class ResponseBuilder:
    """The response object's parts: its constant fields (said once), output items, usage and the
    events of a stream (`opening`, `write` per chunk, `finish`; or `whole`)."""

    def __init__(self, request: ResponsesRequest, model: str) -> None:
        self.id = _hex_id("resp")
        self.created_at = int(time.time())
        self.sequence = 0
        self.output: list[Item] = []  # the items finished so far
        self._open: _TextItem | None = None  # the item being streamed
        fmt = request.text.format if request.text is not None and request.text.format is not None else None
        choice = request.tool_choice
        self._fixed = {
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "max_tool_calls": None,
            "model": model,
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": {"effort": request.reasoning_effort, "summary": None},
            "store": False,
            "temperature": request.temperature,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "tool_choice": choice.model_dump()
            if isinstance(choice, FunctionToolChoice)
            else (choice or "auto"),
            "tools": [tool.model_dump() for tool in request.tools or []],
            "top_p": request.top_p,
            "truncation": "disabled",
            "user": request.user,
            "metadata": {},
            "background": False,
            "service_tier": request.answered_tier,
        }

    def response(
        self, status: str, output: list[Item], usage: Item | None = None, error: Item | None = None
    ) -> Item:
        """The response object with this status, output and usage."""
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": incomplete,
            "output": output,
            "usage": usage,
            **self._fixed,
        }

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Item:
        return {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},  # not counted apart (the text is split)
            "total_tokens": prompt_tokens + completion_tokens,
        }

    @staticmethod
    def status_of(finish_reason: str, calls: bool = False) -> str:
        return "incomplete" if finish_reason == "length" and not calls else "completed"

    def items(
        self, thought: str | None, content: str | None, calls: list[tuple[str, str]] | None, status: str
    ) -> list[Item]:
        """The output items of a whole answer: its reasoning, then its calls or its message."""
        items = []
        if thought is not None:
            items.append(_TextItem("reasoning", 0).item("completed" if content or calls else status, thought))
        if calls:
            return items + [self.function_call(name, arguments) for name, arguments in calls]
        return [*items, _TextItem("message", len(items)).item(status, content or "")]

    @staticmethod
    def function_call(name: str, arguments: str) -> Item:
        return {
            "id": _hex_id("fc"),
            "type": "function_call",
            "status": "completed",
            "call_id": tool_calls.new_call_id(),
            "name": name,
            "arguments": arguments,
        }

    # ---- events

    def event(self, kind: str, **fields: Any) -> str:
        """One SSE event (not for the per-token path: `write` makes those)."""
        self.sequence += 1
        data = _encode({"type": kind, **fields, "sequence_number": self.sequence - 1})
        return f"event: {kind}\ndata: {data}\n\n"

    def opening(self) -> str:
        """response.created and response.in_progress."""
        snapshot = self.response("in_progress", [])
        return self.event("response.created", response=snapshot) + self.event(
            "response.in_progress", response=snapshot
        )

    def write(self, thought: str, text: str) -> str:
        """The events of new reasoning and answer text (an item opens when its text starts)."""
        frames = self._delta("reasoning", thought) if thought else ""
        return frames + self._delta("message", text) if text else frames

    def _delta(self, kind: Literal["message", "reasoning"], text: str) -> str:
        frames = ""
        item = self._open
        if item is None or item.kind != kind:
            frames = self._close("completed") + self._start(kind)
            item = self._open
            assert item is not None
        item.parts.append(text)
        self.sequence += 1
        tail = ',"logprobs":[]' if kind == "message" else ""
        return f'{frames}{item.delta_head}{_encode(text)}{tail},"sequence_number":{self.sequence - 1}}}\n\n'

    def _start(self, kind: Literal["message", "reasoning"]) -> str:
        item = self._open = _TextItem(kind, len(self.output))
        where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        return self.event(
            "response.output_item.added", output_index=item.index, item=item.item("in_progress")
        ) + self.event("response.content_part.added", **where, part=item.part(""))

    def _close(self, status: str) -> str:
        item, self._open = self._open, None
        if item is None:
            return ""
        text = "".join(item.parts)
        done = item.item(status, text)
        self.output.append(done)
        where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        extra: dict[str, list[Any]] = {"logprobs": []} if item.kind == "message" else {}
        return (
            self.event(item.done_event, **where, text=text, **extra)
            + self.event("response.content_part.done", **where, part=item.part(text))
            + self.event("response.output_item.done", output_index=item.index, item=done)
        )

    def finish(self, finish_reason: str, usage: Item) -> str:
        """The end of a streamed text answer: the open item closed and the message too (empty when
        the answer said nothing after its reasoning), then response.completed or .incomplete."""
        status = self.status_of(finish_reason)
        frames = ""
        if self._open is None or self._open.kind != "message":
            frames = self._close(status) + self._start("message")
        return frames + self._close(status) + self._closing(status, usage)

    def whole(self, items: list[Item], status: str, usage: Item) -> str:
        """The events of an answer sent when complete (one that may be calls)."""
        frames = []
        for index, item in enumerate(items):
            where = {"item_id": item["id"], "output_index": index}
            if item["type"] == "function_call":
                arguments = item["arguments"]
                frames += [
                    self.event(
                        "response.output_item.added",
                        output_index=index,
                        item={**item, "arguments": "", "status": "in_progress"},
                    ),
                    self.event("response.function_call_arguments.delta", **where, delta=arguments),
                    self.event(
                        "response.function_call_arguments.done",
                        **where,
                        arguments=arguments,
                        name=item["name"],
                    ),
                ]
            else:
                part = item["content"][0]
                text, kind = part["text"], part["type"]
                extra: dict[str, list[Any]] = {"logprobs": []} if kind == "output_text" else {}
                started = {**item, "content": [], "status": "in_progress"}
                frames += [
                    self.event("response.output_item.added", output_index=index, item=started),
                    self.event(
                        "response.content_part.added", **where, content_index=0, part={**part, "text": ""}
                    ),
                ]
                if text:
                    frames.append(
                        self.event(f"response.{kind}.delta", **where, content_index=0, delta=text, **extra)
                    )
                frames += [
                    self.event(f"response.{kind}.done", **where, content_index=0, text=text, **extra),
                    self.event("response.content_part.done", **where, content_index=0, part=part),
                ]
            frames.append(self.event("response.output_item.done", output_index=index, item=item))
        self.output = items
        return "".join(frames) + self._closing(status, usage)

    def _closing(self, status: str, usage: Item) -> str:
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return self.event(kind, response=self.response(status, self.output, usage))

    def failure(self, error: APIError) -> str:
        """An error event, then response.failed."""
        code = error.code or error.type
        return self.event("error", code=code, message=error.message, param=error.param) + self.event(
            "response.failed",
            response=self.response("failed", self.output, error={"code": code, "message": error.message}),
        )


if TYPE_CHECKING:
    from trtllm_service.api.generation.serving import GenerationServing


async def serve_responses(
    serving: GenerationServing, request: ResponsesRequest, http_request: Request | None = None
) -> Response:
    """Answers a Responses API request: one chat choice, as output items (see `responses`)."""
    return await serving.serve_chat(
        request, http_request, RESPONSES_ROUTE, "reasoning.effort", ResponseAnswer
    )


class ResponseAnswer(EventAnswer):
    """How one response is written (`builder`: a `ResponseBuilder`): a JSON response object
    (`build`), streamed events, or events sent whole once the answer is known to be calls (`whole`)."""

    __slots__ = ()

    def new_builder(self, served: str) -> ResponseBuilder:
        return ResponseBuilder(self.request, served)

    def output(self, result: Result, cached: int) -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
        """A finished answer's items, status and usage."""
        builder = self.builder
        thought, content = split_reasoning(self.style, result.text)
        calls = self.request.calls_in(content or "")
        status = builder.status_of(result.finish_reason, bool(calls))
        usage = builder.usage(self.prompt_tokens, result.completion_tokens, cached)
        return builder.items(thought, content, calls, status), status, usage

    def build(self, results: list[Result], cached: int) -> dict[str, Any]:
        """The JSON response object."""
        items, status, usage = self.output(results[0], cached)
        return self.builder.response(status, items, usage)

    def finish(self, reason: str, index: int) -> str:
        """The last events: held-back text, the items' ends, response.completed (or incomplete)."""
        frames = self.held_back()
        tokens = self.choices[0].stream.completion_tokens
        usage = self.builder.usage(self.prompt_tokens, tokens, cached_tokens(self.choices, 1))
        return frames + self.builder.finish(reason, usage)

    def whole(self, results: list[Result]) -> str:
        """The events of a complete answer (after `opening`)."""
        return self.builder.whole(*self.output(results[0], cached_tokens(self.choices, 1)))
