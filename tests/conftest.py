"""Shared fixtures. The backend is chosen by KERAS_BACKEND before keras is imported."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from support import decline_usage_telemetry  # noqa: E402

decline_usage_telemetry()


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    keras.utils.clear_session()
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def pytest_collection_modifyitems(config, items):
    """A test marked ``once`` runs in CI's TensorFlow-free JAX pass only, so it must be marked ``notf`` too."""
    for item in items:
        if item.get_closest_marker("once") and not item.get_closest_marker("notf"):
            raise pytest.UsageError(f"{item.nodeid} is marked once but not notf: CI would never run it")
