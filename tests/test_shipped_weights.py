"""The trained weights that ship with the package, on every backend (issue 22, item 4-5).

For every registry entry's weights: ``create_model(name, weights=...)`` loads the package file by its
sha256; the model carries its input config and class names through ``.keras`` save/load; and on a probe
of real CIFAR-10 test images (the first 10 of each class from ``../shared/data/cifar10-jpeg.tar.gz``,
decoded by Pillow as the TensorFlow-free path does) it gives the probabilities recorded on TensorFlow in
``tests/shipped_weights_probe.json``. And ``keras-preact-evaluate`` on the whole test split (10,000 images,
once) must reproduce the registry's top-1 within 0.05 points: the probe's 100 images would
let a regression of a few points pass. The whole split runs once, in CI's TensorFlow-free JAX pass (``once``):
decoding is Pillow's and the batches are numpy's in every environment, and each backend's outputs are the probe's.

Each shipped file holds, bit for bit, the weights of the trained model it was published from
(``keras_preact_training.publish``; the run's ``model.keras`` is committed under ``reproduction/``, ``PUBLISHED_FROM``).

Re-record the probe after shipping new weights (on TensorFlow)::

    KERAS_BACKEND=tensorflow python tests/test_shipped_weights.py
"""

import io
import json
import os
import pathlib
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from keras_preact.models import create_model, list_models, model_spec
from support import require_data

pytestmark = pytest.mark.notf

REPO = pathlib.Path(__file__).resolve().parents[1]
CIFAR_TAR = REPO.parent / "shared" / "data" / "cifar10-jpeg.tar.gz"
PROBE_FILE = pathlib.Path(__file__).with_name("shipped_weights_probe.json")
PER_CLASS = 10
SHIPPED = [(name, weights) for name in list_models() for weights, spec in model_spec(name).weights.items()
           if spec.origin == "package"]  # published checkpoints of other libraries: tests/test_pretrained_*.py
# The run each shipped weights file was published from (its final model, committed with the run's history).
PUBLISHED_FROM = {
    "cifar_resnet20/cifar10": REPO / "reproduction/cifar10-preact-resnet20-paper/ours-jax-h100-seed0/model.keras",
}


def _cifar_members(split, per_class=None):
    """(member name, class name, JPEG bytes) of the tarball's ``split``, the first ``per_class`` of each
    class by file number (all with None), sorted by class then number."""
    require_data(CIFAR_TAR, "the CIFAR-10 JPEG tarball")
    found = []
    with tarfile.open(CIFAR_TAR) as tar:
        for member in tar:
            parts = pathlib.PurePosixPath(member.name).parts
            if member.isfile() and len(parts) == 4 and parts[1] == split:
                number = int(pathlib.PurePosixPath(parts[3]).stem)
                if per_class is None or number < per_class:
                    found.append((parts[2], number, member.name, tar.extractfile(member).read()))
    return [(name, label, data) for label, _, name, data in sorted(found)]


def _probe_inputs(input_config):
    """(member names, labels as class names, normalized float32 images) of the probe."""
    from PIL import Image

    members = _cifar_members("test", PER_CLASS)
    pixels = np.stack([np.asarray(Image.open(io.BytesIO(data)).convert("RGB")) for _, _, data in members])
    mean, std = np.asarray(input_config.mean, np.float32), np.asarray(input_config.std, np.float32)
    return [m for m, _, _ in members], [c for _, c, _ in members], (pixels.astype(np.float32) - mean) / std


def _probabilities(model, images):
    import keras

    return keras.ops.convert_to_numpy(model.predict(images, batch_size=50, verbose=0))


def _recorded(name, weights):
    recorded = json.loads(PROBE_FILE.read_text(encoding="utf-8")) if PROBE_FILE.exists() else {}
    key = f"{name}/{weights}"
    assert key in recorded, f"{key} has no recorded probe: run `python tests/test_shipped_weights.py`"
    return recorded[key]


