"""Saved files keep loading: the saved-weights layout is pinned (``weights_layout.py``).

For each model of ``weights_layout.models()``: the weights' paths, shapes and order, their keys in a
``.weights.h5`` file, the outputs for the same weights and (TensorFlow) the initial weights under a seed
are those recorded in ``tests/data/weights_layout.json`` (the layout of the shipped weights). A ``.keras``
file in that layout, with one unit of every design, loads (whole, and by ``load_weights``) and gives its
outputs.
"""

import json
import os
import zipfile

import keras
import numpy as np
import pytest
import weights_layout as wl

pytestmark = pytest.mark.core

LAYOUT = json.loads(wl.LAYOUT_FILE.read_text())
SMALL = [name for name in LAYOUT["models"] if name.startswith("unit_")]
LARGE = [name for name in LAYOUT["models"] if name not in SMALL]


def assert_outputs(summary, expected):
    assert len(summary) == len(expected)
    for got, want in zip(summary, expected):
        np.testing.assert_allclose(got["values"], want["values"], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose([got["sum"], got["abs_sum"]], [want["sum"], want["abs_sum"]], rtol=1e-4, atol=1e-5)


def check_model(name):
    record = LAYOUT["models"][name]
    build = wl.models()[name]
    if keras.backend.backend() == LAYOUT["backend"]:
        np.testing.assert_allclose(wl.init_summary(build), record["init"], rtol=1e-5, atol=1e-5)
    keras.utils.clear_session(free_memory=False)
    model = build()
    assert wl.weight_paths(model) == record["weights"]
    keys, others = wl.file_keys(model)
    assert keys == record["file_keys"]
    assert others == record["other_datasets"]
    wl.deterministic_weights(model)
    assert_outputs(wl.outputs_summary(model), record["outputs"])


@pytest.mark.notf
@pytest.mark.parametrize("name", SMALL)
def test_unit_weights_layout_is_unchanged(name):
    check_model(name)


@pytest.mark.parametrize("name", LARGE)
def test_model_weights_layout_is_unchanged(name):
    check_model(name)


@pytest.mark.notf
def test_a_keras_file_written_before_loads_with_the_same_outputs():
    model = keras.saving.load_model(wl.UNITS_FILE)
    assert_outputs(wl.outputs_summary(model), LAYOUT["units_file_outputs"])


@pytest.mark.notf
def test_weights_saved_before_load_with_the_same_outputs(tmp_path):
    path = os.path.join(tmp_path, "units.weights.h5")
    with zipfile.ZipFile(wl.UNITS_FILE) as archive, open(path, "wb") as f:
        f.write(archive.read("model.weights.h5"))
    model = wl.units_model()
    model.load_weights(path)
    assert_outputs(wl.outputs_summary(model), LAYOUT["units_file_outputs"])
