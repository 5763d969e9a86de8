"""``keras-preact-export RUN_DIR``: a run directory's manifest drives the SavedModel (class names, pixel
statistics, the evaluation view), in the current and the first ``config.json`` format."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from keras_preact_training import export as export_lib
from keras_preact_training.recipe.configs import get_config
from keras_preact_training.run.manifest import FORMAT, RunManifest, config_from_run, input_config_for
from support import CLASS_NAMES, MEAN, STD, make_export_model

REPO = pathlib.Path(__file__).resolve().parents[1]
tf = pytest.importorskip("tensorflow")  # SavedModels; the TensorFlow-free refusal is tested in test_training_backends


def reference(model, images):
    normalized = (images.astype(np.float32) - np.float32(MEAN)) / np.float32(STD)
    return np.asarray(model.predict(normalized, verbose=0))


def write_run(run_dir, model, manifest):
    run_dir.mkdir(parents=True)
    model.save(run_dir / "model.keras")
    (run_dir / "config.json").write_text(json.dumps(manifest))


def manifest_for(config):
    return RunManifest(
        name="cifar_run",
        class_names=tuple(CLASS_NAMES),
        input_config=input_config_for(config, MEAN, STD),
        config={"name": config.name, "normalization": config.normalization},
    ).to_dict()


LEGACY = {"name": "cifar_run", "class_names": CLASS_NAMES, "image_size": [32, 32],
          "normalization": {"mean": MEAN, "std": STD}, "normalization_name": "cifar10", "depth": 8}


@pytest.mark.parametrize("manifest", [manifest_for(get_config("synthetic-resnet8", image_size=(32, 32))), LEGACY],
                         ids=[FORMAT, "first-format"])
def test_export_run_and_cli_use_the_run_manifest(tmp_path, capsys, manifest):
    model = make_export_model()
    write_run(tmp_path / "run", model, manifest)
    path = export_lib.export_run(tmp_path / "run", tmp_path / "exports")
    assert path == tmp_path / "exports" / "cifar_run" / "1"
    if manifest is not LEGACY:  # the command line's flags, once: it hands the run to export_run, checked for both
        assert export_lib.main([str(tmp_path / "run"), "--export-dir", str(tmp_path / "exports"), "--name", "other",
                                "--version", "4"]) == 0
        assert capsys.readouterr().out.strip() == str(tmp_path / "exports" / "other" / "4")
    images = np.random.default_rng(2).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    out = tf.saved_model.load(str(path)).signatures["serving_default"](images=tf.constant(images))
    np.testing.assert_allclose(out["probabilities"].numpy(), reference(model, images), atol=1e-5)
    assert (path / "assets" / "class_names.txt").read_text().splitlines() == CLASS_NAMES
    assert json.loads((path / "assets" / "preprocessing.json").read_text())["crop_fraction"] == 1.0


@pytest.mark.parametrize("eval_size, crop_fraction, served", [(None, 0.875, 224), ((320, 320), 1.0, 320)])
def test_an_imagenet_run_serves_the_view_it_was_evaluated_on(eval_size, crop_fraction, served):
    config = get_config("t5-resnet200-preact", eval_image_size=eval_size)
    input_config = RunManifest.from_dict(manifest_for(config)).input_config
    assert input_config.crop_fraction == crop_fraction and input_config.crop_size == (served, served)


def test_manifest_round_trip_and_errors(tmp_path):
    manifest = RunManifest.from_dict(manifest_for(get_config("synthetic-resnet8")))
    assert RunManifest.from_json(manifest.to_json()) == manifest
    assert manifest.num_classes == 10 and manifest.image_size == (32, 32)
    with pytest.raises(ValueError, match="format 'keras-preact-run/99'"):
        RunManifest.from_dict({**manifest.to_dict(), "format": "keras-preact-run/99"})
    with pytest.raises(ValueError, match="missing key.*input_config"):
        RunManifest.from_dict({k: v for k, v in manifest.to_dict().items() if k != "input_config"})
    # The first format without the normalization's name cannot be re-run: no silent "cifar10".
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in LEGACY.items() if k != "normalization_name"}))
    with pytest.raises(ValueError, match="lacks normalization"):
        config_from_run(tmp_path)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{missing}"], "config.json is missing"),
        (["{run}", "--version", "0"], "--version: invalid value '0'"),
        (["{run}", "--top-k", "zero"], "--top-k: invalid value 'zero'"),
        (["{bad_config}"], "it needs the keys"),
        (
            ["{model_file}"],
            "Invalid run_dir='{model_file}': a file; keras-preact-export takes a run directory written by "
            "keras-preact-train (config.json and model.keras): keras-preact-export {run}\n",
        ),
        (
            ["{other_file}"],
            "Invalid run_dir='{other_file}': a file; keras-preact-export takes a run directory written "
            "by keras-preact-train (config.json and model.keras); a .keras file of your own exports with "
            "keras_preact.export.export_model(keras.saving.load_model(path))\n",
        ),
    ],
)
def test_cli_rejects_bad_input_with_a_message(tmp_path, capsys, argv, message):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"name": "x"}))
    (tmp_path / "bad" / "model.keras").write_bytes(b"PK\x03\x04\xff\xfe")  # binary, as a .keras zip
    (tmp_path / "mine.keras").write_bytes(b"PK\x03\x04\xff\xfe")
    paths = {"missing": tmp_path / "nope", "run": tmp_path / "bad", "bad_config": tmp_path / "bad",
             "model_file": tmp_path / "bad" / "model.keras", "other_file": tmp_path / "mine.keras"}
    with pytest.raises(SystemExit) as exit_info:
        export_lib.main([a.format(**paths) for a in argv] + ["--export-dir", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert message.format(**paths) in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_two_class_run_exports_with_the_defaults_and_the_top_k_flag(tmp_path, capsys):
    """top_k defaults to min(5, classes): a 2-class run (a fine-tuning folder of two classes) exports as
    ``keras-preact-train --export`` calls it; ``--top-k`` sets it, checked against the classes first."""
    from keras_preact.models import cifar_resnet

    model = cifar_resnet(8, 2, input_shape=(16, 16, 3), input_config=None)
    config = get_config("synthetic-resnet8", image_size=(16, 16))
    manifest = {**manifest_for(config), "class_names": ["cat", "dog"]}
    write_run(tmp_path / "run", model, manifest)
    images = np.random.default_rng(0).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    path = export_lib.export_run(tmp_path / "run", tmp_path / "exports")
    out = tf.saved_model.load(str(path)).signatures["serving_default"](images=tf.constant(images))
    assert out["classes"].shape == (3, 2) and out["class_names"].shape == (3, 2)
    assert sorted(out["class_names"].numpy()[0].tolist()) == [b"cat", b"dog"]
    assert export_lib.main([str(tmp_path / "run"), "--export-dir", str(tmp_path / "exports"), "--top-k", "1"]) == 0
    path = tmp_path / "exports" / "cifar_run" / "2"
    assert capsys.readouterr().out.strip() == str(path)
    out = tf.saved_model.load(str(path)).signatures["serving_default"](images=tf.constant(images))
    np.testing.assert_array_equal(out["classes"].numpy()[:, 0], np.argmax(out["probabilities"].numpy(), axis=1))
    assert out["scores"].shape == (3, 1)
    with pytest.raises(SystemExit) as exit_info:
        export_lib.main([str(tmp_path / "run"), "--export-dir", str(tmp_path / "exports"), "--top-k", "3"])
    assert exit_info.value.code == 2
    assert "Invalid top_k=3: expected an integer in [1, 2] (num_classes)" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "exports" / "cifar_run").iterdir()) == ["1", "2"]


def test_training_a_two_class_folder_with_export_serves_the_folders_class_names(tmp_path, capsys):
    """The fine-tuning journey in the training app: ``--dataset folder --export`` on two classes trains,
    then exports (top_k 2 by default) under the run's name with the folder's class names."""
    from PIL import Image

    from keras_preact_training.train import train
    from support import TRAIN_JIT_COMPILE

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in ("cat", "dog"):
            (tmp_path / "data" / split / c).mkdir(parents=True)
            for i in range(8):
                Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(
                    tmp_path / "data" / split / c / f"{i}.png"
                )
    config = get_config(
        "synthetic-resnet8",
        dataset="folder",
        data_dir=str(tmp_path / "data"),
        normalization="centered",
        image_size=(16, 16),
        batch_size=8,
        epochs=1,
        steps_per_epoch=2,
        name="pets",
        run_dir=str(tmp_path / "run"),
        export=True,
        export_dir=str(tmp_path / "exports"),
        verbose=0,
        jit_compile=TRAIN_JIT_COMPILE,
    )
    metrics = train(config)
    path = tmp_path / "exports" / "pets" / "1"
    assert metrics["export_dir"] == str(path)
    assert (path / "assets" / "class_names.txt").read_text().splitlines() == ["cat", "dog"]
    images = rng.integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)
    out = tf.saved_model.load(str(path)).signatures["serving_default"](images=tf.constant(images))
    assert out["classes"].shape == (2, 2) and sorted(out["class_names"].numpy()[0].tolist()) == [b"cat", b"dog"]


TORCH_ANSWERS = """
import sys
import numpy as np
from keras_preact.export import ServingContract, serving_model
from keras_preact_training.export import load_run_model
from keras_preact_training.run.manifest import RunManifest

