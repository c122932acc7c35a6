#!/usr/bin/env bash
# bench/relay_path.py of several trees on the GPU box, alternated (three rounds, both routes): each
# .box/tree-<rev>.tar.xz and this checkout. No Triton.
# Here, once:  bash bench/box/prepare.sh; for each revision to compare:
#              mkdir -p .box && git archive --format=tar <rev> trtllm_service tensorrtllm_backend \
#                bench/relay_path.py | xz > .box/tree-<rev>.tar.xz
# Device:      after a call carrying .whl/box/a that runs `bash bench/box/suite.sh setup`, on the same
#              warm machine: bash bench/box_path_trees.sh   (carry .whl/box/b and .box)
set -uo pipefail
source bench/box/env.sh
for t in .box/tree-*.tar.xz; do n=$(basename $t .tar.xz); mkdir -p /tmp/$n; tar -xJf $t -C /tmp/$n; done
for round in 1 2 3; do
  for route in chat generate; do
    for d in /tmp/tree-* "$PWD"; do
      echo "[r$round $route] $(basename $d) $(cd $d && timeout 100 python3 bench/relay_path.py --route $route --repeat 5 2>&1 | tail -1)"
    done
  done
done
