"""Trained weights through the registry (sha256-checked package data) and the input config and class
names a model carries through ``.keras`` files. The weights are files the tests write: none ship yet."""

import pathlib

import keras
import numpy as np
import pytest

from keras_preact.models import (
    PreActResNetClassifier,
    create_model,
    get_input_config,
    list_models,
    model_spec,
    register_model,
)
from keras_preact.models.registry import unregister_model
from keras_preact.models.weights import SUFFIX, WEIGHTS_DIR, WeightsSpec, sha256_of
from support import randomize_statistics, run_saving_test, to_numpy

pytestmark = [pytest.mark.core, pytest.mark.notf]

INPUT = get_input_config("cifar_resnet20").replace(input_size=(16, 16, 3))
CLASSES = ["ant", "bee", "cat"]


@pytest.fixture
def trained(tmp_path):
    """``("test_trained", reference model)``: a registered ResNet-8 whose weights ``"toy"`` are a file
    written here, registered with its sha256."""
    keras.utils.set_random_seed(1)
    reference = randomize_statistics(create_model("cifar_resnet20", num_classes=3, input_shape=(16, 16, 3),
                                                  depth=8), seed=1)
    path = tmp_path / "toy.weights.h5"
    reference.save_weights(path)
    entry = dict(file=str(path), sha256=sha256_of(path), class_names=CLASSES, dataset="toy", top1=0.5)
    register_model("test_trained", family="cifar", arguments={"depth": 8}, input_config=INPUT,
                   weights={"toy": entry})
    yield "test_trained", reference
    unregister_model("test_trained")


def _images(n=4, size=16):
    return np.random.default_rng(0).uniform(-2, 2, (n, size, size, 3)).astype("float32")


def test_weights_load_by_name_and_carry_class_names_and_input_config(trained):
    name, reference = trained
    model = create_model(name, weights="toy")
    np.testing.assert_array_equal(to_numpy(model(_images())), to_numpy(reference(_images())))
    assert model.class_names == tuple(CLASSES) and model.input_config == INPUT
    restored = run_saving_test(model, _images())
    assert restored.class_names == tuple(CLASSES) and restored.input_config == INPUT


def test_a_changed_or_missing_file_names_it_and_both_digests(trained):
    name, _ = trained
    spec = model_spec(name).weights["toy"]
    with open(spec.path, "ab") as f:
        f.write(b"\0")
    with pytest.raises(ValueError, match="reinstall") as error:
        create_model(name, weights="toy")
    message = str(error.value)
    assert message.startswith("Invalid weights='toy' of test_trained: ")
    assert str(spec.path) in message and spec.sha256 in message and sha256_of(spec.path) in message
    spec.path.unlink()
    with pytest.raises(ValueError, match=f"{spec.path} is missing \\(expected sha256 {spec.sha256}"):
        create_model(name, weights="toy")


@pytest.mark.parametrize("kwargs, message", [
    (dict(weights="imagenet"), r"Invalid weights='imagenet' for test_trained\. Allowed values: None, 'toy', or the "
                               r"path of a keras-preact "),
    (dict(weights=["toy"]), "Invalid weights"),
    (dict(weights="toy", include_top=False), "Invalid include_top"),
    (dict(weights="toy", depth=20), "does not fit the model built"),
])
def test_bad_weights_arguments_raise_naming_them(trained, kwargs, message):
    with pytest.raises(ValueError, match=message):
        create_model(trained[0], **kwargs)


def test_unregistered_weights_list_what_is_allowed():
    with pytest.raises(ValueError, match="Allowed values: None \\(no trained weights are registered for it\\)"):
        create_model("imagenet_resnet200", weights="imagenet")


def test_every_shipped_weights_file_is_present_with_its_sha256():  # none ship yet
    for name in list_models():
        for spec in model_spec(name).weights.values():
            if spec.origin == "package":  # published checkpoints are fetched: tests/test_pretrained_registry.py
                assert spec.checked_path(name).is_file()


@pytest.mark.parametrize("entry, message", [
    ({"file": "x.h5", "sha256": "0" * 64, "class_names": ["a"]}, "must be a .weights.h5 file"),
    ({"file": "x.weights.h5", "sha256": "ABC", "class_names": ["a"]}, "64 lowercase hex"),
    ({"file": "x.weights.h5", "sha256": "0" * 64}, "class_names missing"),
    ({"file": "x.weights.h5", "sha256": "0" * 64, "class_names": []}, "class_names must be"),
    ({"file": "x.weights.h5", "sha256": "0" * 64, "class_names": ["a"], "top_1": 0.9}, "unknown \\['top_1'\\]"),
])
def test_bad_weights_entries_are_refused_at_registration(entry, message):
    with pytest.raises(ValueError, match=f"Invalid weights\\['w'\\] of test_bad: .*{message}"):
        register_model("test_bad", family="cifar", arguments={"depth": 8}, input_config=INPUT, weights={"w": entry})
    assert "test_bad" not in list_models()


def test_package_weights_resolve_in_the_package_folder():
    spec = WeightsSpec("cifar10", "cifar_resnet20_cifar10.weights.h5", "0" * 64, ("a",))
    assert spec.path.parent.name == "weights" and spec.path.parent.parent.name == "keras_preact"


@pytest.mark.parametrize("name", ["cifar_resnet20", "imagenet_resnet18"])
def test_registry_models_carry_their_input_config_at_their_input_size(name):
    config = get_input_config(name)
    assert create_model(name, num_classes=2).input_config == config
    small = create_model(name, num_classes=2, input_shape=(64, 64, 3))
    assert small.input_config == config.replace(input_size=(64, 64, 3))
    assert small.input_config.crop_fraction == config.crop_fraction  # ImageNet: 0.875
    assert small.class_names is None
    dynamic = create_model(name, num_classes=2, input_shape=(None, None, 3))
    assert dynamic.input_config == config


def test_carried_metadata_is_checked():
    model = create_model("cifar_resnet20", num_classes=3, depth=8)
    assert isinstance(model, PreActResNetClassifier)
    model.class_names = CLASSES
    model.input_config = INPUT.replace(input_size=(32, 32, 3)).to_dict()
    assert model.class_names == tuple(CLASSES) and model.input_config.input_size == (32, 32, 3)
    with pytest.raises(ValueError, match="Invalid class_names"):
        model.class_names = ["a", "b"]
    with pytest.raises(ValueError, match="Invalid input_config: its input_size"):
        model.input_config = INPUT
    with pytest.raises(ValueError, match="Invalid input_config"):
        model.input_config = "cifar"


def test_the_weights_folder_is_package_data():
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+")
    project = tomllib.loads((pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    globs = project["tool"]["setuptools"]["package-data"]["keras_preact"]
    assert f"{WEIGHTS_DIR.name}/*{SUFFIX}" in globs and WEIGHTS_DIR.is_dir()
