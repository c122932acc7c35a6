#!/usr/bin/env bash
# The relay benchmark on the 16-core GPU box (device tool), before and after a change, in one call.
#
# Here, once:  bash ../shared/gpu/prepare.sh --bento   (fills .whl/: tritonserver, numpy 1.26, bentoml)
#              then in .whl/bento replace bentoml, starlette and fastapi by the versions
#              requirements.txt pins, and add httptools and annotated-doc (the box lacks them):
#              pip download --no-deps -d .whl/bento bentoml==1.4.40 starlette==0.50.0 fastapi==0.121.3 \
#                httptools==0.9.0 annotated-doc==0.0.4 hpack==4.1.0   (cp312, manylinux; no py-spy: it
#                cannot attach in the box's VM, and what travels must stay under 64 MiB)
#              mkdir .box; cp ../shared/gpu/box_env.sh .box/   (.whl/ and .box/ ignored by git)
#              git archive --format=tar <before-commit> service.py trtllm_service tensorrtllm_backend \
#                pack_model.py bentofile.yaml requirements.txt | xz > .box/head.tar.xz
# Device:      bash bench/box_relay.sh "$OUT"   (carry .whl and .box)
#
# With the packages the box has instead (bentoml 1.4.39, starlette 1.10, fastapi 0.165, no
# httptools), streams stalled after the first requests: keep the pinned ones.
#
# Runs, each against a Triton fed by the synthetic engine, the load generator this checkout's:
#   path        bench/relay_path.py (the per-token Python path in one process), before and after
#   before-w2   the service of .box/head.tar.xz, 2 workers
#   after-w2    this checkout's, 2 workers, with the engine read directly (`engine`) and the bare
#               relay floor (`floor-relay`); one worker profiled at chat c=32 (builtin sampler:
#               py-spy cannot attach to processes in the box's VM)
#   before-1tok, after-1tok  one token per request: what a request costs apart from its tokens
#   after-w2-i4, after-w4-i4  4 synthetic engine instances (Triton model instances), so that the
#               engine outruns the service: 2 and 4 workers, and a load generator above 50k tokens/s
set -uo pipefail
OUT=${1:?usage: bench/box_relay.sh OUTDIR}
source .box/box_env.sh
export PATH="$SP/bin:$PATH" PYTHONUNBUFFERED=1
R="$OUT/r"
mkdir -p "$R" .before/bench
tar -xJf .box/head.tar.xz -C .before
cp bench/relay_path.py .before/bench/
for route in chat generate; do
  for side in .before .; do
    echo "[path] $side $(timeout 60 python3 $side/bench/relay_path.py --route $route --repeat 5)"
  done
done | tee "$R/relay-box-path.txt"
C=(--scenario synthetic --requests-per-stream 4 --out "$R" --stall-timeout 60)
timeout 110 python3 bench/relay.py --label box-before-w2 --service-root .before --workers 2 \
  --concurrency 1,32,128 --targets generate,chat "${C[@]}"
timeout 150 python3 bench/relay.py --label box-after-w2 --workers 2 --concurrency 1,32,128 \
  --targets engine,generate,chat,floor-relay --profile chat:32 --profiler builtin "${C[@]}"
T=(--scenario synthetic --max-tokens 1 --min-requests 1500 --concurrency 1,8 --out "$R" --stall-timeout 60)
timeout 80 python3 bench/relay.py --label box-before-1tok --service-root .before --workers 2 \
  --targets generate,chat "${T[@]}"
timeout 80 python3 bench/relay.py --label box-after-1tok --workers 2 --targets engine,generate,chat "${T[@]}"
timeout 90 python3 bench/relay.py --label box-after-w2-i4 --workers 2 --engine-instances 4 \
  --concurrency 32,128 --targets engine,generate,chat "${C[@]}"
timeout 90 python3 bench/relay.py --label box-after-w4-i4 --workers 4 --engine-instances 4 \
  --concurrency 32,128 --targets engine,generate,chat "${C[@]}"
rm -f "$R"/*.png
tar -czf "$OUT/relay.tgz" -C "$R" .
