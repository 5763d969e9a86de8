"""keras_preact.analysis: gradient flow through residual units (paper Sec. 3, Eq. 4-5)."""

import keras
import numpy as np
import pytest

from keras_preact.analysis import gradient_norms, residual_units, unit_signals
from keras_preact.layers import ResidualUnit
from keras_preact.models import cifar_resnet

UNITS = 6
SHAPE = (6, 6, 8)


def zero_branches(model):
    """Set every branch convolution kernel to zero, so F(x) = 0 in every unit."""
    for unit in residual_units(model):
        for v in unit.weights:
            if v.path.split("/")[-2].startswith("conv"):
                v.assign(np.zeros(v.shape, v.dtype))


def unit_stack(units=UNITS, **unit_options):
    """images -> stem conv -> ``units`` equal-shape units -> average pool -> dense -> softmax."""
    inputs = keras.Input(SHAPE, name="images")
    x = keras.layers.Conv2D(SHAPE[-1], 3, padding="same", name="stem")(inputs)
    for i in range(units):
        x = ResidualUnit(SHAPE[-1], name=f"stage1_unit{i + 1}", **unit_options)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(5, name="logits")(x)
    outputs = keras.layers.Activation("softmax", name="predictions")(x)
    return keras.Model(inputs, outputs)


def batch(rng, n=4, shape=SHAPE, classes=5):
    return rng.normal(size=(n,) + shape).astype("float32"), np.arange(n) % classes


@pytest.mark.core
@pytest.mark.parametrize("training", [False, True])
def test_zero_branch_full_preact_passes_gradient_unchanged(rng, training):
    model = unit_stack(ordering="full_preact")
    zero_branches(model)
    images, labels = batch(rng)
    s = unit_signals(model, images, labels, training=training)

    # x_L = x_l and dE/dx_l = dE/dx_L, bit for bit, at every depth.
    for x, g in zip(s.inputs, s.input_grads):
        np.testing.assert_array_equal(x, s.inputs[-1])
        np.testing.assert_array_equal(g, s.input_grads[-1])
    # ... and it is the head's gradient: d/dx of mean CE(softmax(dense(avg_pool(x)))).
    probs = keras.ops.convert_to_numpy(model(images))
    kernel = keras.ops.convert_to_numpy(model.get_layer("logits").kernel)
    dlogits = (probs - np.eye(5)[labels]) / len(labels)
    expected = np.broadcast_to((dlogits @ kernel.T)[:, None, None, :] / 36.0, s.inputs[-1].shape)
    np.testing.assert_allclose(s.input_grads[0], expected, rtol=1e-5, atol=1e-9)
    assert np.abs(expected).max() > 1e-4


@pytest.mark.core
def test_zero_branch_constant_scaling_scales_gradient_by_lambda_power():
    lam = 0.5  # a power of two: every scaling below is exact in floating point
    model = unit_stack(shortcut="constant_scaling", shortcut_scale=lam, residual_scale=1.0)
    zero_branches(model)
    images, labels = batch(np.random.default_rng(1))
    s = unit_signals(model, images, labels)
    top = s.input_grads[-1]
    assert np.abs(top).max() > 1e-4
    for depth, g in enumerate(s.input_grads[:-1]):
        np.testing.assert_array_equal(g, lam ** (UNITS - depth) * top)
        np.testing.assert_array_equal(s.inputs[depth] * lam ** (UNITS - depth), s.inputs[-1])
    norms = gradient_norms(model, images, labels)
    np.testing.assert_array_equal(
        norms.input_grad, norms.output_grad * lam ** np.arange(UNITS, 0, -1)
    )


@pytest.mark.core
def test_zero_branch_constant_scaling_other_lambda(rng):
    lam = 0.7
    model = unit_stack(shortcut="constant_scaling", shortcut_scale=lam)
    zero_branches(model)
    norms = gradient_norms(model, *batch(rng))
    np.testing.assert_allclose(
        norms.input_grad, norms.output_grad * lam ** np.arange(UNITS, 0, -1), rtol=1e-5
    )


@pytest.mark.core
def test_cifar_net_identity_within_stages_only(rng):
    """ResNet-20, zero branches: identity inside a stage; the stage's first unit (option A:
    subsample + zero channels on the pre-activated input) changes the gradient."""
    model = cifar_resnet(20, input_shape=(16, 16, 3))
    zero_branches(model)
    images, labels = rng.uniform(0, 1, (3, 16, 16, 3)).astype("float32"), np.array([0, 3, 9])
    s = unit_signals(model, images, labels)
    assert s.units == tuple(f"stage{a}_unit{b}" for a in (1, 2, 3) for b in (1, 2, 3))
    for first in (0, 3, 6):  # units 2 and 3 of every stage pass their output gradient unchanged
        for depth in (first + 1, first + 2):
            np.testing.assert_array_equal(s.input_grads[depth], s.input_grads[depth + 1])
    for first in (3, 6):
        assert s.input_grads[first].shape != s.input_grads[first + 1].shape


@pytest.mark.core
def test_gradient_norms_shape_order_and_weights(rng):
    model = cifar_resnet(20, input_shape=(16, 16, 3))
    images, labels = rng.uniform(0, 1, (2, 16, 16, 3)).astype("float32"), np.array([1, 2])
    norms = gradient_norms(model, images, labels, training=True)
    assert norms.units[0] == "stage1_unit1" and norms.units[-1] == "stage3_unit3"
    for values in (norms.signal, norms.input_grad, norms.weight_grad):
        assert values.shape == (9,) and np.all(np.isfinite(values)) and np.all(values > 0)
    assert [r["depth"] for r in norms.rows()] == list(range(1, 10))
    s = unit_signals(model, images, labels, training=True)
    unit = model.backbone.get_layer("stage2_unit2")
    assert [g.shape for g in s.weight_grads[4]] == [tuple(v.shape) for v in unit.trainable_weights]


def test_weight_grads_match_gradient_tape(rng):
    tf = pytest.importorskip("tensorflow")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("compares with tf.GradientTape")
    model = unit_stack()
    images, labels = batch(rng)
    s = unit_signals(model, images, labels, training=True)
    with tf.GradientTape() as tape:
        loss = keras.losses.SparseCategoricalCrossentropy()(labels, model(images, training=True))
    unit = model.get_layer("stage1_unit4")
    expected = tape.gradient(loss, [v.value for v in unit.trainable_variables])
    for ours, ref in zip(s.weight_grads[3], expected):
        np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-4, atol=1e-7)
    assert s.loss == pytest.approx(float(loss), rel=1e-6)


@pytest.mark.core
def test_bad_input_names_the_argument(rng):
    model = unit_stack(units=2)
    with pytest.raises(ValueError, match="images"):
        gradient_norms(model, np.zeros((2, 5, 5, 8), "float32"), [0, 1])
    with pytest.raises(ValueError, match="labels"):
        gradient_norms(model, np.zeros((2,) + SHAPE, "float32"), [0, 1, 2])
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="ResidualUnit"):
        gradient_norms(plain, np.zeros((2, 4)), [0, 1])
