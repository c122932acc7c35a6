"""RequestMetrics records each request once into the model's labelled series (looked up once per
model): read back from prometheus_client's registry, as a scrape would."""

from __future__ import annotations

from prometheus_client import REGISTRY

from trtllm_service.api.server.metrics import RequestMetrics


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_each_request_counts_once_under_its_model_route_status_and_reason() -> None:
    done = {"model_name": "metrics-test", "route": "/generate", "status": "200", "finished_reason": "length"}
    refused = {**done, "status": "400", "finished_reason": ""}
    before = _sample("trtllm:requests_total", **done), _sample("trtllm:requests_total", **refused)
    for _ in range(3):
        metrics = RequestMetrics("metrics-test", "/generate")
        assert _sample("trtllm:num_requests_running", model_name="metrics-test") == 1
        metrics.first_token()
        metrics.done(200, "length", prompt_tokens=5, completion_tokens=9)
        metrics.done(200, "length", prompt_tokens=5, completion_tokens=9)  # a second call: nothing
    RequestMetrics("metrics-test", "/generate").done(400)
    assert _sample("trtllm:requests_total", **done) - before[0] == 3
    assert _sample("trtllm:requests_total", **refused) - before[1] == 1
    assert _sample("trtllm:num_requests_running", model_name="metrics-test") == 0
    assert _sample("trtllm:request_generation_tokens_sum", model_name="metrics-test") == 27
    assert _sample("trtllm:inter_token_latency_seconds_count", model_name="metrics-test") == 3
    assert _sample("trtllm:request_prompt_tokens_count", model_name="other-model") == 0


def test_in_the_event_loop_a_request_is_counted_once_the_current_callback_is_done() -> None:
    """On the loop, the running gauge and the TTFT sample are written on the loop's next turn (off
    the first token's way), and written all the same."""
    import asyncio

    async def one_request() -> tuple[float, float, float, float]:
        ttft = "trtllm:time_to_first_token_seconds_count"
        running, first = (
            _sample("trtllm:num_requests_running", model_name="loop-test"),
            _sample(ttft, model_name="loop-test"),
        )
        metrics = RequestMetrics("loop-test", "/generate")
        metrics.first_token()
        now = (
            _sample("trtllm:num_requests_running", model_name="loop-test") - running,
            _sample(ttft, model_name="loop-test") - first,
        )
        await asyncio.sleep(0)
        later = (
            _sample("trtllm:num_requests_running", model_name="loop-test") - running,
            _sample(ttft, model_name="loop-test") - first,
        )
        metrics.done(200, "length", 1, 1)
        return (*now, *later)

    assert asyncio.run(one_request()) == (0, 0, 1, 1)


def test_endpoint_labels_are_route_templates_or_other() -> None:
    """BentoML's request metrics get a bounded label: a route's template, or "other" for a path no
    route serves (/v1's catch-all 404 included)."""
    from fastapi import FastAPI
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Mount, Route

    from trtllm_service.api.server.metrics import OTHER, EndpointLabels

    def endpoint(request: object) -> Response:
        return Response()

    v1 = FastAPI()
    v1.add_api_route("/models", endpoint)
    v1.add_api_route("/models/{model}", endpoint)
    v1.add_api_route("/{path:path}", endpoint)  # the OpenAI-shaped 404 of unknown /v1 paths
    app = Starlette(
        routes=[
            Route("/generate", endpoint, methods=["POST"]),
            Mount("/static_content", app=lambda scope, receive, send: None),
            Mount("/v1", app=v1),
        ]
    )
    labels = EndpointLabels()
    assert labels.of("/generate") == OTHER  # nothing learnt yet
    labels.learn(app)
    assert labels.of("/generate") == "/generate"
    assert labels.of("/v1/models") == "/v1/models"
    assert labels.of("/v1/models/any-name") == "/v1/models/{model}"
    assert labels.of("/static_content/swagger.css") == "/static_content/{path}"
    for path in ("/v1/no-such-route", "/v1/models/a/b", "/x\x00y", "/a" * 1000, "/generate/"):
        assert labels.of(path) == OTHER, path
    assert len(labels._cache) <= 4
