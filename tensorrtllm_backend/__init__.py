"""The Triton side of the product: model repository templates, tools and the launcher."""

from pathlib import Path

ALL_MODELS_DIR = Path(__file__).resolve().parent / "all_models"
TEMPLATES_DIR = ALL_MODELS_DIR / "inflight_batcher_llm"
LLMAPI_TEMPLATES_DIR = ALL_MODELS_DIR / "llmapi"
STANDIN_DIR = Path(__file__).resolve().parent / "standin"
LAUNCHER = Path(__file__).resolve().parent / "scripts" / "launch_triton_server.py"
"""The launcher's entry point, run by path (by users, the service, mpirun's ranks); its logic is launcher.py."""
