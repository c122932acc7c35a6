"""The image double's LLM: the two load-time rules of NVIDIA's 1.2.1 LLM that no other stand-in models,
then our stand-in LLM API over the synthetic engine.

1. Creating the PyTorch executor imports `tensorrt_llm.serve` (py_executor.py imports
   tensorrt_llm.serve.responses_utils, which imports openai's PartReasoningText): an openai without it
   fails the model's load with ImportError.
2. The executor's worker is another process: with TLLM_SPAWN_PROXY_PROCESS=1 (trtllm-llmapi-launch)
   the LLM connects to the leader node at TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR; without it NVIDIA's LLM
   spawns the worker with mpi4py's MPIPoolExecutor (MPI_Comm_spawn from a singleton), which a
   container without an MPI job cannot do. The double fails there with a message of its own (NVIDIA's
   exact text for that failure is not known here).
"""

import os
import socket
from typing import Any

from tensorrt_llm.llmapi import proxy

NO_LAUNCHER = (
    "MpiPoolSession cannot spawn the LLM's worker: this process was not started by "
    "trtllm-llmapi-launch ({} is unset), so MPIPoolExecutor would MPI_Comm_spawn from a singleton, "
    "which this container cannot do"
)


def _connect_worker() -> None:
    if os.environ.get(proxy.SPAWN) != "1":
        raise RuntimeError(NO_LAUNCHER.format(proxy.SPAWN))
    host, port = proxy.address()
    try:
        with socket.create_connection((host, port), timeout=10) as conn:
            conn.sendall(b"hello")
            if not conn.recv(16).startswith(b"worker"):
                raise RuntimeError("the spawn proxy did not answer as a worker")
    except OSError as exc:
        raise RuntimeError(f"cannot reach the spawn proxy at {host}:{port}: {exc}") from exc


class LLM:
    """tensorrt_llm.LLM(**kwargs) of the double; every other attribute is the stand-in LLM's."""

    def __init__(self, **kwargs: Any) -> None:
        import tensorrt_llm.serve  # noqa: F401  (rule 1)

        _connect_worker()  # rule 2
        from llm_standin import StandIn
        from sources import make_source
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(kwargs.get("tokenizer") or kwargs["model"]))
        standin = StandIn("synthetic", tokenizer, make_source)
        self._llm = standin.LLM(**kwargs)
        self._describe = standin.describe

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)
