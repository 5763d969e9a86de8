#!/usr/bin/env bash
# Run once where pip reaches PyPI, for a GPU machine that does not (benchmarks/gpu/README.md): what run.sh needs
# there, in two git-ignored folders to copy beside the checkout on it (about 22 MiB).
#   bash benchmarks/gpu/prepare.sh PATH/TO/cifar10-jpeg.tar.gz
# .whl/: the wheels the machine image lacks (Keras and the two of its requirements not in the image, namex and
# optree), for its Python 3.12 on x86-64, at the versions this environment runs (KERAS_VERSION etc. to override).
# .gpu-carry/: the CIFAR-10 JPEG tarball.
set -euo pipefail
cd "$(dirname "$0")/../.."
tarball=${1:?usage: bash benchmarks/gpu/prepare.sh PATH/TO/cifar10-jpeg.tar.gz}
PYTHON=${PYTHON:-python3}
version() { "$PYTHON" -c "import importlib.metadata as m; print(m.version('$1'))"; }
KERAS_VERSION=${KERAS_VERSION:-$(version keras)}
NAMEX_VERSION=${NAMEX_VERSION:-$(version namex)}
OPTREE_VERSION=${OPTREE_VERSION:-$(version optree)}
rm -rf .whl && mkdir -p .whl .gpu-carry
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  "keras==$KERAS_VERSION" "namex==$NAMEX_VERSION" "optree==$OPTREE_VERSION"
cp "$tarball" .gpu-carry/cifar10-jpeg.tar.gz.tmp && mv .gpu-carry/cifar10-jpeg.tar.gz.tmp .gpu-carry/cifar10-jpeg.tar.gz
{ git check-ignore -q .whl && git check-ignore -q .gpu-carry; } || { echo "prepare.sh: .whl/ or .gpu-carry/ is not git-ignored"; exit 2; }
du -sh .whl .gpu-carry
ls .whl
