"""The Swagger UI that `bentoml serve` puts at `/`, driven in headless Chromium like a user would."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.browser_support import CHROMIUM_ARGS, chromium_path
from tests.e2e.conftest import BentoService

FLAVORS = ("llmapi",)  # the UI does not depend on the repository flavour


def test_generate_from_swagger_ui(service: BentoService, tmp_path: Path) -> None:
    """Open the docs page, "Try it out" on /generate, Execute: the page shows the generated text."""
    from playwright.sync_api import sync_playwright

    body = {"prompt": "Hello!", "max_tokens": 20, "temperature": 0}
    api = httpx.post(f"{service.url}/generate", json=body, timeout=60)
    assert api.status_code == 200, api.text
    expected = api.text
    assert expected.strip(), "the API returned no text to look for"

    screenshot = tmp_path / "swagger-generate.png"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.set_default_timeout(30_000)
            # The page also asks for a tag-manager script on the internet: don't wait for "load".
            page.goto(f"{service.url}/", wait_until="domcontentloaded")
            operation = page.locator(".opblock-post").filter(has=page.locator('[data-path="/generate"]'))
            operation.locator(".opblock-summary").first.click()
            operation.get_by_role("button", name="Try it out").click()
            editor = operation.locator("textarea.body-param__text")
            assert "prompt" in editor.input_value(), "the request body editor has no prompt field"
            editor.fill(json.dumps(body))
            operation.get_by_role("button", name="Execute").click()

            table = operation.locator(".live-responses-table")
            status = table.locator(".response .response-col_status").first
            status.wait_for()
            assert status.inner_text().strip() == "200", table.inner_text()
            shown = table.locator(".response-col_description .microlight").first.inner_text()
            operation.scroll_into_view_if_needed()
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()

    # Greedy decoding: the page shows exactly what the API returns for the same request.
    assert shown.strip() == expected.strip() or (shown.strip() and expected.startswith(shown.strip())), (
        f"Swagger UI showed {shown!r}, the API returned {expected!r}"
    )
    data = screenshot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000, f"the screenshot is suspiciously small ({len(data)} bytes)"


def test_the_page_is_the_services_own(service: BentoService) -> None:
    """The page says what the service is, its version and how to call it; /generate and the /v1
    routes sit under their own tags with example bodies and errors in OpenAI's shape; no image on
    it fails to load."""
    from playwright.sync_api import sync_playwright

    from trtllm_service.api.openapi import GENERATE_TAG, OPENAI_TAG, TITLE
    from trtllm_service.versions import service_version

    failed_images: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.set_default_timeout(30_000)
            page.on(
                "requestfailed",
                lambda request: (
                    failed_images.append(request.url) if request.resource_type == "image" else None
                ),
            )
            page.goto(f"{service.url}/", wait_until="domcontentloaded")
            info = page.locator(".information-container .info")
            info.locator(".description h1").wait_for()
            # BentoML's page hides the document's title but for its badges (version, OAS): the
            # service's title is the description's heading.
            version = info.locator(".title .version").first.inner_text().strip()
            title = info.locator(".description h1").inner_text()
            description = info.locator(".description").inner_text()
            tags = [t.strip() for t in page.locator(".opblock-tag-section h3 .opblock-tag").all_inner_texts()]
            tags = tags or [t.strip() for t in page.locator(".opblock-tag").all_inner_texts()]

            chat = page.locator(".opblock-post").filter(
                has=page.locator('[data-path="/v1/chat/completions"]')
            )
            chat.locator(".opblock-summary").first.click()
            example = chat.locator(".body-param__example, .highlight-code").first.inner_text()
            responses = chat.locator(".responses-table").first.inner_text()

            page.wait_for_load_state("load")
            broken = page.evaluate(
                "() => Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)"
            )
        finally:
            browser.close()

    assert title == TITLE and version == service_version() != "None", (title, version)
    assert ":dev" not in description
    for needle in ("POST /generate", "/v1/chat/completions", "Authorization: Bearer", "X-Request-Id"):
        assert needle in description, needle
    assert any(t.startswith(GENERATE_TAG.name) for t in tags), tags
    assert any(t.startswith(OPENAI_TAG.name) for t in tags), tags
    assert not any(t.startswith("default") for t in tags), tags
    assert "messages" in example, example
    assert "429" in responses and "rate_limit_exceeded" in responses, responses
    assert not broken and not failed_images, (broken, failed_images)


def test_every_route_is_on_the_page(service: BentoService) -> None:
    """Issue 35: /tokenize and /detokenize were missing from the Swagger page. Every route the
    service serves is in /docs.json and on the page, under a tag of its own (none under "default")."""
    from playwright.sync_api import sync_playwright

    paths = httpx.get(f"{service.url}/docs.json", timeout=30).json()["paths"]
    routes = {
        ("post", "/generate"),
        ("post", "/tokenize"),
        ("post", "/detokenize"),
        ("get", "/v1/models"),
        ("get", "/v1/models/{model}"),
        ("post", "/v1/chat/completions"),
        ("post", "/v1/completions"),
        ("post", "/v1/responses"),
        ("post", "/v1/messages"),
        ("post", "/v1/messages/count_tokens"),
    }
    documented = {(method, path) for path, item in paths.items() for method in item}
    assert routes <= documented, routes - documented
    for method, path in routes:
        assert paths[path][method]["tags"] != ["default"], path

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.set_default_timeout(30_000)
            page.goto(f"{service.url}/", wait_until="domcontentloaded")
            page.locator('.opblock [data-path="/generate"]').first.wait_for()
            shown = set(
                page.locator(".opblock .opblock-summary-path").evaluate_all(
                    "els => els.map(e => e.dataset.path)"
                )
            )
        finally:
            browser.close()
    assert {path for _, path in routes} <= shown, {path for _, path in routes} - shown
