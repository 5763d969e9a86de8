"""Shared fixtures. The backend is chosen by KERAS_BACKEND before keras is imported."""

import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow's oneDNN kernels as the apps' launchers set them (on unless the user says): a test comparing a console
# command's run with one in this process compares the same kernels on every CPU (TensorFlow turns them on by
# default only with AVX-512).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from support import decline_usage_telemetry  # noqa: E402

decline_usage_telemetry()


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    # Keras' state (layer names, graphs, caches) fresh for each test; Python's own garbage collector frees the
    # last test's objects when it runs. A full gc.collect() per test (clear_session's default) cost ~0.3 s of a
    # worker in each of ~2,200 tests, about 10% of CI (233 TensorFlow tests, quiet 2-core AMD EPYC: 169 -> 152 s).
    keras.utils.clear_session(free_memory=False)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


REPO_OUTPUTS = pathlib.Path(__file__).resolve().parents[1] / "saved_models"  # the user's exports: never the tests'


def _entries(root):
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.is_dir() else set()


@pytest.fixture(autouse=True)
def _writes_nothing_into_the_repos_saved_models():
    """Tests write into temporary directories only: a test that leaves anything new in the checkout's
    ``saved_models/`` (where ``keras-preact-serve saved_models/<name>`` would serve it) fails."""
    before = _entries(REPO_OUTPUTS)
    yield
    new = sorted(_entries(REPO_OUTPUTS) - before)
    if new:
        pytest.fail(f"the test wrote into {REPO_OUTPUTS}: {', '.join(new[:5])}; write into tmp_path (e.g. "
                    "--export-dir, --run-dir or cwd=tmp_path)", pytrace=False)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def pytest_collection_modifyitems(config, items):
    """A test marked ``once`` runs in CI's TensorFlow-free JAX pass only, so it must be marked ``notf`` too."""
    for item in items:
        if item.get_closest_marker("once") and not item.get_closest_marker("notf"):
            raise pytest.UsageError(f"{item.nodeid} is marked once but not notf: CI would never run it")
