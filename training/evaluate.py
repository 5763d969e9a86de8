"""``keras-preact-evaluate``: top-1 (and top-5) accuracy of a trained model on a data set's test split.

::

    keras-preact-evaluate cifar_resnet20 --weights cifar10 --data-dir /tmp/cifar10-jpeg   # registry weights
    keras-preact-evaluate runs/<run> --data-dir /tmp/cifar10-jpeg                         # a run directory
    keras-preact-evaluate model.keras --dataset cifar10 --data-dir ~/tensorflow_datasets --json metrics.json

MODEL is a registry name with ``--weights`` (``create_model(name, weights=...)``, sha256-checked), a run
directory (``config.json`` + ``model.keras``) or a ``.keras`` file (a classifier carrying its input config,
or one beside its run's ``config.json``). The data is an image folder (``train/`` and ``test/`` class
folders, as ``sources`` reads them) or a prepared TFDS data set's test split. Evaluation is training's:
images at the model's input size (crop fraction 1.0: CIFAR) are normalized arrays
(``pipelines.numpy_array_eval``), others go through the evaluation view (resize the shorter side, centre
crop): ``keras_preact.preprocessing.eval_view`` in tf.data on the TensorFlow backend, the same view as the
Keras layer ``keras_preact.layers.EvalView`` on the files decoded by Pillow on JAX and PyTorch (no TensorFlow
needed), both with the model's own mean/std, measured by ``model.evaluate`` with training's metrics. Every
argument is checked before anything is loaded. It prints, and ``--json`` writes,
``top1_accuracy``/``top5_accuracy`` as fractions in [0, 1], as every accuracy keras-preact reports.

While ``model.evaluate`` runs, ``keras_preact_training.machine.memory_guard`` ends the process with one line
(``[evaluate] error: out of host memory during model.evaluate: ...``) when host memory in use reaches ``--memory-limit``
of the limit (default 0.95, 0: off). Exit codes: 0 done, 2 a bad argument (one line, before anything is loaded, or
data that does not fit the model once it is), 1 a run that failed (the memory guard; an uncaught error).
"""

from __future__ import annotations  # Target's InputConfig: imported where a model is resolved

import argparse
import dataclasses
import json
import math
import pathlib
import zipfile

import numpy as np

# Standard library, numpy and memory_guard only at the top: ``--help`` and a bad flag are answered (``build_parser``)
# before Keras loads. Keras, the library and the data modules are imported where they are used.
from .machine import memory_guard

__all__ = ["evaluate", "resolve_data", "resolve_model"]  # the Python API; main is the command line's


@dataclasses.dataclass
class Target:
    """A model to evaluate, resolved without loading it."""

    label: str
    load: object  # () -> keras.Model
    input_config: InputConfig  # noqa: F821 - keras_preact.preprocessing's, imported where a model is resolved
    class_names: tuple = None
    registered: dict = dataclasses.field(
        default_factory=dict
    )  # the registry's top1/top5 as top1_accuracy/top5_accuracy


@dataclasses.dataclass
class TestData:
    """A test split, listed but not read: ``arrays()`` or ``stream()`` reads it."""

    label: str
    class_names: list
    size: int
    image_size: tuple  # (height, width), or None when the images differ in size
    arrays: object  # () -> (uint8 images, labels)
    stream: object  # () -> tf.data of (encoded image, label)
    files: list = None  # an image folder's files and labels (the evaluation view without TensorFlow), else None
    labels: object = None


# ---------------------------------------------------------------------------------------- model
def resolve_model(model, weights):
    """A ``Target`` for MODEL: a run directory, a ``.keras`` file or a registry name (with ``weights``).
    Nothing is loaded: ``target.load()`` builds the model.

    Examples:
        >>> from keras_preact_training.evaluate import resolve_model
        >>> target = resolve_model("cifar_resnet20", "cifar10")  # the shipped weights, sha256-checked
        >>> target.label, target.input_config.input_size, target.class_names[:2]
        ('cifar_resnet20 (weights cifar10)', (32, 32, 3), ('airplane', 'automobile'))
        >>> resolve_model("cifar_resnet20", None)
        Traceback (most recent call last):
        ...
        ValueError: Invalid --weights: a registry model is evaluated with its trained weights, --weights NAME;
        for cifar_resnet20: 'cifar10'.
    """
    path = pathlib.Path(model)
    if path.is_dir() or model.endswith(".keras"):
        if weights is not None:
            raise ValueError(f"Invalid --weights={weights!r}: only a registry model name takes --weights; "
                             f"{model!r} is a {'run directory' if path.is_dir() else '.keras file'}.")
        return _run_target(path) if path.is_dir() else _keras_target(path)
    return _registry_target(model, weights)


