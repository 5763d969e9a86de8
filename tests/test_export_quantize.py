"""int8 exports (``export_model(..., quantize="int8")``, ``keras-preact-export --quantize int8``): calibrated on some
of a folder's images, checked on the others, refused past the accuracy drop, every bad input one line first.

The folder is made so that int8 must change some answers: besides plain images, pairs of blends of two images the
float model tells apart, taken where its answer switches (a margin far under int8's rounding), each labelled with the
float ONNX model's answer; the folder's labels are then the float model's, and every answer int8 changes costs it."""

import json
import pathlib
import shutil
import sys

import keras
import numpy as np
import pytest
from PIL import Image

from keras_preact.export import export_model, load
from keras_preact.export import quantize as quantization
from keras_preact_training import export as export_lib
from keras_preact_training.recipe.configs import get_config
from keras_preact_training.run.manifest import RunManifest, input_config_for
from support import CLASS_NAMES, MEAN, STD, make_export_model

pytestmark = [pytest.mark.notf, pytest.mark.xdist_group("test_export_quantize")]
if keras.backend.backend() == "jax":
    pytest.skip("ONNX and OpenVINO are written from the tensorflow and torch backends", allow_module_level=True)
pytest.importorskip("onnxruntime", reason="needs the onnx extra")
pytest.importorskip("nncf", reason="needs the quantize extra")

FORMATS = ("onnx", "openvino")
CALIBRATION = 16


def plain_images(rng):
    """Random-pixel images and flat colours: float answers of several classes."""
    noise = rng.integers(0, 256, (24, 32, 32, 3), dtype=np.uint8)
    flat = rng.integers(0, 256, (40, 1, 1, 3), dtype=np.uint8).repeat(32, 1).repeat(32, 2)
    return np.concatenate([noise, flat])


def boundary_images(runtime, pool, rng, pairs=24):
    """For ``pairs`` pairs of ``pool`` images of two float answers, the two neighbouring blends where the answer
    switches."""
    answers = runtime.predict(pool)["probabilities"].argmax(-1)
    candidates = [(a, b) for a in range(len(pool)) for b in range(a) if answers[a] != answers[b]]
    found, weights = [], np.linspace(0, 1, 64)[:, None, None, None]
    for index in rng.permutation(len(candidates))[:pairs]:
        a, b = candidates[index]
        blends = np.round(weights * pool[a] + (1 - weights) * pool[b]).astype(np.uint8)
        switch = np.flatnonzero(np.diff(runtime.predict(blends)["probabilities"].argmax(-1)))
        found += [blends[switch[0]], blends[switch[0] + 1]]
    return np.stack(found)


@pytest.fixture(scope="module")
def model():
    return make_export_model()


