"""keras-preact-serve and a version's int8 models (keras-preact-export --quantize int8): ``--runtime auto`` (and a bare
onnx or openvino) serves the int8 model where the version holds one and says so (start-up line, TF Serving's
metadata, the v2 platform); ``*-fp32`` serves the float model, ``*-int8`` the int8 one or refuses in one line; a
damaged int8 file skips its version with one line naming it, as the float files do."""

import logging
import shutil

import keras
import numpy as np
import pytest

import support
from keras_preact.export import export_model, load
from keras_preact.export import quantize as quantization

pytestmark = [pytest.mark.notf, pytest.mark.xdist_group("test_serving_int8")]
if keras.backend.backend() == "jax":
    pytest.skip("ONNX and OpenVINO are written from the tensorflow and torch backends", allow_module_level=True)
pytest.importorskip("onnxruntime", reason="needs ONNX Runtime")
pytest.importorskip("openvino", reason="needs OpenVINO")
pytest.importorskip("nncf", reason="needs the quantize extra")
pytest.importorskip("starlette", reason="needs the serve extra")

from keras_preact_serving import v2  # noqa: E402
from keras_preact_serving.servable import Servable, check_runtime  # noqa: E402

IMAGES = support.images(8, seed=11)
CALIBRATION = support.images(16, seed=5)


def add_int8_models(version, images=CALIBRATION):
    """The int8 ONNX and OpenVINO models of ``version``'s float ones, as ``--quantize int8`` writes them."""
    quantization.quantize_onnx(str(version / "model.onnx"), str(version / "model-int8.onnx"), images)
    quantization.quantize_openvino(str(version / "openvino" / "model.xml"),
                                   str(version / "openvino" / "model-int8.xml"), images)
    return version


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """A version holding the float and int8 ONNX and OpenVINO models (no SavedModel: no TensorFlow needed)."""
    version = export_model(support.make_export_model(), tmp_path_factory.mktemp("exports"), name="m",
                           formats=("onnx", "openvino"), class_names=support.CLASS_NAMES, mean=support.MEAN,
                           std=support.STD, top_k=3)
    return add_int8_models(version)


def copy(whole, base, version="1", ignore=()):
    return shutil.copytree(whole, base / version, ignore=shutil.ignore_patterns(*ignore))


# --runtime -> (what serves serving_default, the format and precision whose answers it gives)
CHOICES = {"auto": ("openvino-int8", "openvino", "int8"), "openvino": ("openvino-int8", "openvino", "int8"),
           "onnx": ("onnx-int8", "onnx", "int8"), "openvino-int8": ("openvino-int8", "openvino", "int8"),
           "onnx-int8": ("onnx-int8", "onnx", "int8"), "openvino-fp32": ("openvino", "openvino", "fp32"),
           "onnx-fp32": ("onnx", "onnx", "fp32")}


@pytest.mark.parametrize("runtime", CHOICES)
def test_each_runtime_choice_serves_its_model_and_says_which(whole, tmp_path, runtime):
    served, fmt, precision = CHOICES[runtime]
    copy(whole, tmp_path / "m")
    model = Servable("m", tmp_path / "m", runtime=runtime)
    assert model.signatures == {"serving_default": served}
    expected_line = f"serving_default on {served}" + (
        f" ({quantization.INT8_FILES[fmt][0]})" if precision == "int8" else "")
    assert model.describe() == expected_line  # what the start-up line shows in brackets
    assert model.metadata["metadata"]["runtime"] == {"serving_default": served}
    assert v2.model_metadata(model)["platform"] == v2.PLATFORMS[fmt]
    got = model.predict("serving_default", {"images": IMAGES})
    want = load(tmp_path / "m" / "1", fmt, precision).predict(IMAGES)
    np.testing.assert_array_equal(got["probabilities"], want["probabilities"])
    other = load(tmp_path / "m" / "1", fmt, "fp32" if precision == "int8" else "int8").predict(IMAGES)
    assert not np.array_equal(got["probabilities"], other["probabilities"])  # the other model's answers differ


