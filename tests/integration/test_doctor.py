"""`python -m trtllm_service.doctor`: a user's self-check, run against our stand-ins in a real Triton.

The GPU box runs the same command against TensorRT-LLM; here the reference engine serves, so the
feature probes must all pass on it, and what the packed model lacks must say why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.lora_support import make_adapter
from trtllm_service import doctor

REPO_ROOT = Path(__file__).resolve().parents[2]


def run(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BENTOML_HOME": str(home), "BENTOML_DO_NOT_TRACK": "true", **(env or {})}
    return subprocess.run(
        [sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def packed_home(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BENTOML_HOME with two demo models packed: `with-lora` (an adapter) and `no-guides`."""
    home = tmp_path_factory.mktemp("doctor-home")
    config = json.loads((demo_model_dir / "config.json").read_text())
    adapter = make_adapter(tmp_path_factory.mktemp("adapter") / "poet", config, seed=1)
    for name, extra in (
        ("with-lora", ["--lora", f"poet={adapter}"]),
        ("no-guides", ["--no-guided-decoding"]),
    ):
        packed = run(
            home, "pack_model.py", "--demo", "tiny", "--flavor", "ensemble", "--quiet", "--name", name, *extra
        )
        assert packed.returncode == 0, packed.stderr
    return home


@pytest.mark.box
def test_every_feature_of_a_packed_model_answers(packed_home: Path) -> None:
    result = run(packed_home, "-m", "trtllm_service.doctor", "with-lora", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    checks = {check["name"]: check for check in report["checks"]}
    assert report["facts"]["engine"] == "reference" and report["facts"]["triton"]
    for name in ("stream", "stop", "seed", "logprobs", "guided", "lora", "gpus", "engine build"):
        assert checks[name]["status"] == "ok", checks[name]
    assert "top 2" in checks["logprobs"]["detail"] and "'poet'" in checks["lora"]["detail"]
    assert checks["beams"]["status"] == "unsupported" and "max_beam_width 1" in checks["beams"]["detail"]
    assert checks["tensorrt_llm"]["status"] == "unsupported"  # no TensorRT-LLM on this machine


@pytest.mark.box
@pytest.mark.parametrize("demo", ["smollm2", "tiny"])
def test_the_doctor_passes_on_the_demo(
    demo: str, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`pack_model.py --demo` (SmolLM2, whose greedy answer to a raw prompt is end-of-text at once),
    then the doctor as the README says, with no model named: every probe a chat, every one ok. The
    tiny one is packed alone with --max-lora-rank, and the doctor loads an adapter into it
    (--probe-lora-load), asks it once and unloads it: LoRA with no adapter packed (llmapi)."""
    home = tmp_path_factory.mktemp(f"doctor-{demo}")
    lora = ["--max-lora-rank", "4"] if demo == "tiny" else []
    packed = run(home, "pack_model.py", "--demo", demo, "--quiet", *lora)
    assert packed.returncode == 0, packed.stderr
    probe, env = [], {}
    if lora:
        config = json.loads((demo_model_dir / "config.json").read_text())
        root = tmp_path_factory.mktemp("doctor-adapters")
        make_adapter(root / "poet", config, seed=1)
        probe, env = ["--probe-lora-load", "poet"], {"TRTLLM_LORA_ROOT": str(root)}
    result = run(home, "-m", "trtllm_service.doctor", "--json", *probe, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["facts"]["chosen by"].startswith("the served model recorded in "), report["facts"]
    checks = {check["name"]: check for check in report["checks"]}
    for name in ("stream", "stop", "seed", "logprobs", "guided"):
        assert checks[name]["status"] == "ok", checks[name]
    if lora:
        assert report["facts"]["flavor"] == "llmapi"
        load = checks["lora load"]
        assert load["status"] == "ok" and load["detail"].startswith("'poet' loaded (rank 4), "), load
        assert load["detail"].endswith(" tokens, unloaded")
    assert not [check for check in report["checks"] if check["status"] in ("failed", "warning")]


def test_what_the_model_was_packed_without_is_unsupported_with_why(packed_home: Path) -> None:
    result = run(packed_home, "-m", "trtllm_service.doctor", "no-guides")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith("  ")}
    assert "unsupported" in lines["guided"] and "packed without" in lines["guided"], lines["guided"]
    assert "unsupported" in lines["lora"] and "--lora" in lines["lora"]


def test_an_unknown_model_is_one_line(packed_home: Path) -> None:
    result = run(packed_home, "-m", "trtllm_service.doctor", "no-such-model")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("trtllm_service.doctor: error: ") and result.stderr.count("\n") == 1


def test_environment_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = SimpleNamespace(
        world_size=2, tp_size=2, pp_size=1, backend="tensorrtllm", versions={"tensorrt_llm": "1.2.0"}
    )
    monkeypatch.setattr(doctor, "gpus_seen", lambda: 1)
    checks = {c.name: c for c in doctor.environment_checks(engine, "tensorrt_llm (C++ backend)", "1.2.1")}
    assert checks["tensorrt_llm"].status == "ok"
    assert checks["gpus"].status == "failed" and "needs 2 (tp 2 x pp 1)" in checks["gpus"].detail
    assert checks["engine build"].status == "failed" and "rebuild" in checks["engine build"].detail
    old = {c.name: c for c in doctor.environment_checks(engine, "x", "1.0.3.2510")}
    assert old["tensorrt_llm"].status == "failed" and "older than the 1.1.0" in old["tensorrt_llm"].detail


def test_a_failed_check_fails_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def diagnose(
        tag: str | None, lora_path: str | None = None
    ) -> tuple[dict[str, str], list[doctor.Check]]:
        return {"model": "m"}, [
            doctor.Check("stream", "ok", "fine"),
            doctor.Check("seed", "failed", "differs"),
        ]

    monkeypatch.setattr(doctor, "diagnose", diagnose)
    assert doctor.main(["m"]) == 1
    assert "seed    failed" in capsys.readouterr().out
