"""The serving contract is one object: both writers, the SavedModel's (TensorFlow ops) and the Keras
wrapper that ONNX, LiteRT and OpenVINO are exported from (keras.ops), serve what it says.

Each test runs with the default contract and with one changed in everything it defines (output order,
top-k, normalisation): what the writers produce follows the object handed to them.
"""

import importlib.util

import keras
import numpy as np
import pytest

from keras_preact.export import FORMATS, OUTPUT_NAMES, ServingContract, serving_model
from keras_preact.preprocessing import InputConfig
from support import CLASS_NAMES, MEAN, STD, make_export_model

DEFAULT = ServingContract(InputConfig(input_size=(32, 32, 3), mean=MEAN, std=STD), top_k=5)
CHANGED = ServingContract(
    InputConfig(input_size=(32, 32, 3), mean=np.random.default_rng(5).uniform(60, 190, (32, 32, 3)).round(2),
                std=[50.0, 70.0, 90.0]),
    top_k=2, output_names=tuple(reversed(OUTPUT_NAMES)))
CONTRACTS = [pytest.param(DEFAULT, id="default"), pytest.param(CHANGED, id="changed")]
BOTH_WRITERS = importlib.util.find_spec("tensorflow") is not None and keras.backend.backend() == "tensorflow"


def images():
    return np.random.default_rng(11).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)


def expected(model, serving, pixels):
    """What ``serving`` says the outputs are, computed here in numpy."""
    config = serving.input_config
    normalized = (pixels.astype(np.float32) - np.asarray(config.mean, np.float32)) / np.asarray(config.std, np.float32)
    probabilities = np.asarray(model.predict(normalized, verbose=0), np.float32)
    classes = np.argsort(-probabilities, axis=1, kind="stable")[:, :serving.top_k].astype(np.int32)
    return {
        "probabilities": probabilities,
        "scores": np.take_along_axis(probabilities, classes, axis=1),
        "classes": classes,
    }


def assert_outputs_equal(got, want):
    np.testing.assert_allclose(got["probabilities"], want["probabilities"], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(got["classes"], want["classes"])
    np.testing.assert_allclose(got["scores"], want["scores"], rtol=0, atol=1e-5)


@pytest.mark.notf
@pytest.mark.parametrize("serving", CONTRACTS)
def test_the_keras_wrapper_serves_the_contract(serving):
    """keras.ops side, on every backend: names, dtypes and values as the contract says, and the order of
    the tuple outputs (ONNX's and OpenVINO's) the contract's."""
    model, pixels = make_export_model(), images()
    out = serving_model(model, serving).predict(pixels, verbose=0)  # a dict: Keras returns it by sorted key
    assert {k: str(v.dtype) for k, v in out.items()} == {
        "probabilities": "float32",
        "scores": "float32",
        "classes": "int32",
    }
    assert_outputs_equal(out, expected(model, serving, pixels))
    as_tuple = serving_model(model, serving, structure="tuple").predict(pixels, verbose=0)
    assert len(as_tuple) == len(serving.output_names)
    for name, value in zip(serving.output_names, as_tuple):
        np.testing.assert_array_equal(np.asarray(value), out[name])


@pytest.mark.skipif(not BOTH_WRITERS, reason="the SavedModel and ONNX writers side by side run on TensorFlow")
@pytest.mark.parametrize("serving", CONTRACTS)
def test_saved_model_and_onnx_writers_serve_one_contract(serving, tmp_path):
    """The SavedModel (tf ops) and ONNX (the keras.ops wrapper) written from one contract object: the same
    output names, ONNX's in the contract's order, the same values for the same input."""
    import onnxruntime
    import tensorflow as tf

    model, pixels = make_export_model(), images()
    version, scratch = tmp_path / "1", tmp_path / "scratch"
    scratch.mkdir()
    for fmt in ("saved_model", "onnx"):
        FORMATS[fmt].write(str(version), model, serving, CLASS_NAMES, str(scratch), FORMATS[fmt])

    signature = tf.saved_model.load(str(version)).signatures["serving_default"]
    saved = {k: v.numpy() for k, v in signature(**{serving.input_name: tf.constant(pixels)}).items()}
    session = onnxruntime.InferenceSession(str(version / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [serving.input_name]
    assert [o.name for o in session.get_outputs()] == list(serving.output_names)
    onnx = dict(zip(serving.output_names, session.run(None, {serving.input_name: pixels})))

    assert sorted(saved) == sorted(serving.served_names)
    assert_outputs_equal(onnx, saved)
    assert_outputs_equal(saved, expected(model, serving, pixels))
    assert saved[serving.class_names_output].tolist() == [
        [CLASS_NAMES[c].encode() for c in row] for row in saved["classes"]
    ]


@pytest.mark.notf
def test_the_contract_refuses_unknown_outputs():
    with pytest.raises(ValueError, match=r"Invalid output_names=\('probabilities', 'classes'\): expected an order of"):
        ServingContract(DEFAULT.input_config, 5, output_names=("probabilities", "classes"))