def test_without_int8_models_auto_serves_the_float_model_and_int8_is_refused(whole, tmp_path):
    copy(whole, tmp_path / "m", ignore=("model-int8.*",))
    assert Servable("m", tmp_path / "m").signatures == {"serving_default": "openvino"}
    for fmt, file in (("onnx", "model-int8.onnx"), ("openvino", "openvino/model-int8.xml")):
        with pytest.raises(ValueError) as refused:
            check_runtime(tmp_path / "m", f"{fmt}-int8")
        assert str(refused.value) == (f"Invalid runtime='{fmt}-int8': the version holds no int8 {fmt} model ({file}, "
                                      "written by keras-preact-export --quantize int8).")


def test_an_int8_runtime_missing_from_the_newest_version_serves_the_older_one(whole, tmp_path, caplog):
    copy(whole, tmp_path / "m", "1")
    copy(whole, tmp_path / "m", "2", ignore=("model-int8.onnx",))
    with caplog.at_level(logging.WARNING, logger="keras_preact_serving.servable"):
        model = Servable("m", tmp_path / "m", runtime="onnx-int8")
    assert model.version == 1 and model.signatures == {"serving_default": "onnx-int8"}
    assert [(f.version, f.file) for f in model.failed] == [(2, "model-int8.onnx")]


def truncate(path):
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


# Damage to a newer version's int8 files, the runtimes whose start finds it, and the file its one line names. Missing,
# empty and short files are found whatever serves (a copy under way); damage within a file whole in length (cut short,
# or random bytes of the right size), where the model is loaded.
EVERY = ("auto", "onnx-int8", "openvino-fp32")
DAMAGES = {
    "onnx_int8_empty": (lambda v: (v / "model-int8.onnx").write_bytes(b""), EVERY, "model-int8.onnx: empty"),
    "onnx_int8_truncated": (lambda v: truncate(v / "model-int8.onnx"), ("onnx-int8",), "model-int8.onnx: "),
    "openvino_int8_bin_removed": (lambda v: (v / "openvino" / "model-int8.bin").unlink(), EVERY,
                                  "openvino/model-int8.bin: missing"),
    "openvino_int8_bin_truncated": (lambda v: truncate(v / "openvino" / "model-int8.bin"), EVERY,
                                    "openvino/model-int8.bin: "),
    "openvino_int8_xml_truncated": (lambda v: truncate(v / "openvino" / "model-int8.xml"), EVERY,
                                    "openvino/model-int8.xml: "),
    "openvino_int8_bin_random": (
        lambda v: (v / "openvino" / "model-int8.bin").write_bytes(
            np.random.default_rng(0).bytes((v / "openvino" / "model-int8.bin").stat().st_size)),
        ("auto", "openvino-int8"), "openvino/model-int8.bin: "),
}
CASES = [(damage, runtime) for damage, (_, runtimes, _) in DAMAGES.items() for runtime in runtimes]


@pytest.mark.parametrize("damage, runtime", CASES, ids=[f"{d}-{r}" for d, r in CASES])
def test_a_damaged_int8_file_skips_its_version_naming_the_file(whole, tmp_path, damage, runtime):
    """A newer version whose int8 files are damaged is skipped in one line naming the file; version 1 serves."""
    hurt, _, named = DAMAGES[damage]
    copy(whole, tmp_path / "m", "1")
    hurt(copy(whole, tmp_path / "m", "2"))
    model = Servable("m", tmp_path / "m", runtime=runtime)
    assert model.version == 1
    (failure,) = model.failed
    assert str(failure).startswith(f"version 2 ({tmp_path / 'm' / '2'}): {named}"), str(failure)
    assert "\n" not in str(failure)


def test_the_start_up_line_says_the_int8_model_serves(whole, tmp_path, capsys):
    from keras_preact_serving.server import announce, make_server

    copy(whole, tmp_path / "m")
    server = make_server(tmp_path / "m", port=0)  # --runtime auto
    try:
        announce(server, "keras-preact-serve")
    finally:
        server.server_close()
    line = capsys.readouterr().out.splitlines()[0]
    assert line.endswith("[serving_default on openvino-int8 (openvino/model-int8.xml)]"), line
