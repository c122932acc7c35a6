#!/usr/bin/env bash
# bench/relay.py before and after a change on the 16-core GPU box, alternated in one call, so that
# both sides see the same machine: after, before, before, after, ... (ROUNDS pairs).
#
# Here, once:  as bench/box_relay.sh says (.whl/ with tritonserver, numpy 1.26 and bentoml; .box/
#              with box_env.sh and the before tree as head.tar.xz), and grpcio, protobuf and psutil
#              wheels for cp312 in .whl/grpc. In .box/box_env.sh (a copy of ../shared/gpu/box_env.sh)
#              add .whl/python_rapidjson-*.whl to the numpy/tritonclient install (the box's Python
#              lacks python-rapidjson, which tritonclient.grpc imports) and install .whl/grpc/*.whl
#              the same way as .whl/bento/*.whl:
#              pip download --no-deps --only-binary=:all: --python-version 3.12 \
#                --platform manylinux2014_x86_64 -d .whl/grpc grpcio==1.85.3 protobuf==6.33.6 psutil==7.2.2
#              What travels must stay under 64 MiB: carry .whl/pytriton-trim.tar.xz and the numpy
#              wheel in a first call that copies them to /tmp/stash, the rest in a second call to
#              the same warm machine (it is given back after 30 s idle), which copies them back.
# Device:      ROUNDS=3 bash bench/box_before_after.sh "$OUT" --workers 1 --concurrency 1,32
#              (the arguments after OUT go to every bench/relay.py run)
set -uo pipefail
OUT=${1:?usage: bench/box_before_after.sh OUTDIR [relay.py arguments]}
shift
ROUNDS=${ROUNDS:-2}
RUN_LIMIT=${RUN_LIMIT:-85}
source .box/box_env.sh
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
