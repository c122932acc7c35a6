"""The Triton side of the product: model repository templates, tools and the launcher.

The modules here that a model imports by bare name (triton_adapter, shared_contract, engine_metrics,
nvidia_backend, ...) are production code, copied beside the models' model.py by repository.py; the
stand-in engines (standin/) are copied only where a stand-in serves, and production never imports them.
"""

from pathlib import Path

ALL_MODELS_DIR = Path(__file__).resolve().parent / "all_models"
TEMPLATES_DIR = ALL_MODELS_DIR / "inflight_batcher_llm"
LLMAPI_TEMPLATES_DIR = ALL_MODELS_DIR / "llmapi"
STANDIN_DIR = Path(__file__).resolve().parent / "standin"
"""The stand-ins for NVIDIA's engine (reference, synthetic, the stand-in LLM API): what serves where
TensorRT-LLM does not (repository.build_repository says where they are copied; the layering test,
tests/unit/repo/test_standin_layering.py, that no production model imports them)."""
LAUNCHER = Path(__file__).resolve().parent / "scripts" / "launch_triton_server.py"
"""The launcher's entry point, run by path (by users, the service, mpirun's ranks); its logic is launcher.py."""
