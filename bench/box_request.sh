#!/usr/bin/env bash
# What a request costs apart from its tokens, on the 16-core GPU box (device tool), before and after
# a change, in one call: time to first token step by step, and per-request CPU and TTFT.
#
# Here, once: bash bench/box/prepare.sh, and the "before" commit's service in .box/head.tar.xz
#             (as bench/box_before_after.sh says).
# Device:     after a call carrying .whl/box/a that runs `bash bench/box/suite.sh setup`, on the same
#             warm machine: bash bench/box_request.sh "$OUT"   (carry .whl/box/b and .box)
#
# Runs, each against a Triton fed by the synthetic engine, alternating before and after, ROUNDS
# times (default 1: the box's speed drifts within a call, so several rounds show the spread):
#   ttft-before, ttft-after   bench/ttft_breakdown.py (one worker, one stream, 1 and 256 tokens)
#   before-1tok, after-1tok   bench/relay.py, one token per request, c=1 and 8, 2 workers
# then once (LONG=0 skips them):
#   before-c1, after-c1       bench/relay.py, 256 tokens, c=1 and 32, 2 workers
set -uo pipefail
OUT=${1:?usage: bench/box_request.sh OUTDIR}
ROUNDS=${ROUNDS:-1}
LONG=${LONG:-1}
source bench/box/env.sh
export PATH="$SP/bin:$PATH" PYTHONUNBUFFERED=1
R="$OUT/r"
mkdir -p "$R" .before
tar -xJf .box/head.tar.xz -C .before
T=(--scenario synthetic --max-tokens 1 --min-requests 1500 --concurrency 1,8 --out "$R" --stall-timeout 60 --workers 2)
for round in $(seq 1 "$ROUNDS"); do
  n=$([ "$ROUNDS" = 1 ] && echo "" || echo "-r$round")
  for side in before after; do
    root=$([ $side = before ] && echo .before || echo .)
    timeout 120 python3 bench/ttft_breakdown.py --label box-$side$n --service-root $root --out "$R"
  done
  timeout 80 python3 bench/relay.py --label box-before-1tok$n --service-root .before --targets generate,chat "${T[@]}"
  timeout 80 python3 bench/relay.py --label box-after-1tok$n --targets engine,generate,chat "${T[@]}"
done
[ "$LONG" = 0 ] && { rm -f "$R"/*.png; tar -czf "$OUT/relay.tgz" -C "$R" .; exit 0; }
C=(--scenario synthetic --requests-per-stream 4 --concurrency 1,32 --out "$R" --stall-timeout 60 --workers 2)
timeout 100 python3 bench/relay.py --label box-before-c1 --service-root .before --targets generate,chat "${C[@]}"
timeout 100 python3 bench/relay.py --label box-after-c1 --targets engine,generate,chat,floor-relay "${C[@]}"
rm -f "$R"/*.png
tar -czf "$OUT/relay.tgz" -C "$R" .
