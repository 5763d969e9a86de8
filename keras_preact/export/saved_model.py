"""Export a classifier as a SavedModel in TF Serving layout, preprocessing and class names inside.

``export_saved_model(model, "saved_models")`` writes ``saved_models/<name>/<version>/`` (the layout
TF Serving loads) with ``keras.export.ExportArchive``, from the TensorFlow or the JAX backend. Every
signature returns the same named outputs:

- ``probabilities`` ``[N, num_classes]`` float32 (the model's softmax output),
- ``classes`` ``[N, k]`` int32 (top-k class indices, best first), ``scores`` ``[N, k]`` float32,
- ``class_names`` ``[N, k]`` string (names of the top-k classes, from the asset
  ``assets/class_names.txt``, one name per line, line number = label).

The signatures differ only in what they take (the ``SIGNATURES`` table): raw uint8 pixels
(``serving_default``), float pixels in 0-255 units, or encoded JPEG/PNG/GIF/BMP bytes that go
through the evaluation view of ``keras_preact.preprocessing`` in the graph (``eval_view``: decode,
shorter side resized to ``ceil(crop / crop_fraction)``, centre crop), the same function evaluation
uses, so a served image is seen as the model's accuracy was measured. The normalization
``(pixels - mean) / std`` runs in the graph, so clients send plain pixels. The input config used
(``keras_preact.preprocessing.InputConfig.to_dict()``) is written to ``assets/preprocessing.json``.

The export is written to a temporary directory next to the target and renamed into place, so a
failed export leaves nothing behind.
"""

import dataclasses
import os
import shutil

import keras
import tensorflow as tf

from keras_preact.export.version_dir import CLASS_NAMES_ASSET, PREPROCESSING_ASSET, write_class_names, write_input_config
from keras_preact.preprocessing import IMAGE_FORMATS, eval_view, normalize

OUTPUTS = ("probabilities", "classes", "scores", "class_names")


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
        "images", tf.uint8, False, _cast_pixels, "uint8 RGB pixels [N, H, W, 3] at the model resolution"
    ),
    "serving_float": Signature(
        "images", tf.float32, False, _cast_pixels, "float RGB pixels in 0-255 units [N, H, W, 3]"
    ),
    "serving_bytes": Signature(
        "image_bytes",
        tf.string,
        True,
        _view_pixels,
        f"encoded {'/'.join(IMAGE_FORMATS)} images [N] (base64 {{'b64': ...}} in REST JSON), any size: the "
        "evaluation view (shorter side resized to ceil(crop / crop_fraction), centre crop)",
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


def _serving_function(signature, inference, table, input_config, top_k):
    image_size = input_config.crop_size

    def serve(inputs):
        pixels = signature.to_pixels(inputs, input_config)
        probabilities = tf.cast(inference.infer(normalize(pixels, input_config.mean, input_config.std)), tf.float32)
        scores, classes = tf.math.top_k(probabilities, k=top_k)
        return {
            "probabilities": probabilities,
            "classes": classes,
            "scores": scores,
            "class_names": table.lookup(tf.cast(classes, tf.int64)),
        }

    return tf.function(serve, input_signature=[signature.input_spec(image_size)], autograph=False)


def _write_archive(path, model, input_config, class_names, top_k, scratch):
    """The SavedModel: the inference object, the class-name table, the preprocessing config asset and
    one signature per ``SIGNATURES`` entry (nothing else is published)."""
    labels_file = os.path.join(scratch, CLASS_NAMES_ASSET)
    write_class_names(labels_file, class_names)
    config_file = os.path.join(scratch, PREPROCESSING_ASSET)
    write_input_config(config_file, input_config)
    root = tf.Module()
    root.inference = _inference_module(model, input_config.crop_size, scratch)
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
        function = _serving_function(signature, root.inference, root.class_names, input_config, top_k)
        setattr(root, name, function)
        signatures[name] = function.get_concrete_function()
    # Serving needs no gradients; the jax2tf function loaded back (JAX backend) cannot re-save its custom
    # gradient, so none is saved.
    options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
    tf.saved_model.save(root, str(path), signatures=signatures, options=options)


def export_saved_model(
    model,
    export_dir="saved_models",
    *,
    name=None,
    version=None,
    class_names=None,
    mean=None,
    std=None,
    top_k=5,
    image_size=None,
    input_config=None,
    crop_fraction=None,
    interpolation=None,
):
    """Write ``model`` to ``export_dir/<name>/<version>/`` as a SavedModel for TF Serving.

    Args:
        model: a single-input image classifier ``[N, H, W, 3] -> [N, num_classes]`` whose output is
            probabilities (the package's models end in a softmax "predictions" layer).
        export_dir: the model base directory's parent (TF Serving's ``--model_base_path`` is
            ``export_dir/<name>``).
        name: the model name (a directory name); default ``model.name``.
        version: a positive integer; default: one more than the highest existing version. An existing
            version is never overwritten.
        class_names: one string per class (index = label); default the model's own ``class_names`` (a
            ``PreActResNetClassifier`` with trained weights), else ``"0"``, ``"1"``, ...
        mean, std: per-channel (R, G, B) normalization in 0-255 pixel units, applied in the graph as
            ``(pixels - mean) / std``; default 0 and 1 (the model consumes raw pixels). ``mean`` may
            also be an ``[H, W, 3]`` mean image (the paper's per-pixel mean subtraction).
        top_k: how many classes the ``classes``/``scores``/``class_names`` outputs hold
            (1 to num_classes).
        image_size: ``(height, width)``, needed only when the model's input size is dynamic.
        input_config: the model's ``keras_preact.preprocessing.InputConfig`` (or its ``to_dict()``),
            e.g. ``keras_preact.models.get_input_config(name)``: its ``input_size`` must match the model
            input; ``mean``/``std``/``crop_fraction``/``interpolation`` default to its values. Default:
            the model's own ``input_config`` (every classifier ``create_model`` builds carries its
            registry's), else none.
        crop_fraction: the ``serving_bytes`` evaluation view keeps the centre ``crop`` of the image
            whose shorter side is resized to ``ceil(crop / crop_fraction)``; in (0, 1]. Default: the
            input config's, else 1.0 (shorter side to the crop: CIFAR-style evaluation of the whole
            image). An ImageNet model evaluated at 224 of 256 needs 0.875 (its input config, carried by
            a ``create_model`` classifier), or its served view differs from the one its accuracy was
            measured on.
        interpolation: the resize method of that view (``keras_preact.preprocessing.INTERPOLATIONS``);
            default the input config's, else "bilinear".

    Returns:
        The version directory written, a ``pathlib.Path``.
    """
    from keras_preact.export.formats import export_model

    return export_model(
        model, export_dir, formats=("saved_model",), name=name, version=version, class_names=class_names,
        mean=mean, std=std, top_k=top_k, image_size=image_size, input_config=input_config,
        crop_fraction=crop_fraction, interpolation=interpolation,
    )


def write_saved_model(path, model, input_config, class_names, top_k, scratch):
    """The ``saved_model`` entry of ``keras_preact.export.formats.FORMATS``: the SavedModel into the
    (not yet existing) version directory ``path``."""
    _write_archive(path, model, input_config, class_names, top_k, scratch)
