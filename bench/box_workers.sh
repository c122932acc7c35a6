#!/usr/bin/env bash
# Do more workers carry more? The relay benchmark with the synthetic engine spread over enough
# Triton model instances that the engine outruns the workers, at 1, 2 and 4 workers, on a box with
# the cores for it (on the 16-core box Triton's side of 4 engines takes 8-10 cores, leaving the
# workers none to scale into: run this on a box of 32 cores or more).
# Here, once:  bash bench/box/prepare.sh
# Device:      after a call carrying .whl/box/a that runs `bash bench/box/suite.sh setup`, on the same
#              warm machine: bash bench/box_workers.sh "$OUT"   (carry .whl/box/b)
#              -> relay-<cores>core-workers-w<N>-i<instances>.{json,md} in $OUT/r and relay.tgz
# Environment: INSTANCES (8), WORKERS ("1 2 4"), CONCURRENCY (128,256), LOADGEN (8 processes)
set -uo pipefail
OUT=${1:?usage: bench/box_workers.sh OUTDIR}
source bench/box/env.sh
export PATH="$SP/bin:$PATH" PYTHONUNBUFFERED=1
R="$OUT/r"
mkdir -p "$R"
echo "cores: $(nproc)"
C=(--scenario synthetic --requests-per-stream 4 --out "$R" --stall-timeout 90
   --engine-instances "${INSTANCES:-8}" --loadgen-procs "${LOADGEN:-8}" --concurrency "${CONCURRENCY:-128,256}")
first=1
for w in ${WORKERS:-1 2 4}; do
  targets=generate,chat
  [ "$first" = 1 ] && targets=engine,generate,chat  # the engine read directly, once
  first=0
  timeout 150 python3 bench/relay.py --label "$(nproc)core-workers-w$w-i${INSTANCES:-8}" --workers "$w" \
    --targets "$targets" "${C[@]}"
done
rm -f "$R"/*.png
tar -czf "$OUT/relay.tgz" -C "$R" .
