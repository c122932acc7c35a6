#!/usr/bin/env bash
# The GPU box suite: the service through Triton on the box's Python 3.12.3 (NVIDIA's image's) and GPU,
# both flavours, with real clients: `pytest -m box` (the tests marked box: every route streamed and
# not, tools, guided JSON, log probs, LoRA, NGram drafts, a beam-packed model, the doctor, a stub
# killed mid-stream, a wedged model, the huge-grammar freeze, a clean stop; SmolLM2 in real language)
# and the GPU figures of bench/README.md (relay.py and SmolLM2's speed, llmapi beside ensemble).
#
# Here, once: bash bench/box/prepare.sh (fills .whl/box/{a,b,c,d}). Then four calls to one warm machine
# (it stays warm 30 s after a call: send the next at once), each carrying its folder:
#   carry .whl/box/a:  bash bench/box/suite.sh setup     the environment (bench/box/env.sh)
#   carry .whl/box/b:  bash bench/box/suite.sh relay     bench/relay.py, synthetic engine, llmapi and ensemble
#   carry .whl/box/c:  bash bench/box/suite.sh tiny      pytest -m box on the tiny model, both flavours
#   carry .whl/box/d:  bash bench/box/suite.sh smollm2   SmolLM2: real language, the doctor, its speed
# The tiny step runs about 10 minutes, a call's limit: `tiny 1` and `tiny 2` run its halves in two
# calls (each on a machine that has had setup and .whl/box/b).
# Logs and results go to $OUT (the device tool brings them back).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/box/env.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --porcelain 2>/dev/null | head -1)"
TINY=(tests/e2e/test_image_python.py tests/e2e/test_generate.py tests/e2e/test_openai_chat.py
      tests/e2e/test_responses_endpoint.py tests/e2e/test_anthropic_messages.py tests/e2e/test_tool_calls.py
      tests/e2e/test_structured_output.py tests/e2e/test_logprobs.py tests/e2e/test_lora.py
      tests/e2e/test_beam_packed.py tests/e2e/test_faults.py tests/integration/test_speculative.py
      tests/integration/test_doctor.py)
run_pytest() {
  python3 -m pytest -p no:cacheprovider -q -rfE --timeout 540 "$@" 2>&1 | tee -a "$OUT/box-suite.log" | tail -25
}
case "${1:-}" in
  setup) python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" ;;
  relay)
    for flavor in llmapi ensemble; do
      timeout 280 python3 bench/relay.py --label "box-$flavor" --flavor "$flavor" --scenario synthetic \
        --concurrency 1,32,128 --targets engine,generate,chat --workers 2 --out "$OUT" 2>&1 | tail -12
    done ;;
  tiny)
    case "${2:-all}" in
      1) TINY=("${TINY[@]:0:6}") ;;
      2) TINY=("${TINY[@]:6}") ;;
    esac
    run_pytest -m box -k "not smollm2" "${TINY[@]}" ;;
  smollm2)
    run_pytest -m box tests/e2e/test_real_language.py "tests/integration/test_doctor.py::test_the_doctor_passes_on_the_demo"
    timeout 300 python3 bench/demo_speed.py --label box --mode service --flavors llmapi,ensemble --slots 32 \
      --out "$OUT" 2>&1 | tail -12 ;;
  *) echo "usage: bash bench/box/suite.sh setup|relay|tiny [1|2]|smollm2" >&2; exit 2 ;;
esac
