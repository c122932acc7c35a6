"""The production stack this project is built against: one image, and what it carries.

Triton's release compatibility matrix (triton-inference-server/server docs/introduction/compatibility.md
at v2.71.0, trtllm-python-py3 rows) lists 26.07 as the newest image with a TensorRT-LLM row:
Triton 2.71.0, TensorRT-LLM 1.2.1, Python 3.12.3, torch 2.10.0a0+b4e4ee81d3.nv25.12, TensorRT
10.14.1.48, CUDA 13.1.0.036, driver 590.44.01. (26.08 has no trtllm row; 26.11's release notes say
the TensorRT-LLM container is not part of that release.) bentofile.yaml's base image is IMAGE; a
test holds the two together.

26.07 serves both flavours: llmapi (the LLM API, PyTorch backend, from a Hugging Face checkpoint) and
the legacy ensemble (a prebuilt TensorRT engine). The next line, TensorRT-LLM main (1.3), serves
llmapi only (LAST_ENSEMBLE_IMAGE) and adds inputs to NVIDIA's llmapi model (`image_url`, per-request
LoRA by path): nvidia_llmapi.py's docstring lists them.
"""

from __future__ import annotations

IMAGE = "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
IMAGE_PYTHON = "3.12"
"""The image's Python (3.12.3): bentofile.yaml's docker.python_version, from which BentoML's build makes
the venv it installs into before trtllm_service/image_env.py moves the service into the image's own."""
TRITON_VERSION = "2.71.0"
TENSORRT_LLM_VERSION = "1.2.1"
TENSORRT_LLM_COMMIT = "376f7e1bd8ed543f75014309e3fd4b237e9b0e73"  # NVIDIA/TensorRT-LLM tag v1.2.1
MIN_TENSORRT_LLM = "1.1.0"
"""The oldest TensorRT-LLM the service starts with (trtllm_service.runtime.check_tensorrt_llm refuses
older ones in one line). 1.1.0 (images 25.12-26.02) and 1.2.x have the same C++ backend contract
(nvidia_backend.py); 1.0.x (25.09-25.11) was never checked against, and 0.19 (25.05) names tensors
differently (min_length, random_seed) and knows neither lora_config nor llguidance."""

LAST_ENSEMBLE_IMAGE = "26.07"
"""The newest image that serves the ensemble flavour as far as we can confirm (the C++ `tensorrtllm`
backend, prebuilt TensorRT engines). NVIDIA removed that backend (`inflight_batcher_llm`, trtllm-build's
engine workflow) from TensorRT-LLM's main in July 2026: an image built on the 1.3 line serves only the
llmapi flavour, NVIDIA's `llmapi` model running the LLM API's PyTorch backend from a Hugging Face
checkpoint."""

ENSEMBLE_LEGACY_WARNING = (
    "the ensemble flavour (a prebuilt TensorRT engine on NVIDIA's C++ tensorrtllm backend) is legacy: "
    "NVIDIA removed that backend from TensorRT-LLM's main in July 2026, and only images up to "
    f"{LAST_ENSEMBLE_IMAGE} serve it; the path forward is --flavor llmapi with a Hugging Face checkpoint "
    "(pack_model.py --hf-model DIR)"
)
"""The one line pack_model.py prints when it packs an ensemble-flavour model, and the doctor reports
for one (a warning: the model still serves on the pinned image)."""

CONSTRAINTS_FILE = "constraints/tensorrt_llm-1.2.1.txt"
"""TensorRT-LLM's own pins at the tag (relative to the repository root): what the service installs
into the image must resolve with them."""


def version_tuple(version: str) -> tuple[int, ...]:
    """(1, 2, 1) of "1.2.1", "1.2.1.post1" or "1.0.3.2510"; pre-releases ("1.2.0rc8") count as their base."""
    parts = []
    for piece in version.split(".")[:3]:
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def supported(version: str) -> bool:
    """Whether the service starts with this TensorRT-LLM version."""
    found = version_tuple(version)
    return bool(found) and found >= version_tuple(MIN_TENSORRT_LLM)
