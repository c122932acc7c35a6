"""One typed settings object for the service, read from the environment once.

Every knob has a default that works on a fresh machine; docs/operations.md's configuration table lists
them. Ports default to 0, which means "pick a free one", so two services can share a host.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from trtllm_service.chat.template import ContentSpecialTokens


def default_workers() -> int:
    """One HTTP worker per 8 cores, 1 to 8.

    Measured (bench/relay.py, 16-core box, relay-box{,2}-after-w{2,4}-i4.md): two workers relay
    56-66k streamed tokens/s from four synthetic engines at 23-28 us of CPU per token; four relay no
    more (53-63k, the engines' limit) at 24-43 us, since each wakes for fewer tokens. Two on 16 cores
    keep headroom above what one engine streams, and a second worker that serves on when one dies.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cores // 8))


class SettingsError(ValueError):
    """An environment variable holds a value the service cannot use."""


class Settings(BaseModel, frozen=True):
    """Service configuration; field names map to upper-case environment variables below."""

    model_tag: str | None = Field(
        None,
        description="TRTLLM_MODEL: model store tag; default the served model (docs/own-models.md: What is served)",
    )
    triton_host: str = Field("127.0.0.1", description="TRITON_HOST: Triton has no auth, keep it on loopback")
    triton_grpc_port: int = Field(0, ge=0, le=65535, description="TRITON_GRPC_PORT: 0 picks a free port")
    triton_http_port: int = Field(0, ge=0, le=65535, description="TRITON_HTTP_PORT: 0 picks a free port")
    triton_metrics_port: int = Field(
        0, ge=0, le=65535, description="TRITON_METRICS_PORT: 0 picks a free port"
    )
    triton_startup_timeout_s: float = Field(600.0, gt=0, description="TRITON_STARTUP_TIMEOUT: seconds")
    triton_max_restarts: int = Field(5, ge=0, description="TRITON_MAX_RESTARTS: restarts after a crash")
    triton_restart_backoff_s: float = Field(
        1.0, gt=0, description="TRITON_RESTART_BACKOFF: first delay, doubles"
    )
    triton_stall_timeout_s: float = Field(
        30.0, gt=0, description="TRITON_STALL_TIMEOUT: seconds without health answers before a restart"
    )
    triton_log_verbose: bool = Field(False, description="TRITON_LOG_VERBOSE: verbose Triton logging")
    run_dir: Path | None = Field(
        None, description="TRTLLM_RUN_DIR: runtime repository and logs; default a temp dir"
    )
    api_keys: tuple[str, ...] = Field((), description="TRTLLM_API_KEYS: comma-separated; empty = no auth")
    default_max_tokens: int = Field(1024, ge=1, description="TRTLLM_DEFAULT_MAX_TOKENS for `generate`")
    concurrency: int | None = Field(
        None,
        ge=1,
        description="TRTLLM_CONCURRENCY: requests a replica serves at once (traffic.concurrency, the "
        "autoscaling target); default the engine's batch slots",
    )
    max_concurrency: int | None = Field(
        None,
        ge=1,
        description="TRTLLM_MAX_CONCURRENCY: requests in flight, then 429 (traffic.max_concurrency); "
        "default four batches' worth, at least 256",
    )
    engine_slots: int | Literal["auto", "off"] = Field(
        "auto",
        description="TRTLLM_ENGINE_SLOTS: requests let into the engine at once, across the workers; the "
        "rest wait in the service's queue, by priority then arrival (auto: traffic.concurrency, the "
        "engine's batch slots); off: no service queue, requests wait in the engine's own, in arrival order",
    )
    max_waiting: int | None = Field(
        None,
        ge=0,
        description="TRTLLM_MAX_WAITING: requests that may wait in the service's queue, then 429 (529 on "
        "/v1/messages); default TRTLLM_MAX_CONCURRENCY's limit",
    )
    queue_timeout_s: float | None = Field(
        None,
        gt=0,
        description="TRTLLM_QUEUE_TIMEOUT: seconds a request may wait in the service's queue, then 429 "
        "(529 on /v1/messages); default TRTLLM_STREAM_TIMEOUT",
    )
    cors_allow_origins: tuple[str, ...] = Field(
        (),
        description="TRTLLM_CORS_ALLOW_ORIGINS: comma-separated origins (or *) for BentoML's CORS; empty = off",
    )
    stream_timeout_s: float = Field(600.0, gt=0, description="TRTLLM_STREAM_TIMEOUT: per request, seconds")
    stream_interval_ms: float = Field(
        0.0,
        ge=0,
        le=1000,
        description="TRTLLM_STREAM_INTERVAL_MS: after a stream's first text, write its text at most once per "
        "this many ms (tokens that arrive meanwhile go out in one chunk: less CPU per token when tokens "
        "come faster than that); 0 = every token as it arrives",
    )
    loaded_stream_interval_ms: float = Field(
        10.0,
        ge=0,
        le=1000,
        description="TRTLLM_LOADED_STREAM_INTERVAL_MS: while requests of a worker wait for their first token, "
        "write other streams' text at most once per this many ms (the loop's time goes to the new requests, "
        "and a write carries several tokens: less CPU per token under load); 0 = off",
    )
    stream_idle_timeout_s: float = Field(
        120.0,
        gt=0,
        description="TRTLLM_STREAM_IDLE_TIMEOUT: seconds Triton may send nothing while requests are open",
    )
    shutdown_grace_s: float = Field(
        20.0, ge=0, description="TRTLLM_SHUTDOWN_GRACE: seconds SIGTERM waits for requests in flight"
    )
    max_body_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="TRTLLM_MAX_BODY_BYTES: larger request bodies get a 413"
    )
    header_timeout_s: float = Field(
        20.0,
        gt=0,
        description="TRTLLM_HEADER_TIMEOUT: seconds a request's headers may take to arrive, from the "
        "connection's start or the request's first byte; then 408 and the connection closed",
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description="TRTLLM_BODY_TIMEOUT: seconds a request's body may send nothing; then 408 and the "
        "connection closed",
    )
    max_header_bytes: int = Field(
        32 * 1024, ge=1024, description="TRTLLM_MAX_HEADER_BYTES: a request's head, larger gets a 431"
    )
    max_headers: int = Field(100, ge=8, description="TRTLLM_MAX_HEADERS: header lines; more get a 431")
    content_special_tokens: ContentSpecialTokens = Field(
        "control",
        description="TRTLLM_CONTENT_SPECIAL_TOKENS: special-token text in a request's messages is the "
        "template's control tokens (control, as Hugging Face and vLLM) or plain text (text)",
    )
    allow_runtime_lora_updating: bool = Field(
        False,
        description="TRTLLM_ALLOW_RUNTIME_LORA_UPDATING: serve POST /v1/load_lora_adapter and "
        "/v1/unload_lora_adapter (vLLM's); off: they are 404s",
    )
    lora_root: Path | None = Field(
        None,
        description="TRTLLM_LORA_ROOT: the directory /v1/load_lora_adapter's lora_path may name adapters "
        "under (nothing outside it); unset: only BentoML model tags",
    )
    workers: int = Field(
        default_factory=default_workers,
        ge=1,
        le=64,
        description="TRTLLM_WORKERS: HTTP worker processes sharing the one Triton",
    )

    @field_validator("api_keys", "cors_allow_origins", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(key.strip() for key in value.split(",") if key.strip())
        return value

    @field_validator("engine_slots")
    @classmethod
    def _positive_slots(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("must be at least 1, auto or off")
        return value

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        names = {
            "model_tag": "TRTLLM_MODEL",
            "triton_host": "TRITON_HOST",
            "triton_grpc_port": "TRITON_GRPC_PORT",
            "triton_http_port": "TRITON_HTTP_PORT",
            "triton_metrics_port": "TRITON_METRICS_PORT",
            "triton_startup_timeout_s": "TRITON_STARTUP_TIMEOUT",
            "triton_max_restarts": "TRITON_MAX_RESTARTS",
            "triton_restart_backoff_s": "TRITON_RESTART_BACKOFF",
            "triton_stall_timeout_s": "TRITON_STALL_TIMEOUT",
            "triton_log_verbose": "TRITON_LOG_VERBOSE",
            "run_dir": "TRTLLM_RUN_DIR",
            "api_keys": "TRTLLM_API_KEYS",
            "default_max_tokens": "TRTLLM_DEFAULT_MAX_TOKENS",
            "concurrency": "TRTLLM_CONCURRENCY",
            "max_concurrency": "TRTLLM_MAX_CONCURRENCY",
            "engine_slots": "TRTLLM_ENGINE_SLOTS",
            "max_waiting": "TRTLLM_MAX_WAITING",
            "queue_timeout_s": "TRTLLM_QUEUE_TIMEOUT",
            "cors_allow_origins": "TRTLLM_CORS_ALLOW_ORIGINS",
            "stream_timeout_s": "TRTLLM_STREAM_TIMEOUT",
            "stream_interval_ms": "TRTLLM_STREAM_INTERVAL_MS",
            "loaded_stream_interval_ms": "TRTLLM_LOADED_STREAM_INTERVAL_MS",
            "stream_idle_timeout_s": "TRTLLM_STREAM_IDLE_TIMEOUT",
            "shutdown_grace_s": "TRTLLM_SHUTDOWN_GRACE",
            "max_body_bytes": "TRTLLM_MAX_BODY_BYTES",
            "workers": "TRTLLM_WORKERS",
            "content_special_tokens": "TRTLLM_CONTENT_SPECIAL_TOKENS",
            "header_timeout_s": "TRTLLM_HEADER_TIMEOUT",
            "body_timeout_s": "TRTLLM_BODY_TIMEOUT",
            "max_header_bytes": "TRTLLM_MAX_HEADER_BYTES",
            "max_headers": "TRTLLM_MAX_HEADERS",
            "allow_runtime_lora_updating": "TRTLLM_ALLOW_RUNTIME_LORA_UPDATING",
            "lora_root": "TRTLLM_LORA_ROOT",
        }
        raw = {field: env[var] for field, var in names.items() if env.get(var, "") != ""}
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{names[str(err['loc'][0])]}: {err['msg']}" for err in exc.errors() if err["loc"]
            )
            raise SettingsError(f"invalid service settings: {problems}") from None

    def __repr__(self) -> str:  # API keys never reach a log line
        shown = self.model_dump(exclude={"api_keys"})
        return f"Settings({shown}, api_keys=<{len(self.api_keys)} keys>)"

    __str__ = __repr__


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings.from_env()
