"""Fine-tuning levers of the library (``keras_preact.models.levers``): layer-wise learning-rate decay scales each
stage's update as asked under plain ``model.fit``; the linear probe's head is the ridge regression's solution."""

import keras
import numpy as np
import pytest

from keras_preact.models import cifar_resnet, levers

pytestmark = [pytest.mark.core, pytest.mark.notf]


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    return cifar_resnet(8, num_classes=3, input_shape=(8, 8, 3))


def _batch():
    rng = np.random.default_rng(0)
    return rng.normal(size=(8, 8, 8, 3)).astype("float32"), np.arange(8) % 3


def _one_step(model, optimizer):
    """Each trainable variable's change in one ``model.fit`` step, by path."""
    x, y = _batch()
    model.compile(optimizer, "sparse_categorical_crossentropy")
    before = {v.path: keras.ops.convert_to_numpy(v).copy() for v in model.trainable_variables}
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    return {v.path: keras.ops.convert_to_numpy(v) - before[v.path] for v in model.trainable_variables}


@pytest.mark.parametrize("make", [lambda: keras.optimizers.SGD(0.1), lambda: keras.optimizers.Adam(1e-2)],
                         ids=["sgd", "adam"])
def test_layerwise_decay_scales_each_stage_update(make):
    """The update of a variable of stage k is decay ** (depth - k) times the update the optimizer alone makes
    (SGD: lr * decay ** (depth - k) * grad; Adam's first step too: its moments are the same)."""
    plain = _one_step(_model(), make())
    model = _model()
    decay = 0.5
    steps = _one_step(model, levers.layerwise_decay(model, make(), decay))
    factors = levers.stage_factors(model, decay)
    assert factors == {"stem": 1 / 16, "stage1": 1 / 8, "stage2": 1 / 4, "stage3": 1 / 2, "head": 1.0}
    checked = set()
    for group, layers in levers.stage_groups(model):
        for variable in (v for layer in layers for v in layer.trainable_weights):
            assert np.abs(plain[variable.path]).max() > 0, variable.path
            np.testing.assert_allclose(steps[variable.path], factors[group] * plain[variable.path],
                                       rtol=2e-4, atol=1e-7, err_msg=variable.path)
            checked.add(variable.path)
    assert checked == set(plain)  # every trainable variable belongs to one stage


def test_layerwise_decay_scales_a_schedule():
    model = _model()
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([0], [0.1, 0.01])
    optimizer = levers.layerwise_decay(model, keras.optimizers.SGD(schedule), 0.5)
    model.compile(optimizer, "sparse_categorical_crossentropy")
    x, y = _batch()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)  # two steps: the second at 0.01
    rates = [float(keras.ops.convert_to_numpy(o.learning_rate)) for o in optimizer.optimizers]
    np.testing.assert_allclose(sorted(rates), [0.01 / 16, 0.01 / 8, 0.01 / 4, 0.01 / 2, 0.01], rtol=1e-6)


def test_layerwise_decay_refuses_bad_arguments():
    model = _model()
    with pytest.raises(ValueError, match=r"Invalid decay=1\.5: a number in \(0, 1\]"):
        levers.layerwise_decay(model, keras.optimizers.SGD(0.1), 1.5)
    with pytest.raises(ValueError, match="Invalid optimizer="):
        levers.layerwise_decay(model, "sgd", 0.5)
    with pytest.raises(ValueError, match="Invalid model="):
        levers.layerwise_decay(keras.Sequential([keras.layers.Dense(2)]), keras.optimizers.SGD(0.1), 0.5)


def test_linear_probe_head_is_the_ridge_solution():
    """The dense head after ``linear_probe`` zeroes the ridge objective's gradient on the model's own features,
    and the backbone is untouched (one forward pass, nothing trained)."""
    model = _model()
    rng = np.random.default_rng(1)
    x = rng.normal(size=(24, 8, 8, 3)).astype("float32")
    y = np.arange(24) % 3
    backbone_before = [keras.ops.convert_to_numpy(w).copy() for w in model.backbone.weights]
    l2 = 0.01
    levers.linear_probe(model, x, y, l2=l2, batch_size=7)
    for before, after in zip(backbone_before, model.backbone.weights):
        np.testing.assert_array_equal(before, keras.ops.convert_to_numpy(after))
    feats = levers.features(model, x).astype(np.float64)
    dense = model.get_layer("logits")
    kernel, bias = (keras.ops.convert_to_numpy(dense.kernel).astype(np.float64),
                    keras.ops.convert_to_numpy(dense.bias).astype(np.float64))
    residual = feats @ kernel + bias - np.eye(3)[y]
    np.testing.assert_allclose(residual.sum(0), 0, atol=1e-4)  # the bias: no penalty, mean residual 0
    gradient = feats.T @ residual + l2 * len(x) * kernel
    np.testing.assert_allclose(gradient, 0, atol=1e-3 * np.abs(feats.T @ np.eye(3)[y]).max())
    logits = keras.ops.convert_to_numpy(model.get_layer("logits")(levers.features(model, x)))
    np.testing.assert_array_equal(model.predict(x, verbose=0).argmax(-1), logits.argmax(-1))


def test_linear_probe_refuses_bad_labels():
    model = _model()
    x = np.zeros((4, 8, 8, 3), "float32")
    with pytest.raises(ValueError, match=r"Invalid labels: in \[0, 3\]; allowed \[0, 2\]"):
        levers.linear_probe(model, x, [0, 1, 2, 3])
    with pytest.raises(ValueError, match="Invalid labels: 3 for 4 images"):
        levers.linear_probe(model, x, [0, 1, 2])
