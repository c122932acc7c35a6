#!/usr/bin/env python3
"""The same answers before and after a change: two checkouts served side by side, one recorded set.

A refactor that should change nothing is held to that here: both checkouts pack the tiny demo model
with the reference engine (seeded weights, deterministic on one machine), serve it, and get the same
requests: every route, streamed and not, guided, with log probs and tools, and the errors (4xx bodies
included). Each answer is compared after dropping what differs by nature (ids, creation times,
timing headers). Exit status 1 when an answer differs; `--out DIR` keeps both recordings.

    python bench/answers.py --before OLDER_CHECKOUT [--after .] [--flavor llmapi|ensemble] [--out DIR]
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.relay import Service  # noqa: E402

MODEL = "tiny"  # the served name is read from /v1/models; requests name it
VOLATILE_KEYS = {"id", "created", "created_at", "system_fingerprint", "request_id", "x-request-id"}
VOLATILE_PREFIXES = ("chatcmpl-", "cmpl-", "resp_", "msg_", "call_", "toolu_", "rs_")
KEPT_HEADERS = ("content-type", "www-authenticate", "retry-after", "allow")

CHAT = [{"role": "user", "content": "Name three colours."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def requests(model: str) -> list[tuple[str, str, Any]]:
    """(method, path, JSON body or raw bytes) of the recorded set."""
    chat = {"model": model, "messages": CHAT, "max_tokens": 12, "temperature": 0}
    completion = {"model": model, "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
    return [
        ("GET", "/v1/models", None),
        ("GET", "/readyz", None),
        ("GET", "/docs.json", None),
        ("POST", "/generate", {"prompt": "Hello there", "max_tokens": 16, "temperature": 0}),
        ("POST", "/generate", {"prompt": "Count", "max_tokens": 8, "temperature": 0, "stop": ["3"]}),
        ("POST", "/generate", {"prompt": "Hi", "max_tokens": 8, "temperature": 0.8, "seed": 7}),
        (
            "POST",
            "/generate",
            {"prompt": "A person", "max_tokens": 40, "temperature": 0, "json_schema": SCHEMA},
        ),
        ("POST", "/generate", {"prompt": "Hi", "max_tokens": 0}),
        ("POST", "/generate", {"prompt": "Hi", "max_token": 4}),
        ("POST", "/generate", {"prompt": "Hi", "max_tokens": "4"}),
        ("POST", "/generate", {"prompt": "Hi", "lora": "nope"}),
        ("POST", "/v1/chat/completions", chat),
        ("POST", "/v1/chat/completions", {**chat, "stream": True}),
        ("POST", "/v1/chat/completions", {**chat, "stream": True, "stream_options": {"include_usage": True}}),
        ("POST", "/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 2}),
        ("POST", "/v1/chat/completions", {**chat, "n": 2, "temperature": 0.9, "seed": 3}),
        ("POST", "/v1/chat/completions", {**chat, "stop": ["e"]}),
        (
            "POST",
            "/v1/chat/completions",
            {**chat, "tools": TOOLS, "tool_choice": "required", "max_tokens": 40},
        ),
        (
            "POST",
            "/v1/chat/completions",
            {
                **chat,
                "max_tokens": 40,
                "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
            },
        ),
        ("POST", "/v1/chat/completions", {**chat, "guided_choice": ["red", "green"]}),
        ("POST", "/v1/chat/completions", {**chat, "model": "no-such-model"}),
        ("POST", "/v1/chat/completions", {**chat, "temperature": 3}),
        ("POST", "/v1/chat/completions", {"model": model, "max_tokens": 4}),
        ("POST", "/v1/chat/completions", {**chat, "messages": []}),
        ("POST", "/v1/chat/completions", {**chat, "unknown_field": 1}),
        ("POST", "/v1/chat/completions", b'{"model": '),
        ("POST", "/v1/completions", completion),
        ("POST", "/v1/completions", {**completion, "stream": True}),
        ("POST", "/v1/completions", {**completion, "echo": True, "logprobs": 2}),
        ("POST", "/v1/completions", {**completion, "prompt": ["a", "b"]}),
        ("POST", "/v1/completions", {**completion, "max_tokens": -1}),
        (
            "POST",
            "/v1/responses",
            {"model": model, "input": "Say hi", "max_output_tokens": 12, "temperature": 0},
        ),
        (
            "POST",
            "/v1/responses",
            {"model": model, "input": "Say hi", "max_output_tokens": 12, "temperature": 0, "stream": True},
        ),
        ("POST", "/v1/messages", {"model": model, "messages": CHAT, "max_tokens": 12, "temperature": 0}),
        (
            "POST",
            "/v1/messages",
            {"model": model, "messages": CHAT, "max_tokens": 12, "temperature": 0, "stream": True},
        ),
        ("POST", "/v1/messages", {"model": model, "messages": CHAT}),
        ("POST", "/tokenize", {"model": model, "prompt": "Hello world"}),
        ("POST", "/detokenize", {"model": model, "tokens": [1, 2, 3]}),
        ("GET", "/v1/nowhere", None),
        ("DELETE", "/v1/chat/completions", None),
    ]


def normal(value: Any) -> Any:
    """The value with what differs by nature (ids, times) replaced by a placeholder."""
    if isinstance(value, dict):
        return {k: ("<volatile>" if k in VOLATILE_KEYS else normal(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [normal(v) for v in value]
    if isinstance(value, str) and value.startswith(VOLATILE_PREFIXES):
        return "<volatile>"
    return value


def body_of(raw: bytes, content_type: str) -> Any:
    """JSON as data, an event stream as its events' data, the OpenAPI document as its hash."""
    text = raw.decode("utf-8", "replace")
    if "text/event-stream" in content_type:
        events = []
        for line in text.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(normal(json.loads(line[6:])))
            elif line:
                events.append(line)
        return events
    if "json" in content_type:
        return normal(json.loads(text))
    return text


