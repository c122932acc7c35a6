"""What BentoML and BentoCloud are told about the service, derived from the packed model.

The service decorator's runtime settings come from here, so `bentoml build` writes them into the
Bento (its bento.yaml) and BentoCloud's scheduler and autoscaler read them there:

- `traffic.concurrency`: the requests one replica serves at once, the engine's batch slots (the
  packed `max_batch_size` per instance of the engine's model: `PackInfo.batch_slots`). BentoCloud
  scales a Deployment on it: replicas = concurrent requests / concurrency, within the Deployment's
  min and max replicas. Without it BentoCloud has no request-based target and scales on CPU alone.
  Requests beyond it wait in the service's queue (`TRTLLM_ENGINE_SLOTS=auto`, api/server/admission.py).
- `traffic.max_concurrency`: the requests in flight a replica takes before it answers 429: four
  batches' worth, at least 256. The service's own limiter (api/server/limits.py) enforces it across every
  worker, in OpenAI's error shape; BentoML's per-worker one is left out (api/server/bentoml_patches.py).
- `traffic.timeout`: as long as one request may stream (`TRTLLM_STREAM_TIMEOUT`).
- `traffic.external_queue` stays off: with it BentoCloud holds every request beyond `concurrency`
  in its own queue (a replica then never sees more than `concurrency`, `max_concurrency` never
  applies, and each request pays the queue's round trip). The service's queue does the same job
  within a replica without that cost; a Deployment can turn it on in `config_overrides.traffic`.
- `resources.gpu`: the ranks the engine was built for (tensor x pipeline parallel). The GPU type
  is the deployer's: `bentoml build --arg gpu_type=...` records one, or the Deployment's
  `instance_type` picks the machine; it is never assumed.
- `labels.openai_endpoint`: where the OpenAI-compatible routes are mounted.
- `http.cors`: BentoML's own CORS, on when `TRTLLM_CORS_ALLOW_ORIGINS` names origins.
- `image`: the base image and its Python, from tensorrtllm_backend/pinned.py (BentoML 1.4's
  `bentoml.images.Image`); what goes into the image is bentofile.yaml's.

Each can be overridden: the `TRTLLM_*` variables (settings.py) when the Bento is built (what its
bento.yaml tells BentoCloud) or served (what the service enforces), BentoML's configuration
(`BENTOML_CONFIG`, `services.trtllm.*`) when it is served, and a BentoCloud Deployment's
`config_overrides` when it is deployed (the service's limiter follows those too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tensorrtllm_backend import pinned
from trtllm_service.api.server.admission import QUEUE_OFF, Admission, AdmissionMiddleware, QueueLimits
from trtllm_service.api.server.limits import ConcurrencyLimitMiddleware
from trtllm_service.api.server.waiting_queue import SharedQueue
from trtllm_service.packed_model import PackInfo
from trtllm_service.settings import Settings

SERVICE_NAME = "trtllm"


def image() -> Any:
    """The Bento's base image, NVIDIA's pinned trtllm image, and its Python: BentoML's build makes its
    venv from that Python (the image has it: nothing is downloaded), before bentofile.yaml's setup
    script moves the service into the image's own environment (trtllm_service/image_env.py). Given
    here and not as bentofile.yaml's `docker.base_image` / `docker.python_version`, which BentoML
    1.4 warns about ("'python=3.12' option is ignored", a v1 leftover: a v2 image uses it).

    `distro` is what NVIDIA's image is, Ubuntu, for which BentoML has no default `apt-get install`
    (for "debian" its build would run one, twice: bentofile.yaml's options evolve the image and
    insert it again); the image has what the service's wheels need."""
    import bentoml

    return bentoml.images.Image(base_image=pinned.IMAGE, python_version=pinned.IMAGE_PYTHON, distro="ubuntu")


OPENAI_ROUTE = "/v1"
MIN_MAX_CONCURRENCY = 256
"""The least `max_concurrency` derived for any engine: the load the service is tested and
benchmarked at (256 concurrent streams), whatever few slots the engine has."""
QUEUED_BATCHES = 4
"""`max_concurrency` is this many batches' worth of requests: one running, the rest queued."""
EXPOSED_HEADERS = ("X-Request-Id",)
"""Response headers a browser page on another origin may read."""


def traffic(info: PackInfo, settings: Settings) -> dict[str, Any]:
    """`traffic` for the service decorator: concurrency from the engine's batch slots,
    max_concurrency from them, timeout from the stream timeout; the settings override each. A
    target above the hard limit could never be reached: concurrency is at most max_concurrency."""
    concurrency = settings.concurrency or info.batch_slots or max(1, int(info.max_batch_size))
    max_concurrency = settings.max_concurrency or max(MIN_MAX_CONCURRENCY, QUEUED_BATCHES * concurrency)
    return {
        "timeout": settings.stream_timeout_s,
        "concurrency": min(concurrency, max_concurrency),
        "max_concurrency": max_concurrency,
    }


def resources(info: PackInfo, gpu_type: str | None = None) -> dict[str, Any]:
    """`resources`: one GPU per rank of the engine (tp x pp), of the type given, if any."""
    found: dict[str, Any] = {"gpu": max(1, int(info.tp_size) * int(info.pp_size))}
    if gpu_type:
        found["gpu_type"] = gpu_type
    return found


