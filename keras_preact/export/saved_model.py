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
import errno
import json
import os
import pathlib
import re
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf

from keras_preact import scratch as scratch_names
from keras_preact.preprocessing import IMAGE_FORMATS, InputConfig, eval_view, normalize

CLASS_NAMES_ASSET = "class_names.txt"
PREPROCESSING_ASSET = "preprocessing.json"
OUTPUTS = ("probabilities", "classes", "scores", "class_names")
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


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


def _check_name(argument, value):
    if not isinstance(value, str) or not _NAME_PATTERN.match(value):
        raise ValueError(
            f"Invalid {argument}={value!r}: use letters, digits, '.', '_' and '-' (a directory name)."
        )


def _check_class_names(class_names, num_classes):
    if class_names is None:
        return [str(i) for i in range(num_classes)]
    names = list(class_names) if isinstance(class_names, (list, tuple)) else None
    if names is None or len(names) != num_classes:
        raise ValueError(
            f"Invalid class_names: expected a list of {num_classes} strings (one per model output), "
            f"got {class_names!r:.200}."
        )
    for n in names:
        if not isinstance(n, str) or not n or "\n" in n or "\r" in n:
            raise ValueError(f"Invalid class_names entry {n!r}: class names are non-empty one-line strings.")
    return names


def _model_geometry(model, image_size):
    """(height, width) and num_classes of a single-input image classifier, validated."""
    if not isinstance(model, keras.Model) or len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ValueError(f"Invalid model={model!r}: expected a built keras.Model with one input and one output.")
    in_shape = tuple(model.inputs[0].shape)
    out_shape = tuple(model.outputs[0].shape)
    if len(in_shape) != 4 or in_shape[-1] != 3:
        raise ValueError(f"Invalid model: its input shape {in_shape} is not [N, H, W, 3] (channels_last RGB).")
    if len(out_shape) != 2 or not out_shape[-1]:
        raise ValueError(f"Invalid model: its output shape {out_shape} is not [N, num_classes].")
    size = tuple(in_shape[1:3])
    if image_size is not None:
        size_arg = tuple(image_size)
        if len(size_arg) != 2 or not all(isinstance(s, int) and s > 0 for s in size_arg) or any(
            m is not None and m != s for m, s in zip(size, size_arg)
        ):
            raise ValueError(
                f"Invalid image_size={image_size!r}: expected [height, width] positive integers "
                f"matching the model input {size}."
            )
        size = size_arg
    if None in size:
        raise ValueError(
            f"Invalid model: its input has a dynamic size {in_shape}; pass image_size=(height, width)."
        )
    return size, int(out_shape[-1])


def _check_free_space(model_dir, model):
    """OSError(ENOSPC), one line, when the export (about the weights plus 2 MB of graph) cannot fit."""
    needed = int(1.25 * sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize for v in model.weights)) + 2**21
    free = shutil.disk_usage(model_dir).free
    if free < needed:
        raise OSError(
            errno.ENOSPC,
            f"No space left to export to {model_dir}: it needs about {needed / 2**20:.1f} MB free, "
            f"{free / 2**20:.1f} MB is available there",
        )


def next_version(model_dir):
    """The next TF Serving version number under ``model_dir`` (1 when there is none)."""
    model_dir = pathlib.Path(model_dir)
    versions = [int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()] if model_dir.is_dir() else []
    return max(versions, default=0) + 1


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
    with open(labels_file, "w", encoding="utf-8") as f:
        f.write("".join(name + "\n" for name in class_names))
    config_file = os.path.join(scratch, PREPROCESSING_ASSET)
    with open(config_file, "w", encoding="utf-8") as f:
        json.dump(input_config.to_dict(), f)
        f.write("\n")
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


