"""One model, whichever way it is built (issue 34, item 4): ``create_model``, the family builders, the
Keras-Applications functions and the backbone + classifier classes give the same network, input config
and class names included, and all take ``dtype``; none of them is generated at run time. And keras.applications'
conventions on it (item 7): ``preprocess_input``/``decode_predictions`` from the model's own input config and
class names."""

import inspect
import pathlib

import keras
import numpy as np
import pytest

from keras_preact import applications
from keras_preact.applications import decode_predictions, preprocess_input, preprocess_input_resnet_v2
from keras_preact.models import (
    PreActResNetBackbone,
    PreActResNetClassifier,
    cifar_resnet,
    create_model,
    get_input_config,
    imagenet_resnet,
)
from keras_preact.models.presets import CIFAR10_CLASSES
from support import to_numpy

pytestmark = [pytest.mark.core, pytest.mark.notf]

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_preact"
SHAPE = (64, 64, 3)


def imagenet18_paths(shape=SHAPE, **kwargs):
    """ResNet-18 with 10 classes at ``shape``, built each way a user can (``kwargs`` given to each)."""
    return {
        "create_model": lambda: create_model("imagenet_resnet18", num_classes=10, input_shape=shape, **kwargs),
        "imagenet_resnet": lambda: imagenet_resnet(18, num_classes=10, input_shape=shape, **kwargs),
        "PreActResNet18": lambda: applications.PreActResNet18(classes=10, input_shape=shape, **kwargs),
        "classifier class": lambda: PreActResNetClassifier(
            imagenet_resnet(18, include_top=False, input_shape=shape, **kwargs), 10),
    }


def cifar20_paths(**kwargs):
    return {
        "create_model": lambda: create_model("cifar_resnet20", **kwargs),
        "cifar_resnet": lambda: cifar_resnet(20, **kwargs),
        "classifier class": lambda: PreActResNetClassifier(cifar_resnet(20, include_top=False, **kwargs), 10),
    }


def _unnamed(config):
    """A classifier's config without the names (the classifier class names itself after its class)."""
    config = {k: v for k, v in config.items() if k != "name"}
    backbone = dict(config["backbone"], config={k: v for k, v in config["backbone"]["config"].items()
                                                if k != "name"})
    return {**config, "backbone": backbone}


@pytest.mark.parametrize("family, paths", [("imagenet", imagenet18_paths), ("cifar", cifar20_paths)])
def test_every_path_gives_the_same_model_input_config_included(family, paths):
    models = {path: build() for path, build in paths().items()}
    reference = models["create_model"]
    expected = get_input_config(reference.name.replace("preact_resnet", f"{family}_resnet").replace("_cifar", ""))
    expected = expected.replace(input_size=tuple(reference.input_shape[1:]))
    for path, model in models.items():
        assert isinstance(model, PreActResNetClassifier), path
        assert model.input_config == expected, path
        assert _unnamed(model.get_config()) == _unnamed(reference.get_config()), path
    assert reference.input_config.crop_fraction == (0.875 if family == "imagenet" else 1.0)


def test_class_names_are_carried_on_every_path():
    weights = create_model("cifar_resnet20", weights="cifar10")
    assert weights.class_names == tuple(CIFAR10_CLASSES)
    for path, build in cifar20_paths().items():
        assert build().class_names is None, path  # untrained: no classes known
    given = [cifar_resnet(20, class_names=CIFAR10_CLASSES), create_model("cifar_resnet20", class_names=CIFAR10_CLASSES),
             PreActResNetClassifier(cifar_resnet(20, include_top=False), 10, class_names=CIFAR10_CLASSES)]
    assert {model.class_names for model in given} == {tuple(CIFAR10_CLASSES)}
    assert {_unnamed(m.get_config())["input_config"]["mean"] == list(weights.input_config.mean) for m in given} == {
        True
    }


def test_an_explicit_input_config_or_none_is_kept_and_old_files_stay_without_one():
    config = get_input_config("imagenet_resnet18").replace(crop_fraction=1.0)
    assert imagenet_resnet(18, input_shape=SHAPE, input_config=config).input_config == config.replace(input_size=SHAPE)
    assert imagenet_resnet(18, input_shape=SHAPE, input_config=None).input_config is None
    # A config written without one (an older .keras file) loads without one.
    model = cifar_resnet(8, 3, input_shape=(16, 16, 3))
    revived = PreActResNetClassifier.from_config({**model.get_config(), "input_config": None})
    assert revived.input_config is None
    # A channel count the family has no statistics for: no input config rather than a wrong one.
    assert cifar_resnet(8, 3, input_shape=(16, 16, 1)).input_config is None


def _layers(model):
    return [layer for layer in model._flatten_layers() if not isinstance(layer, keras.layers.InputLayer)]


