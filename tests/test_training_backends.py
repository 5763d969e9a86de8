"""Training on every backend, with or without TensorFlow: on-device input, the CLI end to end on real
JPEGs, one-line messages for what needs TensorFlow, and errors from inside ``fit`` in one line.

CI runs the ``notf`` tests in an environment without TensorFlow on JAX and on PyTorch (``.ci/run``),
and with TensorFlow on the TensorFlow backend.
"""

import importlib.util
import json
import os
import pathlib
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
)

pytestmark = pytest.mark.notf

REPO = pathlib.Path(__file__).resolve().parents[1]
CIFAR_TAR = REPO.parent / "shared" / "data" / "cifar10-jpeg.tar.gz"
HAS_TF = importlib.util.find_spec("tensorflow") is not None
TINY = dict(depth=8, image_size=(16, 16), synthetic_train_size=96, synthetic_test_size=32, batch_size=16,
            epochs=2, steps_per_epoch=3, checkpoint_every=2, verbose="0", export=False, jit_compile=TRAIN_JIT_COMPILE)


def env():
    return {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3", **ONE_THREAD}


def run_cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "keras_preact_training.cli", *args], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=timeout)


def saved_weights(path):
    import keras_preact.layers  # noqa: F401  (registers ResidualUnit)

    return [np.asarray(w) for w in keras.saving.load_model(path).get_weights()]


