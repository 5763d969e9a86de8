"""Smoke test of benchmarks/served_accuracy.py: a random-weight CIFAR ResNet-8 (the family's smallest
depth) saved as .keras (carrying its input config and class names), a tiny JPEG folder, the SavedModel
served by the real ``keras-preact-serve`` subprocess. Served predictions must be the in-process ones,
image by image, for JPEG bytes and for uint8 pixels. TensorFlow backend (the SavedModel export, and a
fast in-process evaluation); about 30 s.
"""

import json
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed

CLASSES = ("ant", "bee", "cat", "dog")


def write_folder(root, per_class, rng):
    """train/ and test/ class folders of 32 x 32 JPEGs (a class colour under noise)."""
    from PIL import Image

    for split in ("train", "test"):
        for index, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True)
            colour = np.array([60 * index, 255 - 60 * index, 40 + 50 * index])
            for i in range(per_class):
                noise = rng.integers(-90, 90, (32, 32, 3))
                pixels = np.clip(colour + noise, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:03d}.jpg", quality=75)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the SavedModel is exported from TensorFlow here")
def test_served_predictions_are_the_evaluated_ones(tmp_path, rng):
    pytest.importorskip("tensorflow")
    from benchmarks import served_accuracy
    from keras_preact.models import cifar_resnet

    write_folder(tmp_path / "data", 6, rng)
    model = cifar_resnet(8, len(CLASSES), class_names=CLASSES)  # CIFAR's input config, as the registry's
    head = model.get_layer("logits")
    kernel, bias = head.get_weights()
    head.set_weights([rng.normal(0, 1, kernel.shape).astype("float32"), bias])  # probabilities far from uniform
    model.save(tmp_path / "model.keras")

    out = tmp_path / "served.json"
    code = served_accuracy.main([str(tmp_path / "model.keras"), "--data-dir", str(tmp_path / "data"), "--limit", "20",
                                 "--formats", "saved_model", "--batch", "8", "--cache-dir", str(tmp_path / "cache"),
                                 "--start-timeout", "120", "--request-timeout", "60", "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == 0 and report["passed"]
    assert report["evaluation"]["images"] == 20 and len(report["labels"]) == 20
    assert sorted(set(report["labels"])) == [0, 1, 2, 3]  # --limit spreads over the classes
    in_process = report["in_process_predictions"]
    rows = {r["input"]: r for r in report["results"]}
    assert set(rows) == {"jpeg_bytes", "uint8_pixels"}
    for kind, row in rows.items():
        assert row["served"] and row["format"] == "saved_model" and row["runtime"] == "saved_model", kind
        assert row["images"] == 20 and row["predictions"] == in_process, kind
        assert (
            row["top1_accuracy"] == pytest.approx(report["evaluation"]["top1_accuracy"], abs=1e-6)
            and row["diff_points"] == 0.0
        )
        # A random network may give most images one class: the probabilities are the stricter check.
        assert row["max_probability_diff"] < 1e-4, kind


def test_a_model_without_its_input_config_is_refused(tmp_path, rng):
    """export_model would fall back to mean 0 / std 1: served accuracy would not be the evaluated one."""
    pytest.importorskip("tensorflow")
    from benchmarks import served_accuracy
    from keras_preact.preprocessing import InputConfig
    from keras_preact_training.evaluate import Target

    config = InputConfig(input_size=(32, 32, 3), crop_fraction=1.0)
    bare = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(), keras.layers.Dense(4)])
    with pytest.raises(ValueError, match="does not carry the input config"):
        served_accuracy.check_carried(bare, Target("bare", None, config, CLASSES))


def test_a_server_that_cannot_start_is_reported_and_stopped(tmp_path):
    """A server that exits (here: nothing to serve) raises with its own last lines, within the bound."""
    from benchmarks import served_accuracy

    with pytest.raises(RuntimeError, match=r"keras-preact-serve exited \(2\).*no numeric version folder"):
        served_accuracy.Server(tmp_path, "onnx", max_batch=8, max_body=2**20, start_timeout=120)


@pytest.mark.notf
@pytest.mark.skipif(keras.backend.backend() == "jax", reason="ONNX is written from the tensorflow and torch backends")
def test_quantize_serves_each_int8_model_beside_its_float_one(tmp_path, rng):
    """--quantize int8: onnx-int8 exported with its calibration folder and served by --runtime onnx-int8, judged by
    --max-accuracy-drop against the evaluation (the float ONNX by --tolerance)."""
    for module in ("onnxruntime", "starlette"):
        pytest.importorskip(module)
    from benchmarks import served_accuracy
    from keras_preact.models import cifar_resnet

    write_folder(tmp_path / "data", 6, rng)
    model = cifar_resnet(8, len(CLASSES), class_names=CLASSES)
    model.save(tmp_path / "model.keras")
    out = tmp_path / "served.json"
    code = served_accuracy.main([str(tmp_path / "model.keras"), "--data-dir", str(tmp_path / "data"), "--formats",
                                 "onnx", "--quantize", "int8", "--calibration-data", str(tmp_path / "data" / "train"),
                                 "--calibration-images", "8", "--max-accuracy-drop", "100", "--batch", "8",
                                 "--cache-dir", str(tmp_path / "cache"), "--start-timeout", "120", "--json", str(out)])
    report = json.loads(out.read_text())
    rows = {(r["format"], r["input"]): r for r in report["results"]}
    assert code == 0 and report["passed"], report["results"]
    int8 = rows["onnx-int8", "uint8_pixels"]
    assert int8["served"] and int8["runtime"] == "onnx-int8 (model-int8.onnx)" and int8["images"] == 24
    assert rows["onnx", "uint8_pixels"]["runtime"] == "onnx"
