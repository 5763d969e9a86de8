"""Training on every backend, with or without TensorFlow: on-device input, the CLI end to end on real
JPEGs, one-line messages for what needs TensorFlow, and errors from inside ``fit`` in one line.

CI runs the ``notf`` tests in an environment without TensorFlow on JAX and on PyTorch (``.ci/run``),
and with TensorFlow on the TensorFlow backend.
"""

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile

import keras
import numpy as np
import pytest

from keras_preact_training import cli
from keras_preact_training import train as train_lib
from keras_preact_training.data import pipelines, sources
from keras_preact_training.machine import backends
from keras_preact_training.recipe import augment, configs
from keras_preact_training.run import run_dir as run_files
from support import (
    ONE_THREAD,
    TRAIN_JIT_COMPILE,
    assert_printed_fractions,
    assert_uniform_crop_draws,
    crop_draws,
    misnamed_metrics,
    printed_metrics,
    require_data,
)

pytestmark = pytest.mark.notf

REPO = pathlib.Path(__file__).resolve().parents[1]
CIFAR_TAR = REPO.parent / "shared" / "data" / "cifar10-jpeg.tar.gz"
HAS_TF = importlib.util.find_spec("tensorflow") is not None
TINY = dict(depth=8, image_size=(16, 16), synthetic_train_size=96, synthetic_test_size=32, batch_size=16,
            epochs=2, steps_per_epoch=3, checkpoint_every=2, verbose="0", export=False, jit_compile=TRAIN_JIT_COMPILE)


def env():
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)  # a checkout's overlay first
    return {**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "3", **ONE_THREAD}


def run_cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "keras_preact_training.cli", *args], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=timeout)


def saved_weights(path):
    import keras_preact.layers  # noqa: F401  (registers ResidualUnit)

    return [np.asarray(w) for w in keras.saving.load_model(path).get_weights()]


@pytest.fixture(scope="module")
def cifar_folder(tmp_path_factory):
    """A small real CIFAR-10 JPEG tree: 12 train and 4 test images per class from the shared tarball."""
    require_data(CIFAR_TAR, "the CIFAR-10 JPEG tarball")
    root = tmp_path_factory.mktemp("cifar")
    wanted = {"train": 12, "test": 4}
    with tarfile.open(CIFAR_TAR) as tar:
        for member in tar:
            parts = pathlib.PurePosixPath(member.name).parts
            if member.isfile() and len(parts) == 4 and int(pathlib.PurePosixPath(parts[3]).stem) < wanted[parts[1]]:
                tar.extract(member, root, filter="data")
    return root / "cifar10-jpeg"


def test_environment_without_tensorflow_is_real():
    """In CI's TensorFlow-free environment (KERAS_PREACT_REQUIRE_NO_TF=1) TensorFlow is truly absent."""
    if not os.environ.get("KERAS_PREACT_REQUIRE_NO_TF"):
        pytest.skip("not the TensorFlow-free environment")
    assert importlib.util.find_spec("tensorflow") is None
    assert importlib.util.find_spec("tensorflow_datasets") is None
    import keras_preact.applications
    import keras_preact.models

    model = keras_preact.models.cifar_resnet(20)
    assert model.count_params() > 0 and keras_preact.applications.PreActResNet18(weights=None).built


# ------------------------------------------------------------------------------ on-device input
def test_pad_crop_flip_draws_a_valid_view_per_image():
    images = np.random.default_rng(0).integers(0, 256, (16, 8, 8, 3)).astype("uint8")
    layer = augment.PadCropFlip(2, seed=7)
    first = keras.ops.convert_to_numpy(layer(images, training=True))
    second = keras.ops.convert_to_numpy(layer(images, training=True))
    padded = np.pad(images, [(0, 0), (2, 2), (2, 2), (0, 0)])
    views = []
    for i in range(len(images)):
        found = [(oy, ox, flip) for oy in range(5) for ox in range(5) for flip in (0, 1)
                 if np.array_equal(first[i], padded[i, oy:oy + 8, ox:ox + 8][:, ::-1 if flip else 1])]
        assert found, f"image {i} is not a padded crop (or its mirror) of its input"
        views.append(found[0])
    assert len(set(views)) > 4, "offsets and flips must be drawn per image, not per batch"
    assert first.dtype == np.uint8 and not np.array_equal(first, second)
    # The draws at call k depend only on (seed, k): the counter is a saved weight.
    assert [w.path for w in layer.weights] == ["pad_crop_flip/iterations"]
    assert int(keras.ops.convert_to_numpy(layer.iterations)) == 2
    layer.iterations.assign(1)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(images, training=True)), second)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(images, training=False)), images)