@pytest.fixture(scope="module")
def folder(tmp_path_factory, model):
    """An image folder of ``CLASS_NAMES`` sub-folders labelled by the float ONNX model (see the module's doc)."""
    tmp = tmp_path_factory.mktemp("quantize")
    float_version = export_model(model, tmp / "float", formats=("onnx",), class_names=CLASS_NAMES, mean=MEAN,
                                 std=STD)
    runtime, rng = load(float_version, "onnx"), np.random.default_rng(0)
    pool = plain_images(rng)
    images = np.concatenate([pool[:CALIBRATION], boundary_images(runtime, pool, rng)])
    root = tmp / "images"
    for index, (image, label) in enumerate(zip(images, runtime.predict(images)["probabilities"].argmax(-1))):
        (root / CLASS_NAMES[label]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(root / CLASS_NAMES[label] / f"{index:03d}.png")
    return root


def export_int8(model, export_dir, folder, **options):
    return export_model(model, export_dir, formats=FORMATS, name="cifar", class_names=CLASS_NAMES, mean=MEAN,
                        std=STD, top_k=3, quantize="int8", calibration_data=folder, calibration_images=CALIBRATION,
                        **options)


def test_the_calibration_and_held_out_images_are_disjoint_and_cover_the_folder(folder):
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.png"))
    (calibration, labels), (held_out, held_labels) = quantization.calibration_split(folder, CLASS_NAMES, CALIBRATION)
    assert len(calibration) == CALIBRATION and set(calibration).isdisjoint(held_out)
    assert sorted(calibration + held_out) == files
    for file, label in zip(calibration + held_out, [*labels, *held_labels]):  # each its class folder's label
        assert CLASS_NAMES[label] == file.split("/")[0]
    again = quantization.calibration_split(folder, CLASS_NAMES, CALIBRATION)
    assert again[0][0] == calibration  # a fixed draw: the report names the same files each time


def test_refused_past_the_accuracy_drop_and_accepted_at_it(tmp_path, model, folder):
    """The drop the first export measures is accepted as the limit (the same int8 models again); a limit just under
    it is refused with one line, and nothing is written."""
    first = export_int8(model, tmp_path, folder, max_accuracy_drop=100)
    report = json.loads((first / quantization.REPORT).read_text())
    drops = {fmt: report["formats"][fmt]["accuracy_drop"] for fmt in FORMATS}
    assert max(drops.values()) > 0, drops  # int8 changed some of the boundary images' answers
    limit = max(drops.values())
    second = export_int8(model, tmp_path, folder, max_accuracy_drop=limit)
    assert json.loads((second / quantization.REPORT).read_text())["formats"] == report["formats"]
    with pytest.raises(quantization.AccuracyDropError) as refused:
        export_int8(model, tmp_path, folder, max_accuracy_drop=np.nextafter(limit, 0))
    assert "refused, nothing written" in str(refused.value) and "\n" not in str(refused.value)
    assert sorted(p.name for p in (tmp_path / "cifar").iterdir()) == ["1", "2"]  # no version 3, no scratch left


def test_the_report_holds_each_formats_top1_and_agreement(tmp_path, model, folder):
    version = export_int8(model, tmp_path, folder, max_accuracy_drop=100)
    report = json.loads((version / quantization.REPORT).read_text())
    (calibration, _), (held_out, labels) = quantization.calibration_split(folder, CLASS_NAMES, CALIBRATION)
    assert report["calibration_files"] == calibration and report["held_out_images"] == len(held_out)
    assert (report["calibration_images"], report["max_accuracy_drop"]) == (CALIBRATION, 100.0)
    views = quantization.view_images(folder, held_out, load(version, "onnx").input_config)
    for fmt in FORMATS:
        answers = [load(version, fmt, precision).predict(views)["probabilities"].argmax(-1)
                   for precision in ("fp32", "int8")]
        entry = report["formats"][fmt]
        assert entry["file"] == quantization.INT8_FILES[fmt][0] and (version / entry["file"]).is_file()
        assert entry["float_top1"] == 100.0 * int(np.sum(answers[0] == labels)) / len(labels)
        assert entry["int8_top1"] == 100.0 * int(np.sum(answers[1] == labels)) / len(labels)
        assert entry["differing"] == int(np.sum(answers[0] != answers[1]))
        assert entry["accuracy_drop"] == entry["float_top1"] - entry["int8_top1"]
    onnx = load(version, "onnx", "int8").predict(views[:2])  # the contract's outputs, uint8 pixels in
    assert {k: v.shape for k, v in onnx.items()} == {"probabilities": (2, 10), "scores": (2, 3), "classes": (2, 3)}


def write_run(run_dir, model):
    run_dir.mkdir(parents=True)
    model.save(run_dir / "model.keras")
    manifest = RunManifest(name="cifar_run", class_names=tuple(CLASS_NAMES),
                           input_config=input_config_for(get_config("synthetic-resnet8", image_size=(32, 32)), MEAN,
                                                         STD), config={"name": "synthetic-resnet8"})
    (run_dir / "config.json").write_text(json.dumps(manifest.to_dict()))
    return run_dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, model):
    return write_run(tmp_path_factory.mktemp("run") / "run", model)


def test_the_command_prints_and_stores_the_agreement_and_refuses_past_the_drop(tmp_path, run_dir, folder, capsys):
    exports = tmp_path / "exports"
    argv = [str(run_dir), "--export-dir", str(exports), "--format", "onnx,openvino", "--quantize", "int8",
            "--calibration-data", str(folder), "--calibration-images", str(CALIBRATION)]
    assert export_lib.main([*argv, "--max-accuracy-drop", "100"]) == 0
    out, err = capsys.readouterr()
    version = pathlib.Path(out.strip())
    report = json.loads((version / quantization.REPORT).read_text())
    for fmt in FORMATS:
        entry = report["formats"][fmt]
        assert (f"int8 {fmt} ({entry['file']}): top-1 {entry['int8_top1']:.2f}% (float {entry['float_top1']:.2f}%) "
                f"on {report['held_out_images']} held-out images, {entry['differing']} predictions differ") in err
    with pytest.raises(SystemExit) as exited:
        export_lib.main([*argv, "--max-accuracy-drop", "0"])
    err = capsys.readouterr().err
    assert exited.value.code == 1 and len(err.strip().splitlines()) == 1 and "refused, nothing written" in err
    assert sorted(p.name for p in version.parent.iterdir()) == ["1"]


