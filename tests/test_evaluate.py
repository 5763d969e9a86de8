"""``keras-preact-evaluate`` end to end on a tiny registered model whose weights file the test writes.

The test images are labelled so that exactly half are the model's own top-1 under the right
preprocessing (the model's mean/std); the CLI's top-1 must equal ``model.evaluate`` on the same data.
"""

import json
import re

import keras
import numpy as np
import pytest

from keras_preact.models import create_model, get_input_config, register_model
from keras_preact.models.registry import unregister_model
from keras_preact.models.weights import sha256_of
from keras_preact_training import evaluate as evaluate_lib
from keras_preact_training.run.manifest import RunManifest
from support import assert_printed_fractions, misnamed_metrics, randomize_statistics, to_numpy

NAME = "test_eval_tiny"
CLASSES = [f"c{k}" for k in range(6)]  # more than 5: top-5 is measured too
CIFAR16 = get_input_config("cifar_resnet20").replace(input_size=(16, 16, 3))


def _normalized(images, config):
    return (images.astype(np.float32) - np.asarray(config.mean, np.float32)) / np.asarray(config.std, np.float32)


def _register(tmp_path, config, name=NAME):
    keras.utils.set_random_seed(3)
    model = randomize_statistics(create_model("cifar_resnet20", depth=8, num_classes=len(CLASSES),
                                              input_shape=config.input_size), seed=3)
    path = tmp_path / f"{name}.weights.h5"
    model.save_weights(path)
    register_model(name, family="cifar", arguments={"depth": 8}, input_config=config, weights={
        "toy": dict(file=str(path), sha256=sha256_of(path), class_names=CLASSES, dataset="toy", top1=0.5)})
    return create_model(name, weights="toy")


def _write_folder(root, images, labels):
    from PIL import Image

    for split, items in (("train", [(images[0], k) for k in range(len(CLASSES))]), ("test", zip(images, labels))):
        for i, (image, label) in enumerate(items):
            folder = root / split / CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{i:03d}.png")  # lossless: every decoder agrees


def _half_right(model, images, inputs):
    """Labels: the model's top-1 for even images, another class for odd ones (top-1 exactly 0.5), with
    every class present (a folder needs every class)."""
    predicted = to_numpy(model(inputs)).argmax(-1)
    labels = predicted.copy()
    needed = [c for c in range(len(CLASSES)) if c not in predicted[::2]]
    for i in range(1, len(images), 2):
        label = next((c for c in needed if c != predicted[i]), (predicted[i] + 1) % len(CLASSES))
        needed = [c for c in needed if c != label]
        labels[i] = label
    assert not needed and (labels == predicted).mean() == 0.5
    return labels.astype(np.int32)


@pytest.fixture
def registered(tmp_path):
    """(model, data_dir, images, labels): the registered model with its ``toy`` weights and a folder
    of 16 PNGs at its input size, listed in file order."""
    model = _register(tmp_path, CIFAR16)
    images = np.random.default_rng(0).integers(0, 256, (16, 16, 16, 3), dtype=np.uint8)
    labels = _half_right(model, images, _normalized(images, CIFAR16))
    _write_folder(tmp_path / "data", images, labels)
    order = np.argsort(labels, kind="stable")  # the folder lists class by class
    yield model, tmp_path / "data", images[order], labels[order]
    unregister_model(NAME)


def _run(capsys, *argv):
    assert evaluate_lib.main([str(a) for a in argv]) == 0
    return capsys.readouterr().out


