#!/bin/sh
# Run by the Bento's image build (bentofile.yaml: docker.setup_script) once the requirements are
# installed into the image's own Python (UV_SYSTEM_PYTHON). BentoML's entrypoint activates
# /app/.venv, which BentoML made from the Python `bentoml build` ran on: make it a view of the
# image's Python instead, so that `python` and `bentoml` in the container see TensorRT-LLM, torch
# and the service's requirements, and drop any Python that uv fetched for it.
set -eu
image_python=$(PATH=$(printf '%s' "$PATH" | sed 's#/app/\.venv/bin:##') command -v python3)
rm -rf /app/.venv /app/python
"$image_python" -m venv --system-site-packages --without-pip /app/.venv
chown -R bentoml:bentoml /app/.venv
/app/.venv/bin/python -c "import bentoml, tritonclient, transformers"
