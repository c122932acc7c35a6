"""triton_adapter.watch_server: a stub whose server dies ends at once, while the dead server is not
yet reaped (a reaped server is what makes Triton's stub free the model and crash, issue 42)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from tests.support import REPO_ROOT

STUB = """
import sys, time, types
fake = types.ModuleType("triton_python_backend_utils")  # the stub's module, absent outside Triton
fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
sys.modules["triton_python_backend_utils"] = fake
sys.path.insert(0, "tensorrtllm_backend")
from triton_adapter import watch_server
watch_server()
print("watching", flush=True)
time.sleep(60)
"""

SERVER = """
import subprocess, sys
stub = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
assert stub.stdout.readline().strip() == "watching"
print(stub.pid, flush=True)
"""  # then it exits, and nobody reaps it until the test has looked at its stub


def test_a_stub_ends_when_its_server_exits_before_the_server_is_reaped() -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, STUB], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        stub = psutil.Process(int(server.stdout.readline()))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.01)
        assert psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE  # exited, not reaped
        try:
            stub.wait(timeout=5)
        except psutil.TimeoutExpired:
            stub.kill()
            raise AssertionError("the stub outlived its server by 5 s") from None
    finally:
        server.wait(timeout=30)