def test_pad_crop_flip_draws_every_offset_and_mirror_uniformly():
    """4000 draws, each identified exactly: offsets -4..+4 each way (0..8 in the padded image) and the mirror,
    uniform (``support.assert_uniform_crop_draws``); the same for the numpy pipeline's augmentation."""
    image = np.arange(1, 101, dtype="float32").reshape(10, 10, 1)  # distinct pixels: every view tells its draw
    images = np.broadcast_to(image, (4000, 10, 10, 1))
    out = keras.ops.convert_to_numpy(augment.PadCropFlip(4, seed=0)(images, training=True))
    assert_uniform_crop_draws(crop_draws(out, image, 4), 4)
    out = pipelines.numpy_cifar_augment(images.astype("uint8"), np.random.default_rng(0))
    assert_uniform_crop_draws(crop_draws(out, image.astype("uint8"), 4), 4)


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
@pytest.mark.parametrize("padding", [0, 3])
def test_pad_crop_flip_puts_every_pixel_where_the_crop_and_mirror_do(dtype, padding):
    """The one gather of ``pad_crop_flip`` against the definition, per image: zero-pad, crop at (oy, ox), mirror
    where drawn. Non-square images (rows and columns strides differ), the extreme offsets, both flips."""
    rng = np.random.default_rng(3)
    images = rng.integers(1, 256, (6, 5, 7, 2)).astype(dtype)
    offsets = np.array([[0, 2 * padding, padding, 0, 2 * padding, 1 % (2 * padding + 1)],
                        [2 * padding, 0, padding, 0, 2 * padding, 1 % (2 * padding + 1)]], "int32")
    flip = np.array([False, True, False, True, True, False])
    out = keras.ops.convert_to_numpy(augment.pad_crop_flip(images, offsets, flip, padding))
    padded = np.pad(images, [(0, 0), (padding, padding), (padding, padding), (0, 0)])
    for i, (oy, ox) in enumerate(offsets.T):
        view = padded[i, oy:oy + 5, ox:ox + 7]
        np.testing.assert_array_equal(out[i], view[:, ::-1] if flip[i] else view, err_msg=f"image {i}")
    assert out.dtype == np.dtype(dtype) and out.shape == images.shape


def test_device_model_normalizes_like_the_host():
    from keras_preact.models import cifar_resnet

    classifier = cifar_resnet(8, 10, input_shape=(16, 16, 3))
    mean, std = pipelines.pixel_stats(configs.get_config("synthetic-resnet8"))
    model = augment.device_training_model(classifier, augmentation="cifar", mean=mean, std=std, seed=0)
    images = np.random.default_rng(1).integers(0, 256, (4, 16, 16, 3)).astype("uint8")
    host = classifier.predict((images.astype("float32") - mean) / std, verbose=0)
    np.testing.assert_allclose(model.predict(images, verbose=0), host, rtol=1e-5, atol=1e-6)
    assert model.input.dtype == "uint8"
    with pytest.raises(ValueError, match="augmentation='imagenet'"):
        augment.device_training_model(classifier, augmentation="imagenet", mean=mean, std=std, seed=0)


@pytest.mark.parametrize("pipeline", ["device", "numpy"])
def test_pipelines_feed_fit_and_are_deterministic(tmp_path, pipeline):
    def run(sub, **overrides):
        config = configs.get_config("synthetic-resnet8", run_dir=str(tmp_path / sub), pipeline=pipeline,
                                    **{**TINY, **overrides})
        result = train_lib.train(config)
        return result, saved_weights(tmp_path / sub / "model.keras")

    result, a = run("a")
    assert (result["steps"], result["epochs"]) == (6, 2)
    # The reported accuracy is the saved model's on the test split (32 images), as a reader recomputes it.
    config = configs.get_config("synthetic-resnet8", **TINY)
    data = sources.load(config)
    mean, std = pipelines.pixel_stats(config, data)
    model = keras.saving.load_model(tmp_path / "a" / "model.keras")
    predicted = model.predict((data.test_images.astype("float32") - mean) / std, verbose=0).argmax(-1)
    assert result["test_accuracy"] == pytest.approx(np.mean(predicted == data.test_labels), abs=1e-6)
    _, b = run("b")
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    # Several steps per compiled call: same steps, backups at the right step, the same training.
    if keras.backend.backend() == "torch":
        with pytest.raises(ValueError, match="steps_per_execution=3: Keras' PyTorch backend runs one step"):
            run("c", steps_per_execution=3)
        return
    result, c = run("c", steps_per_execution=3)
    assert result["steps"] == 6
    assert run_files.read_backup(tmp_path / "c" / "checkpoints" / "backup")["step"] == 6
    for x, y in zip(a, c):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def test_auto_pipeline_choice():
    config = configs.get_config("synthetic-resnet8")
    expected = "tf_data" if keras.backend.backend() == "tensorflow" and HAS_TF else "device"
    assert pipelines.resolve_pipeline(config) == expected
    if not HAS_TF:
        with pytest.raises(sources.DataError, match="pipeline='tf_data' needs TensorFlow"):
            pipelines.pipelines(sources.synthetic(16, 16, image_size=(8, 8)), config.replace(pipeline="tf_data"), 8)


