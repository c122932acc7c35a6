#!/usr/bin/env bash
# The relay benchmark on the 16-core GPU box (device tool), before and after a change, in one call.
#
# Here, once:  bash ../shared/gpu/prepare.sh --bento   (fills .whl/: tritonserver, numpy 1.26, bentoml)
#              pip download --no-deps -d .whl/bento py-spy==0.4.3 hpack==4.1.0
#              mkdir .box; cp ../shared/gpu/box_env.sh .box/   (.whl/ and .box/ ignored by git)
#              git archive --format=tar <before-commit> service.py trtllm_service tensorrtllm_backend \
#                pack_model.py bentofile.yaml requirements.txt | xz > .box/before.tar.xz
# Device:      bash bench/box_relay.sh "$OUT" [relay.py args...]   (carry .whl and .box)
#
# Serves the service of .box/before.tar.xz with 2 workers, then this checkout's with 2 (profiled at
# chat c=32) and 4, each against the same Triton-fed synthetic engine; the load generator is this
# checkout's in every run. Everything lands in "$OUT/relay.tgz" (the device returns 8 files at most).
set -uo pipefail
OUT=${1:?usage: bench/box_relay.sh OUTDIR [relay.py args]}
shift
source .box/box_env.sh
export PATH="$SP/bin:$PATH" PYTHONUNBUFFERED=1
python3 -c "import hpack, psutil, uvloop, httptools" 2>&1 | tail -1
RESULTS=/tmp/relay-results
mkdir -p "$RESULTS" .before
tar -xJf .box/before.tar.xz -C .before
COMMON=(--scenario synthetic --concurrency 1,32,128 --targets engine,generate,chat,completions
  --requests-per-stream 4 --out "$RESULTS" "$@")
python3 bench/relay.py --label box-before-w2 --service-root .before --workers 2 "${COMMON[@]}"
python3 bench/relay.py --label box-after-w2 --workers 2 --profile chat:32 "${COMMON[@]}"
python3 bench/relay.py --label box-after-w4 --workers 4 "${COMMON[@]}"
tar -czf "$OUT/relay.tgz" -C "$RESULTS" .
