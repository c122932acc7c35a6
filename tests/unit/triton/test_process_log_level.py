"""Which of Triton's output lines reach the service log, and at which level (triton/process.py)."""

from __future__ import annotations

import logging

import pytest

from trtllm_service.triton import process

# Triton 2.51's own lines on every start on a machine without a GPU driver (from a real triton.log)
NO_GPU = (
    'W1128 17:56:07.690809 11950 pinned_memory_manager.cc:273] "Unable to allocate pinned system memory, '
    'pinned memory pool will not be available: CUDA driver version is insufficient for CUDA runtime version"',
    'E1128 17:56:07.691066 11950 server.cc:241] "CudaDriverHelper has not been initialized."',
    'W1128 17:56:12.550694 11950 metrics.cc:798] "DCGM unable to start: DCGM initialization error"',
)


def test_no_gpu_warnings_are_said_once_in_our_words(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(process, "_no_gpu_said", [])
    with caplog.at_level(logging.DEBUG, logger="trtllm_service.triton"):
        levels = [process.triton_log_level(line) for line in NO_GPU * 2]
    assert levels == [logging.DEBUG] * 6
    assert [r.getMessage() for r in caplog.records] == [process.NO_GPU_NOTE]
    assert caplog.records[0].levelno == logging.INFO


def test_other_warnings_and_errors_stay_warnings() -> None:
    model = 'W1128 17:56:12.090398 11950 model.py:147] "tensorrt_llm: tensorrt_llm cannot be imported"'
    failed = "E1128 17:56:12.1 11950 model_lifecycle.cc:654] \"failed to load 'tensorrt_llm'\""
    assert process.triton_log_level(model) == process.triton_log_level(failed) == logging.WARNING
    assert process.triton_log_level('I1128 17:56:07.692771 11950 model_lifecycle.cc:472] "loading"') == (
        logging.DEBUG
    )