# --------------------------------------------------------------------------------- CLI end to end
def test_cli_on_real_jpeg_folder(tmp_path, cifar_folder):
    run_dir = tmp_path / "run"
    done = run_cli("--dataset", "folder", "--data-dir", str(cifar_folder), "--cache-dir", str(tmp_path / "cache"),
                   "--depth", "8", "--batch-size", "20", "--epochs", "2", "--steps-per-epoch", "3",
                   "--run-dir", str(run_dir), "--verbose", "0", "--no-export", "--jit-compile", TRAIN_JIT_COMPILE)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[train] summary" in done.stdout
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert (metrics["steps"], metrics["epochs"]) == (6, 2)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["class_names"][:3] == ["airplane", "automobile", "bird"]
    assert config["keras_backend"] == keras.backend.backend()
    assert len((run_dir / "history.csv").read_text().strip().splitlines()) == 3
    assert (run_dir / "curves.png").read_bytes()[:4] == b"\x89PNG"
    # keras-preact-evaluate on the saved run and the same test folder gives the accuracy training reported.
    from keras_preact_training import evaluate

    assert evaluate.main([str(run_dir), "--dataset", "folder", "--data-dir", str(cifar_folder),
                          "--cache-dir", str(tmp_path / "cache"), "--json", str(tmp_path / "evaluation.json")]) == 0
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    assert evaluation["top1_accuracy"] == pytest.approx(metrics["test_accuracy"], abs=1e-6), evaluation