def _registry_target(name, weights):
    from keras_preact.models import create_model, list_models, model_spec

    if name not in list_models():
        raise ValueError(f"Invalid model={name!r}: not a run directory, a .keras file or a registry name "
                         f"({', '.join(list_models())}).")
    spec = model_spec(name)
    if weights is None:
        allowed = ", ".join(map(repr, spec.weights)) or "none are registered for it yet"
        raise ValueError(f"Invalid --weights: a registry model is evaluated with its trained weights, "
                         f"--weights NAME; for {name}: {allowed}.")
    from keras_preact.pretrained.loader import get_loader

    loader = get_loader(name, weights)  # checked (a published checkpoint: fetched, converted) before anything is built
    trained = loader.spec
    return Target(f"{name} (weights {weights})", lambda: create_model(name, weights=loader),
                  loader.input_config or spec.input_config, loader.class_names,  # a checkpoint's own preprocessing
                  {"top1_accuracy": getattr(trained, "top1", None), "top5_accuracy": getattr(trained, "top5", None)})


def _run_target(path):
    from .export import load_run_model
    from .run.manifest import RunManifest

    manifest = RunManifest.read(path)
    if not (path / "model.keras").is_file():
        raise ValueError(f"Invalid model={str(path)!r}: the run directory has no model.keras (the run did not "
                         "finish; re-run its training command with the same --run-dir).")
    return Target(f"run {path}", lambda: load_run_model(path / "model.keras"), manifest.input_config,
                  manifest.class_names)


def _keras_target(path):
    from keras_preact.preprocessing import InputConfig

    from .export import load_run_model
    from .run.manifest import RunManifest

    if not path.is_file():
        raise ValueError(f"Invalid model={str(path)!r}: no such .keras file.")
    config = _saved_config(path)
    input_config, class_names = config.get("input_config"), config.get("class_names")
    if input_config is None and (path.parent / "config.json").is_file():
        manifest = RunManifest.read(path.parent)
        input_config, class_names = manifest.input_config.to_dict(), manifest.class_names
    if input_config is None:
        raise ValueError(f"Invalid model={str(path)!r}: it carries no input config (mean/std, evaluation crop) "
                         "and has no run config.json beside it; evaluate its run directory, or save a model "
                         "built by keras_preact.models.create_model (or set model.input_config).")
    names = None if class_names is None else tuple(class_names)
    return Target(str(path), lambda: load_run_model(path), InputConfig.from_dict(input_config), names)


def _saved_config(path):
    """The top-level model's constructor config inside a ``.keras`` archive, read without building it."""
    try:
        with zipfile.ZipFile(path) as archive:
            return json.loads(archive.read("config.json")).get("config") or {}
    except (zipfile.BadZipFile, KeyError, ValueError, OSError):
        raise ValueError(f"Invalid model={str(path)!r}: not a readable .keras archive.") from None


# ----------------------------------------------------------------------------------------- data
def resolve_data(dataset, data_dir, cache_dir=None):
    """The test split of an image folder (``dataset="folder"``) or of a prepared TFDS data set, listed
    but not read (``TestData``); ``cache_dir``: where decoded folder images are cached.

    Examples:
        >>> from keras_preact_training.evaluate import resolve_data
        >>> resolve_data("folder", "no/such/folder")
        Traceback (most recent call last):
        ...
        keras_preact_training.data.sources.DataError: data_dir='no/such/folder' is not a directory. ...
    """
    from .data import sources

    if dataset == "folder":
        _, test_dir = sources.folder_splits(data_dir)
        files, labels, classes = sources._list_folder(test_dir)
        size = _image_size(files[0])

        def arrays():
            return sources._decode_cached(files, labels, cache_dir)

        def stream():
            return sources.folder_stream(data_dir).make("test")

        return TestData(f"{test_dir} ({len(files)} images)", classes, len(files), size, arrays, stream, files, labels)
    sources.require_tensorflow(f"dataset={dataset!r} (a TFDS data set)",
                               "; without TensorFlow use --dataset folder")
    builder = sources.tfds_builder(dataset, data_dir)
    split = sources._test_split(builder)
    shape = builder.info.features["image"].shape
    return TestData(f"TFDS {dataset} {split} ({builder.info.splits[split].num_examples} images)",
                    list(builder.info.features["label"].names), builder.info.splits[split].num_examples,
                    tuple(shape[:2]) if None not in shape[:2] else None,
                    lambda: _tfds_arrays(builder, split), lambda: sources.tfds_stream(builder).make("test"))