def _resolve_input_config(input_config, image_size, mean, std, crop_fraction, interpolation):
    """The InputConfig the export uses: ``input_config`` (an InputConfig or its dict) with the explicit
    arguments applied over it; without one, ``crop_fraction`` 1.0, bilinear, mean 0 and std 1.
    Every problem raises ValueError naming the argument."""
    if input_config is None:
        base = InputConfig(input_size=(*image_size, 3), mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), crop_fraction=1.0)
    else:
        if isinstance(input_config, dict):
            try:
                input_config = InputConfig.from_dict(input_config)
            except (TypeError, ValueError) as error:
                message = str(error).removeprefix("Invalid input config: ")
                raise ValueError(f"Invalid input_config: {message}") from None
        if not isinstance(input_config, InputConfig):
            raise ValueError(f"Invalid input_config={input_config!r:.200}: expected a "
                             "keras_preact.preprocessing.InputConfig (or its to_dict()).")
        if input_config.input_size != (*image_size, 3):
            raise ValueError(f"Invalid input_config: its input_size {input_config.input_size} does not match the "
                             f"model input {(*image_size, 3)}.")
        base = input_config
    changes = {}
    if mean is not None:
        changes["mean"] = mean
    if std is not None:
        changes["std"] = std
    if crop_fraction is not None:
        changes["crop_fraction"] = crop_fraction
    if interpolation is not None:
        changes["interpolation"] = interpolation
    return base.replace(**changes)  # InputConfig checks each field, naming it


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
        class_names: one string per class (index = label); default ``"0"``, ``"1"``, ...
        mean, std: per-channel (R, G, B) normalization in 0-255 pixel units, applied in the graph as
            ``(pixels - mean) / std``; default 0 and 1 (the model consumes raw pixels). ``mean`` may
            also be an ``[H, W, 3]`` mean image (the paper's per-pixel mean subtraction).
        top_k: how many classes the ``classes``/``scores``/``class_names`` outputs hold
            (1 to num_classes).
        image_size: ``(height, width)``, needed only when the model's input size is dynamic.
        input_config: the model's ``keras_preact.preprocessing.InputConfig`` (or its ``to_dict()``),
            e.g. ``keras_preact.models.get_input_config(name)``: its ``input_size`` must match the model
            input; ``mean``/``std``/``crop_fraction``/``interpolation`` default to its values.
        crop_fraction: the ``serving_bytes`` evaluation view keeps the centre ``crop`` of the image
            whose shorter side is resized to ``ceil(crop / crop_fraction)``; in (0, 1]. Default: the
            input config's, else 1.0 (shorter side to the crop: CIFAR-style evaluation of the whole
            image). An ImageNet model evaluated at 224 of 256 needs 0.875 (or its input config), or its
            served view differs from the one its accuracy was measured on.
        interpolation: the resize method of that view (``keras_preact.preprocessing.INTERPOLATIONS``);
            default the input config's, else "bilinear".

    Returns:
        The version directory written, a ``pathlib.Path``.
    """
    image_size, num_classes = _model_geometry(model, image_size)
    name = model.name if name is None else name
    _check_name("name", name)
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise ValueError(f"Invalid version={version!r}: expected a positive integer (TF Serving version).")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= num_classes:
        raise ValueError(f"Invalid top_k={top_k!r}: expected an integer in [1, {num_classes}] (num_classes).")
    class_names = _check_class_names(class_names, num_classes)
    input_config = _resolve_input_config(input_config, image_size, mean, std, crop_fraction, interpolation)

    model_dir = pathlib.Path(export_dir) / name
    for path in (pathlib.Path(export_dir), model_dir):
        if path.exists() and not path.is_dir():
            raise ValueError(f"Invalid export_dir={str(export_dir)!r}: {path} is a file, not a directory.")
    scratch_names.remove_stale(model_dir)  # left by killed exports
    version = next_version(model_dir) if version is None else version
    target = model_dir / str(version)
    if target.exists():
        raise ValueError(f"Invalid version={version}: {target} already exists; exports are never overwritten.")
    model_dir.mkdir(parents=True, exist_ok=True)
    _check_free_space(model_dir, model)
    # The temporary directory sits next to the target (same file system, so the rename is atomic);
    # its name is not a number, so TF Serving never loads it.
    scratch = tempfile.mkdtemp(prefix=scratch_names.tag(str(version)) + "-", dir=model_dir)
    try:
        staged = os.path.join(scratch, "saved_model")
        _write_archive(staged, model, input_config, class_names, top_k, scratch)
        os.rename(staged, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