def test_default_command_and_what_needs_tensorflow(tmp_path):
    """The README's default command (shortened) finishes; without TensorFlow, export and TensorBoard
    are skipped with one line each, and TFDS fails at once with one line."""
    run_dir = tmp_path / "run"
    done = run_cli("--epochs", "1", "--steps-per-epoch", "4", "--run-dir", str(run_dir),
                   "--export-dir", str(tmp_path / "exported"), "--verbose", "0")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[train] summary" in done.stdout and "Traceback" not in done.stderr
    # The summary's accuracy and error are fractions under their keys (test_error was a percentage
    # beside the fraction test_accuracy), as in metrics.json.
    summary = done.stdout.split("[train] summary", 1)[1]
    assert_printed_fractions(summary, {"test_accuracy", "test_error"})
    printed = {name: value for name, value, _ in printed_metrics(summary)}
    assert printed["test_error"] == pytest.approx(1 - printed["test_accuracy"], abs=1.5e-4), summary
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert misnamed_metrics(metrics) == [] and metrics["test_error"] == 1 - metrics["test_accuracy"]
    # model.keras is the bare classifier: it loads in a fresh process with Keras and our layers only.
    load = subprocess.run([sys.executable, "-c", "import sys, keras, keras_preact.layers; "
                           "print(keras.saving.load_model(sys.argv[1]).count_params())", str(run_dir / "model.keras")],
                          cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
    assert load.returncode == 0 and int(load.stdout.split()[-1]) > 0, load.stderr[-2000:]
    if HAS_TF:
        assert list((tmp_path / "exported").glob("*/1/saved_model.pb"))
        return
    skipped = [line for line in done.stdout.splitlines() if "skipped" in line]
    assert len(skipped) == 2 and all("pip install tensorflow" in line for line in skipped)
    assert not (tmp_path / "exported").exists()

    tfds = run_cli("--dataset", "cifar10", "--run-dir", str(tmp_path / "tfds"), timeout=120)
    assert tfds.returncode == 2 and "Traceback" not in tfds.stderr
    assert "needs TensorFlow" in tfds.stderr and "--dataset folder or synthetic" in tfds.stderr
    export = subprocess.run([sys.executable, "-m", "keras_preact_training.export", str(run_dir)], cwd=REPO,
                            env=env(), capture_output=True, text=True, timeout=120)
    assert export.returncode == 2 and "Traceback" not in export.stderr
    assert export.stderr.strip().endswith("needs TensorFlow: pip install tensorflow")
    saved_model_only = tmp_path / "saved_models" / "m" / "1"
    saved_model_only.mkdir(parents=True)
    (saved_model_only / "saved_model.pb").write_bytes(b"")
    serve = subprocess.run([sys.executable, "-c",
                            "import sys, keras_preact_serving as s; sys.exit(s.main(sys.argv[1:]))",
                            str(saved_model_only.parent)], cwd=REPO, env=env(), capture_output=True, text=True,
                           timeout=120)
    assert serve.returncode == 2 and serve.stderr.strip().splitlines() == [
        "keras-preact-serve: error: serving this version (saved_model) needs a runtime that is not installed: "
        "pip install tensorflow (saved_model)"]
    if keras.backend.backend() == "torch":
        serve_onnx_without_tensorflow(run_dir, tmp_path)


def serve_onnx_without_tensorflow(run_dir, tmp_path):
    """PyTorch writes ONNX without TensorFlow, and keras-preact-serve serves it (serving_default on
    ONNX Runtime), as the exported model answers in its runtime."""
    import http.client

    from keras_preact.export import load

    export = subprocess.run([sys.executable, "-m", "keras_preact_training.export", str(run_dir), "--format", "onnx",
                             "--export-dir", str(tmp_path / "onnx")], cwd=REPO, env=env(), capture_output=True,
                            text=True, timeout=600)
    assert export.returncode == 0, export.stderr[-3000:]
    version_dir = pathlib.Path(export.stdout.strip().splitlines()[-1])
    assert sorted(p.name for p in version_dir.iterdir()) == ["assets", "model.onnx"]
    process = subprocess.Popen([sys.executable, "-m", "keras_preact_serving.server", str(version_dir.parent),
                                "--port", "0", "--model-name", "m"], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    try:
        line = process.stdout.readline()
        assert line.rstrip().endswith("[serving_default on onnx]"), line
        port = int(line.split("http://127.0.0.1:", 1)[1].split("/")[0])
        batch = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/v1/models/m:predict", body=json.dumps({"instances": batch.tolist()}).encode())
        response = conn.getresponse()
        reply = json.loads(response.read())
        conn.close()
    finally:
        process.terminate()
        process.wait(timeout=30)
    want = load(version_dir, "onnx").predict(batch)
    assert response.status == 200, reply
    assert [row["classes"] for row in reply["predictions"]] == want["classes"].tolist()
    np.testing.assert_allclose([row["probabilities"] for row in reply["predictions"]], want["probabilities"], atol=1e-6)


def test_error_inside_fit_is_reported_in_one_line(tmp_path, monkeypatch, capsys):
    """A malformed batch makes Keras raise inside fit with pages of array values; we print one line."""
    real = pipelines.pipelines

    def malformed(*args, **kwargs):
        train, test = real(*args, **kwargs)
        return (((x, y),) for x, y in train), test

    monkeypatch.setattr(pipelines, "pipelines", malformed)
    code = cli.main(["--depth", "8", "--image-size", "16", "16", "--batch-size", "16", "--epochs", "1",
                           "--steps-per-epoch", "2", "--run-dir", str(tmp_path / "run"), "--no-export",
                           "--verbose", "0", "--pipeline", "numpy"])
    err = capsys.readouterr().err
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("keras-preact-train: error: model.fit failed: ")
    assert "KERAS_PREACT_TRACEBACK" in lines[0] and len(lines[0]) < 600 and "[[" not in lines[0]


# ------------------------------------------------------------------ the backend: Keras' choice; measured when asked
TINY_RUN = ["--depth", "8", "--image-size", "16", "16", "--batch-size", "8"]
# Runs keras-preact-train's real entry point in a fresh interpreter and records every Python process it starts
# (audit events: a subprocess or spawn of a Python interpreter, any fork; multiprocessing starts through them).
# Libraries' own small tools (platform's `uname -p`, matplotlib's `fc-list`) are not Python processes.
RECORD_PROCESSES = """
import json, os, sys
started = []
def hook(event, args):
    if event in ("os.fork", "os.forkpty") or (event in ("subprocess.Popen", "os.posix_spawn", "os.spawn", "os.exec")
                                              and "python" in os.path.basename(str(args[1][0] if args[1] else args[0]))):
        started.append(event + " " + repr(args)[:300])
sys.addaudithook(hook)
from keras_preact_training import cli
code = cli.main(sys.argv[1:])
import keras
print(json.dumps({"code": code, "backend": keras.backend.backend(), "started": started}))
"""


def keras_choice_case(case, tmp_path):
    """(environment, expected backend) of a ``test_the_backend_is_keras_choice`` case."""
    home = tmp_path / "keras_home"
    home.mkdir()
    environ = {key: value for key, value in env().items() if key != "KERAS_BACKEND"}
    environ.update(KERAS_HOME=str(home), KERAS_PREACT_CACHE=str(tmp_path / "cache"), HOME=str(tmp_path))
    others = [b for b in ("jax", "torch", "tensorflow") if importlib.util.find_spec(b)]
    if case == "KERAS_BACKEND":
        return {**environ, "KERAS_BACKEND": others[0]}, others[0]
    if case == "keras.json":
        (home / "keras.json").write_text(json.dumps({"backend": others[-1]}))
        return environ, others[-1]
    return environ, "tensorflow" if HAS_TF else backends.QUICKEST_IMPORT_FIRST[0]


@pytest.mark.any_backend  # KERAS_BACKEND is the case's, not the pass's
@pytest.mark.parametrize("case", ["default", "KERAS_BACKEND", "keras.json"])
def test_the_backend_is_keras_choice_and_no_process_is_started(tmp_path, case):
    """``keras-preact-train`` runs on the backend Keras itself would load (``KERAS_BACKEND``, else keras.json,
    else TensorFlow; without TensorFlow an installed one) and starts no process to decide: a whole tiny run on
    the default, ``--dry-run`` on the others. (It measured every installed backend in subprocesses before.)"""
    environ, expected = keras_choice_case(case, tmp_path)
    run = (["--dry-run"] if case != "default" else
           ["--epochs", "1", "--steps-per-epoch", "2", "--synthetic-train-size", "16", "--synthetic-test-size", "8",
            "--verbose", "0", "--no-export", "--run-dir", str(tmp_path / "run")])
    done = subprocess.run([sys.executable, "-c", RECORD_PROCESSES, *TINY_RUN, *run], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 0 and result["started"] == [] and result["backend"] == expected, result
    line = next(line for line in done.stdout.splitlines() if line.startswith("[backend] "))
    reason = {"default": "Keras' default" if HAS_TF else "installed;", "KERAS_BACKEND": "set by KERAS_BACKEND",
              "keras.json": f"set by {tmp_path / 'keras_home' / 'keras.json'}"}[case]
    assert line.startswith(f"[backend] {expected} ({reason}") and "--measure-backends" in line, line
    if case == "default":
        assert json.loads((tmp_path / "run" / "config.json").read_text())["keras_backend"] == expected
    assert not (tmp_path / "cache").exists()  # nothing measured, nothing cached


def test_backend_choice_reads_what_keras_reads(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "keras")  # as in a fresh process
    monkeypatch.setattr(backends, "installed", lambda b: True)
    home = tmp_path / "keras_home"
    home.mkdir()
    environ = {"KERAS_HOME": str(home)}
    assert backends.choose(None, {**environ, "KERAS_BACKEND": "jax"}) == ("jax", "set by KERAS_BACKEND")
    assert backends.choose(None, environ) == ("tensorflow", "Keras' default")
    (home / "keras.json").write_text(json.dumps({"backend": "torch"}))
    assert backends.choose(None, environ) == ("torch", f"set by {home / 'keras.json'}")
    assert backends.choose("jax", environ) == ("jax", "--backend")
    monkeypatch.setattr(backends, "installed", lambda b: b in ("jax", "torch"))
    (home / "keras.json").unlink()
    assert backends.choose(None, environ) == ("torch", "installed; TensorFlow, Keras' default, is not")
    with pytest.raises(ValueError, match=r"--backend tensorflow: tensorflow is not installed"):
        backends.choose("tensorflow", environ)
    with pytest.raises(ValueError, match=r"Invalid --backend 'auto': allowed tensorflow, jax, torch"):
        backends.choose("auto", environ)


def test_measure_backends_report_names_figures_choice_and_how_to_set_it():
    from keras_preact_training import backend_probe

    config = configs.get_config("synthetic-resnet8", needs_data=False, depth=8, image_size=(16, 16), batch_size=8)
    lines = backend_probe.report(config, {"tensorflow": 60.4, "torch": 41.2, "jax": 55.0},
                                 {}, 5, 2)
    assert lines == [
        "[measure] torch 41 ms/step, jax 55, tensorflow 60 (cifar ResNet-8, image 16x16, batch 8; median of 5 steps "
        "after 2 untimed)",
        '[measure] fastest: torch; to train on it: KERAS_BACKEND=torch keras-preact-train ..., or "backend": "torch" '
        "in ~/.keras/keras.json (every Keras program), or --backend torch for one run (--backend fastest measures, then "
        "trains on the fastest)"]
    lines = backend_probe.report(config, {"torch": 41.2}, {"jax": "timed out after 600 s"}, 5, 2)
    assert lines[1] == "[measure] jax failed: timed out after 600 s" and "fastest: torch" in lines[2]


@pytest.mark.any_backend  # every installed backend is measured, whichever the pass's is
def test_measure_backends_times_every_installed_backend_and_trains_nothing(tmp_path, capsys, monkeypatch):
    """``--measure-backends``: this process's backend timed here, each other installed one in a child process
    (what the user asked for); the figures, the fastest and how to choose it printed; no run directory written."""
    monkeypatch.chdir(tmp_path)
    for name, value in ONE_THREAD.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["--measure-backends", "--measure-steps", "1", *TINY_RUN, "--run-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    present = [b for b in backends.BACKENDS if importlib.util.find_spec(b)]
    first = next(line for line in out.splitlines() if line.startswith("[measure] ") and "ms/step" in line)
    figures = dict(re.findall(r"(tensorflow|jax|torch) (\d+)", first))
    assert sorted(figures) == sorted(present) and "median of 1 steps after 2 untimed" in first, out
    fastest = min(figures, key=lambda b: int(figures[b]))
    assert f"[measure] fastest: {fastest}; to train on it: KERAS_BACKEND={fastest} keras-preact-train" in out, out
    assert not (tmp_path / "run").exists()
    with pytest.raises(SystemExit) as stop:
        cli.main(["--measure-backends", "--measure-steps", "0", *TINY_RUN])
    assert (
        stop.value.code == 2 and "argument --measure-steps: 0 given, at least 1 is required" in capsys.readouterr().err
    )


def test_backend_fastest_times_the_quickest_to_start_first_and_stops_at_an_invalid_config(monkeypatch):
    """``--backend fastest``'s measurement runs before Keras loads: every installed backend in a child process,
    the quickest to start first; a child that finds the config invalid stops it with its message, the other
    backends not started."""
    from keras_preact_training import backend_probe

    monkeypatch.setattr(backends, "installed", lambda name: name in ("tensorflow", "torch"))
    config = configs.get_config("synthetic-resnet8", needs_data=False)
    started = []

    def child(backend, config, steps, warmup):
        started.append(backend)
        return {"torch": (41.0, None), "tensorflow": (None, "exit 1: no result")}[backend]

    assert backend_probe.measure_in_children(config, 3, 1, child) == ({"torch": 41.0}, {"tensorflow": "exit 1: no result"})
    assert started == ["torch", "tensorflow", "torch"]  # rounds in turn; a backend that failed is not asked again
    started.clear()

    def invalid(backend, config, steps, warmup):
        started.append(backend)
        return None, f"exit {backend_probe.INVALID_CONFIG}: Invalid depth=7: CIFAR nets have depth 6n+2 ..."

    with pytest.raises(ValueError, match=r"^Invalid depth=7: CIFAR nets"):
        backend_probe.measure_in_children(config, 3, 1, invalid)
    assert started == ["torch"]
    started.clear()
    monkeypatch.setattr(backends, "installed", lambda name: name == "jax")
    assert backend_probe.measure_in_children(config, 3, 1, child) == ({}, {}) and started == []  # nothing to choose


@pytest.mark.any_backend
def test_backend_fastest_with_one_backend_installed_times_nothing(monkeypatch, capsys):
    """One backend installed: ``--backend fastest`` takes it without starting a child process."""
    monkeypatch.setattr(backends, "installed", lambda name: name == "torch")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a process was started"))
    parser = cli.build_parser()
    assert cli.choose_fastest(parser.parse_args(["--backend", "fastest"]), parser) == "torch"
    assert capsys.readouterr().out == "[measure] torch is the one Keras backend installed: nothing to time\n"
    monkeypatch.setattr(backends, "installed", lambda name: False)
    with pytest.raises(SystemExit) as stop:
        cli.choose_fastest(parser.parse_args(["--backend", "fastest"]), parser)
    assert stop.value.code == 2 and capsys.readouterr().err == (
        "keras-preact-train: error: --backend fastest: no Keras backend is installed: install one of tensorflow, "
        "jax, torch\n")


@pytest.mark.any_backend
@pytest.mark.parametrize("ci", [None, "false", "true"])
def test_a_missing_data_set_skips_its_tests_but_fails_them_under_ci(ci, tmp_path, monkeypatch):
    """The real-data tests skip without the CIFAR-10 tarball beside the clone; under ``CI=true`` they fail, naming
    it (a CI run without the data would pass while testing less); with the data they run."""
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    missing = tmp_path / "cifar10-jpeg.tar.gz"
    with pytest.raises(pytest.fail.Exception if ci == "true" else pytest.skip.Exception) as outcome:
        require_data(missing, "the CIFAR-10 JPEG tarball")
    assert str(outcome.value).startswith(f"{missing} is not here (the CIFAR-10 JPEG tarball)")
    missing.write_bytes(b"")
    assert require_data(missing, "the CIFAR-10 JPEG tarball") is None


@pytest.mark.any_backend
@pytest.mark.parametrize("figures, fastest", [
    ({"tensorflow": 60.4, "jax": 55.0, "torch": 41.2}, "torch"),
    ({"tensorflow": 60.4, "jax": 12.5, "torch": 41.2}, "jax"),
    ({"tensorflow": 30.0, "jax": 55.0, "torch": 41.2}, "tensorflow"),
], ids=["last", "middle", "first"])
def test_backend_fastest_takes_the_backend_measured_fastest(figures, fastest, monkeypatch):
    """``--backend fastest`` trains on the backend with the smallest measured step time, wherever it was timed in
    the order: the measurement is fed fake figures (no timing here), so the choice alone is judged."""
    from keras_preact_training import backend_probe

    monkeypatch.setattr(backends, "installed", lambda name: True)
    monkeypatch.delitem(sys.modules, "keras")  # the measurement runs before Keras loads
    monkeypatch.setattr(backend_probe, "measure_in_children", lambda config, steps, warmup: (dict(figures), {}))
    parser = cli.build_parser()
    assert cli.choose_fastest(parser.parse_args(["--backend", "fastest"]), parser) == fastest


@pytest.mark.any_backend  # every installed backend is measured, whichever the pass's is
@pytest.mark.skipif(not HAS_TF, reason="run where the README's main command is: TensorFlow and PyTorch installed")
def test_backend_fastest_measures_every_installed_backend_then_trains_on_the_fastest(tmp_path):
    """``keras-preact-train --backend fastest`` (the README's main command): the figures of every installed
    backend printed, the fastest of them chosen and said, the run trained and written on it."""
    run_dir = tmp_path / "run"
    environ = {key: value for key, value in env().items() if key != "KERAS_BACKEND"}
    done = subprocess.run([sys.executable, "-m", "keras_preact_training.cli", "--backend", "fastest", "--measure-steps",
                           "2", *TINY_RUN, "--epochs", "1", "--steps-per-epoch", "2", "--synthetic-train-size", "32",
                           "--synthetic-test-size", "16", "--no-export", "--verbose", "0", "--run-dir", str(run_dir)],
                          cwd=REPO, env=environ, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("[measure] timing "), done.stdout  # what it times, said first
    measured = next(line for line in lines if line.startswith("[measure] ") and "median of" in line)  # each's best round
    figures = {name: int(ms) for name, ms in re.findall(r"(tensorflow|jax|torch) (\d+)", measured)}
    assert sorted(figures) == sorted(b for b in backends.BACKENDS if importlib.util.find_spec(b)), measured
    assert len([line for line in lines if line.startswith("[measure] round ")]) == 2, done.stdout
    fastest = min(figures, key=figures.get)
    assert next(line for line in lines if line.startswith("[backend] ")).startswith(
        f"[backend] {fastest} (--backend fastest: the fastest measured;"), done.stdout
    assert json.loads((run_dir / "config.json").read_text())["keras_backend"] == fastest


@pytest.mark.parametrize("argv, message", [
    (["--config", "run/config.json"], "--backend fastest measures a preset's model before Keras loads; with --config"),
    (["--measure-backends"], "--backend fastest trains; --measure-backends and --dry-run take a backend by name"),
    (["--measure-steps", "0"], "argument --measure-steps: 0 given, at least 1 is required"),
    (["--depth", "7"], "Invalid depth=7: CIFAR nets have depth 6n+2"),
])
@pytest.mark.any_backend
def test_backend_fastest_refuses_what_it_cannot_measure_in_one_line(argv, message):
    environ = {key: value for key, value in env().items() if key != "KERAS_BACKEND"}
    done = subprocess.run([sys.executable, "-m", "keras_preact_training.cli", "--backend", "fastest", *argv], cwd=REPO,
                          env=environ, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith("keras-preact-train: error: " + message), done.stderr


NO_BACKEND = """
import importlib.abc, sys
class NotInstalled(importlib.abc.MetaPathFinder):  # as if no backend were installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "jax", "torch"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NotInstalled())
import keras_preact
"""


@pytest.mark.once  # what is installed decides, not the pass's backend
@pytest.mark.skipif(HAS_TF, reason="TensorFlow, Keras' default backend, is installed: the commands run on it")
def test_without_tensorflow_or_keras_backend_the_commands_run_on_the_runs_backend(tmp_path, monkeypatch):
    """No ``KERAS_BACKEND`` and no TensorFlow: export, evaluate and serve take the backend the run recorded
    (``config.json``'s ``keras_backend``), else an installed one, and say so in one line; a user's choice
    stands; with no backend at all, the command and ``import keras_preact`` each say in one line what to install."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"keras_backend": "torch"}))
    for argv in ([str(run)], ["--name", "x", str(run / "model.keras"), "--format", "onnx"]):
        environ = {"KERAS_HOME": str(tmp_path)}
        line = backends.for_command("keras-preact-export", argv, environ)
        assert environ["KERAS_BACKEND"] == "torch"
        assert line == (f"[backend] torch (the run's, recorded in {run / 'config.json'}; TensorFlow, Keras' default, "
                        "is not installed; set KERAS_BACKEND to choose)")
    environ = {"KERAS_HOME": str(tmp_path)}
    assert backends.for_command("keras-preact-serve", [str(tmp_path / "saved_models" / "m")], environ).startswith(
        "[backend] torch (installed;")
    assert environ["KERAS_BACKEND"] == backends.QUICKEST_IMPORT_FIRST[0]
    environ = {"KERAS_HOME": str(tmp_path), "KERAS_BACKEND": "jax"}
    assert (
        backends.for_command("keras-preact-export", [str(run)], environ) is None and environ["KERAS_BACKEND"] == "jax"
    )
    monkeypatch.setattr(backends, "installed", lambda name: False)
    with pytest.raises(ValueError, match=r'^keras-preact-evaluate needs a Keras backend and none is installed: '
                                         r'pip install torch, pip install "jax\[cpu\]" or pip install tensorflow$'):
        backends.for_command("keras-preact-evaluate", [str(run)], {"KERAS_HOME": str(tmp_path)})

    clean = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"} | {"KERAS_HOME": str(tmp_path), **ONE_THREAD}
    export = subprocess.run([sys.executable, "-m", "keras_preact_training.export", str(run), "--format", "nonsense"],
                            cwd=tmp_path, env=clean, capture_output=True, text=True, timeout=300)
    lines = export.stderr.strip().splitlines()
    assert export.returncode == 2 and "Traceback" not in export.stderr, export.stderr[-3000:]
    assert lines[0].startswith("[backend] torch (the run's") and "Invalid formats=['nonsense']" in lines[-1]
    imported = subprocess.run([sys.executable, "-c", NO_BACKEND], cwd=tmp_path, env=clean | {"KERAS_BACKEND": "jax"},
                              capture_output=True, text=True, timeout=300)
    assert imported.returncode == 1 and imported.stderr.strip().splitlines()[-1] == (
        "ImportError: keras-preact needs a Keras backend: Keras is set to jax (KERAS_BACKEND, else keras.json, else "
        'TensorFlow), which is not installed: install one: pip install torch, pip install "jax[cpu]" or pip install '
        "tensorflow")


def test_an_export_dir_under_a_file_or_not_writable_is_refused_in_one_line_before_any_work(tmp_path, capsys,
                                                                                            monkeypatch):
    """keras-preact-export to a path under a file, or on a read-only file system: exit 2 with argparse's usage and
    one error line naming --export-dir, before the run is read (a 23-30-line traceback at the write before)."""
    from keras_preact_training import export as export_lib

    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setattr(export_lib, "export_run", lambda *a, **k: pytest.fail("exported despite a bad --export-dir"))
    cases = [
        (tmp_path / "file" / "saved_models", f"{tmp_path / 'file'} is a file, not a directory.", None),
        (
            tmp_path / "ro" / "saved_models",
            f"{tmp_path} is not writable (a read-only file system or no permission); export somewhere writable.",
            lambda path, mode: False,
        ),
    ]
    for export_dir, message, access in cases:
        if access is not None:  # as os.access answers on a read-only mount (root passes every permission check)
            monkeypatch.setattr(export_lib.os, "access", access)
        with pytest.raises(SystemExit) as exit_info:
            export_lib.main([str(tmp_path / "run"), "--export-dir", str(export_dir)])
        err = capsys.readouterr().err.strip().splitlines()  # argparse's usage, then the one error line
        assert exit_info.value.code == 2 and err[0].startswith("usage: keras-preact-export"), err
        assert err[-1] == f"keras-preact-export: error: Invalid --export-dir={str(export_dir)!r}: {message}", err
