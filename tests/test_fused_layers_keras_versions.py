"""The fused layers (``keras_preact.layers.BatchNormalization``, ``Conv2D``) against the Keras releases allowed.

``keras_preact.layers.fused.CHECKED_KERAS`` holds the oldest and newest Keras ``major.minor`` their equality
tests (tests/test_batch_normalization.py, tests/test_convolution.py) ran on. The oldest is pyproject's lower
bound and those tests run on it here (PyTorch, the backend with fused kernels), with those of the units' direct
kernel calls (tests/test_unit_kernels.py: bit for bit the layers' numbers); the newest covers the Keras CI
installs (the newest pip resolves). On any other release the layers take Keras' own path.
"""

import os
import pathlib
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_preact.layers import BatchNormalization, Conv2D, fused
from keras_preact.layers import batch_normalization as bn_lib
from keras_preact.layers import convolution as conv_lib
from support import to_numpy

REPO = pathlib.Path(__file__).resolve().parents[1]


def allowed_keras():
    """pyproject's ``keras>=LOW,<HIGH`` requirement, as (LOW, HIGH)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    [requirement] = [d for d in dependencies if re.match(r"keras\b", d)]
    found = re.fullmatch(r"keras\s*>=\s*([\d.]+)\s*,\s*<\s*([\d.]+)", requirement)
    assert found, f"pyproject's {requirement!r}: expected keras>=LOW,<HIGH"
    return found[1], found[2]


@pytest.mark.notf
@pytest.mark.any_backend
@pytest.mark.once
def test_the_oldest_checked_keras_is_the_lowest_allowed():
    low, high = allowed_keras()
    assert fused.CHECKED_KERAS[0] == ".".join(low.split(".")[:2]), (low, fused.CHECKED_KERAS)
    assert int(high.split(".")[0]) == int(fused.CHECKED_KERAS[1].split(".")[0]) + 1  # within one major release


@pytest.mark.notf
@pytest.mark.any_backend
@pytest.mark.once
@pytest.mark.parametrize("version, checked", [("3.9.2", False), ("3.10.0", True), ("3.15.1", True),
                                              ("3.16.0.dev2026", False), ("4.0.0", False), ("nightly", False)])
def test_which_versions_are_checked(version, checked):
    assert fused.is_checked(version) is checked


@pytest.mark.core
@pytest.mark.notf
@pytest.mark.parametrize("version", ["3.9.2", "3.16.0"])
def test_on_an_unchecked_keras_the_layers_are_keras_own(version, monkeypatch, rng):
    calls = []
    backend = keras.backend.backend()
    for table in (conv_lib.FAST_CONV, bn_lib.FUSED_TRAINING, bn_lib.FUSED_INFERENCE):
        if backend in table:
            kernel = table[backend]
            monkeypatch.setitem(table, backend, lambda *a, _k=kernel: calls.append(1) or _k(*a))
    monkeypatch.setattr(keras, "version", lambda: version)
    x = rng.normal(size=(4, 6, 6, 3)).astype("float32")
    for ours, theirs in ((Conv2D(4, 3, padding="same"), keras.layers.Conv2D(4, 3, padding="same")),
                         (BatchNormalization(), keras.layers.BatchNormalization())):
        for layer in (ours, theirs):
            layer.build(x.shape)
        theirs.set_weights(ours.get_weights())
        for training in (True, False):
            np.testing.assert_array_equal(to_numpy(ours(x, training=training)),
                                          to_numpy(theirs(x, training=training)))
    assert calls == []


@pytest.mark.notf
@pytest.mark.any_backend  # it runs the equality tests on PyTorch in a process of its own
@pytest.mark.once
def test_the_fused_layers_equal_keras_on_the_lowest_allowed_keras(tmp_path):
    """The equality tests, the units' and backbones' direct kernel calls' included, on PyTorch with pyproject's
    lowest Keras (``pip install --no-deps --target``: that Keras first on PYTHONPATH, everything else from this
    environment)."""
    pytest.importorskip("torch")
    low = allowed_keras()[0]
    lowest = low if low.count(".") == 2 else f"{low}.0"
    target = tmp_path / "keras"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                          f"keras=={lowest}"], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, f"could not install keras=={lowest}: {pip.stderr[-2000:]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(KERAS_BACKEND="torch", PYTHONPATH=os.pathsep.join([str(target), str(REPO)]), OMP_NUM_THREADS="1")
    version = subprocess.run([sys.executable, "-c", "import keras; from keras_preact.layers import fused; "
                              "print(keras.version(), fused.enabled())"], env=env, cwd=REPO,
                             capture_output=True, text=True, timeout=300)
    assert version.stdout.strip() == f"{lowest} True", version.stderr[-2000:]  # the fused paths on, and tested below
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "0", "-m", "core",
                          "tests/test_batch_normalization.py", "tests/test_convolution.py",
                          "tests/test_unit_kernels.py"],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:]
    assert re.search(r"\b\d+ passed\b", run.stdout) and " failed" not in run.stdout, run.stdout[-2000:]
