"""`X-Request-Id` on every answer and in the log lines of its request; CORS for a browser page on
another origin, driven in headless Chromium. Both on the shared service (no server of their own)."""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.browser_support import CHROMIUM_ARGS, chromium_path
from tests.e2e.conftest import BentoService
from tests.support import wait_for

FLAVORS = ("llmapi",)  # neither depends on the repository flavour

HEX_ID = re.compile(r"[0-9a-f]{32}")
TRACE = re.compile(r"\(trace=([0-9a-f]{32}),span=[0-9a-f]{16},sampled=([01])")


def chat(model_name: str, **extra: Any) -> dict[str, Any]:
    return {"model": model_name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **extra}


def logged(service: BentoService, request_id: str) -> bool:
    return f"[request_id={request_id}]" in service.log()


def test_request_ids_are_echoed_and_logged(service: BentoService, model_name: str) -> None:
    url = service.url
    with httpx.Client(base_url=url, timeout=60) as client:
        sent = {
            "generate": client.post(
                "/generate", json={"prompt": "Hi", "max_tokens": 4}, headers={"X-Request-Id": "e2e-generate"}
            ),
            "chat": client.post(
                "/v1/chat/completions", json=chat(model_name), headers={"X-Request-Id": "e2e-chat"}
            ),
            "bad-body": client.post(
                "/v1/chat/completions",
                json=chat(model_name, temperature=5),
                headers={"X-Request-Id": "e2e-400"},
            ),
            "not-json": client.post(  # refused by a middleware, before any route
                "/generate", content="Hi", headers={"content-type": "text/plain", "X-Request-Id": "e2e-415"}
            ),
        }
        with client.stream(
            "POST",
            "/v1/chat/completions",
            json=chat(model_name, stream=True),
            headers={"X-Request-Id": "e2e-sse"},
        ) as streamed:
            events = [line for line in streamed.iter_lines() if line.startswith("data: ")]
            sent["stream"] = streamed
        fresh = client.post("/generate", json={"prompt": "Hi", "max_tokens": 2})
        replaced = client.post(
            "/generate", json={"prompt": "Hi", "max_tokens": 2}, headers={"X-Request-Id": "two words"}
        )

    statuses = {name: response.status_code for name, response in sent.items()}
    assert statuses == {"generate": 200, "chat": 200, "bad-body": 400, "not-json": 415, "stream": 200}
    assert events[-1] == "data: [DONE]"
    echoed = {name: response.headers.get("x-request-id") for name, response in sent.items()}
    assert echoed == {
        "generate": "e2e-generate",
        "chat": "e2e-chat",
        "bad-body": "e2e-400",
        "not-json": "e2e-415",
        "stream": "e2e-sse",
    }
    assert sent["bad-body"].json()["error"]["param"] == "temperature"
    for response in (fresh, replaced):
        assert response.status_code == 200
        assert HEX_ID.fullmatch(response.headers["x-request-id"]), response.headers
    assert fresh.headers["x-request-id"] != replaced.headers["x-request-id"]

    # Each request's lines (BentoML's access log line among them) start with its id.
    ids = [*echoed.values(), fresh.headers["x-request-id"]]
    assert wait_for(lambda: all(logged(service, i) for i in ids), 10), [
        i for i in ids if not logged(service, i)
    ]
    line = next(line for line in service.log().splitlines() if "[request_id=e2e-sse]" in line)
    assert "path=/v1/chat/completions" in line and "status=200" in line