def _image_size(file):
    from PIL import Image

    from .data import sources

    try:
        with Image.open(file) as image:
            return image.size[1], image.size[0]
    except (OSError, ValueError, SyntaxError):
        raise sources.DataError(f"Invalid --data-dir: {file} is not an image (corrupt or empty).") from None


def _tfds_arrays(builder, split):
    import tensorflow_datasets as tfds

    images, labels = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1, as_supervised=True))
    return images.astype(np.uint8), labels.astype(np.int32)


def as_arrays(target, data):
    """Whether training evaluates this data as arrays (images at the input size, whole-image view)."""
    config = target.input_config
    return config.crop_fraction == 1.0 and data.image_size == tuple(config.crop_size)


def _some(names, shown=5):
    return ", ".join(repr(n) for n in names[:shown]) + (
        f" (and {len(names) - shown} more)" if len(names) > shown else ""
    )


def class_mismatch(model_names, data_names):
    """The one line saying how a folder's classes differ from the model's: the extra ones, the missing ones, or
    the first place where the same names come in another order.

    Examples:
        >>> class_mismatch(["cat", "dog"], ["cat", "dog", "emu"])
        "Invalid --data-dir: its 3 classes are not the model's 2 class_names (same names, same order):
        1 not the model's: 'emu'."
    """
    model, data = list(model_names), list(data_names)
    extra, missing = [c for c in data if c not in model], [c for c in model if c not in data]
    parts = [f"{len(extra)} not the model's: {_some(extra)}"] if extra else []
    parts += [f"{len(missing)} of the model's missing: {_some(missing)}"] if missing else []
    if not parts:
        i = next(i for i, (a, b) in enumerate(zip(data, model)) if a != b)
        parts = [f"the same names in another order: class {i} is {data[i]!r} where the model's is {model[i]!r}"]
    return (f"Invalid --data-dir: its {len(data)} classes are not the model's {len(model)} class_names (same names, "
            f"same order): {'; '.join(parts)}.")


def views_with_layer(data):
    """Whether the evaluation view is the Keras layer on Pillow-decoded files (an image folder on JAX or PyTorch)
    rather than ``eval_view`` in tf.data (the TensorFlow backend, TFDS data sets)."""
    import keras

    return data.files is not None and keras.backend.backend() != "tensorflow"


def check_match(target, data):
    """The data's classes are the model's, and images of another size can be viewed (TensorFlow)."""
    from .data import sources

    if target.class_names is not None and list(target.class_names) != list(data.class_names):
        raise ValueError(class_mismatch(target.class_names, data.class_names))
    if not as_arrays(target, data) and not views_with_layer(data):
        config, size = target.input_config, data.image_size
        sources.require_tensorflow(
            f"Evaluating images of {'mixed sizes' if size is None else f'size {size[0]}x{size[1]}'} "
            f"through the evaluation view (resize the shorter side to {config.resize_size}, centre crop "
            f"{config.crop_size[0]}x{config.crop_size[1]}: keras_preact.preprocessing.eval_view)")


