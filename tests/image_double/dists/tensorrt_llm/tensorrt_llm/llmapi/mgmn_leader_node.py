"""The double's leader node: holds the spawn-proxy address open while the command runs (NVIDIA's
runs a RemoteMpiCommSessionServer there); `--action stop` ends it."""

import socket
import sys

from tensorrt_llm.llmapi.proxy import address


def serve() -> None:
    with socket.create_server(address()) as server:
        while True:
            conn, _ = server.accept()
            with conn:
                if conn.recv(16).startswith(b"stop"):
                    return
                conn.sendall(b"worker\n")


def stop() -> None:
    try:
        with socket.create_connection(address(), timeout=5) as conn:
            conn.sendall(b"stop")
    except OSError:
        pass  # gone already


if __name__ == "__main__":
    stop() if sys.argv[1:] == ["--action", "stop"] else serve()
