"""Optional API keys: an ASGI middleware that asks for ``Authorization: Bearer <key>`` (OpenAI's
clients) or ``x-api-key: <key>`` (Anthropic's).

Deny by default: with keys configured (``TRTLLM_API_KEYS``), every path needs a key (``/v1/*``,
``/generate`` and any API added later) except the probes, the metrics, and the documentation (Swagger
UI, its assets and the OpenAPI document), which carry no model output. CORS preflights (``OPTIONS``)
pass too: browsers never send credentials on them.

A key is checked against every configured key with ``hmac.compare_digest`` over SHA-256 digests, so the
time taken tells nothing about which key nearly matched or how long the keys are. Keys are never
logged, and a refusal does not echo the key it was given.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from trtllm_service.api.server.metrics import count_rejected
from trtllm_service.errors import APIError

OPEN_PATHS = frozenset({"/", "/livez", "/readyz", "/healthz", "/metrics", "/docs.json", "/schema.json"})
"""Paths answered without a key: health probes, metrics, and the API documentation."""

OPEN_PREFIXES = ("/static_content/", "/assets/")
"""Static files of BentoML's Swagger UI / index page."""

_MISSING = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header "
    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or in an x-api-key header."
)
_WRONG = "Incorrect API key provided."


def is_open(path: str) -> bool:
    """Whether `path` is served without an API key."""
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode("utf-8") if isinstance(key, str) else key).digest()


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive), if any."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return None
    return None


def api_key_tokens(headers: Iterable[tuple[bytes, bytes]]) -> list[bytes]:
    """The keys a request offers: its bearer token, its ``x-api-key`` header (Anthropic's), or both."""
    tokens = []
    bearer = bearer_token(headers)
    if bearer is not None:
        tokens.append(bearer)
    for name, value in headers:
        if name.lower() == b"x-api-key" and value.strip():
            tokens.append(value.strip())
            break
    return tokens


class APIKeys:
    """The accepted keys, kept only as SHA-256 digests; shown as a count, never as keys.

    Args:
        keys: The keys; empty strings are ignored.
    """

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = tuple(_digest(key) for key in keys if key)

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:
        return f"APIKeys(<{len(self._digests)} keys>)"

    def matches(self, token: bytes | None) -> bool:
        """Whether `token` is one of the keys, in time independent of which key (or how much) matched."""
        if token is None:
            return False
        given = _digest(token)
        found = False
        for digest in self._digests:  # no early exit: every key is compared every time
            found |= hmac.compare_digest(given, digest)
        return found


class APIKeyMiddleware:
    """Refuses requests without a valid key with a 401 in OpenAI's error shape.

    Args:
        app: The ASGI app to protect.
        api_keys: The accepted keys (at least one); pass ``APIKeys`` so that no configuration dump
            (e.g. the middleware list's repr) can show them.
    """

    def __init__(self, app: ASGIApp, api_keys: APIKeys | Iterable[str], model_name: str = "") -> None:
        self.app = app
        self.model_name = model_name
        self.keys = api_keys if isinstance(api_keys, APIKeys) else APIKeys(api_keys)
        if not self.keys:
            raise ValueError("APIKeyMiddleware needs at least one non-empty API key")

    def __repr__(self) -> str:
        return f"APIKeyMiddleware({self.keys!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http" and scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        tokens = api_key_tokens(scope["headers"])
        if any(self.keys.matches(token) for token in tokens):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        error = APIError(401, _WRONG if tokens else _MISSING, code="invalid_api_key")
        count_rejected(self.model_name, scope["path"], 401)
        response = JSONResponse(error.body(), status_code=401, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)
