#!/usr/bin/env bash
# Source me: podman configured for this machine (REFERENCE.md section 11): runc, storage under
# $DOUBLE_ROOT (default /var/tmp/trtllm-image-double), ulimits without CAP_SYS_RESOURCE.
DOUBLE_ROOT="${DOUBLE_ROOT:-/var/tmp/trtllm-image-double}"
mkdir -p "$DOUBLE_ROOT/storage" "$DOUBLE_ROOT/run" "$DOUBLE_ROOT/tmp"
cat >"$DOUBLE_ROOT/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$DOUBLE_ROOT/storage"
runroot = "$DOUBLE_ROOT/run"
CONF
cat >"$DOUBLE_ROOT/containers.conf" <<CONF
[engine]
runtime = "runc"
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
CONF
export CONTAINERS_STORAGE_CONF="$DOUBLE_ROOT/storage.conf" CONTAINERS_CONF="$DOUBLE_ROOT/containers.conf"
export TMPDIR="$DOUBLE_ROOT/tmp"