@pytest.fixture(scope="module")
def cifar_folder(tmp_path_factory):
    """A small real CIFAR-10 JPEG tree: 12 train and 4 test images per class from the shared tarball."""
    if not CIFAR_TAR.exists():
        pytest.skip(f"{CIFAR_TAR} is not here")
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
    # Issue 38: the summary's accuracy and error are fractions under their keys (test_error was a percentage
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
    serve = subprocess.run([sys.executable, "-c", "import sys, serving as s; sys.exit(s.main(sys.argv[1:]))",
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


# ------------------------------------------------------------------------- --backend auto measures
TINY_RUN = ["--depth", "8", "--image-size", "16", "16", "--batch-size", "8"]
MODEL = {"architecture": "cifar", "depth": 8, "image_size": [16, 16], "batch_size": 8}


@pytest.fixture
def fresh_process(monkeypatch):
    """``backends.choose`` as in a fresh process (Keras not imported), on a CPU with all three installed."""
    monkeypatch.delitem(sys.modules, "keras")
    monkeypatch.setattr(backends, "has_accelerator", lambda: False)
    monkeypatch.setattr(backends, "installed", lambda backend: True)


@pytest.mark.any_backend  # every installed backend's probe runs in test_cli_auto_measures_the_installed_backends
def test_probe_subprocess_times_the_runs_model_on_this_backend():
    backend = keras.backend.backend()
    result = backends.run_probe(backend, TINY_RUN, steps=2, warmup=1)
    assert result["backend"] == backend and result["steps"] == 2 and result["ms_per_step"] > 0
    assert result["model"]["depth"] == 8 and result["model"]["image_size"] == [16, 16]
    assert result["model"]["batch_size"] == 8


def test_auto_picks_the_fastest_measured_and_caches_it(tmp_path, fresh_process, monkeypatch, capsys):
    speeds = {"tensorflow": 602.0, "torch": 412.0, "jax": 455.0}
    probed = []

    def measure(backend, argv):
        probed.append(backend)
        return speeds[backend]

    def describe(backend, argv):
        return {**MODEL, "depth": int(argv[argv.index("--depth") + 1])}

    versions = {"keras": "3.15.0", "tensorflow": "2.21.0", "jax": "0.7.0", "torch": "2.13.0"}
    monkeypatch.setattr(backends, "installed_versions", lambda: dict(versions))
    probe = dict(argv=TINY_RUN, measure=measure, describe=describe, cache_dir=tmp_path)
    environ = {"KERAS_HOME": str(tmp_path / "no_keras_json")}
    assert backends.select("auto", environ, **probe) == "torch" == environ["KERAS_BACKEND"]
    cache = tmp_path / backends.PROBE_CACHE_FILE
    assert capsys.readouterr().out.strip() == (
        f"[backend] torch (measured on this machine: torch 412 ms/step, jax 455, tensorflow 602; cached in "
        f"{cache}; --backend or KERAS_BACKEND to choose)")
    assert sorted(probed) == ["jax", "tensorflow", "torch"]
    (entry,) = json.loads(cache.read_text()).values()
    assert entry["ms_per_step"] == speeds and entry["model"]["depth"] == 8 and entry["versions"] == versions
    assert not list(tmp_path.glob(".*.tmp"))  # written to a temporary name, then renamed

    probed.clear()
    assert backends.choose("auto", {}, **probe) == (
        "torch", f"cached: measured on this machine: torch 412 ms/step, jax 455, tensorflow 602; from {cache}")
    assert probed == []
    deeper = ["--depth", "20", *TINY_RUN[2:]]
    speeds["jax"] = 300.0
    assert backends.choose("auto", {}, **{**probe, "argv": deeper})[0] == "jax" and len(probed) == 3
    probed.clear()
    versions["keras"] = "3.16.0"
    assert backends.choose("auto", {}, **probe)[0] == "jax" and len(probed) == 3
    assert len(json.loads(cache.read_text())) == 3


def test_failing_probes_are_named_and_skipped(tmp_path, fresh_process):
    def measure(backend, argv):
        if backend == "jax":
            raise backends.ProbeFailed("timed out after 300 s")
        return {"tensorflow": 9.0, "torch": 7.0}[backend]

    probe = dict(argv=TINY_RUN, describe=lambda backend, argv: MODEL, cache_dir=tmp_path)
    backend, reason = backends.choose("auto", {}, measure=measure, **probe)
    assert backend == "torch" and reason.startswith("measured on this machine: torch 7 ms/step, tensorflow 9; "
                                                    "jax failed: timed out after 300 s; cached in ")

    def broken(backend, argv):
        raise backends.ProbeFailed(f"exit 1: ModuleNotFoundError: No module named '{backend}'")

    backend, reason = backends.choose("auto", {}, measure=broken, **{**probe, "cache_dir": tmp_path / "other"})
    assert backend == backends.CPU_FASTEST_FIRST[0] and "\n" not in reason
    assert reason.startswith("fixed order measured on one CPU (BENCHMARKS.md, Training speed); every probe failed; "
                             "tensorflow failed: exit 1: ModuleNotFoundError")
    assert not (tmp_path / "other" / backends.PROBE_CACHE_FILE).exists()  # nothing measured: nothing cached


def test_a_chosen_backend_is_never_probed(tmp_path, fresh_process, monkeypatch):
    def never(*args):
        raise AssertionError("probed")

    probe = dict(argv=TINY_RUN, measure=never, describe=never, cache_dir=tmp_path)
    assert backends.choose("auto", {"KERAS_BACKEND": "jax"}, **probe) == ("jax", "set by KERAS_BACKEND")
    home = tmp_path / "keras_home"
    home.mkdir()
    (home / "keras.json").write_text(json.dumps({"backend": "torch"}))
    assert backends.choose("auto", {"KERAS_HOME": str(home)}, **probe)[0] == "torch"
    assert backends.choose("jax", {}, **probe) == ("jax", "--backend")
    backend, reason = backends.choose("auto", {}, dry_run=True, **probe)
    assert backend == backends.CPU_FASTEST_FIRST[0] and reason.startswith("--dry-run: a run would measure ")
    monkeypatch.setattr(backends, "installed", lambda backend: backend == "jax")
    assert backends.choose("auto", {}, **probe) == ("jax", "the only backend installed: nothing to measure")


@pytest.mark.any_backend  # KERAS_BACKEND unset: the pass's backend plays no part
def test_cli_auto_measures_the_installed_backends_then_trains(tmp_path):
    """The real entry point, KERAS_BACKEND unset: every installed backend is probed on this run's model in
    its own process, the line names the figures, and the run trains on the fastest. No --jit-compile: each
    backend compiles as Keras does by default (``auto``: XLA on JAX and TensorFlow, eager PyTorch), as a user's
    run does; one flag for all would probe JAX eagerly (``false``) or PyTorch through torch.compile (``true``)."""
    run_dir = tmp_path / "run"
    environ = {key: value for key, value in env().items() if key != "KERAS_BACKEND"}
    environ.update(KERAS_HOME=str(tmp_path / "keras_home"), KERAS_PREACT_CACHE=str(tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, "-m", "keras_preact_training.cli", "--backend-probe-steps", "1", *TINY_RUN[:5], "--batch-size", "16",
         "--epochs", "1", "--steps-per-epoch", "2", "--synthetic-train-size", "32", "--synthetic-test-size", "16",
         "--verbose", "0", "--no-export", "--run-dir", str(run_dir)],
        cwd=REPO, env=environ, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("[backend] "))
    present = [b for b in backends.CPU_FASTEST_FIRST if importlib.util.find_spec(b)]
    assert "measured on this machine: " in line and all(f"{b} " in line for b in present), line
    assert str(tmp_path / "cache" / backends.PROBE_CACHE_FILE) in line
    chosen = line.split()[1]
    assert json.loads((run_dir / "config.json").read_text())["keras_backend"] == chosen
    assert "[train] summary" in done.stdout


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
    assert backends.for_command("keras-preact-export", [str(run)], environ) is None and environ["KERAS_BACKEND"] == "jax"
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
    cases = [(tmp_path / "file" / "saved_models", f"{tmp_path / 'file'} is a file, not a directory.", None),
             (tmp_path / "ro" / "saved_models", f"{tmp_path} is not writable (a read-only file system or no permission); "
              "export somewhere writable.", lambda path, mode: False)]
    for export_dir, message, access in cases:
        if access is not None:  # as os.access answers on a read-only mount (root passes every permission check)
            monkeypatch.setattr(export_lib.os, "access", access)
        with pytest.raises(SystemExit) as exit_info:
            export_lib.main([str(tmp_path / "run"), "--export-dir", str(export_dir)])
        err = capsys.readouterr().err.strip().splitlines()  # argparse's usage, then the one error line
        assert exit_info.value.code == 2 and err[0].startswith("usage: keras-preact-export"), err
        assert err[-1] == f"keras-preact-export: error: Invalid --export-dir={str(export_dir)!r}: {message}", err
