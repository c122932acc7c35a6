"""The double's spawn-proxy address, as trtllm-llmapi-launch exports it and NVIDIA's executor reads it
(tensorrt_llm/executor/utils.py: TLLM_SPAWN_PROXY_PROCESS, ..._IPC_ADDR, ..._IPC_HMAC_KEY)."""

import os

SPAWN = "TLLM_SPAWN_PROXY_PROCESS"
ADDR = "TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR"
HMAC = "TLLM_SPAWN_PROXY_PROCESS_IPC_HMAC_KEY"


def address() -> tuple[str, int]:
    """(host, port) of the leader node; NVIDIA's asserts when the launcher did not set it."""
    addr = os.environ.get(ADDR)
    assert addr, f"{ADDR} is not set."
    assert os.environ.get(HMAC), f"{HMAC} is not set. HMAC encryption is required for IPC communication."
    host, port = addr.removeprefix("tcp://").rsplit(":", 1)
    return host, int(port)