def _keras_metrics(model, inputs, labels):
    model.compile(loss="sparse_categorical_crossentropy",
                  metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5_accuracy")])
    return model.evaluate(inputs, labels, batch_size=5, verbose=0, return_dict=True)


@pytest.mark.notf
def test_registry_weights_on_a_folder_equal_model_evaluate(registered, tmp_path, capsys):
    model, data_dir, images, labels = registered
    out = _run(capsys, NAME, "--weights", "toy", "--data-dir", data_dir, "--json", tmp_path / "m.json",
               "--cache-dir", tmp_path / "cache", "--batch-size", 5)
    expected = _keras_metrics(model, _normalized(images, CIFAR16), labels)
    written = json.loads((tmp_path / "m.json").read_text())
    assert written["top1_accuracy"] == float(expected["accuracy"]) == 0.5
    assert written["top5_accuracy"] == float(expected["top5_accuracy"]) and written["images"] == 16
    assert written["input_config"] == CIFAR16.to_dict() and written["backend"] == keras.backend.backend()
    assert (f"top1_accuracy 0.5000, top5_accuracy {expected['top5_accuracy']:.4f} (registered: top1_accuracy 0.5000)"
            in out)


@pytest.mark.notf
def test_every_printed_and_written_accuracy_is_a_fraction_under_its_key(registered, tmp_path, capsys):
    """Issue 38: one unit everywhere. keras-preact-evaluate prints and writes top1_accuracy/top5_accuracy
    (and the registry's figures) as fractions in [0, 1], as keras-preact-train and Keras do: no %, no
    unnamed top-1 (it printed "top-1 50.00%" and wrote "top1")."""
    _, data_dir, _, _ = registered
    out = _run(capsys, NAME, "--weights", "toy", "--data-dir", data_dir, "--json", tmp_path / "m.json",
               "--cache-dir", tmp_path / "cache")
    assert "%" not in out, out
    assert_printed_fractions(out, {"top1_accuracy", "top5_accuracy"})
    written = json.loads((tmp_path / "m.json").read_text())
    assert {"top1_accuracy", "top5_accuracy"} <= set(written) and misnamed_metrics(written) == []


@pytest.mark.notf
def test_a_saved_model_and_a_run_directory_evaluate_the_same(registered, tmp_path, capsys):
    model, data_dir, _, _ = registered
    model.save(tmp_path / "tiny.keras")  # carries its input config and class names
    out = _run(capsys, tmp_path / "tiny.keras", "--data-dir", data_dir, "--cache-dir", tmp_path / "cache")
    assert "top1_accuracy 0.5000" in out
    run = tmp_path / "run"
    run.mkdir()
    plain = keras.Model(model.inputs, model.outputs)  # no input config of its own: the manifest's is used
    plain.save(run / "model.keras")
    manifest = RunManifest(name="tiny", class_names=tuple(CLASSES), input_config=CIFAR16, config={})
    (run / "config.json").write_text(manifest.to_json())
    assert "top1_accuracy 0.5000" in _run(capsys, run / "model.keras", "--data-dir", data_dir)  # beside its config.json
    # The run directory itself (``python -m keras_preact_training.evaluate RUN`` in a process of its own: in
    # test_evaluate_memory_guard.py's --memory-limit 0 run).
    out = _run(capsys, run, "--data-dir", data_dir, "--json", tmp_path / "run.json")
    assert "top1_accuracy 0.5000" in out and json.loads((tmp_path / "run.json").read_text())["top1_accuracy"] == 0.5


@pytest.mark.notf
@pytest.mark.parametrize(
    "argv, message",
    [
        (["resnet9000", "--weights", "toy"], "Invalid model='resnet9000': not a run directory"),
        ([NAME, "--weights", "imagenet"], f"Invalid weights='imagenet' for {NAME}. Allowed values: None, 'toy'"),
        ([NAME], "Invalid --weights: a registry model is evaluated with its trained weights"),
        (["cifar_resnet32", "--weights", "cifar10"], "Allowed values: None \\(no trained weights are registered"),
        (
            ["cifar_resnet20", "--weights", "cifar10"],
            "its 6 classes are not the model's 10 class_names .*: 6 not the model's: 'c0', "
            ".*; 10 of the model's missing: 'airplane'",
        ),
        ([NAME, "--weights", "toy", "--data-dir", "{tmp}/nowhere"], "data_dir='.*nowhere' is not a directory"),
        (["{tmp}/data", "--weights", "toy"], "Invalid --weights='toy': only a registry model name takes --weights"),
        (["{tmp}/absent.keras"], "Invalid model='.*absent.keras': no such .keras file"),
        ([NAME, "--weights", "toy", "--dataset", "not_a_tfds_name", "--data-dir", "{tmp}"], "not_a_tfds_name"),
    ],
)
def test_bad_arguments_fail_first_in_one_line(registered, tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setattr(evaluate_lib, "evaluate", lambda *a, **k: pytest.fail("evaluated despite a bad argument"))
    with pytest.raises(SystemExit) as exit_info:
        evaluate_lib.main([a.format(tmp=tmp_path) for a in argv] + ([] if "--data-dir" in argv else
                                                                     ["--data-dir", str(registered[1])]))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("keras-preact-evaluate: error: ") and re.search(message, err), err


@pytest.mark.notf
def test_classes_that_are_not_the_models_fail_first(registered, tmp_path, capsys):
    _, data_dir, _, _ = registered
    (data_dir / "test" / "c5").rename(data_dir / "test" / "z5")
    with pytest.raises(SystemExit) as exit_info:
        evaluate_lib.main([NAME, "--weights", "toy", "--data-dir", str(data_dir)])
    assert exit_info.value.code == 2
    assert "Invalid --data-dir: its 6 classes are not the model's 6 class_names (same names, same order): 1 not the " \
           "model's: 'z5'; 1 of the model's missing: 'c5'." in capsys.readouterr().err


@pytest.mark.notf
def test_an_extra_or_reordered_class_is_named(registered, tmp_path, capsys):
    """An 11th class in test/ is named (the first ten are the model's: listing them twice said nothing); a
    renamed class is named both ways; the same names in another order name the first place they differ."""
    from keras_preact_training.evaluate import class_mismatch

    _, data_dir, _, _ = registered
    extra = data_dir / "test" / "zz_extra"
    extra.mkdir()
    extra.joinpath("000.png").write_bytes(next((data_dir / "test" / CLASSES[0]).glob("*.png")).read_bytes())
    with pytest.raises(SystemExit) as exit_info:
        evaluate_lib.main([NAME, "--weights", "toy", "--data-dir", str(data_dir)])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.endswith(f"its {len(CLASSES) + 1} classes are not the model's {len(CLASSES)} class_names (same names, "
                        "same order): 1 not the model's: 'zz_extra'."), err
    assert class_mismatch(["a", "b", "c"], ["a", "x", "c"]).endswith(
        "1 not the model's: 'x'; 1 of the model's missing: 'b'.")
    assert class_mismatch(["a", "b", "c"], ["a", "c", "b"]).endswith(
        "the same names in another order: class 1 is 'c' where the model's is 'b'.")


@pytest.mark.notf
def test_images_needing_the_evaluation_view_evaluate_on_every_backend(tmp_path, capsys):
    """Images of another size than the model's go through the evaluation view on every backend: the EvalView
    layer on Pillow-decoded files on JAX and PyTorch (no TensorFlow), eval_view in tf.data on TensorFlow (the
    same numbers: tests/test_eval_view.py). The CLI's top-1 is model.evaluate's on the layer's views."""
    from keras_preact.layers import EvalView

    config = CIFAR16.replace(crop_fraction=0.875)  # shorter side 19, centre 16 x 16
    model = _register(tmp_path, config, "test_eval_view")
    try:
        images = np.random.default_rng(1).integers(0, 256, (16, 20, 24, 3), dtype=np.uint8)
        views = np.stack([to_numpy(EvalView(config)(image)) for image in images])
        labels = _half_right(model, images, views)
        _write_folder(tmp_path / "data", images, labels)
        out = _run(capsys, "test_eval_view", "--weights", "toy", "--data-dir", tmp_path / "data",
                   "--json", tmp_path / "m.json")
        order = np.argsort(labels, kind="stable")
        expected = _keras_metrics(model, views[order], labels[order])
        assert json.loads((tmp_path / "m.json").read_text())["top1_accuracy"] == float(expected["accuracy"]) == 0.5
        assert "top1_accuracy 0.5000" in out
    finally:
        unregister_model("test_eval_view")


def test_the_evaluation_view_path_equals_model_evaluate_on_eval_view(tmp_path, capsys):
    tf = pytest.importorskip("tensorflow", reason="the evaluation view (resize, centre crop) is tf.image")
    from keras_preact.preprocessing import eval_view

    config = CIFAR16.replace(crop_fraction=0.875)  # shorter side 19, centre 16 x 16
    model = _register(tmp_path, config, "test_eval_view")
    try:
        images = np.random.default_rng(1).integers(0, 256, (16, 20, 24, 3), dtype=np.uint8)
        views = np.stack([eval_view(tf.constant(image), config).numpy() for image in images])
        labels = _half_right(model, images, _normalized(views, config))
        _write_folder(tmp_path / "data", images, labels)
        out = _run(capsys, "test_eval_view", "--weights", "toy", "--data-dir", tmp_path / "data",
                   "--json", tmp_path / "m.json")
        order = np.argsort(labels, kind="stable")
        expected = _keras_metrics(model, _normalized(views[order], config), labels[order])
        assert json.loads((tmp_path / "m.json").read_text())["top1_accuracy"] == float(expected["accuracy"]) == 0.5
        assert "top1_accuracy 0.5000" in out
    finally:
        unregister_model("test_eval_view")
