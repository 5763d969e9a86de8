"""Keras-Applications entry points and exact conversion of keras.applications ResNetV2."""

import keras
import numpy as np
import pytest

from keras_preact import applications
from keras_preact.applications import from_keras_applications
from support import to_numpy, trainable_params

pytestmark = pytest.mark.core


def randomize_batch_norm(model, rng):
    """Non-trivial statistics so the equivalence test exercises every BN (fresh BN is ~identity)."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            g, b, m, v = layer.get_weights()
            layer.set_weights(
                [rng.uniform(0.5, 1.5, g.shape), rng.normal(0, 0.2, b.shape),
                 rng.normal(0, 0.2, m.shape), rng.uniform(0.5, 1.5, v.shape)]
            )


@pytest.mark.parametrize(
    "source, kwargs",
    [
        (keras.applications.ResNet50V2, dict(input_shape=(64, 64, 3), classifier_activation=None)),
        (keras.applications.ResNet50V2, dict(input_shape=(64, 64, 3))),
        (keras.applications.ResNet101V2, dict(include_top=False, pooling="avg", input_shape=(32, 32, 3))),
        (keras.applications.ResNet152V2, dict(include_top=False, input_shape=(32, 32, 3))),
    ],
)
def test_conversion_gives_same_outputs(source, kwargs, rng):
    reference = source(weights=None, **kwargs)
    randomize_batch_norm(reference, rng)
    converted = from_keras_applications(reference)
    assert converted.count_params() == reference.count_params()
    x = rng.uniform(-1, 1, size=(2, *reference.input_shape[1:])).astype("float32")
    expected = to_numpy(reference(x, training=False))
    actual = to_numpy(converted(x, training=False))
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-4)


def test_conversion_rejects_other_models():
    # The refusal reads the layers, not the weights: MobileNetV3Small is built without running its initializers
    # (on JAX each new variable shape's initializer is an XLA compile: 27 s of a CI worker, 2-core AMD EPYC).
    with keras.StatelessScope(initialize_variables=False):
        other = keras.applications.MobileNetV3Small(weights=None, input_shape=(32, 32, 3))
    with pytest.raises(ValueError, match=r"expects a keras.applications ResNet50V2, .*; got 'MobileNetV3Small'"):
        from_keras_applications(other)


@pytest.mark.parametrize("depth", [18, 34, 50, 101, 152, 200])
def test_entry_points_follow_keras_applications_semantics(depth):
    builder = getattr(applications, f"PreActResNet{depth}")
    model = builder(include_top=False, pooling="max", input_shape=(32, 32, 3))
    assert model.output_shape[-1] == (512 if depth < 50 else 2048)
    assert builder(include_top=False).input_shape == (None, None, None, 3)


def test_entry_point_default_is_official_layout():
    model = applications.PreActResNet50(classes=10, classifier_activation=None)
    assert model.input_shape == (None, 224, 224, 3)
    assert trainable_params(model) == 25_549_352 - 2048 * 990 - 990


def test_weights_from_file(tmp_path, rng):
    model = applications.PreActResNet18(input_shape=(32, 32, 3), classes=5)
    path = str(tmp_path / "w.weights.h5")
    model.save_weights(path)
    loaded = applications.PreActResNet18(input_shape=(32, 32, 3), classes=5, weights=path)
    x = rng.uniform(size=(1, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(to_numpy(loaded(x)), to_numpy(model(x)))


def test_imagenet_weights_offline_fail_fast(tmp_path, monkeypatch):
    """Offline (an unreachable host), PreActResNet50(weights="imagenet") fails fast in create_model's one line:
    the same fetcher of Keras' file."""
    from keras_preact.pretrained import sources

    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    monkeypatch.setattr(sources, "KERAS_WEIGHTS_URL", "https://keras-weights.invalid/resnet/")
    import time

    start = time.monotonic()
    with pytest.raises(OSError, match="Cannot fetch Keras' resnet50v2_weights_tf_dim_ordering_tf_kernels.h5"):
        applications.PreActResNet50(weights="imagenet", include_top=False, input_shape=(32, 32, 3))
    assert time.monotonic() - start < 60


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(depth=18, weights="imagenet"), "depth 50, 101, 152"),
        (dict(depth=50, weights="imagenet", classes=10), "classes"),
        (dict(depth=50, weights="imagenet", layout="fb"), "layout"),
        (dict(depth=50, weights="imagenet", input_shape=(128, 128, 3)), "input_shape"),
        (dict(depth=50, weights="imagenet", ordering="original"), "unit options"),
        (dict(depth=50, weights="imagenet21k"), "weights"),
        (dict(depth=50, layout="caffe"), "layout"),
    ],
)
def test_bad_application_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        applications.preact_resnet(**kwargs)
