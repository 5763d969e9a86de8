"""Export a classifier as a SavedModel in TF Serving layout, preprocessing and class names inside.

``export_saved_model(model, "saved_models")`` writes ``saved_models/<name>/<version>/`` (the layout
TF Serving loads) with ``keras.export.ExportArchive``, from the TensorFlow or the JAX backend. Every
signature returns the same named outputs:

- ``probabilities`` ``[N, num_classes]`` float32 (the model's softmax output),
- ``classes`` ``[N, k]`` int32 (top-k class indices, best first), ``scores`` ``[N, k]`` float32,
- ``class_names`` ``[N, k]`` string (names of the top-k classes, from the asset
  ``assets/class_names.txt``, one name per line, line number = label).

The signatures differ only in what they take (the ``SIGNATURES`` table): raw uint8 pixels
(``serving_default``), float pixels in 0-255 units, or encoded JPEG/PNG/GIF/BMP bytes that are
decoded, resized (shorter side) and centre-cropped to the model resolution in the graph. The
training normalization ``(pixels - mean) / std`` runs in the graph, so clients send plain pixels.

The export is written to a temporary directory next to the target and renamed into place, so a
failed export leaves nothing behind.
"""

import dataclasses
import errno
import os
import pathlib
import re
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf

from keras_preact import scratch as scratch_names

CLASS_NAMES_ASSET = "class_names.txt"
OUTPUTS = ("probabilities", "classes", "scores", "class_names")
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _cast_pixels(images, image_size):
    return tf.cast(images, tf.float32)


def _decode_pixels(image_bytes, image_size):
    """Decode each encoded image, resize its shorter side to the model size, centre-crop."""
    height, width = image_size

    def decode_one(data):
        image = tf.io.decode_image(data, channels=3, expand_animations=False)
        image = tf.cast(image, tf.float32)
        shape = tf.shape(image)
        same_size = tf.logical_and(tf.equal(shape[0], height), tf.equal(shape[1], width))

        def resize_and_crop():
            scale = tf.maximum(height / tf.cast(shape[0], tf.float64), width / tf.cast(shape[1], tf.float64))
            new_h = tf.maximum(height, tf.cast(tf.math.round(tf.cast(shape[0], tf.float64) * scale), tf.int32))
            new_w = tf.maximum(width, tf.cast(tf.math.round(tf.cast(shape[1], tf.float64) * scale), tf.int32))
            resized = tf.image.resize(image, tf.stack([new_h, new_w]), method="bilinear", antialias=True)
            top = (new_h - height) // 2
            left = (new_w - width) // 2
            return tf.clip_by_value(resized[top : top + height, left : left + width, :], 0.0, 255.0)

        # An image already at the model resolution goes through untouched (bit-exact pixels).
        image = tf.cond(same_size, lambda: image, resize_and_crop)
        return tf.ensure_shape(image, (height, width, 3))

    return tf.map_fn(
        decode_one, image_bytes, fn_output_signature=tf.TensorSpec((height, width, 3), tf.float32)
    )


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
        _decode_pixels,
        "encoded JPEG/PNG/GIF/BMP images [N] (base64 {'b64': ...} in REST JSON), any size: the "
        "shorter side is resized to the model resolution, then centre-cropped",
    ),
}


def _check_name(argument, value):
    if not isinstance(value, str) or not _NAME_PATTERN.match(value):
        raise ValueError(
            f"Invalid {argument}={value!r}: use letters, digits, '.', '_' and '-' (a directory name)."
        )


def _check_triple(argument, value, positive=False, image_size=None):
    """Per-channel (R, G, B) statistics, or per pixel ([H, W, 3] at ``image_size``: the paper's mean image)."""
    values = np.asarray(value, dtype=np.float64) if value is not None else None
    shapes = [(3,)] + ([(*image_size, 3)] if image_size is not None else [])
    if values is None or values.shape not in shapes or not np.all(np.isfinite(values)) or (
        positive and not np.all(values > 0)
    ):
        kind = "positive numbers" if positive else "finite numbers"
        per_pixel = f" or an [{image_size[0]}, {image_size[1]}, 3] image" if image_size is not None else ""
        shown = value if values is None or values.size <= 3 else f"<array of shape {values.shape}>"
        raise ValueError(f"Invalid {argument}={shown!r}: expected three {kind} (R, G, B){per_pixel} in 0-255 "
                         "pixel units.")
    return values.astype(np.float32)


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


def _model_function(archive, model, image_size):
    """The model's inference call as a tf.function on normalized float32 images.

    ``ExportArchive`` turns a Keras callable into a tf.function for the current backend (through
    jax2tf on JAX). Its public ``add_endpoint`` would also publish that function as a serving
    signature on normalized inputs, which clients would misuse, so the backend conversion is called
    without registering it; the preprocessing signatures below call it.
    """
    spec = [tf.TensorSpec((None, *image_size, 3), tf.float32, name="normalized_images")]
    archive.track(model)
    return archive._backend_add_endpoint("model", lambda x: model(x, training=False), spec)


def _serving_function(signature, model_fn, table, image_size, mean, std, top_k):
    mean = tf.constant(mean, tf.float32)
    std = tf.constant(std, tf.float32)

    def serve(inputs):
        pixels = signature.to_pixels(inputs, image_size)
        probabilities = tf.cast(model_fn((pixels - mean) / std), tf.float32)
        scores, classes = tf.math.top_k(probabilities, k=top_k)
        return {
            "probabilities": probabilities,
            "classes": classes,
            "scores": scores,
            "class_names": table.lookup(tf.cast(classes, tf.int64)),
        }

    return tf.function(serve, input_signature=[signature.input_spec(image_size)], autograph=False)


def _write_archive(path, model, image_size, class_names, mean, std, top_k, scratch):
    labels_file = os.path.join(scratch, CLASS_NAMES_ASSET)
    with open(labels_file, "w", encoding="utf-8") as f:
        f.write("".join(name + "\n" for name in class_names))
    table = tf.lookup.StaticHashTable(
        tf.lookup.TextFileInitializer(
            labels_file,
            tf.int64,
            tf.lookup.TextFileIndex.LINE_NUMBER,
            tf.string,
            tf.lookup.TextFileIndex.WHOLE_LINE,
        ),
        default_value="",
    )
    archive = keras.export.ExportArchive()
    model_fn = _model_function(archive, model, image_size)
    archive.track(table)
    for name, signature in SIGNATURES.items():
        archive.add_endpoint(name, _serving_function(signature, model_fn, table, image_size, mean, std, top_k))
    archive.write_out(str(path), verbose=False)


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
    mean = _check_triple("mean", [0.0, 0.0, 0.0] if mean is None else mean, image_size=image_size)
    std = _check_triple("std", [1.0, 1.0, 1.0] if std is None else std, positive=True)

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
        _write_archive(staged, model, image_size, class_names, mean, std, top_k, scratch)
        os.rename(staged, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
