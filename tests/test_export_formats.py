"""ONNX, LiteRT and OpenVINO exports beside the SavedModel: each run in its own runtime equals the Keras model.

The cells are the current backend's (KERAS_BACKEND): every format it can write is exported, loaded with
``keras_preact.export.load`` and compared with the Keras model on the same uint8 batches; every format it
cannot write is refused before any work. Cells that need no TensorFlow are ``notf`` (CI runs them on JAX
and PyTorch in the TensorFlow-free environment).
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_preact.export import FORMATS, check_formats, export_model, load
from keras_preact.export import formats as formats_lib
from keras_preact.preprocessing import InputConfig
from keras_preact_training import export as export_lib
from keras_preact_training.recipe.configs import get_config
from keras_preact_training.run.manifest import RunManifest, input_config_for
from support import CLASS_NAMES, MEAN, STD, make_export_model

# One worker (`--dist loadgroup`): the exports of the module fixture, one per mean, are made once, not on each worker.
pytestmark = pytest.mark.xdist_group("test_export_formats")
REPO = pathlib.Path(__file__).resolve().parents[1]
BACKEND = keras.backend.backend()
TOP_K = 3
TOLERANCE = {"openvino": 1e-4}  # else 1e-5
WRITABLE = tuple(f for f in FORMATS if BACKEND in FORMATS[f].exporters)


def needs_tensorflow(fmt, backend=BACKEND):
    return backend == "tensorflow" or "tensorflow" in (*FORMATS[fmt].exporters[backend], *FORMATS[fmt].runtime_modules)


def cell(fmt, backend=BACKEND):
    return pytest.param(fmt, marks=[] if needs_tensorflow(fmt, backend) else [pytest.mark.notf], id=fmt)


REFUSED = [pytest.param(b, f, marks=[pytest.mark.notf], id=f"{b}-{f}")
           for f in FORMATS for b in ("tensorflow", "jax", "torch") if b not in FORMATS[f].exporters]
MEAN_IMAGE = np.random.default_rng(7).uniform(60, 190, (32, 32, 3)).round(2)
WRITABLE_WITHOUT_TF = [f for f in WRITABLE if not needs_tensorflow(f)]


def keras_reference(model, images, mean):
    normalized = (images.astype(np.float32) - np.asarray(mean, np.float32)) / np.float32(STD)
    return np.asarray(model.predict(normalized, verbose=0))


def batches():
    rng = np.random.default_rng(3)
    return [rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8) for n in (3, 1)]  # N=1: the batch is dynamic


@pytest.fixture(scope="module", params=["per_channel_mean", "mean_image"])
def exported(request, tmp_path_factory):
    """Every format this backend writes, in one version directory (per-channel mean, or a mean image)."""
    keras.utils.clear_session(free_memory=False)
    model = make_export_model()
    mean = MEAN if request.param == "per_channel_mean" else MEAN_IMAGE
    export_dir = tmp_path_factory.mktemp("exports")
    path = export_model(model, export_dir, formats=WRITABLE, name="cifar_r8", class_names=CLASS_NAMES, mean=mean,
                        std=STD, top_k=TOP_K)
    return model, mean, path


@pytest.mark.parametrize("fmt", [cell(f) for f in WRITABLE])
def test_artifact_in_its_runtime_equals_keras(exported, fmt):
    model, mean, path = exported
    runtime = load(path, fmt)
    assert runtime.input_size == (32, 32) and runtime.class_names == CLASS_NAMES
    for images in batches():
        expected = keras_reference(model, images, mean)
        out = runtime.predict(images)
        n = len(images)
        assert {k: (v.dtype, v.shape) for k, v in out.items()} == {
            "probabilities": (np.float32, (n, 10)),
            "scores": (np.float32, (n, TOP_K)),
            "classes": (np.int32, (n, TOP_K)),
        }
        tolerance = TOLERANCE.get(fmt, 1e-5)
        assert np.abs(out["probabilities"] - expected).max() <= tolerance
        np.testing.assert_array_equal(out["classes"], np.argsort(-expected, axis=1, kind="stable")[:, :TOP_K])
        np.testing.assert_allclose(out["scores"], np.take_along_axis(expected, out["classes"], axis=1), atol=tolerance)


@pytest.mark.parametrize("fmt", [cell(f) for f in WRITABLE])
def test_version_dir_holds_every_format_and_the_assets(exported, fmt):
    model, mean, path = exported
    assert sorted(p.name for p in path.parent.iterdir()) == ["1"]  # no temporary directory left
    for name in FORMATS[fmt].files:
        assert (path / name).exists()
    assert (path / "assets" / "class_names.txt").read_text(encoding="utf-8").splitlines() == CLASS_NAMES
    config = InputConfig.from_dict(json.loads((path / "assets" / "preprocessing.json").read_text()))
    assert config == InputConfig(input_size=(32, 32, 3), mean=np.asarray(mean), std=STD, crop_fraction=1.0)
    assert load(path, fmt).input_config == config


@pytest.mark.skipif(
    "saved_model" not in WRITABLE or "onnx" not in WRITABLE, reason=f"{BACKEND} writes no SavedModel + ONNX"
)
def test_saved_model_and_onnx_side_by_side(tmp_path):
    model = make_export_model()
    path = export_model(model, tmp_path, formats="saved_model,onnx".split(","), mean=MEAN, std=STD, top_k=TOP_K)
    assert sorted(p.name for p in path.iterdir()) == ["assets", "fingerprint.pb", "model.onnx", "saved_model.pb",
                                                      "variables"]
    assert sorted(p.name for p in (path / "assets").iterdir()) == ["class_names.txt", "preprocessing.json"]
    images = batches()[0]
    saved, onnx = load(path, "saved_model").predict(images), load(path, "onnx").predict(images)
    np.testing.assert_allclose(saved["probabilities"], onnx["probabilities"], atol=1e-5)
    np.testing.assert_array_equal(saved["classes"], onnx["classes"])


@pytest.mark.parametrize("backend, fmt", REFUSED)
def test_cells_keras_cannot_write_are_refused(tmp_path, backend, fmt):
    message = re.escape(
        f"Invalid formats: {fmt} cannot be written from the {backend} backend: {FORMATS[fmt].refused[backend]}"
    )
    with pytest.raises(ValueError, match=f"^{message}$"):
        check_formats([fmt], backend=backend)
    if backend == BACKEND:  # through the public function, before any work
        with pytest.raises(ValueError, match=message):
            export_model(make_export_model(), tmp_path / "out", formats=[fmt])
        assert not (tmp_path / "out").exists()


@pytest.mark.notf
def test_every_format_defaults_to_the_models_own_input_config_and_class_names():
    """export_model and export_saved_model take what a create_model classifier carries when no
    input_config/class_names is given (tests/test_export_preprocessing.py serves it end to end)."""
    from keras_preact.export.version_dir import carried
    from keras_preact.models import create_model, get_input_config

    model = create_model("imagenet_resnet18", num_classes=3, input_shape=(None, None, 3))
    model.class_names = ["a", "b", "c"]
    own = get_input_config("imagenet_resnet18")
    assert carried(model, None, None, None) == (own, ("a", "b", "c"), (224, 224))
    given = own.replace(crop_fraction=1.0)
    assert carried(model, given, ["x", "y", "z"], None) == (given, ["x", "y", "z"], None)
    assert carried(make_export_model(), None, None, None) == (None, None, None)


@pytest.mark.notf
@pytest.mark.parametrize("formats, message", [
    (["bogus"], r"Invalid formats=\['bogus'\]: unknown 'bogus'; the formats are saved_model, onnx, litert, openvino"),
    (["onnx", "onnx"], "a format listed twice"),
    ([], "expected a list of format names"),
    ("onnx,litert", "unknown 'onnx,litert'"),
])
def test_bad_formats_fail_first_and_leave_nothing(tmp_path, formats, message):
    with pytest.raises(ValueError, match=message):
        export_model(make_export_model(), tmp_path / "out", formats=formats)
    assert not (tmp_path / "out").exists()


@pytest.mark.notf
@pytest.mark.parametrize("fmt", WRITABLE)
def test_a_missing_exporter_or_runtime_fails_first_naming_the_extra(tmp_path, monkeypatch, fmt):
    monkeypatch.setattr(formats_lib, "_installed", lambda module: False)
    with pytest.raises(ImportError, match=f"{fmt} export from the {BACKEND} backend needs .*: "
                                          + FORMATS[fmt].install.replace("[", r"\[").replace("]", r"\]")):
        export_model(make_export_model(), tmp_path / "out", formats=[fmt])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", [cell(f) for f in WRITABLE if f != "saved_model"])
def test_a_missing_runtime_is_one_line_naming_the_extra(exported, monkeypatch, fmt):
    for module in ("onnxruntime", "ai_edge_litert", "ai_edge_litert.interpreter", "tensorflow", "tensorflow.lite",
                   "openvino"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(
        ImportError, match=r'^running a .* export needs .*: pip install "keras-preact\[' + fmt + r'\]"$'
    ):
        load(exported[2], fmt)


@pytest.mark.parametrize("fmt", [cell(f) for f in WRITABLE])
def test_runtime_rejects_wrong_images(exported, fmt):
    runtime = load(exported[2], fmt)
    for bad in (
        np.zeros((2, 32, 32, 3), np.float32),
        np.zeros((2, 16, 16, 3), np.uint8),
        np.zeros((0, 32, 32, 3), np.uint8),
    ):
        with pytest.raises(ValueError, match=r"Invalid images: expected uint8 \[N, 32, 32, 3\]"):
            runtime.predict(bad)
    with pytest.raises(ValueError, match="Invalid format='bogus'"):
        load(exported[2], "bogus")


# ------------------------------------------------------------------------------------------------ CLI
CLI_FORMAT = next((f for f in WRITABLE if f != "saved_model"), "saved_model")


def run_cli(*args):
    env = {**os.environ, "KERAS_BACKEND": BACKEND, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", "keras_preact_training.export", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("fmt", [cell(CLI_FORMAT)])
def test_cli_exports_a_run_directory(tmp_path, fmt):
    model = make_export_model()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    model.save(run_dir / "model.keras")
    config = get_config("synthetic-resnet8", image_size=(32, 32))
    manifest = RunManifest(
        name="cifar_run",
        class_names=tuple(CLASS_NAMES),
        input_config=input_config_for(config, MEAN, STD),
        config={"name": config.name, "normalization": config.normalization},
    )
    (run_dir / "config.json").write_text(json.dumps(manifest.to_dict()))
    result = run_cli(run_dir, "--export-dir", tmp_path / "exports", "--format", fmt)
    assert result.returncode == 0, result.stderr[-2000:]
    path = tmp_path / "exports" / "cifar_run" / "1"
    assert result.stdout.strip().splitlines()[-1] == str(path)
    images = batches()[0]
    out = load(path, fmt).predict(images)
    expected = keras_reference(model, images, MEAN)
    assert np.abs(out["probabilities"] - expected).max() <= TOLERANCE.get(fmt, 1e-5)
    np.testing.assert_array_equal(out["classes"], np.argsort(-expected, axis=1, kind="stable")[:, :5])
    assert (path / "assets" / "class_names.txt").read_text().splitlines() == CLASS_NAMES


@pytest.mark.notf
@pytest.mark.parametrize("argument, message", [
    ("bogus", "unknown 'bogus'"),
    ("onnx,,litert", "invalid format list 'onnx,,litert'"),
    ("onnx,onnx", "a format listed twice"),
])
def test_cli_bad_format_fails_first_and_writes_nothing(tmp_path, capsys, argument, message):
    # The run directory does not exist: the formats are checked before it is read.
    with pytest.raises(SystemExit) as exit_info:
        export_lib.main([str(tmp_path / "no_run"), "--export-dir", str(tmp_path / "out"), "--format", argument])
    assert exit_info.value.code == 2
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert last_line.startswith("keras-preact-export: error:") and message in last_line
    assert not (tmp_path / "out").exists()
