"""The start-up log: one line per phase (the model and why, Triton starting, ready in N s, serving on a
URL); Triton's own tables only at debug level (they are in triton.log). Read from the shared service's
log."""

from __future__ import annotations

import re
from pathlib import Path

from tests.e2e.conftest import BentoService
from tests.support import wait_for
from trtllm_service.triton.process import NO_GPU_LINES, NO_GPU_NOTE

FLAVORS = ("llmapi",)  # the log does not depend on the repository flavour


def test_one_line_per_phase_and_no_triton_tables(service: BentoService, model_name: str) -> None:
    # The owner logs "serving ..." once Triton is ready, a moment after /readyz may answer.
    assert wait_for(lambda: f"serving {model_name} on {service.url} " in service.log(), timeout=20), (
        service.log()[-3000:]
    )
    lines = service.log().splitlines()
    starting = [line for line in lines if "Triton starting (pid " in line]
    ready = [
        line
        for line in lines
        if re.search(rf"Triton is ready for {re.escape(model_name)} in \d+\.\d s: ", line)
    ]
    serving = [line for line in lines if f"serving {model_name} on {service.url} " in line]
    assert (len(starting), len(ready), len(serving)) == (1, 1, 1), "\n".join(lines[-40:])
    assert lines.index(starting[0]) < lines.index(ready[0]) < lines.index(serving[0])
    assert f"OpenAI API at {service.url}/v1" in serving[0]
    # The service's queue is on by default where the engine's batch is known (test_priority shows it
    # at work); this demo leaves its batch size to the LLM API, so the line says why it is off.
    assert serving[0].endswith(
        "; no service queue, requests wait in the engine's in arrival order: the LLM API picks its own "
        "batch size (pack with --max-batch-size, or set TRTLLM_ENGINE_SLOTS or TRTLLM_CONCURRENCY)"
    ), serving[0]

    tables = [line for line in lines if re.search(r"\[triton\] (\+-|\| )", line)]
    assert not tables, f"Triton's tables reached the log at INFO: {tables[:3]}"
    triton_info = [line for line in lines if re.search(r"\[triton\] I\d{4} ", line)]
    assert not triton_info, triton_info[:3]
    # No silent stretch: the tokenizer's load (transformers) is a phase, said while Triton starts.
    hook = next(i for i, line in enumerate(lines) if "Completed async startup hook" in line)
    loading = [i for i, line in enumerate(lines) if f"{model_name}: loading its tokenizer" in line]
    loaded = [i for i, line in enumerate(lines) if re.search(rf"{model_name}: tokenizer loaded in \d", line)]
    assert len(loading) == len(loaded) == 1, "\n".join(lines[-40:])
    assert hook < loading[0] < loaded[0] < lines.index(serving[0])
    assert hook < lines.index(starting[0])
    # Triton's expected complaints on a machine without a GPU: said once, in our words.
    no_gpu = [line for line in lines if "[triton]" in line and any(known in line for known in NO_GPU_LINES)]
    assert not no_gpu, no_gpu
    assert not [line for line in lines if re.search(r"\[triton\] E\d{4} ", line)]
    assert sum(NO_GPU_NOTE in line for line in lines) == 1, "\n".join(lines[-40:])
    # Everything Triton said is in its own log.
    triton_log = (Path(service.env["TRTLLM_RUN_DIR"]) / "triton.log").read_text(errors="replace")
    assert "| Model" in triton_log and "READY" in triton_log


def test_the_log_names_the_model_and_why_once(service: BentoService, packed_model_dir: Path) -> None:
    """Which model, its exact tag and the rule that chose it: one line, from `bentoml serve`'s own
    process (its workers import service.py too, and say nothing)."""
    tag = f"{packed_model_dir.parent.name}:{packed_model_dir.name}"
    named = [line for line in service.log().splitlines() if line.startswith("trtllm_service: model ")]
    assert named == [
        f"trtllm_service: model {tag} (the only model pack_model.py packed into the model store)"
    ]
