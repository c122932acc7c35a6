#!/usr/bin/env bash
# bench/relay.py before and after a change on the 16-core GPU box, alternated in one call, so that
# both sides see the same machine: after, before, before, after, ... (ROUNDS pairs).
#
# Here, once:  bash bench/box/prepare.sh            (.whl/box/{a,b,c,d}: what the box lacks)
#              mkdir -p .box && git archive --format=tar <before-commit> service.py trtllm_service \
#                tensorrtllm_backend pack_model.py bentofile.yaml requirements.txt | xz > .box/head.tar.xz
# Device:      two calls to one warm machine (bench/box/env.sh builds the environment over both):
#                carry .whl/box/a:           bash bench/box/suite.sh setup
#                carry .whl/box/b and .box:  ROUNDS=3 bash bench/box_before_after.sh "$OUT" --workers 1 --concurrency 1,32
#              (the arguments after OUT go to every bench/relay.py run). Should the box lack grpcio,
#              protobuf or psutil, put their cp312 wheels in a carried .whl/box/ folder: env.sh
#              installs every wheel of the folders it finds.
set -uo pipefail
OUT=${1:?usage: bench/box_before_after.sh OUTDIR [relay.py arguments]}
shift
ROUNDS=${ROUNDS:-2}
RUN_LIMIT=${RUN_LIMIT:-85}
source bench/box/env.sh
export PYTHONUNBUFFERED=1
R="$OUT/r"
mkdir -p "$R" .before
tar -xJf .box/head.tar.xz -C .before
C=(--scenario synthetic --requests-per-stream 4 --targets engine,generate,chat --out "$R" --stall-timeout 60 "$@")
run() {  # run SIDE LABEL
  local root=. ; [ "$1" = before ] && root=.before
  echo "== $2 ($(date +%T), load $(cut -d' ' -f1 /proc/loadavg))"
  timeout "$RUN_LIMIT" python3 bench/relay.py --label "$2" --service-root "$root" "${C[@]}" 2>&1 | tail -n 12
}
for i in $(seq 1 "$ROUNDS"); do
  if [ $((i % 2)) = 1 ]; then order="after before"; else order="before after"; fi
  for side in $order; do run "$side" "box-$side-r$i"; done
done
rm -f "$R"/*.png
