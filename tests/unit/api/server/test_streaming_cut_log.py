"""uvicorn's log of a stream cut on purpose: one warning line, other app errors keep their traceback."""

from __future__ import annotations

import logging

import pytest

from trtllm_service.api.server.streaming import CutStreamLogFilter, quiet_cut_streams
from trtllm_service.errors import APIError


def _logged(error: BaseException, caplog: pytest.LogCaptureFixture) -> logging.LogRecord:
    log = logging.getLogger("uvicorn.error")
    quiet_cut_streams()
    quiet_cut_streams()
    assert sum(isinstance(f, CutStreamLogFilter) for f in log.filters) == 1
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        try:
            raise error
        except BaseException as exc:  # what uvicorn's run_asgi does with an app's exception
            log.error("Exception in ASGI application\n", exc_info=exc)
    [record] = caplog.records
    return record


def test_a_cut_stream_is_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    record = _logged(APIError(503, "The inference server is unavailable: connection lost"), caplog)
    assert record.levelno == logging.WARNING
    assert record.exc_info is None
    assert caplog.text.strip().endswith(
        "a streamed answer was cut short (503): The inference server is unavailable: connection lost"
    )
    assert "Traceback" not in caplog.text


def test_any_other_error_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    record = _logged(KeyError("oops"), caplog)
    assert record.levelno == logging.ERROR
    assert "Exception in ASGI application" in caplog.text and "Traceback" in caplog.text