DTYPE_PATHS = {
    "create_model": lambda dtype: create_model("cifar_resnet20", depth=8, input_shape=(16, 16, 3), dtype=dtype),
    "cifar_resnet": lambda dtype: cifar_resnet(8, input_shape=(16, 16, 3), dtype=dtype),
    "imagenet_resnet": lambda dtype: imagenet_resnet(18, input_shape=SHAPE, dtype=dtype),
    "imagenet_resnet headless": lambda dtype: imagenet_resnet(18, input_shape=SHAPE, include_top=False, dtype=dtype),
    "PreActResNet18": lambda dtype: applications.PreActResNet18(input_shape=SHAPE, dtype=dtype),
    "backbone class": lambda dtype: PreActResNetBackbone([1, 1], [8, 16], [1, 2], input_shape=(16, 16, 3), dtype=dtype),
    "classifier class": lambda dtype: PreActResNetClassifier(
        PreActResNetBackbone([1, 1], [8, 16], [1, 2], input_shape=(16, 16, 3)), 3, dtype=dtype),
}


@pytest.mark.parametrize("path", sorted(DTYPE_PATHS))
def test_dtype_works_on_every_path(path, rng):
    model = DTYPE_PATHS[path]("mixed_bfloat16")
    layers = _layers(model)
    assert len(layers) > 10
    for layer in layers:
        expected = "float32" if layer.name == "predictions" else "mixed_bfloat16"
        assert layer.dtype_policy.name == expected, (path, layer.name)
    revived = type(model).from_config(model.get_config())
    assert {layer.dtype_policy.name for layer in _layers(revived)} == {layer.dtype_policy.name for layer in layers}
    y = model(rng.uniform(size=(1, *model.input_shape[1:])).astype("float32"))
    assert np.isfinite(to_numpy(y).astype("float32")).all()


def test_builders_show_their_arguments_without_a_rewritten_signature():
    shared = {"include_top", "pooling", "classifier_activation", "dropout", "drop_path_rate", "input_tensor",
              "data_format", "dtype", "remat", "input_config", "class_names", "name"}
    for builder in (cifar_resnet, imagenet_resnet):
        assert "__signature__" not in vars(builder)
        parameters = inspect.signature(builder).parameters
        assert shared <= set(parameters), builder.__name__
        assert all(parameters[p].kind is inspect.Parameter.KEYWORD_ONLY for p in shared)
        assert "Examples:" in builder.__doc__ and "He et al. 2016" in builder.__doc__


def test_nothing_of_the_library_is_generated_at_run_time():
    """No module ``__getattr__``/``__dir__``, ``globals().update``, ``__signature__`` assignment or
    process-global socket timeout in the model-building code."""
    for path in [*sorted((PACKAGE / "models").glob("*.py")), *sorted((PACKAGE / "applications").glob("*.py"))]:
        source = path.read_text(encoding="utf-8")
        for pattern in ("def __getattr__", "def __dir__", "globals().update", "__signature__ =", "setdefaulttimeout",
                        "__all__ +="):
            assert pattern not in source, f"{path.name}: {pattern}"
    for depth in (18, 34, 50, 101, 152, 200):
        entry = getattr(applications, f"PreActResNet{depth}")
        assert inspect.isfunction(entry) and entry.__module__ == "keras_preact.applications.preact_resnet"
        assert list(inspect.signature(entry).parameters)[:8] == [
            "include_top", "weights", "input_tensor", "input_shape", "pooling", "classes", "classifier_activation",
            "name"]


# ------------------------------------------------------------------ preprocess_input, decode_predictions
def _model_preprocessing(images, config):
    """The model's own preprocessing, as export and evaluation apply it (keras_preact.preprocessing.normalize)."""
    try:
        from keras_preact.preprocessing import normalize

        return np.asarray(normalize(images, config.mean, config.std))
    except ImportError:  # TensorFlow-free: the same float32 arithmetic, written out
        return (images.astype("float32") - np.float32(config.mean)) / np.float32(config.std)


@pytest.mark.parametrize("name", ["cifar_resnet20", "imagenet_resnet18"])
def test_preprocess_input_is_the_models_own_preprocessing(name):
    model = create_model(name, weights="cifar10") if name == "cifar_resnet20" else create_model(name)
    config = model.input_config
    images = np.random.default_rng(0).integers(0, 256, (3, *config.input_size)).astype("uint8")
    expected = _model_preprocessing(images, config)
    for given in (model, name, config, config.to_dict()):
        actual = preprocess_input(images, given)
        assert actual.dtype == np.float32
        np.testing.assert_array_equal(actual, expected)
    # A backend tensor stays one; XLA (JAX) may divide through a reciprocal: to one float32 rounding.
    tensor = preprocess_input(keras.ops.convert_to_tensor(images), model)
    np.testing.assert_allclose(to_numpy(tensor), expected, rtol=3e-7, atol=0)
    # Keras' ResNetV2 [-1, 1] scaling is another function, and another result for this model.
    resnet_v2 = preprocess_input_resnet_v2(images.astype("float32"))
    np.testing.assert_allclose(resnet_v2, images / 127.5 - 1, atol=1e-6)
    assert np.abs(resnet_v2 - expected).max() > 0.1


