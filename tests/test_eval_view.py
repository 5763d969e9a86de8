"""keras_preact.layers.EvalView: the evaluation view as a Keras layer, TensorFlow's numbers on every backend.

``tests/data/eval_view_tf.json`` holds ``keras_preact.preprocessing.eval_view``'s output (TensorFlow) for each
case of ``CASES``, every float32 as its shortest decimal that reads back to the same float32 (text: exact, and
reviewable in a diff); ``test_the_stored_views_are_tensorflows`` recomputes them on TensorFlow and asserts them
bit for bit, the notf tests compare the layer on JAX and PyTorch with them. After a change of the TensorFlow
path, ``python tests/test_eval_view.py`` (with TensorFlow) writes the file again.

Tolerance ``ATOL`` (0-255 pixel units) off TensorFlow: the layer's
JAX weights (``resize_weights``) and PyTorch's antialiased resize use TensorFlow's kernels (the triangle and Keys
cubic kernels of ``scale_and_translate``, stretched when downscaling, normalized at the borders), computed and
summed in another order; the float32 rounding stays under 0.006 (measured on uniform noise, 300 x 400 to the
centre 224 of 256, bilinear and bicubic: JAX 0.0055, PyTorch 0.0002; on the stored cases under 0.0001), far
from the 0.5 that moves a pixel's rounded value. Exact on TensorFlow.
"""

import json
import os
import pathlib

import keras
import numpy as np
import pytest

from keras_preact.layers import EvalView
from keras_preact.preprocessing import InputConfig, decode_image_array
from support import encode_image, photo_like, to_numpy

GOLDEN = pathlib.Path(__file__).parent / "data" / "eval_view_tf.json"
ATOL = 0.01
# name -> (image (height, width, seed), InputConfig): down- and upscaling, each interpolation, a non-square crop,
# each crop_mode.
CASES = {
    "landscape-32-0.875-bilinear": ((45, 60, 0), InputConfig(input_size=(32, 32, 3))),
    "small-40-1.0-bilinear": ((30, 36, 2), InputConfig(input_size=(40, 40, 3), crop_fraction=1.0)),
    "portrait-28-0.9-bicubic": ((70, 33, 1), InputConfig(input_size=(28, 28, 3), crop_fraction=0.9,
                                                          interpolation="bicubic")),
    "portrait-24x32-0.875-nearest": ((70, 33, 1), InputConfig(input_size=(24, 32, 3), interpolation="nearest")),
    # Keras' arithmetic (keras-hub's ImageConverter: the centred square, resized without antialiasing).
    "keras-landscape-32-0.875-bilinear-aliased": ((45, 61, 3), InputConfig(input_size=(32, 32, 3), crop_mode="keras",
                                                                           antialias=False)),
    "keras-portrait-24x32-1.0-bilinear": ((70, 33, 1), InputConfig(input_size=(24, 32, 3), crop_fraction=1.0,
                                                                   crop_mode="keras")),
}
IMAGENET_224 = InputConfig()


def _png(name):
    height, width, seed = CASES[name][0]
    return encode_image(photo_like(height, width, seed), "PNG")  # lossless: Pillow and TensorFlow decode alike


def _tolerance():
    return 0.0 if keras.backend.backend() == "tensorflow" else ATOL


def tensorflow_views():
    """``eval_view`` of every case, on TensorFlow: what ``GOLDEN`` stores."""
    import tensorflow as tf

    from keras_preact.preprocessing import eval_view

    return {name: eval_view(tf.constant(_png(name)), config).numpy() for name, (_, config) in CASES.items()}


def read_views(path=GOLDEN):
    """The stored views: name -> float32 array of its shape (each image row one list of its pixels' values)."""
    cases = json.loads(pathlib.Path(path).read_text())
    return {name: np.asarray(case["rows"], np.float32).reshape(case["shape"]) for name, case in cases.items()}


def write_views(views, path=GOLDEN):
    """``views`` as ``read_views`` reads them, each value the shortest decimal of its float32; written to a
    temporary name, then renamed."""
    cases = []
    for name, view in views.items():
        rows = ",\n".join("   [" + ", ".join(np.format_float_positional(v, unique=True, trim="-") for v in row) + "]"
                          for row in np.asarray(view, np.float32).reshape(view.shape[0], -1))
        cases.append(f'  "{name}": {{\n   "shape": {json.dumps(list(view.shape))},\n   "rows": [\n{rows}\n   ]\n  }}')
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("{\n" + ",\n".join(cases) + "\n}\n")
    os.replace(tmp, path)


