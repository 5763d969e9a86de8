#!/usr/bin/env bash
# One command for a GPU machine (benchmarks/gpu/README.md):
#   bash benchmarks/gpu/run.sh {throughput|paper-run|all} [session.py flags]
# 1. installs what the bare machine image lacks (keras, namex, optree) from the carried wheels in .whl/, unless
#    `import keras` already works (GPU_INSTALL=always forces it, never skips it);
# 2. puts this checkout's packages on PYTHONPATH under their import names (keras_preact, keras_preact_training);
# 3. unpacks the carried CIFAR-10 JPEG tarball (GPU_DATA_TAR, default .gpu-carry/cifar10-jpeg.tar.gz; or
#    GPU_DATA_DIR, an image folder already unpacked) into the work folder;
# 4. names the Keras backend before anything loads Keras, this check of the install included (KERAS_BACKEND,
#    default jax; each run names its own);
# 5. runs benchmarks/gpu/session.py, which writes every figure and run file under $OUT.
# On a CPU, with tiny settings (a rehearsal): OUT=/tmp/out bash benchmarks/gpu/run.sh all --tiny
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
: "${OUT:?set OUT, the folder that keeps the results (copy it off afterwards)}"
WORK=${GPU_WORK:-/tmp/keras-preact-gpu}
WHEELS=${GPU_WHEELS:-.whl}
mkdir -p "$OUT" "$WORK"
# The backend, before anything loads Keras (Keras 3 reads it once, at import; unset it would be TensorFlow).
export KERAS_BACKEND=${KERAS_BACKEND:-jax} PYTHONUNBUFFERED=1
say() { echo "[run.sh $(date -u +%H:%M:%S)] $*"; }

install=${GPU_INSTALL:-auto}
if [ "$install" = always ] || { [ "$install" = auto ] && ! "$PYTHON" -c "import keras" 2>/dev/null; }; then
  ls "$WHEELS"/*.whl >/dev/null 2>&1 || { say "no wheels in $WHEELS: run benchmarks/gpu/prepare.sh here first and carry $WHEELS"; exit 2; }
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" "$WHEELS"/*.whl
  export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
  say "installed $(ls "$WHEELS" | tr '\n' ' ')into $WORK/site"
else
  say "keras importable: no wheels installed (GPU_INSTALL=$install)"
fi

mkdir -p "$WORK/path"
ln -sfn "$PWD/keras_preact" "$WORK/path/keras_preact"
ln -sfn "$PWD/training" "$WORK/path/keras_preact_training"
export PYTHONPATH="$WORK/path${PYTHONPATH:+:$PYTHONPATH}"

if [ -n "${GPU_DATA_DIR:-}" ]; then
  data=$GPU_DATA_DIR
else
  tarball=${GPU_DATA_TAR:-.gpu-carry/cifar10-jpeg.tar.gz}
  data=$WORK/data
  if [ ! -d "$data/train" ]; then
    [ -f "$tarball" ] || { say "no data: $tarball is missing (benchmarks/gpu/prepare.sh copies it; carry .gpu-carry)"; exit 2; }
    rm -rf "$WORK/data.tmp" && mkdir -p "$WORK/data.tmp" && tar xzf "$tarball" -C "$WORK/data.tmp"
    root=$(dirname "$(find "$WORK/data.tmp" -maxdepth 3 -type d -name train | head -1)")
    [ -d "$root/test" ] || { say "$tarball holds no train/ and test/ folders"; exit 2; }
    rm -rf "$data" && mv "$root" "$data" && rm -rf "$WORK/data.tmp"
  fi
fi

"$PYTHON" -c "import keras, keras_preact, keras_preact_training; print('[run.sh] keras', keras.__version__, 'on', keras.backend.backend())"
exec "$PYTHON" benchmarks/gpu/session.py "$@" --data-dir "$data" --out "$OUT" --work-dir "$WORK"
