"""The supervisor's judgement of the engine model's probe, and how it finds Python-backend stubs."""

from __future__ import annotations

from trtllm_service.triton.process import _is_stub, stuck_engine


def test_no_progress_with_work_in_flight_is_a_stuck_engine() -> None:
    assert stuck_engine({"in_flight": 2, "idle_s": 31.0, "busy": False}, 30) == (
        "the engine made no progress for 31 s with 2 requests in flight"
    )
    # TensorRT-LLM cannot say whether it is in a step: silence that long with work is a hang too
    assert stuck_engine({"in_flight": 1, "idle_s": 40.0, "busy": None}, 30) is not None


def test_a_long_step_an_idle_engine_or_a_short_silence_is_not_stuck() -> None:
    assert stuck_engine({"in_flight": 1, "idle_s": 300.0, "busy": True}, 30) is None  # a long prefill
    assert stuck_engine({"in_flight": 0, "idle_s": 0.0, "busy": False}, 30) is None
    assert stuck_engine({"in_flight": 3, "idle_s": 29.9, "busy": False}, 30) is None


def test_stubs_are_found_whether_run_directly_or_by_a_loader() -> None:
    direct = [
        b"/tmp/x/backends/python/triton_python_backend_stub",
        b"model.py",
        b"tensorrt_llm_0_0",
        b"DEFAULT",
    ]
    loaded = [
        b"/opt/noble/ld-linux-x86-64.so.2",
        b"--library-path",
        b"/opt/noble/lib",
        b"--argv0",
        b"/tmp/x/backends/python/triton_python_backend_stub",
        b"/opt/stub-3.12",
        b"model.py",
        b"tensorrt_llm_0_0",
        b"DEFAULT",
    ]
    assert _is_stub(direct) and _is_stub(loaded)
    assert not _is_stub([b"/opt/noble/ld-linux-x86-64.so.2", b"/usr/bin/python3.12"])
    assert not _is_stub([b"tritonserver", b"--model-repository=x"])