def ask(port: int, method: str, path: str, body: Any) -> dict[str, Any]:
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            status, headers, raw = answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as error:
        status, headers, raw = error.code, error.headers, error.read()
    content_type = headers.get("content-type", "")
    recorded: dict[str, Any] = {
        "status": status,
        "headers": {name: headers.get(name) for name in KEPT_HEADERS if headers.get(name)},
    }
    if path == "/docs.json":
        recorded["sha256"] = hashlib.sha256(raw).hexdigest()
    else:
        recorded["body"] = body_of(raw, content_type)
    return recorded


def record(service: Service) -> list[dict[str, Any]]:
    models = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{service.port}/v1/models").read())
    model = models["data"][0]["id"]
    return [
        {"request": f"{method} {path} {json.dumps(body) if not isinstance(body, bytes) else body!r}"[:300]}
        | ask(service.port, method, path, body)
        for method, path, body in requests(model)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the older checkout")
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--flavor", choices=("llmapi", "ensemble"), default="llmapi")
    parser.add_argument("--out", type=Path, help="keep both recordings here")
    args = parser.parse_args()
    recordings: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-answers-") as tmp:
        for side, root in (("before", args.before), ("after", args.after)):
            service = Service(Path(tmp) / side, "reference", 1, 8, args.flavor, root=root.resolve())
            try:
                service.start()
                recordings[side] = record(service)
            finally:
                service.stop()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        for side, answers in recordings.items():
            (args.out / f"answers-{args.flavor}-{side}.json").write_text(json.dumps(answers, indent=1) + "\n")
    differ = 0
    for before, after in zip(recordings["before"], recordings["after"], strict=True):
        same = before == after
        differ += not same
        print(
            f"{'same' if same else 'DIFFERS'}  {before['status']:>3} -> {after['status']:>3}  {before['request'][:110]}"
        )
        if not same:
            lines = difflib.unified_diff(
                json.dumps(before, indent=1).splitlines(),
                json.dumps(after, indent=1).splitlines(),
                lineterm="",
            )
            print("\n".join(f"    {line}" for line in list(lines)[2:40]))
    print(
        f"{len(recordings['before']) - differ} of {len(recordings['before'])} answers the same ({args.flavor})"
    )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