def test_log_lines_carry_the_requests_trace(service: BentoService) -> None:
    """BentoML's log lines show the trace of the request they belong to (OpenTelemetry's current
    span), which api/server/tracing.py starts alone when nothing records spans: a caller's `traceparent`
    is followed, its trace id and sampled flag kept; without one, each request is a fresh trace."""
    caller = "4bf92f3577b34da6a3ce929d0e0e4736"
    body = {"prompt": "Hi", "max_tokens": 2}
    with httpx.Client(base_url=service.url, timeout=60) as client:
        traced = client.post(
            "/generate",
            json=body,
            headers={"traceparent": f"00-{caller}-00f067aa0ba902b7-01", "X-Request-Id": "e2e-traced"},
        )
        fresh = [
            client.post("/generate", json=body, headers={"X-Request-Id": f"e2e-fresh-{i}"}) for i in range(2)
        ]
    assert [r.status_code for r in (traced, *fresh)] == [200, 200, 200]
    ids = ["e2e-traced", "e2e-fresh-0", "e2e-fresh-1"]
    assert wait_for(lambda: all(logged(service, i) for i in ids), 10)

    def traces(request_id: str) -> set[tuple[str, str]]:
        lines = [line for line in service.log().splitlines() if f"[request_id={request_id}]" in line]
        found = {m.groups() for line in lines for m in [TRACE.search(line)] if m}
        assert found, lines
        return found

    assert traces("e2e-traced") == {(caller, "1")}
    (first, sampled_first), (second, sampled_second) = *traces("e2e-fresh-0"), *traces("e2e-fresh-1")
    assert first != second and caller not in (first, second) and int(first, 16) and int(second, 16)
    assert sampled_first == sampled_second == "0"  # BentoML's default sample rate: 0


# ---- CORS, from a page on another origin -------------------------------------------------------------------

PAGE = b"<!doctype html><title>another origin</title><p>a page that calls the service</p>"

CALL = """async ([url, body, headers]) => {
  try {
    const response = await fetch(url, {method: "POST", headers, body});
    return {status: response.status, requestId: response.headers.get("x-request-id"),
            body: await response.text()};
  } catch (error) {
    return {error: String(error)};
  }
}"""


@pytest.fixture
def page_origin(service: BentoService) -> Iterator[str]:
    """A page server on the port of the origin the shared service allows (localhost:<port>)."""
    allowed = service.env["TRTLLM_CORS_ALLOW_ORIGINS"]
    port = urlsplit(allowed).port

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(PAGE)))
            self.end_headers()
            self.wfile.write(PAGE)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield allowed
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_on_another_origin_calls_the_api(
    service: BentoService, page_origin: str, model_name: str
) -> None:
    """A custom header (X-Request-Id) makes Chromium send a preflight first: the allowed origin
    gets its answer and may read the id; the refusal of a middleware (415) is readable too; a page
    on an origin not allowed is refused by the browser."""
    from playwright.sync_api import sync_playwright

    endpoint = f"{service.url}/v1/chat/completions"
    body = json.dumps(chat(model_name))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{page_origin}/")
            json_headers = {"Content-Type": "application/json", "X-Request-Id": "cors-page-1"}
            allowed = page.evaluate(CALL, [endpoint, body, json_headers])
            text_headers = {"Content-Type": "text/plain", "X-Request-Id": "cors-page-2"}
            refused = page.evaluate(CALL, [endpoint, body, text_headers])

            other = page_origin.replace("localhost", "127.0.0.1")  # same server, another origin
            page.goto(f"{other}/")
            blocked = page.evaluate(CALL, [endpoint, body, json_headers])
        finally:
            browser.close()

    assert allowed.get("status") == 200, allowed
    assert allowed["requestId"] == "cors-page-1", "X-Request-Id is exposed to the page"
    assert json.loads(allowed["body"])["choices"][0]["message"]["role"] == "assistant"
    assert refused.get("status") == 415 and refused["requestId"] == "cors-page-2", refused
    assert json.loads(refused["body"])["error"]["code"] == "unsupported_media_type"
    assert "error" in blocked and "Failed to fetch" in blocked["error"], blocked

    # Outside a browser: the preflight's answer names the one allowed origin, and no other.
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x-request-id"}
    ok = httpx.options(endpoint, headers={"Origin": page_origin, **preflight}, timeout=30)
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == page_origin
    no = httpx.options(endpoint, headers={"Origin": "http://elsewhere.example", **preflight}, timeout=30)
    assert no.status_code == 400 and "access-control-allow-origin" not in no.headers
