#!/usr/bin/env bash
# bench/relay_path.py of several trees on the GPU box, alternated (three rounds, both routes): each
# .box/tree-<rev>.tar.xz (git archive --format=tar <rev> trtllm_service tensorrtllm_backend
# bench/relay_path.py | xz) and this checkout. No Triton: carry .whl/bento, .whl/grpc, the
# tritonclient and python-rapidjson wheels and .box (see bench/box_before_after.sh).
set -uo pipefail
SP=/tmp/sp; mkdir -p $SP
python3 -m pip install -q --no-index --no-deps --no-compile --target $SP .whl/tritonclient-*.whl .whl/python_rapidjson-*.whl .whl/grpc/*.whl .whl/bento/*.whl 2>&1 | tail -2
export PYTHONPATH=$SP TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
for t in .box/tree-*.tar.xz; do n=$(basename $t .tar.xz); mkdir -p /tmp/$n; tar -xJf $t -C /tmp/$n; done
for round in 1 2 3; do
  for route in chat generate; do
    for d in /tmp/tree-* "$PWD"; do
      echo "[r$round $route] $(basename $d) $(cd $d && timeout 100 python3 bench/relay_path.py --route $route --repeat 5 2>&1 | tail -1)"
    done
  done
done
