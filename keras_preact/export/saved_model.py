"""The SavedModel format: TF Serving layout, preprocessing and class names inside.

``write_saved_model`` is the ``saved_model`` entry of ``keras_preact.export.formats.FORMATS``
(``export_saved_model``/``export_model`` call it), written with ``keras.export.ExportArchive`` from the
TensorFlow or the JAX backend. Every signature serves the serving contract
(``keras_preact.export.contract``) in TensorFlow ops and adds the contract's ``class_names`` output
``[N, k]`` string, the names of the top-k classes from the asset ``assets/class_names.txt`` (one name
per line, line number = label): ``OUTPUTS``.

The signatures differ only in what they take (the ``SIGNATURES`` table): raw uint8 pixels
(``serving_default``), float pixels in 0-255 units, or encoded JPEG/PNG/GIF/BMP bytes that go
through the evaluation view of ``keras_preact.preprocessing`` in the graph (``eval_view``: decode,
resize to ``ceil(crop / crop_fraction)`` and centre crop in the arithmetic of the config's ``crop_mode``:
torchvision's for timm's checkpoints, Keras' for keras.applications and keras-hub), the same function evaluation
uses, so a served image is seen as the model's accuracy was measured. The input config used
(``keras_preact.preprocessing.InputConfig.to_dict()``) is written to ``assets/preprocessing.json``.
"""

import dataclasses
import os
import shutil
import types

import keras
import tensorflow as tf

from keras_preact.export.contract import CLASS_NAMES_OUTPUT, INPUT_NAME, OUTPUT_NAMES
from keras_preact.export.version_dir import (
    CLASS_NAMES_ASSET,
    PREPROCESSING_ASSET,
    write_class_names,
    write_input_config,
)
from keras_preact.preprocessing import IMAGE_FORMATS, eval_view

OUTPUTS = (*OUTPUT_NAMES, CLASS_NAMES_OUTPUT)  # what every signature returns
TF_OPS = types.SimpleNamespace(cast=tf.cast, top_k=tf.math.top_k)  # ServingContract.serve's ops, in TensorFlow


def _cast_pixels(images, input_config):
    return tf.cast(images, tf.float32)


def _view_pixels(image_bytes, input_config):
    """Each encoded image's evaluation view (``keras_preact.preprocessing.eval_view``)."""
    return eval_view(image_bytes, input_config)


@dataclasses.dataclass(frozen=True)
class Signature:
    """One serving signature: its input tensor and how that becomes float pixels ``[N, H, W, 3]``."""

    input_name: str
    dtype: tf.DType
    encoded: bool  # True: a vector of encoded images; False: a batch of H x W x 3 pixel arrays.
    to_pixels: callable
    description: str

    def input_spec(self, image_size):
        shape = (None,) if self.encoded else (None, *image_size, 3)
        return tf.TensorSpec(shape, self.dtype, name=self.input_name)


SIGNATURES = {
    "serving_default": Signature(
        INPUT_NAME, tf.uint8, False, _cast_pixels, "uint8 RGB pixels [N, H, W, 3] at the model resolution"
    ),
    "serving_float": Signature(
        INPUT_NAME, tf.float32, False, _cast_pixels, "float RGB pixels in 0-255 units [N, H, W, 3]"
    ),
    "serving_bytes": Signature(
        "image_bytes",
        tf.string,
        True,
        _view_pixels,
        f"encoded {'/'.join(IMAGE_FORMATS)} images [N] (base64 {{'b64': ...}} in REST JSON), any size: the "
        "evaluation view (resized to ceil(crop / crop_fraction), centre crop, in the input config's crop_mode)",
    ),
}


def _inference_module(model, image_size, scratch):
    """The model's inference as a plain TensorFlow object: ``module.infer(normalized_images)``.

    ``ExportArchive.add_endpoint`` turns a Keras callable into a TensorFlow function for the current
    backend (through jax2tf on JAX), but publishes every endpoint as a serving signature, and one on
    normalized inputs would be misused by clients. So the model alone is written with the public
    ``ExportArchive`` API to a scratch SavedModel and loaded back: the loaded ``infer`` is plain
    TensorFlow on any backend, the preprocessing signatures call it, and only they are published.
    Loading restores the variables into memory, so the scratch copy is deleted at once.
    """
    spec = [tf.TensorSpec((None, *image_size, 3), tf.float32, name="normalized_images")]
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("infer", lambda x: model(x, training=False), spec)
    path = os.path.join(scratch, "inference")
    archive.write_out(path, verbose=False)
    module = tf.saved_model.load(path)
    shutil.rmtree(path)
    return module


def _serving_function(signature, inference, table, serving):
    """``signature``'s ``tf.function``: its input to pixels, then ``serving.serve`` in TensorFlow ops and
    the top-k classes' names from ``table``."""

    def serve(inputs):
        pixels = signature.to_pixels(inputs, serving.input_config)
        outputs = serving.serve(inference.infer, pixels, TF_OPS)
        outputs[serving.class_names_output] = table.lookup(tf.cast(outputs["classes"], tf.int64))
        return outputs

    return tf.function(serve, input_signature=[signature.input_spec(serving.image_size)], autograph=False)


def _write_archive(path, model, serving, class_names, scratch):
    """The SavedModel: the inference object, the class-name table, the preprocessing config asset and
    one signature per ``SIGNATURES`` entry (nothing else is published)."""
    labels_file = os.path.join(scratch, CLASS_NAMES_ASSET)
    write_class_names(labels_file, class_names)
    config_file = os.path.join(scratch, PREPROCESSING_ASSET)
    write_input_config(config_file, serving.input_config)
    root = tf.Module()
    root.inference = _inference_module(model, serving.image_size, scratch)
    root.class_names = tf.lookup.StaticHashTable(
        tf.lookup.TextFileInitializer(
            labels_file,
            tf.int64,
            tf.lookup.TextFileIndex.LINE_NUMBER,
            tf.string,
            tf.lookup.TextFileIndex.WHOLE_LINE,
        ),
        default_value="",
    )
    root.preprocessing_config = tf.saved_model.Asset(config_file)
    signatures = {}
    for name, signature in SIGNATURES.items():
        function = _serving_function(signature, root.inference, root.class_names, serving)
        setattr(root, name, function)
        signatures[name] = function.get_concrete_function()
    # Serving needs no gradients; the jax2tf function loaded back (JAX backend) cannot re-save its custom
    # gradient, so none is saved.
    options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
    tf.saved_model.save(root, str(path), signatures=signatures, options=options)


def write_saved_model(path, model, serving, class_names, scratch, entry=None):
    """The ``saved_model`` entry's writer (``keras_preact.export.formats.FORMATS``): the SavedModel of
    ``model`` under the ``ServingContract`` ``serving`` into the (not yet existing) version directory
    ``path``."""
    _write_archive(path, model, serving, class_names, scratch)