@pytest.mark.parametrize("name, weights", SHIPPED)
def test_shipped_weights_load_carry_their_config_and_give_the_recorded_outputs(name, weights, tmp_path):
    import keras

    spec, trained = model_spec(name), model_spec(name).weights[weights]
    model = create_model(name, weights=weights)
    assert model.class_names == trained.class_names and model.input_config == spec.input_config
    model.save(tmp_path / "shipped.keras")
    reloaded = keras.saving.load_model(tmp_path / "shipped.keras")
    assert reloaded.class_names == trained.class_names and reloaded.input_config == spec.input_config

    recorded = _recorded(name, weights)
    files, labels, images = _probe_inputs(spec.input_config)
    assert files == recorded["files"]
    probabilities = _probabilities(reloaded, images)
    np.testing.assert_allclose(probabilities, np.asarray(recorded["probabilities"]), atol=2e-4)
    predicted = [trained.class_names[k] for k in probabilities.argmax(-1)]
    accuracy = np.mean([p == t for p, t in zip(predicted, labels)])
    assert accuracy == recorded["accuracy"] and accuracy >= 0.8  # trained weights, not a fresh draw


def test_every_shipped_weights_file_names_the_run_it_was_published_from():
    assert sorted(PUBLISHED_FROM) == sorted(f"{name}/{weights}" for name, weights in SHIPPED)


@pytest.mark.parametrize("key", sorted(PUBLISHED_FROM))
def test_shipped_weights_hold_the_values_of_the_trained_model_they_were_published_from(key):
    import keras

    name, weights = key.split("/")
    shipped = create_model(name, weights=weights)
    trained = keras.saving.load_model(PUBLISHED_FROM[key], compile=False)
    assert [v.path for v in trained.weights] == [v.path for v in shipped.weights]
    for a, b in zip(trained.weights, shipped.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), err_msg=a.path)


@pytest.mark.parametrize("name, weights", SHIPPED)
def test_a_changed_weights_file_is_refused_by_its_sha256(name, weights, tmp_path, monkeypatch):
    import dataclasses

    from keras_preact.models import registry

    spec = model_spec(name)
    copy = tmp_path / "copy.weights.h5"
    data = bytearray(spec.weights[weights].path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte changed
    copy.write_bytes(bytes(data))
    changed = dataclasses.replace(spec.weights[weights], file=str(copy))
    monkeypatch.setitem(registry._REGISTRY, name, dataclasses.replace(spec, weights={weights: changed}))
    with pytest.raises(ValueError, match=r"has sha256 [0-9a-f]{64}, the registry expects"):
        create_model(name, weights=weights)


# The probe above checks each backend's outputs; the whole split (Pillow's decoding, numpy's batches: the same with
# TensorFlow installed or not) once. On TensorFlow it took 67 s of a CI worker (2-core AMD EPYC), on JAX 41 s.
@pytest.mark.any_backend
@pytest.mark.once
@pytest.mark.parametrize("name, weights", SHIPPED)
def test_the_whole_test_split_reproduces_the_registered_top1(name, weights, tmp_path):
    """``keras-preact-evaluate NAME --weights W`` on all 10,000 test images, in a fresh process on this
    backend: the registry's top-1 and top-5 within 0.05 points."""
    root = tmp_path / "cifar10"
    for split, per_class in (("train", 1), ("test", None)):
        for member, label, data in _cifar_members(split, per_class):
            path = root / split / label / pathlib.PurePosixPath(member).name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_preact_training.evaluate",
            name,
            "--weights",
            weights,
            "--data-dir",
            str(root),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--json",
            str(tmp_path / "m.json"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads((tmp_path / "m.json").read_text())
    assert measured["images"] == 10000
    assert abs(measured["top1_accuracy"] - model_spec(name).weights[weights].top1) <= 0.0005
    assert abs(measured["top5_accuracy"] - model_spec(name).weights[weights].top5) <= 0.0005


def record():
    """Write the probe's probabilities for every shipped weights (run on TensorFlow)."""
    import keras

    assert keras.backend.backend() == "tensorflow", "record the probe on TensorFlow"
    recorded = {}
    for name, weights in SHIPPED:
        spec = model_spec(name)
        files, labels, images = _probe_inputs(spec.input_config)
        probabilities = _probabilities(create_model(name, weights=weights), images)
        predicted = [spec.weights[weights].class_names[k] for k in probabilities.argmax(-1)]
        recorded[f"{name}/{weights}"] = {
            "files": files,
            "accuracy": float(np.mean([p == t for p, t in zip(predicted, labels)])),
            "probabilities": np.round(probabilities.astype(np.float64), 6).tolist(),
        }
    PROBE_FILE.write_text(json.dumps(recorded, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {PROBE_FILE}: {', '.join(recorded)}")


if __name__ == "__main__":
    record()