def test_preprocess_input_channels_first_and_keras_imagenet_weights_config():
    config = get_input_config("cifar_resnet20")
    images = np.random.default_rng(1).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    first = preprocess_input(images.transpose(0, 3, 1, 2), config, data_format="channels_first")
    np.testing.assert_array_equal(first.transpose(0, 2, 3, 1), preprocess_input(images, config))
    # A model with Keras' ResNetV2 ImageNet weights carries their [-1, 1] input config.
    from keras_preact.applications.preact_resnet import KERAS_RESNET_V2_INPUT

    np.testing.assert_allclose(preprocess_input(images, KERAS_RESNET_V2_INPUT), preprocess_input_resnet_v2(images),
                               atol=1e-6)


@pytest.mark.parametrize("model, message", [
    (None, "^Invalid model=None: .*preprocess_input_resnet_v2"),
    ("resnet9000", "^Invalid model='resnet9000': Unknown model name"),
    ("headless", "^Invalid model='preact_resnet18_backbone': it carries no input_config"),
    ({"crop_pct": 0.9}, "^Invalid model="),
])
def test_preprocess_input_refuses_without_a_known_input_config(model, message):
    if model == "headless":
        model = imagenet_resnet(18, include_top=False, input_shape=SHAPE)
    with pytest.raises(ValueError, match=message):
        preprocess_input(np.zeros((1, 8, 8, 3)), model)
    with pytest.raises(ValueError, match="^Invalid data_format"):
        preprocess_input(np.zeros((1, 8, 8, 3)), "cifar_resnet20", data_format="NHWC")


def test_decode_predictions_names_and_orders_the_top_classes():
    model = create_model("cifar_resnet20", weights="cifar10")
    preds = np.array([[0.05, 0.1, 0.3, 0.0, 0.0, 0.0, 0.05, 0.5, 0.0, 0.0],
                      [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.4, 0.6]], "float32")
    expected = [[(7, "horse", 0.5), (2, "bird", 0.3), (1, "automobile", 0.1)],
                [(9, "truck", 0.6), (8, "ship", 0.4), (0, "airplane", 0.0)]]
    for kwargs in (dict(model=model), dict(model="cifar_resnet20"), dict(class_names=CIFAR10_CLASSES)):
        decoded = decode_predictions(preds, top=3, **kwargs)
        assert [[(i, n) for i, n, _ in row] for row in decoded] == [[(i, n) for i, n, _ in row] for row in expected]
        np.testing.assert_allclose(
            [[s for *_, s in row] for row in decoded], [[s for *_, s in row] for row in expected]
        )
    assert len(decode_predictions(preds, model=model)[0]) == 5  # keras.applications' default top=5
    images = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3))
    probabilities = to_numpy(model(preprocess_input(images, model)))
    top = decode_predictions(probabilities, top=1, model=model)
    assert [row[0][0] for row in top] == list(np.argmax(probabilities, axis=1))


@pytest.mark.parametrize("kwargs, message", [
    (dict(), "^Invalid model=None"),
    (dict(model="imagenet_resnet200"), "^Invalid model='imagenet_resnet200': it has no registered trained weights"),
    # timm's ImageNet-1k weights carry the 1,000 shipped names: 10 scores do not fit them
    (dict(model="imagenet_resnet18"), r"^Invalid preds of shape \(1, 10\): expected \[N, 1000\]"),
    (dict(model="untrained"), "^Invalid model='preact_resnet8_cifar': it carries no class_names"),
    (dict(model="cifar_resnet20", class_names=CIFAR10_CLASSES), "^Invalid model and class_names"),
    (dict(class_names=["a", "b"]), r"^Invalid preds of shape \(1, 10\)"),
    (dict(class_names=CIFAR10_CLASSES, top=0), "^Invalid top=0"),
    (dict(class_names=CIFAR10_CLASSES, top=11), "^Invalid top=11"),
])
def test_decode_predictions_errors_name_the_argument(kwargs, message):
    if kwargs.get("model") == "untrained":
        kwargs["model"] = cifar_resnet(8, input_shape=(16, 16, 3))
    with pytest.raises(ValueError, match=message):
        decode_predictions(np.full((1, 10), 0.1), **kwargs)
