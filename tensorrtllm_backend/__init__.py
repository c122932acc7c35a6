"""The Triton side of the product: model repository templates, tools and the launcher."""

from pathlib import Path

TEMPLATES_DIR = Path(__file__).resolve().parent / "all_models" / "inflight_batcher_llm"
LAUNCHER = Path(__file__).resolve().parent / "scripts" / "launch_triton_server.py"
