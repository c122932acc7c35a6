"""Triton's Python backend utilities, as far as our models use them (for mypy; see pyproject.toml).

The module exists only inside tritonserver's Python stub process. Its classes are pybind11 classes
of `c_python_backend_utils` that the stub sets on this module at start-up (python_backend's
src/pb_stub.cc); the signatures below are theirs. Classes with a leading underscore are not
attributes of this module: only their instances reach a model.
"""

from collections.abc import Iterator
from typing import Any, ClassVar, Literal, overload

import numpy as np

TRITONSERVER_RESPONSE_COMPLETE_FINAL: int

class _ErrorCode:
    """The pybind11 enum TritonError.__ErrorCode (TRITONSERVER_Error_Code)."""

class TritonError:
    INTERNAL: ClassVar[_ErrorCode]
    INVALID_ARG: ClassVar[_ErrorCode]
    CANCELLED: ClassVar[_ErrorCode]
    def __init__(self, message: str, code: _ErrorCode = ...) -> None: ...
    def code(self) -> _ErrorCode: ...
    def message(self) -> str: ...

class TritonModelException(Exception): ...

class Tensor:
    def __init__(self, name: str, numpy_array: np.ndarray, /) -> None: ...
    def name(self) -> str: ...
    def as_numpy(self) -> np.ndarray: ...

class InferenceResponse:
    def __init__(
        self,
        output_tensors: list[Tensor] = ...,
        error: TritonError | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None: ...
    def output_tensors(self) -> list[Tensor]: ...
    def has_error(self) -> bool: ...
    def error(self) -> TritonError | None: ...

class _InferenceResponseSender:
    """c_python_backend_utils.InferenceResponseSender: InferenceRequest.get_response_sender()."""

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None: ...
    def is_cancelled(self) -> bool: ...

class _ResponseIterator(Iterator[InferenceResponse]):
    """c_python_backend_utils.ResponseIterator: the responses of a decoupled BLS call."""

    def __next__(self) -> InferenceResponse: ...
    def cancel(self) -> None: ...

class InferenceRequest:
    # pybind11 gives `inputs`, `requested_output_names` and `model_name` no defaults after two that
    # have them; they are keywords here, as every call passes them.
    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        *,
        inputs: list[Tensor],
        requested_output_names: list[str],
        model_name: str,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        parameters: dict[str, Any] | None = None,
    ) -> None: ...
    def inputs(self) -> list[Tensor]: ...
    def request_id(self) -> str: ...
    def requested_output_names(self) -> set[str]: ...
    def get_response_sender(self) -> _InferenceResponseSender: ...
    def is_cancelled(self) -> bool: ...
    @overload
    def exec(self, decoupled: Literal[False] = False) -> InferenceResponse: ...
    @overload
    def exec(self, decoupled: Literal[True]) -> _ResponseIterator: ...

class Logger:
    @staticmethod
    def log_info(message: str) -> None: ...
    @staticmethod
    def log_warn(message: str) -> None: ...
    @staticmethod
    def log_error(message: str) -> None: ...

class Metric:
    def increment(self, value: float, /) -> None: ...
    def set(self, value: float, /) -> None: ...

_Metric = Metric  # MetricFamily's method `Metric` hides the class inside MetricFamily

class _MetricKind:
    """The pybind11 enum c_python_backend_utils.MetricKind."""

class MetricFamily:
    COUNTER: ClassVar[_MetricKind]
    GAUGE: ClassVar[_MetricKind]
    def __init__(self, name: str, description: str, kind: _MetricKind) -> None: ...
    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> _Metric: ...

def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None: ...
def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool: ...
