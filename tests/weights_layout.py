"""The saved-weights layout of representative models, pinned so that a change of it is deliberate.

Keras addresses a weight in a ``.weights.h5`` / ``.keras`` file by the attribute path that reaches its layer
(``layers/residual_unit/_sublayers/conv2d/vars/0``), so a refactor of ``ResidualUnit`` can silently make
every saved file unloadable. ``tests/data/weights_layout.json`` records, for the models below, each weight's
path and shape (in ``model.weights`` order), its key in the weights file, its initial values under a fixed
seed (sum and sum of squares, TensorFlow) and the model's outputs for deterministic weights.
``tests/test_weights_layout.py`` checks the current code against it.

The layout changed once, deliberately (issue 34, item 5): the units' weights moved from the views kept for
older files (``_before/container_1/batch_normalization``, ``_convs/conv2d_1``, ...) to the unit's one list
of sublayers (``_sublayers/batch_normalization_1``, ``_sublayers/conv2d_1``); only ``file_keys`` changed in
the record (the weights' paths, order, initial values and the outputs are those recorded before), and the
shipped weights and ``tests/data/units_v1.keras`` were converted (same values, same config).

Regenerate only from the code whose files must keep loading (``PYTHONPATH=<that checkout> python
tests/weights_layout.py``); ``tests/data/units_v1.keras`` is written by the same run.
"""

import json
import os
import pathlib
import sys
import tempfile
import zipfile

import h5py
import keras
import numpy as np

DATA = pathlib.Path(__file__).parent / "data"
LAYOUT_FILE = DATA / "weights_layout.json"
UNITS_FILE = DATA / "units_v1.keras"
SEED = 1234
ORDERINGS = ("original", "bn_after_addition", "relu_before_addition", "relu_only_preact", "full_preact")
SHORTCUTS = ("identity", "constant_scaling", "exclusive_gating", "shortcut_only_gating", "conv1x1", "dropout")
# One unit model per ordering, per shortcut and per other structural option.
UNIT_VARIANTS = {
    **{f"ordering_{o}": {"ordering": o} for o in ORDERINGS},
    **{f"shortcut_{s}": {"shortcut": s} for s in SHORTCUTS},
    "shortcut_type_A": {"shortcut_type": "A"},
    "shortcut_type_C": {"shortcut_type": "C", "ordering": "original"},
    "bottleneck_stride_first": {"block": "bottleneck", "stride_position": "first", "preactivate_shortcut": True},
    "bottleneck_original_zero_init": {"block": "bottleneck", "ordering": "original", "zero_init_residual": True},
    "one_layer_skip_preactivation": {"block": "one_layer", "skip_preactivation": True},
    "group_norm_output_bias_dropout": {"normalization": "group", "norm_groups": 4, "output_bias": True,
                                       "dropout_rate": 0.1, "drop_path_rate": 0.1},
}


def unit_model(options, channels=4, filters=8):
    """Two units: one that changes shape (stride 2, more channels) and one that keeps it."""
    from keras_preact.layers import ResidualUnit

    inputs = keras.Input((8, 8, channels))
    x = ResidualUnit(filters, strides=2, name="down", **options)(inputs)
    x = ResidualUnit(filters, name="same", **options)(x)
    return keras.Model(inputs, x)


def units_model():
    """Every unit variant side by side: the committed ``.keras`` file."""
    from keras_preact.layers import ResidualUnit

    inputs = keras.Input((8, 8, 4))
    outputs = [ResidualUnit(8, strides=2, name=name, **options)(inputs) for name, options in UNIT_VARIANTS.items()]
    return keras.Model(inputs, outputs)


def models():
    from keras_preact.models import cifar_resnet, imagenet_resnet

    return {
        "cifar_resnet20": lambda: cifar_resnet(20),
        "cifar_resnet164": lambda: cifar_resnet(164),
        "imagenet_resnet18": lambda: imagenet_resnet(18, input_shape=(64, 64, 3)),
        **{f"unit_{name}": (lambda o=options: unit_model(o)) for name, options in UNIT_VARIANTS.items()},
    }


def weight_paths(model):
    return [[v.path, list(v.shape)] for v in model.weights]