def bad_folder(tmp_path):
    (tmp_path / "bad" / "unicorn").mkdir(parents=True)
    Image.new("RGB", (32, 32)).save(tmp_path / "bad" / "unicorn" / "0.png")
    return tmp_path / "bad"


BAD_INPUT = [  # (flags after the run directory, the line's start); each refused before the model is loaded
    (["--format", "onnx", "--quantize", "int8"], "Invalid --quantize='int8': an int8 model needs --calibration-data"),
    (["--format", "saved_model", "--quantize", "int8", "--calibration-data", "{folder}"],
     "Invalid --quantize='int8' with --format saved_model: int8 models are written for onnx and openvino"),
    (["--format", "onnx", "--quantize", "int8", "--calibration-data", "{tmp}/missing"],
     "Invalid --calibration-data='{tmp}/missing': not a directory"),
    (["--format", "onnx", "--quantize", "int8", "--calibration-data", "{bad}"],
     "Invalid --calibration-data='{bad}': its class folders 'unicorn' are not among the model's classes"),
    (["--format", "onnx", "--quantize", "int8", "--calibration-data", "{folder}", "--calibration-images", "1000"],
     "Invalid --calibration-data='{folder}': "),
    (["--format", "onnx", "--calibration-data", "{folder}"],
     "Invalid --calibration-data='{folder}': it calibrates an int8 model; give --quantize int8 with it."),
    (["--format", "onnx", "--quantize", "int8", "--calibration-data", "{folder}", "--max-accuracy-drop", "-1"],
     "Invalid --max-accuracy-drop=-1.0: expected a number of top-1 points >= 0."),
    (["--format", "onnx", "--quantize", "int4"], "argument --quantize: invalid choice: 'int4'"),
]


@pytest.mark.parametrize("flags, line", BAD_INPUT, ids=[
    "no-calibration-data", "savedmodel-only", "missing-folder", "foreign-classes", "none-held-out",
    "calibration-without-quantize", "negative-drop", "unknown-quantize"])
def test_bad_input_is_refused_in_one_line_naming_the_flag(tmp_path, folder, capsys, flags, line):
    run_dir = tmp_path / "not-loaded"  # a manifest whose model.keras is missing: refused before it is read
    run_dir.mkdir()
    manifest = RunManifest(name="cifar_run", class_names=tuple(CLASS_NAMES),
                           input_config=input_config_for(get_config("synthetic-resnet8", image_size=(32, 32)), MEAN,
                                                         STD), config={"name": "synthetic-resnet8"})
    (run_dir / "config.json").write_text(json.dumps(manifest.to_dict()))
    values = {"folder": str(folder), "tmp": str(tmp_path), "bad": str(bad_folder(tmp_path))}
    with pytest.raises(SystemExit) as exited:
        export_lib.main([str(run_dir), "--export-dir", str(tmp_path / "exports"),
                         *[flag.format(**values) for flag in flags]])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and line.format(**values) in err, err
    assert [text for text in err.splitlines() if "error:" in text] == [err.strip().splitlines()[-1]]
    assert not (tmp_path / "exports").exists()  # nothing begun


def test_an_unreadable_image_is_named_and_nothing_is_written(tmp_path, model, folder):
    broken = pathlib.Path(shutil.copytree(folder, tmp_path / "images"))
    (broken / CLASS_NAMES[0]).mkdir(exist_ok=True)
    (broken / CLASS_NAMES[0] / "broken.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match=r"^Invalid calibration_data='.*': airplane/broken.png: Invalid encoded image"):
        export_int8(model, tmp_path / "exports", broken, max_accuracy_drop=100)
    assert [p.name for p in (tmp_path / "exports" / "cifar").iterdir()] == []  # nothing, no scratch left


def test_the_command_states_the_librarys_defaults():
    assert export_lib.QUANTIZE_CHOICES == quantization.QUANTIZE_CHOICES
    assert export_lib.DEFAULT_CALIBRATION_IMAGES == quantization.DEFAULT_CALIBRATION_IMAGES == 300
    assert export_lib.DEFAULT_MAX_ACCURACY_DROP == quantization.DEFAULT_MAX_ACCURACY_DROP == 0.5


def test_without_nncf_the_openvino_int8_export_names_the_install_line(tmp_path, folder, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "nncf", None)  # as if not installed
    with pytest.raises(SystemExit) as exited:
        export_lib.main([str(tmp_path / "run"), "--format", "openvino", "--quantize", "int8", "--calibration-data",
                         str(folder)])
    assert exited.value.code == 2
    assert capsys.readouterr().err == ('keras-preact-export: error: int8 openvino export needs nncf: '
                                       'pip install "keras-preact[quantize]"\n')
