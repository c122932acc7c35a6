"""What the service's own processes load: `bentoml serve`'s process and its workers template chats,
relay tokens and speak HTTP; none of it needs PyTorch. transformers imports PyTorch when it can (it can
in NVIDIA's image and here), and with it seconds of every start and some 250 MB in each process.
Read from the shared service's processes, after a chat was answered (its template rendered)."""

from __future__ import annotations

import openai
import psutil

from tests.e2e.conftest import BentoService

FLAVORS = ("llmapi",)  # the service's processes are the same on both flavours


def test_the_service_processes_do_not_load_pytorch(
    service: BentoService, client: openai.OpenAI, model_name: str
) -> None:
    answer = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert answer.choices[0].message.content is not None
    assert service.process is not None
    # `bentoml serve` and its workers: the descendants that are Python (Triton's stubs are not)
    ours = [psutil.Process(service.process.pid)] + [
        process for process in service.descendants() if process.name().startswith("python")
    ]
    workers = [p for p in ours if "_bentoml_impl.worker.service" in " ".join(p.cmdline())]
    assert workers, [p.cmdline() for p in ours]
    for process in ours:
        with open(f"/proc/{process.pid}/maps") as maps:
            torch = sorted({line.split()[-1] for line in maps if "/torch/lib/" in line})
        assert not torch, f"{' '.join(process.cmdline())[:120]} mapped {torch[:3]}"
