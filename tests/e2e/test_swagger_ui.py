"""The Swagger UI that `bentoml serve` puts at `/`, driven in headless Chromium like a user would."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import BentoService

FLAVORS = ("llmapi",)  # the UI does not depend on the repository flavour

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).is_file():
        pytest.fail(
            "Chromium is needed for the Swagger UI test and was not found (PATH or /usr/bin/chromium); "
            "install it with `apt-get install -y chromium`"
        )
    return path


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
