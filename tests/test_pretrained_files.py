"""Checkpoint files from elsewhere, through ``create_model(..., weights=FILE)``: every bad file is refused in one
line that names the file and what is wrong, before any network is built, with no traceback of torch, h5py or
safetensors behind it (a malicious pickle runs nothing); keras.applications' ResNetV2 saved by Keras 3
(``save_weights`` ``.weights.h5``, ``model.save`` ``.keras``) loads as exactly as its legacy ``.h5``."""

import os
import pickle
import struct
import sys
import traceback

import keras
import numpy as np
import pretrained_reference as ref
import pytest

from keras_preact.applications import from_keras_applications
from keras_preact.models import create_model
from keras_preact.pretrained.reading import CheckpointError, check_tensors, read_state_dict
from support import to_numpy

pytestmark = [pytest.mark.core, pytest.mark.notf]
SIZE = (32, 32, 3)
THIRD_PARTY = ("torch", "h5py", "safetensors")


@pytest.fixture(autouse=True)
def keras_home(monkeypatch, tmp_path):
    """A fresh conversion cache: no file of another test is reused."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))


@pytest.fixture
def no_network(monkeypatch):
    """Any convolution constructed fails the test: the refusal comes before a network is built."""
    def refuse(self, *args, **kwargs):
        raise AssertionError("a network was built before the checkpoint was refused")

    monkeypatch.setattr(keras.layers.Conv2D, "__init__", refuse)


def refused(path, *words, model="imagenet_resnet18"):
    """The one line ``create_model(model, weights=path)`` is refused with: it names the file and ``words``, and
    no third-party traceback stands behind it (nothing chained, no frame of torch, h5py or safetensors)."""
    with pytest.raises(CheckpointError) as caught:
        create_model(model, weights=str(path))
    return assert_one_line(caught.value, path, *words)


def assert_one_line(error, path, *words):
    message = str(error)
    assert "\n" not in message and str(path) in message, message
    for word in words:
        assert word in message, (word, message)
    assert "weights_only" not in message  # never torch's advice to load a pickle unsafely
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    frames = "".join(traceback.format_exception(error)).splitlines()
    assert not [line for line in frames if line.lstrip().startswith("File") and any(
        f"{os.sep}{name}{os.sep}" in line for name in THIRD_PARTY)], frames
    return message


def state(seed=0):
    return ref.random_state(18, num_classes=5, seed=seed)


def save_safetensors(path, tensors):
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path))
    return path


# -------------------------------------------------------------------------------------------- pickles
class ShellCommand:
    """A pickle that runs ``touch MARKER`` through the shell when unpickled (as an attacker's would)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("writer", ["torch.save", "pickle"])
def test_malicious_pth_runs_nothing_and_is_refused_in_one_line(tmp_path, writer, no_network):
    torch = pytest.importorskip("torch")
    proof = tmp_path / "proof"
    pickle.loads(pickle.dumps(ShellCommand(proof)))  # the payload is real: unpickled unsafely, it runs
    assert proof.exists()
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pth"
    payload = {"stem.conv.weight": ShellCommand(marker)}
    if writer == "torch.save":
        torch.save(payload, str(path))
    else:
        path.write_bytes(pickle.dumps(payload, protocol=2))
    message = refused(path, "only tensor checkpoints are loaded", ".safetensors")
    assert not marker.exists()
    if writer == "torch.save":
        assert "system" in message  # the call it asked for, named


def test_non_tensor_pickle_is_refused_in_one_line(tmp_path, no_network):
    torch = pytest.importorskip("torch")
    path = tmp_path / "lists.pth"
    torch.save({"stem.conv.weight": [[1.0, 2.0]], "norm.weight": torch.ones(3)}, str(path))
    refused(path, "stem.conv.weight is no tensor", "only tensor checkpoints are loaded", ".safetensors")
    not_a_dict = tmp_path / "list.pth"
    torch.save([torch.ones(3)], str(not_a_dict))
    refused(not_a_dict, "holds list", "only tensor checkpoints are loaded")


def test_a_tensor_pth_still_loads(tmp_path):
    torch = pytest.importorskip("torch")
    tensors = state(1)
    path = tmp_path / "resnetv2_18.pth"
    torch.save({"state_dict": {k: torch.from_numpy(np.array(v)) for k, v in tensors.items()}}, str(path))
    assert set(read_state_dict(path)) == set(tensors)


# ---------------------------------------------------------------------------------------- safetensors
def test_truncated_safetensors_is_refused_in_one_line(tmp_path, no_network):
    good = save_safetensors(tmp_path / "good.safetensors", state())
    path = tmp_path / "truncated.safetensors"
    path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    refused(path, "truncated")


def test_safetensors_header_claiming_2_62_bytes_is_refused_in_one_line(tmp_path, no_network):
    good = save_safetensors(tmp_path / "good.safetensors", state())
    path = tmp_path / "huge_header.safetensors"
    path.write_bytes(struct.pack("<Q", 2**62) + good.read_bytes()[8:])
    refused(path, f"claims {2**62} bytes")


def test_safetensors_header_that_is_no_json_or_points_outside_is_refused(tmp_path):
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(struct.pack("<Q", 4) + b"{{{{")
    refused(garbage, "not JSON")
    outside = tmp_path / "outside.safetensors"
    header = b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}'
    outside.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    refused(outside, "'w' lies at bytes 0-16 of 8")