def http(settings: Settings) -> dict[str, Any]:
    """`http`: BentoML's CORS settings, enabled for the origins `TRTLLM_CORS_ALLOW_ORIGINS` names
    (`*`: any). Requests may send any header (the OpenAI SDKs send several of their own) and carry
    no cookies; pages may read `X-Request-Id`."""
    origins = list(settings.cors_allow_origins)
    if not origins:
        return {"cors": {"enabled": False}}
    return {
        "cors": {
            "enabled": True,
            "access_control_allow_origins": origins,
            "access_control_allow_methods": ["GET", "POST", "OPTIONS"],
            "access_control_allow_headers": ["*"],
            "access_control_allow_credentials": False,
            "access_control_expose_headers": list(EXPOSED_HEADERS),
            "access_control_max_age": 600,
        }
    }


def labels() -> dict[str, str]:
    """The service's labels: where its OpenAI-compatible routes are (as BentoML's LLM examples say)."""
    return {"openai_endpoint": OPENAI_ROUTE}


def build_arguments() -> dict[str, Any]:
    """The Bento's build arguments (`bentoml build --arg key=value`; a built Bento keeps them)."""
    import bentoml

    return dict(vars(bentoml.use_arguments()))


def service_config(info: PackInfo, settings: Settings, arguments: dict[str, Any]) -> dict[str, Any]:
    """The runtime keyword arguments of `@bentoml.service` for this packed model."""
    return {
        "traffic": traffic(info, settings),
        "resources": resources(info, arguments.get("gpu_type") or None),
        "workers": settings.workers,
        "http": http(settings),
    }


def serving_url() -> str:
    """The URL a worker of the service serves on: its listening socket's address (BentoML hands each
    worker the socket), else BentoML's configured host and port."""
    import psutil

    try:
        connections = psutil.Process().net_connections("tcp")
        listening = [c.laddr for c in connections if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        listening = []
    if listening:
        host, port = listening[0].ip, listening[0].port
    else:
        from bentoml._internal.configuration.containers import BentoMLContainer

        host, port = BentoMLContainer.http.host.get(), BentoMLContainer.http.port.get()
    if host in ("0.0.0.0", "::", ""):
        host = "localhost"
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def configured_traffic(service_name: str = SERVICE_NAME) -> dict[str, Any]:
    """The service's `traffic` as BentoML finally configured it (the decorator's, overridden by
    BentoML's configuration or a Deployment's `config_overrides`); read once BentoML has loaded it,
    as it builds a worker's app."""
    from bentoml._internal.configuration.containers import BentoMLContainer

    services = BentoMLContainer.config.services.get()
    return dict((services.get(service_name) or {}).get("traffic") or {})


class ServiceConcurrencyLimit(ConcurrencyLimitMiddleware):
    """The concurrency limit at the service's configured `traffic.max_concurrency` (`fallback`
    where it has none)."""

    def __init__(self, app: Any, *, fallback: int, service_name: str = SERVICE_NAME, **options: Any) -> None:
        limit = configured_traffic(service_name).get("max_concurrency") or fallback
        super().__init__(app, limit=int(limit), **options)


def queue_limits(settings: Settings, traffic: dict[str, Any], batch_known: bool = True) -> QueueLimits | None:
    """The service queue's bounds (None: no queue), from the settings and the service's `traffic`
    (`auto` slots: its concurrency; waiting: its max_concurrency by default). No queue with
    TRTLLM_ENGINE_SLOTS=off, nor with `auto` where the engine's batch size is not known
    (`batch_known`: `PackInfo.batch_slots`) and TRTLLM_CONCURRENCY does not say it: a guess too low
    would hold back an engine that runs more at once."""
    if settings.engine_slots == "off" or (
        settings.engine_slots == "auto" and not batch_known and settings.concurrency is None
    ):
        return None
    slots = int(traffic["concurrency"]) if settings.engine_slots == "auto" else settings.engine_slots
    max_waiting = int(traffic["max_concurrency"]) if settings.max_waiting is None else settings.max_waiting
    return QueueLimits(
        slots=max(1, slots),
        max_waiting=max_waiting,
        timeout_s=settings.queue_timeout_s or settings.stream_timeout_s,
    )


class ServiceAdmission(AdmissionMiddleware):
    """The service's waiting queue at its configured `traffic` (`fallback`: the decorator's), shared
    by the workers through `<shared_dir>/queue.table`; it passes everything where there is no queue."""

    def __init__(
        self,
        app: Any,
        *,
        settings: Settings,
        fallback: dict[str, Any],
        shared_dir: Path,
        model_name: str = "",
        service_name: str = SERVICE_NAME,
        batch_known: bool = True,
    ) -> None:
        limits = queue_limits(settings, {**fallback, **configured_traffic(service_name)}, batch_known)
        admission = None
        if limits is not None:
            admission = Admission(SharedQueue(shared_dir / "queue.table"), limits, model_name)
        why = UNKNOWN_BATCH if settings.engine_slots == "auto" else QUEUE_OFF
        super().__init__(app, admission, without=why)


UNKNOWN_BATCH = (
    "the LLM API picks its own batch size (pack with --max-batch-size, or set TRTLLM_ENGINE_SLOTS "
    "or TRTLLM_CONCURRENCY)"
)
"""Why `auto` leaves the queue off for a model whose engine batch is not known (start-up log)."""