def test_the_stored_views_are_tensorflows():
    pytest.importorskip("tensorflow", reason="the stored views are TensorFlow's eval_view")
    stored = read_views()
    assert sorted(stored) == sorted(CASES)
    for name, view in tensorflow_views().items():
        assert stored[name].dtype == view.dtype == np.float32, name
        np.testing.assert_array_equal(stored[name], view, err_msg=name)


@pytest.mark.notf
@pytest.mark.any_backend
def test_stored_views_read_back_bit_for_bit(tmp_path, rng):
    """The text keeps every float32 exactly: values of all magnitudes written and read back are equal."""
    values = {"a": rng.uniform(0, 255, (3, 4, 3)).astype(np.float32),
              "b": np.array([[[0.0, 1e-7, 254.99998], [np.float32(1) / 3, 255.0, 12.5]]], np.float32)}
    write_views(values, tmp_path / "views.json")
    read = read_views(tmp_path / "views.json")
    assert list(read) == ["a", "b"]
    for name, value in values.items():
        assert read[name].shape == value.shape and read[name].dtype == np.float32
        np.testing.assert_array_equal(read[name], value)


@pytest.mark.core
@pytest.mark.notf
@pytest.mark.parametrize("name", sorted(CASES))
def test_eval_view_layer_gives_tensorflows_view_on_every_backend(name):
    """The layer on Pillow-decoded pixels equals TensorFlow's eval_view (stored), then its normalize."""
    stored = read_views()[name]
    config = CASES[name][1]
    image = decode_image_array(_png(name))
    view = to_numpy(EvalView(config, normalize=False)(image))
    assert view.shape == (*config.crop_size, 3) and view.dtype == np.float32
    np.testing.assert_allclose(view, stored, rtol=0, atol=_tolerance())
    normalized = to_numpy(EvalView(config)(image[None]))  # a batch of one, normalized
    expected = (stored - np.float32(config.mean)) / np.float32(config.std)
    np.testing.assert_allclose(normalized[0], expected, rtol=1e-6, atol=_tolerance() / min(config.std) + 1e-6)


@pytest.mark.parametrize("width, height", [(500, 375), (375, 500), (100, 60), (224, 224), (640, 210)])
def test_eval_view_layer_equals_eval_view_on_tensorflow(width, height):
    """On TensorFlow bit for bit: ImageNet's 224 of 256 and the 320 test, on JPEGs of several shapes."""
    tf = pytest.importorskip("tensorflow", reason="compares with TensorFlow's eval_view")
    from keras_preact.preprocessing import decode_image, eval_view

    encoded = tf.constant(encode_image(photo_like(height, width, seed=width), quality=90))
    for config in (IMAGENET_224, IMAGENET_224.at_test_size(320)):
        view = to_numpy(EvalView(config, normalize=False)(decode_image(encoded).numpy()))
        np.testing.assert_allclose(view, eval_view(encoded, config).numpy(), rtol=0, atol=_tolerance())


def test_eval_view_layer_in_a_tf_data_map_of_unknown_sizes():
    """On the TensorFlow backend the layer runs in tf.data on images whose size the graph does not know."""
    tf = pytest.importorskip("tensorflow", reason="tf.data")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("keras.ops are TensorFlow ops in a tf.data graph on the TensorFlow backend only")
    from keras_preact.preprocessing import decode_image, eval_view

    encoded = [encode_image(photo_like(h, w, seed=h), "PNG") for h, w in ((45, 60), (70, 33), (32, 32))]
    for case in ("landscape-32-0.875-bilinear", "keras-landscape-32-0.875-bilinear-aliased"):
        view = EvalView(CASES[case][1])
        mapped = tf.data.Dataset.from_tensor_slices(encoded).map(lambda e, view=view: view(decode_image(e)))
        for got, data in zip(mapped, encoded):
            expected = (eval_view(tf.constant(data), view.input_config).numpy() - np.float32(IMAGENET_224.mean)) \
                / np.float32(IMAGENET_224.std)
            np.testing.assert_array_equal(got.numpy(), expected, err_msg=case)