# ------------------------------------------------------------------------------------------- tensors
@pytest.mark.parametrize("defect, words", [
    ("int8", ("stem.conv.weight is int8", "only float tensors")),
    ("nan", ("stem.conv.weight holds NaN or infinite values", "allow_non_finite=True")),
    ("inf", ("norm.running_var holds NaN or infinite values",)),
])
def test_int8_nan_and_inf_tensors_are_refused_in_one_line(tmp_path, defect, words, no_network):
    tensors = state()
    if defect == "int8":
        tensors["stem.conv.weight"] = np.clip(tensors["stem.conv.weight"] * 100, -127, 127).astype("int8")
    elif defect == "nan":
        tensors["stem.conv.weight"][0, 0, 0, 0] = np.nan
    else:
        tensors["norm.running_var"][3] = np.inf
    path = save_safetensors(tmp_path / f"{defect}.safetensors", tensors)
    refused(path, *words)
    if defect != "int8":  # the documented flag reads them anyway
        assert not np.isfinite(read_state_dict(path, allow_non_finite=True)[words[0].split()[0]]).all()



def test_allow_non_finite_weights_loads_them_and_a_checked_load_still_refuses_them(tmp_path):
    """create_model(..., allow_non_finite_weights=True) converts a checkpoint holding NaN (the logit of the
    NaN bias is NaN, the others are not); the conversion it cached is never served to a load without the flag."""
    tensors = state()
    tensors["head.fc.bias"][2] = np.nan
    path = save_safetensors(tmp_path / "nan.safetensors", tensors)
    model = create_model("imagenet_resnet18", weights=str(path), allow_non_finite_weights=True, input_shape=SIZE,
                         classifier_activation=None)
    logits = to_numpy(model(np.zeros((1, *SIZE), "float32"), training=False))
    assert np.isnan(logits[0, 2]) and np.isfinite(np.delete(logits[0], 2)).all()
    refused(path, "head.fc.bias holds NaN or infinite values", "allow_non_finite=True")


@pytest.mark.parametrize("defect, words", [
    ("missing", ("1 missing (stages.1.blocks.0.norm2.weight)",)),
    ("extra", ("1 unexpected (stages.0.blocks.0.attn.weight)",)),
    ("mis-shaped", ("mis-shaped: stages.2.blocks.1.conv1.weight is (256, 256, 1, 1), expected (256, 256, 3, 3)",)),
])
def test_missing_extra_and_mis_shaped_tensors_are_named_in_one_line(tmp_path, defect, words, no_network):
    tensors = state()
    if defect == "missing":
        del tensors["stages.1.blocks.0.norm2.weight"]
    elif defect == "extra":
        tensors["stages.0.blocks.0.attn.weight"] = np.ones((4, 4), "float32")
    else:
        tensors["stages.2.blocks.1.conv1.weight"] = tensors["stages.2.blocks.1.conv1.weight"][:, :, :1, :1]
    refused(save_safetensors(tmp_path / f"{defect}.safetensors", tensors), *words)


def test_check_tensors_names_the_first_few():
    tensors = {f"w{i}": np.zeros(2, "float32") for i in range(6)}
    with pytest.raises(CheckpointError, match=r"6 missing \(x0, x1, x2 and 3 more\); 6 unexpected \(w0, w1, w2 and"):
        check_tensors(tensors, {f"x{i}": (2,) for i in range(6)}, path="w.safetensors")
    check_tensors({**tensors, "bn.num_batches_tracked": np.array(7)}, {k: (2,) for k in tensors}, path="ok")


# ---------------------------------------------------------------------------------------------- .h5
def test_empty_h5_is_refused_in_one_line(tmp_path, no_network):
    empty = tmp_path / "empty.h5"
    empty.write_bytes(b"")
    refused(empty, "empty (0 bytes)", model="imagenet_resnet50")
    empty_weights = tmp_path / "empty.weights.h5"
    empty_weights.write_bytes(b"")
    refused(empty_weights, "empty (0 bytes)", model="imagenet_resnet50")