run_dir, images_file = sys.argv[1:3]
model = load_run_model(f"{run_dir}/model.keras")
contract = ServingContract(RunManifest.read(run_dir).input_config, top_k=1)
probabilities = serving_model(model, contract)(np.load(images_file))["probabilities"]
np.save(images_file + ".torch.npy", np.asarray(probabilities.detach().cpu()))
"""


@pytest.mark.any_backend  # the run trains on PyTorch whichever backend the pass's is
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch beside TensorFlow")
def test_a_run_trained_on_pytorch_writes_its_saved_model_through_tensorflow(tmp_path):
    """Keras writes no SavedModel from PyTorch: keras-preact-train on PyTorch, with TensorFlow installed, writes it
    from a child process on TensorFlow (the README's main install has both), and the SavedModel answers as the
    trained model does on PyTorch."""
    environ = {**os.environ, "KERAS_BACKEND": "torch", "TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)}
    run_dir, exported = tmp_path / "run", tmp_path / "exported"
    done = subprocess.run([sys.executable, "-m", "keras_preact_training.cli", "--depth", "8", "--image-size", "16",
                           "16", "--synthetic-train-size", "64", "--synthetic-test-size", "32", "--batch-size", "16",
                           "--epochs", "1", "--steps-per-epoch", "2", "--verbose", "0", "--run-dir", str(run_dir),
                           "--export-dir", str(exported)], cwd=REPO, env=environ, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "[backend] torch" in done.stdout
    assert "on TensorFlow, in a child process (Keras writes no SavedModel from the torch backend)" in done.stdout
    version_dir = pathlib.Path(done.stdout.split("[train] exported SavedModel to ", 1)[1].splitlines()[0])
    assert version_dir.parent.parent == exported and (version_dir / "saved_model.pb").is_file()

    images = np.random.default_rng(0).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    np.save(tmp_path / "images.npy", images)
    torch_side = subprocess.run([sys.executable, "-c", TORCH_ANSWERS, str(run_dir), str(tmp_path / "images.npy")],
                                cwd=REPO, env=environ, capture_output=True, text=True, timeout=300)
    assert torch_side.returncode == 0, torch_side.stderr[-3000:]
    trained = np.load(tmp_path / "images.npy.torch.npy")
    served = tf.saved_model.load(str(version_dir)).signatures["serving_default"](images=tf.constant(images))
    np.testing.assert_allclose(served["probabilities"].numpy(), trained, rtol=0, atol=1e-6)
    assert not np.allclose(trained, trained[:1])  # the images are told apart: the comparison can fail


def test_the_export_on_tensorflow_says_why_it_failed_in_one_line(tmp_path):
    """A failed child export is a RuntimeError carrying the child's last line (here: no model.keras), and the
    command that re-runs it; nothing is written."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(manifest_for(get_config("synthetic-resnet8"))))
    with pytest.raises(RuntimeError) as failed:
        export_lib.export_in_tensorflow(run_dir, tmp_path / "exported")
    message = str(failed.value)
    assert message.startswith(f"the export on TensorFlow (keras-preact-export {run_dir} --export-dir "), message
    assert "failed with exit 2: " in message and "model.keras is missing" in message and "\n" not in message
    assert not (tmp_path / "exported").exists()