def file_keys(model):
    """Each weight's key in a ``.weights.h5`` file, in ``model.weights`` order, and any other dataset."""
    for i, v in enumerate(model.weights):
        v.assign(np.full(v.shape, i + 1, v.dtype))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.weights.h5")
        model.save_weights(path)
        found = {}
        with h5py.File(path, "r") as f:
            f.visititems(
                lambda key, obj: found.__setitem__(key, np.asarray(obj)) if isinstance(obj, h5py.Dataset) else None
            )
    keys, others = [None] * len(model.weights), []
    for key, value in sorted(found.items()):
        index = int(value.flat[0]) - 1 if value.size and np.all(value == value.flat[0]) else -1
        if 0 <= index < len(keys) and keys[index] is None and list(value.shape) == list(model.weights[index].shape):
            keys[index] = key
        else:
            others.append([key, list(value.shape)])
    return keys, others


def deterministic_weights(model):
    """Weights from a fixed rule on each weight's place (no randomness of Keras' own)."""
    for i, v in enumerate(model.weights):
        rng = np.random.default_rng(i)
        if v.path.endswith(("moving_variance", "gamma", "scale")):
            value = rng.uniform(0.5, 1.5, v.shape)
        else:
            fan_in = int(np.prod(v.shape[:-1])) if len(v.shape) > 1 else 16
            value = rng.uniform(-1.0, 1.0, v.shape) * np.sqrt(3.0 / fan_in)
        v.assign(value.astype(v.dtype))


def sample_input(model):
    shape = [2 if d is None else d for d in model.inputs[0].shape]
    return np.random.default_rng(0).uniform(0.0, 1.0, shape).astype("float32")


def outputs_summary(model):
    """The outputs on ``sample_input``: at most 64 values per output and each output's sums."""
    outputs = model.predict(sample_input(model), verbose=0)
    outputs = outputs if isinstance(outputs, list) else [outputs]
    summary = []
    for out in outputs:
        flat = np.asarray(out, "float64").ravel()
        step = max(1, flat.size // 64)
        summary.append({"sum": float(flat.sum()), "abs_sum": float(np.abs(flat).sum()), "step": step,
                        "values": [float(x) for x in flat[::step][:64]]})
    return summary


def init_summary(build):
    keras.utils.set_random_seed(SEED)
    model = build()
    return [[float(np.sum(np.asarray(v, "float64"))), float(np.sum(np.square(np.asarray(v, "float64"))))]
            for v in model.weights]


def describe(build):
    keras.utils.clear_session(free_memory=False)
    record = {"init": init_summary(build)}
    keras.utils.clear_session(free_memory=False)
    model = build()
    record["weights"] = weight_paths(model)
    record["file_keys"], record["other_datasets"] = file_keys(model)
    deterministic_weights(model)
    record["outputs"] = outputs_summary(model)
    return record


def main():
    import keras_preact

    layout = {"keras_preact": keras_preact.__file__, "backend": keras.backend.backend(),
              "keras": keras.__version__, "models": {}}
    for name, build in models().items():
        print(name, file=sys.stderr)
        layout["models"][name] = describe(build)
    keras.utils.clear_session(free_memory=False)
    model = units_model()
    deterministic_weights(model)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "units.keras")
        model.save(path)
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(UNITS_FILE, "w", zipfile.ZIP_DEFLATED) as dst:
            for item in src.infolist():  # deflated: a third of the size, and Keras reads it as it is
                dst.writestr(item.filename, src.read(item.filename))
    layout["units_file_outputs"] = outputs_summary(model)
    LAYOUT_FILE.write_text(_dumps(layout))


def _dumps(layout):
    """Compact JSON, one model a line; floats to 9 significant digits."""
    def rounded(x):
        if isinstance(x, float):
            return float(f"{x:.9g}")
        if isinstance(x, (list, tuple)):
            return [rounded(e) for e in x]
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        return x

    layout = rounded(layout)
    models = layout.pop("models")
    lines = [f"{json.dumps(k)}:{json.dumps(v, separators=(',', ':'))}" for k, v in models.items()]
    head = json.dumps(layout, separators=(",", ":"))[:-1]
    return head + ',"models":{\n' + ",\n".join(lines) + "\n}}\n"


if __name__ == "__main__":
    main()
