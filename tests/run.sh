#!/usr/bin/env bash
# Set up and run every test, in both supported environments (README "Two commands"; CI runs this):
#   1. without TensorFlow (Keras on JAX or PyTorch only, like the borrowed GPU machine): a fresh
#      virtual environment with keras, jax[cpu], torch, numpy, pillow, matplotlib and pytest, the
#      project installed with --no-deps, and the `notf` tests on JAX and on PyTorch;
#   2. with TensorFlow (the default install): every test on TensorFlow, the core tests on JAX.
# torch==2.13.0 is this machine's CPU build; an unpinned torch pulls several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
NOTF_VENV=${KERAS_PREACT_NOTF_VENV:-.venv-notf}

echo "== without TensorFlow ($NOTF_VENV)"
"$PYTHON" -m venv "$NOTF_VENV"
"$NOTF_VENV/bin/python" -m pip install "keras>=3.10,<4" "jax[cpu]>=0.4.30" "torch==2.13.0" numpy pillow \
    matplotlib pytest
"$NOTF_VENV/bin/python" -m pip install --no-deps -e .
export KERAS_PREACT_REQUIRE_NO_TF=1
KERAS_BACKEND=jax "$NOTF_VENV/bin/python" -m pytest -p no:cacheprovider -m "notf and not slow"
KERAS_BACKEND=torch "$NOTF_VENV/bin/python" -m pytest -p no:cacheprovider -m "notf and not slow"

unset KERAS_PREACT_REQUIRE_NO_TF
echo "== with TensorFlow"
"$PYTHON" -m pip install -e ".[dev]"
KERAS_BACKEND=tensorflow "$PYTHON" -m pytest -m "not slow"
KERAS_BACKEND=jax "$PYTHON" -m pytest -m "core and not slow"