def view_batches(files, labels, batch_size, view):
    """A ``keras.utils.PyDataset`` of ``files`` through the evaluation view layer (``keras_preact.layers.EvalView``,
    normalized): each file decoded by Pillow (``decode_image_array``), viewed alone (the files differ in size),
    stacked."""
    import keras

    from keras_preact.preprocessing import decode_image_array

    from .data import sources

    class ViewBatches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()

        def __len__(self):
            return math.ceil(len(labels) / batch_size)

        def __getitem__(self, index):
            window = slice(index * batch_size, (index + 1) * batch_size)
            views = []
            for file in files[window]:
                try:
                    image = decode_image_array(file)
                except ValueError as error:
                    raise sources.DataError(f"Invalid --data-dir: {file}: {error}") from None
                views.append(keras.ops.convert_to_numpy(view(image)))
            return np.stack(views), np.asarray(labels[window])

    return ViewBatches()


def evaluation_data(target, data, batch_size):
    """Training's evaluation input: normalized arrays, or the evaluation view (in tf.data on TensorFlow, the
    ``EvalView`` layer on JAX and PyTorch)."""
    from .data import pipelines

    config = target.input_config
    mean, std = np.asarray(config.mean, np.float32), np.asarray(config.std, np.float32)
    if as_arrays(target, data):
        images, labels = data.arrays()
        return pipelines.numpy_array_eval(images, labels, batch_size, mean=mean, std=std)
    if views_with_layer(data):
        from keras_preact.layers import EvalView

        return view_batches(data.files, data.labels, batch_size, EvalView(config))
    import tensorflow as tf

    from keras_preact.preprocessing import eval_view

    views = data.stream().map(lambda e, y: (eval_view(e, config), y), num_parallel_calls=tf.data.AUTOTUNE)
    return views.batch(batch_size).map(lambda x, y: (pipelines._tf_normalize(x, mean, std), y)).prefetch(
        tf.data.AUTOTUNE)


# ------------------------------------------------------------------------------------- evaluate
OUT_OF_MEMORY_HINT = " -- out of memory: evaluate with a smaller --batch-size"  # the memory guard's remedies


TTA_CHOICES = ("none", "flip")  # --tta: flip averages the predictions on each image and its mirror image


