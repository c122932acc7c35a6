"""api/server/error_shape.py: every error answer in `{"error": {"message", "type", "param", "code"}}`,
whoever made it (BentoML's validation, Starlette's 404 and 405, a probe's 503), and nothing else
touched."""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from trtllm_service.api.anthropic.errors import DIALECT
from trtllm_service.api.server.error_shape import ErrorShapeMiddleware, reshape
from trtllm_service.errors import APIError

# What BentoML 1.4.40 answers when /generate's body fails its pydantic model (api_endpoint_wrapper).
BENTOML_VALIDATION = {
    "error": "1 validation error for Input",
    "detail": [{"type": "missing", "loc": ["prompt"], "msg": "Field required"}],
}


async def bentoml_validation(request: Request) -> Response:
    return JSONResponse(BENTOML_VALIDATION, status_code=400)


STARTING_SOON = "The service is starting; please retry shortly."


async def ours(request: Request) -> Response:
    error = APIError.unavailable(STARTING_SOON, retry_after=1)
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


async def not_ready(request: Request) -> Response:
    raise HTTPException(503, detail="Service is not ready because .__is_ready__() returns False.")


async def crash(request: Request) -> Response:
    return JSONResponse({"error": "An unexpected error has occurred, please check the server log."}, 500)


async def stream(request: Request) -> Response:
    async def chunks():  # type: ignore[no-untyped-def]  # a test's local generator
        yield b"not "
        yield b"an error"

    return StreamingResponse(chunks(), media_type="text/plain")


async def text_error(request: Request) -> Response:
    return PlainTextResponse("Too many requests", status_code=429, headers={"X-Kept": "yes"})


APP = Starlette(
    routes=[
        Route("/generate", bentoml_validation, methods=["POST"]),
        Route("/v1/chat/completions", ours, methods=["POST"]),
        Route("/readyz", not_ready),
        Route("/crash", crash),
        Route("/stream", stream),
        Route("/busy", text_error),
    ]
)
CLIENT = TestClient(ErrorShapeMiddleware(APP), raise_server_exceptions=False)


def error_of(response: Response) -> dict[str, object]:
    assert response.headers["content-type"] == "application/json"
    assert int(response.headers["content-length"]) == len(response.content)
    payload = json.loads(response.content)
    assert set(payload) == {"error"} and set(payload["error"]) == {"message", "type", "param", "code"}
    return payload["error"]  # type: ignore[no-any-return]  # parsed JSON


def test_bentomls_validation_error_becomes_the_400_v1_gives() -> None:
    response = CLIENT.post("/generate", json={})
    assert response.status_code == 400
    assert error_of(response) == {
        "message": "Missing required parameter: 'prompt'.",
        "type": "invalid_request_error",
        "param": "prompt",
        "code": "missing_required_parameter",
    }


def test_unknown_path_and_wrong_method_say_which_url() -> None:
    missing = CLIENT.get("/nowhere")
    assert missing.status_code == 404
    assert error_of(missing) == {
        "message": "Invalid URL (GET /nowhere)",
        "type": "invalid_request_error",
        "param": None,
        "code": "unknown_url",
    }
    wrong = CLIENT.get("/generate")
    assert wrong.status_code == 405 and error_of(wrong)["code"] == "method_not_allowed"
    assert "GET /generate" in str(error_of(wrong)["message"])


def test_probe_and_server_errors_keep_their_message() -> None:
    ready = CLIENT.get("/readyz")
    assert ready.status_code == 503
    error = error_of(ready)
    assert error["type"] == "server_error" and error["code"] == "service_unavailable"
    assert "not ready" in str(error["message"])
    crashed = CLIENT.get("/crash")
    assert crashed.status_code == 500 and str(error_of(crashed)["message"]).startswith("An unexpected error")


def test_headers_are_kept_but_the_bodys() -> None:
    busy = CLIENT.get("/busy")
    assert busy.status_code == 429 and busy.headers["x-kept"] == "yes"
    assert error_of(busy) == {
        "message": "Too many requests",
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }


def test_our_own_errors_and_successes_pass_untouched() -> None:
    own = CLIENT.post("/v1/chat/completions")
    assert own.status_code == 503 and own.headers["retry-after"] == "1"
    assert own.json() == APIError.unavailable("The service is starting; please retry shortly.").body()
    streamed = CLIENT.get("/stream")
    assert streamed.status_code == 200 and streamed.text == "not an error"
    assert streamed.headers["content-type"].startswith("text/plain")


def test_reshape_leaves_shaped_bodies_alone() -> None:
    body = json.dumps(APIError.bad_request("no", param="x").body()).encode()
    assert reshape(400, body, "POST", "/generate") is None
    error = reshape(502, b"", "GET", "/x")
    assert error is not None and (error.status, error.message, error.type) == (
        502,
        "Bad Gateway",
        "server_error",
    )


async def ours_on_messages(request: Request) -> Response:
    return await ours(request)


async def anthropic_own(request: Request) -> Response:
    return JSONResponse({"type": "error", "error": {"type": "x", "message": "as it is"}}, 400)


def test_the_paths_of_an_error_dialect_answer_in_its_shape() -> None:
    """Anthropic's routes (the dialect the service gives the middleware): our 503 is its 529
    overloaded_error, Starlette's 404 its not_found_error, and a body in its shape passes as it is;
    the middleware itself knows no endpoint."""
    app = Starlette(
        routes=[
            Route("/v1/messages", ours_on_messages, methods=["POST"]),
            Route("/v1/messages/own", anthropic_own),
        ]
    )
    client = TestClient(ErrorShapeMiddleware(app, dialects=(DIALECT,)), raise_server_exceptions=False)
    busy = client.post("/v1/messages")
    assert busy.status_code == 529 and busy.headers["retry-after"] == "1"
    assert busy.json()["error"] == {"type": "overloaded_error", "message": STARTING_SOON}
    missing = client.get("/v1/messages/nowhere")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    own = client.get("/v1/messages/own")
    assert own.status_code == 400 and own.json()["error"] == {"type": "x", "message": "as it is"}
    assert CLIENT.post("/v1/chat/completions").status_code == 503  # no dialect: the service's shape
