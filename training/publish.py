"""A finished run's weights as a registry network's trained weights (package data), for maintainers.

::

    python -m keras_preact_training.publish runs/<run> --model cifar_resnet20 --weights cifar10

Loads the run's ``model.keras``, checks that it is the registry network (the same weight paths and
shapes, the same input config), copies its weights into ``create_model(model)``, checks the outputs are
equal, writes ``<model>_<weights>.weights.h5`` into ``keras_preact/weights/`` (a temporary file, then a
rename) and prints the registry entry (sha256, class names, the run's final-epoch test top-1/top-5) to
add to ``keras_preact/models/presets.py``. Every check runs before anything is written.
"""

import argparse
import json
import pathlib

import numpy as np

from keras_preact.models import weights as weights_lib
from keras_preact.scratch import atomic_path

from .run.manifest import RunManifest


def _weight_layout(model):
    return [(v.path, tuple(v.shape)) for v in model.weights]


def _same_input_config(run, registry):
    """Equal, with the run's mean/std compared at float32 (training computes in float32)."""
    close = all(np.allclose(getattr(run, f), getattr(registry, f), rtol=1e-6, atol=0) for f in ("mean", "std"))
    return close and run.replace(mean=registry.mean, std=registry.std) == registry


def _probe(model):
    """A fixed, platform-independent batch at the model's input size (0-255 pattern, then standardised)."""
    height, width, channels = model.input_shape[1:]
    n, y, x, c = np.meshgrid(np.arange(4), np.arange(height), np.arange(width), np.arange(channels), indexing="ij")
    return (((n * 53 + y * 37 + x * 11 + c * 101) % 256).astype(np.float32) - 127.5) / 64.0


def load_checked(run_dir, model_name):
    """(the run's classifier, the registry network holding its weights, manifest, metrics), checked."""
    import keras

    from keras_preact.models import create_model, model_spec

    from .export import load_run_model

    run_dir = pathlib.Path(run_dir)
    manifest = RunManifest.read(run_dir)
    metrics_file = run_dir / "metrics.json"
    if not metrics_file.is_file():
        raise ValueError(f"Invalid run_dir={str(run_dir)!r}: no metrics.json (the run has not finished).")
    metrics = json.loads(metrics_file.read_text(encoding="utf-8"))
    spec = model_spec(model_name)
    if not _same_input_config(manifest.input_config, spec.input_config):
        raise ValueError(f"Invalid run_dir={str(run_dir)!r}: trained with input config {manifest.input_config}, "
                         f"but {model_name} is evaluated and served with {spec.input_config}.")
    trained = load_run_model(run_dir / "model.keras")
    network = create_model(model_name, num_classes=len(manifest.class_names))
    if _weight_layout(trained) != _weight_layout(network):
        raise ValueError(f"Invalid --model={model_name!r}: the run's network is not {model_name} (its weights "
                         "differ in paths or shapes; was it trained with other unit options or depth?).")
    network.set_weights(trained.get_weights())
    probe = _probe(network)
    same = np.array_equal(keras.ops.convert_to_numpy(trained(probe, training=False)),
                          keras.ops.convert_to_numpy(network(probe, training=False)))
    if not same:
        raise ValueError(f"Invalid --model={model_name!r}: with the run's weights its outputs differ from the "
                         "run's model (a layer whose computation differs).")
    return trained, network, manifest, metrics


def write_weights(network, path):
    """``network.save_weights`` to ``path`` (``*.weights.h5``), complete or absent (``atomic_path``)."""
    with atomic_path(path) as tmp:
        network.save_weights(tmp)
    return pathlib.Path(path)


def registry_entry(path, manifest, metrics, dataset, source):
    """The ``weights`` entry of the registry, as ``WeightsSpec``'s fields."""
    entry = {
        "file": path.name if path.parent == weights_lib.WEIGHTS_DIR else str(path),
        "sha256": weights_lib.sha256_of(path),
        "class_names": list(manifest.class_names),
        "dataset": dataset,
        "top1": round(float(metrics["test_accuracy"]), 4),
        "source": source,
    }
    if "test_top5_accuracy" in metrics:
        entry["top5"] = round(float(metrics["test_top5_accuracy"]), 4)
    return entry


def build_parser():
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m keras_preact_training.publish", description=__doc__.splitlines()[0]
    )
    parser.add_argument("run_dir", help="a finished keras-preact-train run directory")
    parser.add_argument("--model", required=True, help="the registry name of the trained network, e.g. cifar_resnet20")
    parser.add_argument("--weights", required=True, help="the weights' name, e.g. cifar10 (a Python identifier)")
    parser.add_argument("--dataset", default=None, help="what they were trained on (default: the run's dataset)")
    parser.add_argument("--out", default=str(weights_lib.WEIGHTS_DIR), help="default: keras_preact/weights/")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.weights.isidentifier():
        parser.error(f"argument --weights: {args.weights!r} is not a Python identifier")
    try:
        _, network, manifest, metrics = load_checked(args.run_dir, args.model)
    except ValueError as error:
        parser.exit(2, f"{parser.prog}: error: {str(error).splitlines()[0]}\n")
    path = write_weights(network, pathlib.Path(args.out) / f"{args.model}_{args.weights}{weights_lib.SUFFIX}")
    dataset = args.dataset or manifest.config.get("dataset", "")
    source = f"keras-preact-train --preset {manifest.name} (run {pathlib.Path(args.run_dir).name})"
    entry = registry_entry(path, manifest, metrics, dataset, source)
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    print(f"registry entry for {args.model} (keras_preact/models/presets.py):")
    print(json.dumps({args.weights: entry}, indent=4))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