@pytest.mark.core
@pytest.mark.notf
def test_eval_view_layer_is_saved_with_a_model(tmp_path):
    """Registered serializable: a model with the view in front reloads from its .keras file, the view's
    InputConfig with it, and gives the same outputs."""
    config = CASES["landscape-32-0.875-bilinear"][1]
    inputs = keras.Input((45, 60, 3))
    outputs = keras.layers.Dense(2, name="head")(keras.layers.GlobalAveragePooling2D()(EvalView(config)(inputs)))
    model = keras.Model(inputs, outputs)
    path = tmp_path / "viewed.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    view = next(layer for layer in loaded.layers if isinstance(layer, EvalView))
    assert view.input_config == config and view.normalize is True
    assert keras.saving.get_registered_name(EvalView) == "keras_preact>EvalView"
    image = decode_image_array(_png("landscape-32-0.875-bilinear"))[None]
    np.testing.assert_allclose(to_numpy(loaded(image)), to_numpy(model(image)), rtol=1e-6, atol=1e-6)
    assert loaded.layers[1].compute_output_shape((None, 45, 60, 3)) == (None, 32, 32, 3)


@pytest.mark.core
@pytest.mark.notf
def test_eval_view_layer_for_a_model_uses_its_input_config():
    """``EvalView.for_model``: the model's input_config (a stand-in: building a network costs a minute on JAX
    here, and the classifier's input_config is tested with it)."""
    import types

    config = InputConfig(input_size=(16, 16, 3), mean=(125.3, 123.0, 113.9), std=(63.0, 62.1, 66.7), crop_fraction=1.0)
    view = EvalView.for_model(types.SimpleNamespace(input_config=config, name="m"))
    assert view.input_config == config
    pixels = photo_like(16, 16)
    expected = (pixels - np.float32(config.mean)) / np.float32(config.std)
    np.testing.assert_allclose(to_numpy(view(pixels)), expected, rtol=1e-6, atol=1e-5)  # at the crop size: the image
    with pytest.raises(ValueError, match="Invalid model='m': it carries no input_config"):
        EvalView.for_model(types.SimpleNamespace(input_config=None, name="m"))


@pytest.mark.notf
@pytest.mark.any_backend
def test_eval_view_layer_refuses_bad_arguments_in_one_line():
    for kwargs, message in [
        (
            dict(input_config=(224, 0.875)),
            "Invalid input_config=(224, 0.875): a keras_preact.preprocessing.InputConfig",
        ),
        (dict(input_config={"crop": 1}), "unknown key(s) 'crop'"),
        (
            dict(input_config=InputConfig(interpolation="area")),
            "interpolation='area' is not one keras.ops.image.resize",
        ),
        (dict(input_config=InputConfig(), normalize="yes"), "Invalid normalize='yes'"),
    ]:
        with pytest.raises(ValueError) as error:
            EvalView(**kwargs)
        assert message in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"Invalid images of shape \(4, 4\)"):
        EvalView(InputConfig())(np.zeros((4, 4), "uint8"))


@pytest.mark.notf
@pytest.mark.any_backend
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "BMP"])
def test_decode_image_array_gives_pillows_rgb_pixels(fmt, tmp_path):
    import io

    from PIL import Image

    data = encode_image(photo_like(20, 30), fmt)
    with Image.open(io.BytesIO(data)) as image:
        expected = np.asarray(image.convert("RGB"))
    np.testing.assert_array_equal(decode_image_array(data), expected)
    (tmp_path / "image").write_bytes(data)
    np.testing.assert_array_equal(decode_image_array(tmp_path / "image"), expected)  # a path too
    with pytest.raises(ValueError, match="Invalid encoded image: not a readable JPEG/PNG/GIF/BMP image"):
        decode_image_array(b"not an image")
    with pytest.raises(ValueError, match="not a readable"):
        decode_image_array(encode_image(photo_like(4, 4), "TIFF"))  # a format the TensorFlow path does not read


if __name__ == "__main__":  # with TensorFlow: write the stored views again
    write_views(tensorflow_views())
    print(f"wrote {GOLDEN}")
