"""Headless Chromium for the e2e tests that drive a page (the Swagger UI; CORS from another origin):
where it is, and the flags it runs with here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

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
