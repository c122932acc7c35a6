#!/bin/sh
# Run by the Bento's image build (bento_dockerfile.j2) before the service's files are copied in.
# Installs the service's requirements into the image's own Python, the one TensorRT-LLM lives in:
# NVIDIA's 2026 trtllm images keep it in the virtual environment /opt/venv-tritonserver (first on
# PATH), older ones in the system Python. Never into a new environment beside it: a venv made from
# a venv's interpreter sees the base interpreter's packages, not TensorRT-LLM's; and never with
# uv's --system, which skips every virtual environment on PATH and installs into the base Python.
# TensorRT-LLM's own pins, read from the installed distribution, constrain the install; the build
# fails loudly unless that Python then imports tensorrt_llm, tensorrt_llm.serve, torch, tritonclient
# and bentoml with every pin as it was. /app/.venv (which BentoML's entrypoint activates) is made
# that Python.
set -eu
say() { echo "bento_setup: $*"; }
image_python=${TRTLLM_IMAGE_PYTHON:-}
if [ -z "$image_python" ]; then
  if [ -x /opt/venv-tritonserver/bin/python ]; then
    image_python=/opt/venv-tritonserver/bin/python
  else
    image_python=$(command -v python3)
  fi
fi
prefix=$("$image_python" -c 'import sys; print(sys.prefix)')
say "the image's Python: $image_python ($("$image_python" -c 'import platform; print(platform.python_version())'), $prefix)"
constraints=$(mktemp)
if ! "$image_python" ./src/trtllm_service/image_env.py constraints >"$constraints"; then
  say "error: $image_python cannot see tensorrt_llm; is the base image NVIDIA's trtllm image?" >&2
  exit 1
fi
before=$(mktemp)
"$image_python" ./src/trtllm_service/image_env.py versions >"$before"
uv pip install --python "$image_python" -r ./env/python/requirements.txt -c "$constraints"
"$image_python" ./src/trtllm_service/image_env.py check "$before"
rm -f "$constraints" "$before"
rm -rf /app/.venv /app/python
mkdir -p /app
if "$image_python" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
  ln -s "$prefix" /app/.venv # a virtual environment: BentoML's entrypoint activates it as it is
else
  "$image_python" -m venv --system-site-packages --without-pip /app/.venv
  chown -R bentoml:bentoml /app/.venv
fi