def evaluate(target, data, batch_size=128, verbose=1, memory_limit=0, tta="none"):
    """``{"top1_accuracy", "top5_accuracy" (more than 5 classes), "loss", "images"}`` by ``model.evaluate``
    (Keras' progress bar); accuracies are fractions in [0, 1], as Keras' and the registry's.
    ``memory_limit``: the memory guard's fraction around ``model.evaluate`` (its line names this command's
    flags: ``main`` passes ``--memory-limit``; 0, the default for other callers, is off). ``tta="flip"``
    (``--tta flip``): each image's prediction is the mean of the model's on it and on its left-right mirror
    image (``keras_preact.models.levers.flip_tta``).

    Examples:
        The shipped CIFAR-10 weights on a folder of ten grey test images, one per class:

        >>> import pathlib
        >>> import tempfile
        >>> from PIL import Image
        >>> from keras_preact_training.evaluate import evaluate, resolve_data, resolve_model
        >>> target = resolve_model("cifar_resnet20", "cifar10")
        >>> with tempfile.TemporaryDirectory() as root:
        ...     for split in ("train", "test"):
        ...         for name in target.class_names:
        ...             pathlib.Path(root, split, name).mkdir(parents=True)
        ...             Image.new("RGB", (32, 32), (128, 128, 128)).save(pathlib.Path(root, split, name, "0.png"))
        ...     data = resolve_data("folder", root, cache_dir=pathlib.Path(root, "cache"))
        ...     metrics = evaluate(target, data, verbose=0)
        >>> sorted(metrics), metrics["images"]
        (['images', 'loss', 'top1_accuracy', 'top5_accuracy'], 10)
        >>> round(metrics["top1_accuracy"], 4), round(metrics["top5_accuracy"], 4)  # every image gets one class
        (0.1, 0.5)
    """
    import keras

    if tta not in TTA_CHOICES:
        raise ValueError(f"Invalid tta={tta!r}. Allowed values: {', '.join(map(repr, TTA_CHOICES))}.")
    model = target.load()
    if tta == "flip":
        from keras_preact.models.levers import flip_tta

        model = flip_tta(model)
    num_classes = int(model.outputs[0].shape[-1])
    if num_classes != len(data.class_names):
        raise ValueError(f"Invalid --data-dir: {len(data.class_names)} classes, the model has {num_classes}.")
    metrics = ["accuracy"]
    if num_classes > 5:
        metrics.append(keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5_accuracy"))
    model.compile(loss="sparse_categorical_crossentropy", metrics=metrics)
    inputs = evaluation_data(target, data, batch_size)
    with memory_guard.watch("model.evaluate", memory_limit, prefix="[evaluate]", remedies=OUT_OF_MEMORY_HINT):
        result = model.evaluate(inputs, verbose=verbose, return_dict=True)
    metrics = {"top1_accuracy": float(result["accuracy"]), "loss": float(result["loss"]), "images": data.size}
    if "top5_accuracy" in result:
        metrics["top5_accuracy"] = float(result["top5_accuracy"])
    return metrics


def summary(target, data, metrics):
    """One line: the metrics by their keys, accuracies as fractions with four decimals (as
    keras-preact-train's summary), then the registry's recorded figures under the same keys."""
    shown = [key for key in ("top1_accuracy", "top5_accuracy") if key in metrics]
    line = f"{target.label} on {data.label}: " + ", ".join(f"{key} {metrics[key]:.4f}" for key in shown)
    recorded = {k: v for k, v in target.registered.items() if v is not None}
    if recorded:
        line += " (registered: " + ", ".join(f"{k} {v:.4f}" for k, v in recorded.items()) + ")"
    return line


def write_json(path, target, data, metrics):
    import keras

    from keras_preact.scratch import atomic_path

    report = {**metrics, "model": target.label, "data": data.label, "backend": keras.backend.backend(),
              "input_config": target.input_config.to_dict()}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------ CLI
def _positive_int(text):
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected a positive integer")
    return int(text)


def _memory_limit(text):
    """``--memory-limit``: ``memory_guard.check_fraction``'s rule, as argparse says a bad value."""
    try:
        return memory_guard.check_fraction(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: {memory_guard.FRACTION_RULE}") from None


def build_parser():
    parser = argparse.ArgumentParser(
        allow_abbrev=False,  # --data is an error, not --data-dir
        prog="keras-preact-evaluate",
        description="Top-1 (and top-5) of a model on a test split, with training's evaluation preprocessing.",
    )
    parser.add_argument("model", help="a registry name (with --weights), a run directory or a .keras file")
    parser.add_argument("--weights", default=None, help="the registry model's trained weights, e.g. cifar10")
    parser.add_argument("--dataset", default="folder",
                        help="folder (default: DATA_DIR/train, DATA_DIR/test class folders) or a prepared TFDS name")
    parser.add_argument("--data-dir", default=None, help="the image folder, or the TFDS data directory")
    parser.add_argument("--batch-size", type=_positive_int, default=128, help="default 128")
    parser.add_argument("--cache-dir", default=None, help="where decoded folder images are cached (as training)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the metrics to PATH (JSON)")
    parser.add_argument("--tta", choices=TTA_CHOICES, default="none",
                        help="test-time augmentation: flip averages the predictions on each image and its mirror "
                        "image (default none)")
    parser.add_argument("--memory-limit", type=_memory_limit, default=memory_guard.DEFAULT_FRACTION,
                        metavar="FRACTION",
                        help="stop with one line (exit 1) when the host memory in use reaches this fraction of "
                        "the limit (the cgroup's, else the machine's), before Linux's OOM killer ends the run "
                        f"without a word; default {memory_guard.DEFAULT_FRACTION:g}, 0: off")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)

    def fail(message):
        parser.exit(2, f"{parser.prog}: error: {str(message).splitlines()[0]}\n")

    if args.json is not None and pathlib.Path(args.json).is_dir():
        fail(f"Invalid --json={args.json!r}: a directory; give a file path.")
    try:  # every argument, before anything is loaded or read
        target = resolve_model(args.model, args.weights)
        data = resolve_data(args.dataset, args.data_dir, args.cache_dir)
        check_match(target, data)
    except ValueError as error:
        fail(error)
    print(f"[evaluate] {target.label} on {data.label}", flush=True)
    try:
        metrics = evaluate(target, data, args.batch_size, memory_limit=args.memory_limit, tta=args.tta)
    except ValueError as error:
        fail(error)
    print(summary(target, data, metrics), flush=True)
    if args.json is not None:
        write_json(args.json, target, data, metrics)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