def test_foreign_h5_is_refused_in_one_line(tmp_path, no_network):
    import h5py

    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["images"] = np.zeros((2, 3), "float32")
    refused(foreign, "an HDF5 file without Keras weights", model="imagenet_resnet50")
    text = tmp_path / "text.h5"
    text.write_text("not HDF5 at all")
    refused(text, "not an HDF5 file", model="imagenet_resnet50")
    truncated = tmp_path / "truncated.h5"
    with h5py.File(truncated, "w") as f:
        f["model_weights/conv1_conv/kernel"] = np.ones((64, 1024), "float32")
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    refused(truncated, "HDF5 cannot open it", "truncated", model="imagenet_resnet50")
    foreign_weights = tmp_path / "foreign.weights.h5"
    foreign_weights.write_bytes(foreign.read_bytes())
    refused(foreign_weights, "an HDF5 file without Keras weights", model="imagenet_resnet50")


# --------------------------------------------------------------------------------- Keras 3's files
@pytest.fixture(scope="module")
def keras_resnet50v2(tmp_path_factory):
    """keras.applications' ResNet50V2 (random weights and BN statistics, 5 classes, no softmax) saved as the
    legacy ``.h5``, Keras 3's ``save_weights`` ``.weights.h5`` and ``model.save`` ``.keras``."""
    source = keras.applications.ResNet50V2(weights=None, input_shape=SIZE, classes=5, classifier_activation=None)
    rng = np.random.default_rng(3)
    for layer in source.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            g, b, m, v = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, g.shape), rng.normal(0, 0.2, b.shape),
                               rng.normal(0, 0.3, m.shape), rng.uniform(0.5, 2.0, v.shape)])
    folder = tmp_path_factory.mktemp("keras3")
    source.save(str(folder / "r50v2.h5"))  # legacy HDF5, keras.applications' own format
    source.save_weights(str(folder / "r50v2.weights.h5"))
    source.save(str(folder / "r50v2.keras"))
    x = rng.uniform(-1, 1, (2, *SIZE)).astype("float32")
    return folder, x, to_numpy(source(x))


@pytest.mark.parametrize("file", ["r50v2.h5", "r50v2.weights.h5", "r50v2.keras"])
def test_keras3_files_of_keras_applications_load_as_the_legacy_h5(keras_resnet50v2, file):
    """create_model("imagenet_resnet50", weights=FILE) and from_keras_applications(FILE): the source's logits."""
    folder, x, expected = keras_resnet50v2
    model = create_model("imagenet_resnet50", weights=str(folder / file), input_shape=SIZE,
                         classifier_activation=None)
    assert model.output_shape == (None, 5) and model.backbone.stem == "imagenet"  # the tf_slim layout's stem
    assert np.abs(to_numpy(model(x)) - expected).max() <= 1e-4
    converted = from_keras_applications(str(folder / file), classifier_activation="linear", input_shape=SIZE)
    assert np.abs(to_numpy(converted(x)) - expected).max() <= 1e-4


def test_keras_file_of_another_depth_is_refused_in_one_line(keras_resnet50v2, no_network):
    folder, _, _ = keras_resnet50v2
    refused(folder / "r50v2.weights.h5", "a depth-50 Keras file, not a keras.applications ResNet101V2's",
            model="imagenet_resnet101")


def test_reading_examples_run(tmp_path, monkeypatch):
    """The Examples of keras_preact.pretrained.reading (shown in the API docs) run as written."""
    import doctest

    from keras_preact.pretrained import reading

    pytest.importorskip("safetensors")
    monkeypatch.chdir(tmp_path)
    results = doctest.testmod(reading, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert results.attempted >= 8 and results.failed == 0


@pytest.mark.parametrize("modules, file, install", [(("torch",), "w.pth", "pip install torch"), (
    ("safetensors", "safetensors.numpy"), "w.safetensors", "pip install safetensors")])
def test_a_missing_reader_is_named_in_one_line_with_its_install(tmp_path, monkeypatch, modules, file, install):
    path = tmp_path / file
    path.write_bytes(struct.pack("<Q", 2) + b"{}")  # an empty safetensors file; any bytes for the .pth
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # importing it raises ImportError
    with pytest.raises(ImportError) as caught:
        read_state_dict(path)
    assert "\n" not in str(caught.value) and install in str(caught.value) and caught.value.__suppress_context__
