"""The version directory every export writes: ``export_dir/<name>/<version>/``, checked and staged.

What all formats share, without TensorFlow: the argument checks (name, version, class names, top-k, the
model's geometry, the input config), the assets (``assets/class_names.txt``: one name per line, line
number = label; ``assets/preprocessing.json``: ``InputConfig.to_dict()``) and ``staged_version``, which
yields a temporary directory next to the target and renames it into place when every format is written:
a failed or killed export leaves no version directory, and an existing version is never overwritten.
"""

import contextlib
import errno
import json
import os
import pathlib
import re
import shutil
import tempfile

import keras
import numpy as np

from keras_preact import scratch as scratch_names
from keras_preact.preprocessing import InputConfig

ASSETS = "assets"
CLASS_NAMES_ASSET = "class_names.txt"
PREPROCESSING_ASSET = "preprocessing.json"
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_name(argument, value):
    if not isinstance(value, str) or not _NAME_PATTERN.match(value):
        raise ValueError(
            f"Invalid {argument}={value!r}: use letters, digits, '.', '_' and '-' (a directory name)."
        )


def check_version(version):
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise ValueError(f"Invalid version={version!r}: expected a positive integer (TF Serving version).")


DEFAULT_TOP_K = 5  # the top-5 of the ILSVRC evaluation; fewer for a model of fewer classes


def check_top_k(top_k, num_classes):
    """``top_k`` checked against ``num_classes``; None: ``min(DEFAULT_TOP_K, num_classes)``."""
    if top_k is None:
        return min(DEFAULT_TOP_K, num_classes)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= num_classes:
        raise ValueError(f"Invalid top_k={top_k!r}: expected an integer in [1, {num_classes}] (num_classes).")
    return top_k


def check_class_names(class_names, num_classes):
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


def model_geometry(model, image_size):
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


def carried(model, input_config, class_names, image_size):
    """``(input_config, class_names, image_size)`` with the model's own (``PreActResNetClassifier``'s
    ``input_config``/``class_names``) where an argument is None; a dynamic-size model takes its input
    config's size."""
    own = getattr(model, "input_config", None)
    if input_config is None and isinstance(own, InputConfig):
        input_config = own
        shape = tuple(model.inputs[0].shape) if isinstance(model, keras.Model) and model.inputs else ()
        if image_size is None and None in shape[1:3]:
            image_size = own.crop_size
    if class_names is None:
        class_names = getattr(model, "class_names", None)
    return input_config, class_names, image_size


def resolve_input_config(input_config, image_size, mean, std, crop_fraction, interpolation):
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


def write_class_names(path, class_names):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(name + "\n" for name in class_names))


def write_input_config(path, input_config):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(input_config.to_dict(), f)
        f.write("\n")


def write_assets(version_dir, class_names, input_config):
    """``assets/class_names.txt`` and ``assets/preprocessing.json`` in ``version_dir``."""
    assets = pathlib.Path(version_dir, ASSETS)
    assets.mkdir(parents=True, exist_ok=True)
    write_class_names(assets / CLASS_NAMES_ASSET, class_names)
    write_input_config(assets / PREPROCESSING_ASSET, input_config)


def read_assets(version_dir):
    """``(class_names, InputConfig)`` from a version directory's assets."""
    assets = pathlib.Path(version_dir, ASSETS)
    class_names = (assets / CLASS_NAMES_ASSET).read_text(encoding="utf-8").splitlines()
    input_config = InputConfig.from_dict(json.loads((assets / PREPROCESSING_ASSET).read_text(encoding="utf-8")))
    return class_names, input_config


def check_free_space(model_dir, model, copies=1):
    """OSError(ENOSPC), one line, when the export (about the weights plus 2 MB of graph, per format)
    cannot fit."""
    per_copy = int(1.25 * sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize for v in model.weights)) + 2**21
    needed = copies * per_copy
    free = shutil.disk_usage(model_dir).free
    if free < needed:
        raise OSError(
            errno.ENOSPC,
            f"No space left to export to {model_dir}: it needs about {needed / 2**20:.1f} MB free, "
            f"{free / 2**20:.1f} MB is available there",
        )


def next_version(model_dir):
    """The next TF Serving version number under ``model_dir`` (1 when there is none).

    Examples:
        >>> import pathlib
        >>> import tempfile
        >>> from keras_preact.export import next_version
        >>> with tempfile.TemporaryDirectory() as model_dir:
        ...     next_version(model_dir)
        ...     (pathlib.Path(model_dir) / "7").mkdir()
        ...     next_version(model_dir)
        1
        8
    """
    model_dir = pathlib.Path(model_dir)
    versions = (
        [int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()] if model_dir.is_dir() else []
    )
    return max(versions, default=0) + 1


def check_export_dir(export_dir, name):
    """``export_dir/<name>``, after checking that neither is a file."""
    model_dir = pathlib.Path(export_dir) / name
    for path in (pathlib.Path(export_dir), model_dir):
        if path.exists() and not path.is_dir():
            raise ValueError(f"Invalid export_dir={str(export_dir)!r}: {path} is a file, not a directory.")
    return model_dir


@contextlib.contextmanager
def staged_version(export_dir, name, version, model, copies=1):
    """Yield ``(staging, scratch, target)``: fill the directory ``staging`` (not yet created) and it
    becomes ``target = export_dir/<name>/<version>`` when the block succeeds; ``scratch`` is for
    intermediate files. Both sit in one temporary directory next to the target (same file system, so the
    rename is atomic; its name is not a number, so TF Serving never loads it), removed in any case."""
    model_dir = check_export_dir(export_dir, name)
    scratch_names.remove_stale(model_dir)  # left by killed exports
    version = next_version(model_dir) if version is None else version
    target = model_dir / str(version)
    if target.exists():
        raise ValueError(f"Invalid version={version}: {target} already exists; exports are never overwritten.")
    model_dir.mkdir(parents=True, exist_ok=True)
    check_free_space(model_dir, model, copies)
    scratch = tempfile.mkdtemp(prefix=scratch_names.tag(str(version)) + "-", dir=model_dir)
    try:
        staging = os.path.join(scratch, "version")
        yield staging, scratch, target
        os.rename(staging, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
