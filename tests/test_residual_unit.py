"""ResidualUnit: exact math of every design of paper Table 1 / Table 2, config, saving, errors."""

import ast
import inspect
import itertools

import keras
import numpy as np
import pytest

from keras_preact.layers import BLOCKS, ORDERINGS, SHORTCUTS, ResidualUnit, residual_unit
from support import (
    compiled_call,
    run_config_echo_test,
    run_saving_test,
    to_numpy,
    vector_jacobian_product,
    zero_branch,
)

pytestmark = [pytest.mark.core, pytest.mark.notf]  # notf: CI runs it on PyTorch, whose units call kernels directly
EPS = 1e-5


def unit_on(x, **kwargs):
    unit = ResidualUnit(**{"filters": x.shape[-1], **kwargs})
    unit.build(x.shape)
    return unit


def random_input(rng, shape=(2, 8, 8, 16)):
    return rng.normal(size=shape).astype("float32")


# With every branch kernel at zero, F(x) = 0 and each ordering reduces to a known function of x
# (inference-mode BN with fresh statistics divides by sqrt(1 + eps)).
ZERO_BRANCH_OUTPUT = {
    "original": lambda x: np.maximum(x, 0),
    "bn_after_addition": lambda x: np.maximum(x / np.sqrt(np.float32(1 + EPS)), 0),
    "relu_before_addition": lambda x: x,
    "relu_only_preact": lambda x: x,
    "full_preact": lambda x: x,
}


@pytest.mark.parametrize("block", sorted(BLOCKS))
@pytest.mark.parametrize("ordering", sorted(ORDERINGS))
def test_zero_branch_reduces_to_known_function(rng, ordering, block):
    x = random_input(rng)
    unit = unit_on(x, block=block, ordering=ordering)
    zero_branch(unit)
    expected = ZERO_BRANCH_OUTPUT[ordering](x)
    actual = to_numpy(unit(x, training=False))
    if ordering == "bn_after_addition":
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)
    else:  # the identity path is exact: bit for bit
        np.testing.assert_array_equal(actual, expected)


# An independent reference for the order of operations (paper Fig. 4, Table 2), in numpy with the unit's weights:
# BN in inference mode, ReLU, and a convolution that zero-pads k // 2 pixels each side then takes every
# ``stride``-th k x k window (the official code's padding), written out here, not built from the unit's tables.
def np_bn(layer, x):
    gamma, beta, mean, variance = (to_numpy(w).astype(np.float64) for w in
                                   (layer.gamma, layer.beta, layer.moving_mean, layer.moving_variance))
    return gamma * (x - mean) / np.sqrt(variance + EPS) + beta


def np_relu(x):
    return np.maximum(x, 0.0)


def np_conv(layer, x, stride=1):
    kernel = to_numpy(layer.kernel).astype(np.float64)  # (k, k, in, out)
    k = kernel.shape[0]
    padded = np.pad(x, [(0, 0), (k // 2, k // 2), (k // 2, k // 2), (0, 0)])
    rows, cols = (padded.shape[1] - k) // stride + 1, (padded.shape[2] - k) // stride + 1
    out = np.zeros((x.shape[0], rows, cols, kernel.shape[-1]))
    for dy in range(k):
        for dx in range(k):
            window = padded[:, dy:dy + stride * (rows - 1) + 1:stride, dx:dx + stride * (cols - 1) + 1:stride]
            out += window @ kernel[dy, dx]
    return out


STRIDED_CONV = {"one_layer": 0, "basic": 0, "bottleneck": 1}  # the 3x3 conv carries the stride


def reference_unit(unit, ordering, block, x, strides, projects):
    """The unit's output by paper Fig. 4 (a)-(e), every BN, ReLU and conv in its place, in float64."""
    convs, bn = unit.convs(), unit.norm
    stride = [strides if i == STRIDED_CONV[block] else 1 for i in range(len(convs))]
    last = len(convs) - 1
    t = x
    if ordering == "full_preact":  # (e) BN-ReLU-conv per conv; a projection takes the pre-activated x
        t = pre = np_relu(np_bn(bn("before", 0), x))
        for i, conv in enumerate(convs):
            t = np_conv(conv, t if i == 0 else np_relu(np_bn(bn("before", i), t)), stride[i])
        return (np_conv(unit.projection(), pre, strides) if projects else x) + t
    if ordering == "relu_only_preact":  # (d) ReLU-conv-BN per conv; a projection (and its BN) after the ReLU
        t = pre = np_relu(x)
        for i, conv in enumerate(convs):
            t = np_bn(bn("after", i), np_conv(conv, t if i == 0 else np_relu(t), stride[i]))
        return (np_bn(bn("shortcut"), np_conv(unit.projection(), pre, strides)) if projects else x) + t
    for i, conv in enumerate(convs):  # (a)-(c): conv-BN-ReLU, the last conv's BN/ReLU by figure
        t = np_conv(conv, t, stride[i])
        if i < last or ordering in ("original", "relu_before_addition"):
            t = np_bn(bn("after", i), t)
        if i < last or ordering == "relu_before_addition":
            t = np_relu(t)
    if ordering == "bn_after_addition":  # (b) conv-BN-ReLU-conv, add, BN-ReLU; the projection without BN
        return np_relu(np_bn(bn("addition"), (np_conv(unit.projection(), x, strides) if projects else x) + t))
    shortcut = np_bn(bn("shortcut"), np_conv(unit.projection(), x, strides)) if projects else x
    return np_relu(shortcut + t) if ordering == "original" else shortcut + t  # (a) ReLU after the addition; (c)


@pytest.mark.parametrize("strides, filters", [(1, 16), (2, 32)], ids=["identity", "projection"])
@pytest.mark.parametrize("block", sorted(BLOCKS))
@pytest.mark.parametrize("ordering", sorted(ORDERINGS))
def test_every_ordering_and_block_computes_the_papers_order_of_operations(rng, ordering, block, strides, filters):
    """Each unit of Fig. 4 (a)-(e), for each block, with an identity and with a projection shortcut, against
    ``reference_unit``: random kernels, BN statistics and affine parameters far from the identity (so any two
    operations in the wrong order, a missing or an extra BN or ReLU, or the wrong input to the projection change
    the output)."""
    x = random_input(rng)
    unit = unit_on(x, filters=filters, strides=strides, block=block, ordering=ordering)
    for layer in unit._sublayers:
        if isinstance(layer, keras.layers.BatchNormalization):
            channels = layer.gamma.shape
            layer.gamma.assign(rng.uniform(0.5, 1.5, channels).astype("float32"))
            layer.beta.assign(rng.normal(0.0, 0.5, channels).astype("float32"))
            layer.moving_mean.assign(rng.normal(0.0, 0.5, channels).astype("float32"))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, channels).astype("float32"))
    projects = strides > 1
    assert (unit.projection() is not None) == projects
    expected = reference_unit(unit, ordering, block, x.astype(np.float64), strides, projects)
    actual = to_numpy(unit(x, training=False))
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("training", [False, True])
def test_full_preact_zero_branch_is_identity_bit_for_bit(rng, training):
    x = random_input(rng)
    unit = unit_on(x)
    zero_branch(unit)
    np.testing.assert_array_equal(to_numpy(unit(x, training=training)), x)


@pytest.mark.parametrize("scale", [0.5, 0.7])
@pytest.mark.parametrize("ordering", ["full_preact", "original"])
def test_constant_scaling(rng, ordering, scale):
    x = random_input(rng)
    unit = unit_on(x, ordering=ordering, shortcut="constant_scaling", shortcut_scale=scale)
    zero_branch(unit)
    expected = scale * x if ordering == "full_preact" else np.maximum(scale * x, 0)
    np.testing.assert_array_equal(to_numpy(unit(x, training=False)), expected)


def test_constant_scaling_stack_decays_as_lambda_to_the_L(rng):
    x = random_input(rng)
    depth, scale = 12, 0.5
    y = x
    for _ in range(depth):
        unit = unit_on(x, shortcut="constant_scaling", shortcut_scale=scale, residual_scale=0.5)
        zero_branch(unit)
        y = unit(y, training=False)
    np.testing.assert_array_equal(to_numpy(y), x * scale**depth)  # powers of two: exact


@pytest.mark.parametrize("shortcut", ["exclusive_gating", "shortcut_only_gating"])
@pytest.mark.parametrize("bias", [0.0, -6.0])
def test_gating_scales_identity_by_one_minus_gate(rng, shortcut, bias):
    x = random_input(rng)
    unit = unit_on(x, shortcut=shortcut, gate_bias_init=bias)
    zero_branch(unit)
    gate = unit.gate()
    gate.kernel.assign(np.zeros(gate.kernel.shape, "float32"))
    np.testing.assert_allclose(to_numpy(gate.bias), bias)
    expected = (1 - 1 / (1 + np.exp(-bias))) * x
    np.testing.assert_allclose(to_numpy(unit(x, training=False)), expected, rtol=1e-6, atol=1e-7)


def test_exclusive_gate_multiplies_branch_by_gate(rng):
    """y = (1 - g) x + g F(x): with a zero gate kernel and bias b, g = sigmoid(b) everywhere."""
    x = random_input(rng)
    plain = unit_on(x)
    gated = unit_on(x, shortcut="exclusive_gating", gate_bias_init=0.0)
    for ours, theirs in zip(gated.convs(), plain.convs()):
        ours.kernel.assign(theirs.kernel)
    gate = gated.gate()
    gate.kernel.assign(np.zeros(gate.kernel.shape, "float32"))
    branch = to_numpy(plain(x, training=False)) - x
    np.testing.assert_allclose(to_numpy(gated(x, training=False)), 0.5 * x + 0.5 * branch, atol=1e-5)


def test_dropout_shortcut(rng):
    """Fig. 2f: h(x) dropped per value at rate 0.5, the kept scaled by 2. 8,192 values: the kept fraction within
    5.5 standard errors (0.030) of 0.5, so a rate off by 0.05 fails (p of a false alarm: 4e-8; the seed is fixed)."""
    keras.utils.set_random_seed(0)
    x = random_input(rng, (8, 8, 8, 16)) + 10.0  # no zeros in x
    unit = unit_on(x, shortcut="dropout", shortcut_dropout_rate=0.5)
    zero_branch(unit)
    np.testing.assert_array_equal(to_numpy(unit(x, training=False)), x)
    y = to_numpy(unit(x, training=True))
    kept = y != 0
    np.testing.assert_allclose(y[kept], 2 * x[kept], rtol=1e-6)
    assert abs(kept.mean() - 0.5) < 5.5 * np.sqrt(0.25 / kept.size), kept.mean()


def test_conv1x1_shortcut_projects_every_unit(rng):
    x = random_input(rng)
    unit = unit_on(x, shortcut="conv1x1")
    zero_branch(unit)
    projection = unit.projection()
    projection.kernel.assign(np.eye(16, dtype="float32")[None, None])
    # The projection reads the pre-activated input (BN-ReLU, fresh statistics).
    expected = np.maximum(x / np.sqrt(np.float32(1 + EPS)), 0)
    np.testing.assert_allclose(to_numpy(unit(x, training=False)), expected, rtol=1e-6)
    assert len(unit.trainable_weights) == len(unit_on(x).trainable_weights) + 1


@pytest.mark.parametrize("preactivate_shortcut", [False, None])
def test_option_a_subsamples_and_zero_pads(rng, preactivate_shortcut):
    x = random_input(rng)
    unit = unit_on(x, filters=32, strides=2, shortcut_type="A", preactivate_shortcut=preactivate_shortcut)
    zero_branch(unit)
    y = to_numpy(unit(x, training=False))
    source = x if preactivate_shortcut is False else np.maximum(x / np.sqrt(np.float32(1 + EPS)), 0)
    assert y.shape == (2, 4, 4, 32)
    np.testing.assert_allclose(y[..., :16], source[:, ::2, ::2, :], rtol=1e-6)
    np.testing.assert_array_equal(y[..., 16:], 0)
    assert not [w for w in unit.trainable_weights if "projection" in w.path]


def test_option_a_subsamples_and_zero_pads_channels_first(rng):
    """On every CPU: TensorFlow's own CPU Conv2D is NHWC-only (its oneDNN kernels, on by default only with
    AVX-512, take NCHW), so the unit runs compiled there, as ``fit``/``predict`` run it."""
    x = random_input(rng).transpose(0, 3, 1, 2)  # NCHW
    unit = ResidualUnit(filters=32, strides=2, shortcut_type="A", preactivate_shortcut=False,
                        data_format="channels_first")
    unit.build(x.shape)
    zero_branch(unit)
    y = to_numpy(compiled_call(unit, x, training=False))
    assert y.shape == (2, 32, 4, 4)
    np.testing.assert_array_equal(y[:, :16], x[:, :, ::2, ::2])  # the strided identity: the same values
    np.testing.assert_array_equal(y[:, 16:], 0)


@pytest.mark.parametrize(
    "shortcut_type, strides, filters, projects",
    [("A", 1, 16, False), ("B", 1, 16, False), ("B", 2, 16, True), ("B", 1, 32, True), ("C", 1, 16, True)],
)
def test_shortcut_types_project_where_documented(rng, shortcut_type, strides, filters, projects):
    x = random_input(rng)
    unit = unit_on(x, filters=filters, strides=strides, shortcut_type=shortcut_type)
    paths = [w.path for w in unit.weights]
    assert any("projection" in p for p in paths) == projects
    assert not any("projection/bias" in p for p in paths)  # official code: no bias


@pytest.mark.parametrize("stride_position, strided_conv", [("first", "conv1"), ("3x3", "conv2")])
def test_stride_position(rng, stride_position, strided_conv):
    x = random_input(rng)
    unit = unit_on(x, filters=64, strides=2, block="bottleneck", stride_position=stride_position)
    for conv in unit.convs():
        assert conv.strides == ((2, 2) if conv.name == strided_conv else (1, 1))
    assert unit(x).shape == (2, 4, 4, 64)


def test_gradient_through_deep_zero_branch_stack_is_upstream(rng):
    """dL/dx_l = dL/dx_L (1 + d/dx_l sum F) = dL/dx_L when F = 0 (paper Eq. 5)."""
    x = random_input(rng)
    units = []
    for _ in range(30):
        unit = unit_on(x)
        zero_branch(unit)
        units.append(unit)

    def stack(inputs):
        for unit in units:
            inputs = unit(inputs, training=False)
        return inputs

    upstream = rng.normal(size=x.shape).astype("float32")
    np.testing.assert_array_equal(vector_jacobian_product(stack, x, upstream), upstream)


@pytest.mark.parametrize("normalization", ["batch", "rms"])
@pytest.mark.parametrize("ordering", sorted(ORDERINGS))
def test_zero_init_residual_starts_with_zero_branch(rng, ordering, normalization):
    x = random_input(rng)
    unit = unit_on(x, ordering=ordering, zero_init_residual=True, normalization=normalization)
    expected = ZERO_BRANCH_OUTPUT[ordering](x)
    if normalization == "rms" and ordering == "bn_after_addition":  # RMS (scale one) after the addition, then ReLU
        expected = np.maximum(x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + EPS), 0)
    np.testing.assert_allclose(to_numpy(unit(x, training=False)), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("block", sorted(BLOCKS))
@pytest.mark.parametrize("ordering", sorted(ORDERINGS))
def test_zero_init_residual_zeroes_only_the_last_bn_scale_or_else_the_last_conv(ordering, block):
    """zero_init_residual (Goyal et al. 2017): where BN follows the branch's last conv, that BN's gamma starts at
    zero and nothing else changes (every other gamma one, every kernel drawn); where none does (full
    pre-activation, 4b), the last conv's kernel starts at zero instead."""
    keras.utils.set_random_seed(0)
    unit = ResidualUnit(32, strides=2, block=block, ordering=ordering, zero_init_residual=True)
    unit.build((None, 8, 8, 16))
    convs = unit.convs()
    last_norm = unit.norm("after", len(convs) - 1)
    norms = [layer for layer in unit._sublayers if isinstance(layer, keras.layers.BatchNormalization)]
    assert (last_norm is not None) == (ordering in ("original", "relu_before_addition", "relu_only_preact"))
    for norm in norms:
        np.testing.assert_array_equal(to_numpy(norm.gamma), 0.0 if norm is last_norm else 1.0, err_msg=norm.name)
    for conv in (*convs, unit.projection()):
        zero = conv is convs[-1] and last_norm is None
        assert np.all(to_numpy(conv.kernel) == 0) == zero and np.any(to_numpy(conv.kernel) == 0) == zero, conv.name


def test_drop_path_drops_whole_branch_per_sample(rng):
    """Stochastic depth at rate 0.5: each sample's whole branch dropped or kept. 4,000 samples: the dropped count
    within 5.5 standard deviations (174) of 2,000, so a rate off by 0.05 fails (p of a false alarm: 4e-8; the seed
    is fixed); no sample loses only part of its branch."""
    keras.utils.set_random_seed(0)
    x = random_input(rng, (4000, 2, 2, 16))
    unit = unit_on(x, drop_path_rate=0.5)
    branch = to_numpy(unit(x, training=False)) - x
    y = to_numpy(unit(x, training=True)) - x  # training-mode BN changes the branch, so compare zeros
    dropped = np.all(y == 0, axis=(1, 2, 3))
    assert abs(dropped.sum() - 2000) < 5.5 * np.sqrt(4000 * 0.25), dropped.sum()
    assert not np.any((y == 0).all(axis=(1, 2)) != (y == 0).all(axis=(1, 2, 3))[:, None])  # whole samples only
    assert not np.any(np.all(branch == 0, axis=(1, 2, 3)))


@pytest.mark.parametrize("normalization", ["batch", "group", "layer", "rms"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_normalizations_and_activations_run(rng, normalization, activation):
    x = random_input(rng)
    unit = unit_on(x, filters=32, strides=2, normalization=normalization, activation=activation)
    y = to_numpy(unit(x, training=True))
    assert y.shape == (2, 4, 4, 32) and np.isfinite(y).all()


def test_orthogonal_initializer_and_regularizer(rng):
    x = random_input(rng)
    unit = unit_on(x, kernel_initializer="orthogonal", kernel_regularizer=keras.regularizers.L2(1e-4))
    unit(x)
    assert len(unit.losses) == 2  # one L2 term per branch conv


def test_he_normal_fan_out_initialization():
    """N(0, sqrt(2 / (k*k*filters_out))), as the official code initialises convolutions: on a bottleneck unit whose
    convolutions have fan-in != fan-out (1x1 256->64, 3x3 64->64, 1x1 64->256, the 1x1 128->256 projection), each
    kernel's standard deviation within 4% of the fan-out value (at least 8,192 draws: 5 standard errors), where
    fan-in's differs by a factor 2 or more, its mean within 5 standard errors of 0, and the normal untruncated
    (a draw beyond 3 sd; Keras' truncated normal stops at 2.3)."""
    keras.utils.set_random_seed(0)
    unit = ResidualUnit(256, strides=2, block="bottleneck")
    unit.build((None, 8, 8, 128))
    for layer, fan_in, fan_out in zip(
        (*unit.convs(), unit.projection()), (128, 9 * 64, 64, 128), (64, 9 * 64, 256, 256)
    ):
        kernel = to_numpy(layer.kernel)
        assert kernel.size >= 8192 and (fan_in == fan_out or max(fan_in / fan_out, fan_out / fan_in) >= 2)
        np.testing.assert_allclose(kernel.std(), np.sqrt(2 / fan_out), rtol=0.04, err_msg=layer.name)
        assert abs(kernel.mean()) < 5 * np.sqrt(2 / fan_out / kernel.size), layer.name
        assert np.abs(kernel).max() > 3 * np.sqrt(2 / fan_out), layer.name


@pytest.mark.parametrize("initializer", ["he_normal_fan_out", "orthogonal", keras.initializers.HeNormal()])
def test_every_kernel_is_drawn_on_its_own(initializer):
    """Two kernels of one shape in a unit start different, as the official code draws them (Keras'
    unseeded initializers fix their seed when made: one object shared by both would give equal ones)."""
    unit = ResidualUnit(16, shortcut="exclusive_gating", shortcut_type="C", kernel_initializer=initializer)
    unit.build((None, 8, 8, 16))
    kernels = [to_numpy(layer.kernel) for layer in (*unit.convs(), unit.projection(), unit.gate())]
    assert kernels[0].shape == kernels[1].shape and kernels[2].shape == kernels[3].shape
    assert not np.array_equal(kernels[0], kernels[1]) and not np.array_equal(kernels[2], kernels[3])


def test_no_two_kernels_of_a_network_start_equal():
    from keras_preact.models import create_model

    kernels = [to_numpy(w) for w in create_model("cifar_resnet20").weights if w.path.endswith("kernel")]
    assert len(kernels) == 20  # 19 convs and the dense layer
    for a, b in itertools.combinations(kernels, 2):
        assert a.shape != b.shape or not np.array_equal(a, b)


# Every (ordering, shortcut) combination of the paper's tables, from the tables themselves.
VARIANTS = list(itertools.product(sorted(ORDERINGS), sorted(SHORTCUTS)))


def test_every_variant_config_and_saving_round_trip(rng):
    x = random_input(rng, (2, 8, 8, 16))
    inputs = keras.Input((8, 8, 16))
    y = inputs
    for ordering, shortcut in VARIANTS:
        unit = ResidualUnit(16, ordering=ordering, shortcut=shortcut, dropout_rate=0.1, drop_path_rate=0.1)
        run_config_echo_test(ResidualUnit, unit)
        y = unit(y)
    y = ResidualUnit(32, strides=2, shortcut_type="A", block="bottleneck", normalization="group")(y)
    model = keras.Model(inputs, y)
    run_saving_test(model, x)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(ordering="preact"), "ordering"),
        (dict(shortcut="gated"), "shortcut"),
        (dict(shortcut_type="D"), "shortcut_type"),
        (dict(block="wide"), "block"),
        (dict(normalization="instance"), "normalization"),
        (dict(activation="not_an_activation"), "activation"),
        (dict(dropout_rate=1.0), "dropout_rate"),
        (dict(drop_path_rate=-0.1), "drop_path_rate"),
        (dict(shortcut="dropout", shortcut_dropout_rate=1.5), "shortcut_dropout_rate"),
        (dict(shortcut_scale=0.5), "shortcut_scale"),
        (dict(shortcut="dropout", gate_bias_init=-6.0), "gate_bias_init"),
        (dict(block="bottleneck", filters=18), "filters"),
        (dict(filters=0), "filters"),
        (dict(stride_position="last"), "stride_position"),
        (dict(kernel_initializer="nonsense"), "kernel_initializer"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ResidualUnit(**{"filters": 16, **kwargs})


NON_FINITE_OR_OUT_OF_RANGE = [
    (
        dict(shortcut="exclusive_gating", gate_bias_init=float("nan")),
        "Invalid gate_bias_init=nan: a finite number is required.",
    ),
    (
        dict(shortcut="shortcut_only_gating", gate_bias_init=float("-inf")),
        "Invalid gate_bias_init=-inf: a finite number",
    ),
    (dict(shortcut="constant_scaling", shortcut_scale=float("inf")), "Invalid shortcut_scale=inf: a finite number"),
    (dict(shortcut="constant_scaling", residual_scale=float("nan")), "Invalid residual_scale=nan: a finite number"),
    (dict(norm_epsilon=-1), "Invalid norm_epsilon=-1: a finite number > 0.0 is required."),
    (dict(norm_epsilon=0.0), "Invalid norm_epsilon=0.0: a finite number > 0.0 is required."),
    (dict(norm_epsilon=float("nan")), "Invalid norm_epsilon=nan: a finite number > 0.0 is required."),
    (dict(norm_momentum=float("inf")), "Invalid norm_momentum=inf: a finite number in [0.0, 1.0] is required."),
    (dict(norm_momentum=1.5), "Invalid norm_momentum=1.5: a finite number in [0.0, 1.0] is required."),
    (dict(norm_groups=0), "Invalid norm_groups=0: a positive integer is required."),
]


@pytest.mark.parametrize(
    "kwargs, message", NON_FINITE_OR_OUT_OF_RANGE, ids=[m.split(":")[0] for _, m in NON_FINITE_OR_OUT_OF_RANGE]
)
def test_non_finite_or_out_of_range_floats_are_refused_when_constructed(kwargs, message):
    """A NaN gate bias or a non-positive epsilon would build a network that outputs NaN: the unit, its options and
    create_model refuse them when made, in one line naming the argument."""
    from keras_preact.layers import UnitConfig
    from keras_preact.models import create_model

    for make in (lambda: ResidualUnit(16, **kwargs), lambda: UnitConfig(**kwargs),
                 lambda: create_model("cifar_resnet20", **kwargs)):
        with pytest.raises(ValueError) as raised:
            make()
        assert str(raised.value).startswith(message) and "\n" not in str(raised.value), str(raised.value)


def test_option_a_cannot_reduce_channels():
    unit = ResidualUnit(16, shortcut_type="A")
    with pytest.raises(ValueError, match="shortcut_type='A'"):
        unit.build((None, 8, 8, 32))


# The weights-layout views kept before issue 34 (item 5) for files written in an older layout.
LEGACY_VIEWS = ("_before", "_after", "_after_addition", "_convs", "_projection", "_projection_norm", "_gate")


def _class_body(source, name):
    return next(node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == name).body


def test_the_unit_is_what_its_class_body_says():
    """A reader of ``ResidualUnit`` sees all of it: every attribute of the class is defined in its class body
    (none added afterwards, as by a loop of ``setattr``), ``__init__``'s signature is the one written in the
    source (no ``__signature__`` made at run time), and no legacy weights-layout view is left."""
    body = _class_body(inspect.getsource(residual_unit), "ResidualUnit")
    written = {node.name for node in body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    written |= {t.id for node in body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    defined = {name for name in vars(ResidualUnit) if not (name.startswith("__") and name.endswith("__"))}
    assert defined <= written, f"set outside the class body: {sorted(defined - written)}"
    assert "__signature__" not in vars(ResidualUnit.__init__)

    init = next(node for node in body if isinstance(node, ast.FunctionDef) and node.name == "__init__").args
    positional = [a.arg for a in init.args]
    keyword_only = [a.arg for a in init.kwonlyargs]
    signature = inspect.signature(ResidualUnit.__init__)
    assert list(signature.parameters) == [*positional, *keyword_only, init.kwarg.arg]
    written_defaults = {a.arg: ast.literal_eval(d) for a, d in zip(init.args[::-1], init.defaults[::-1])}
    written_defaults |= {a.arg: ast.literal_eval(d) for a, d in zip(init.kwonlyargs, init.kw_defaults) if d is not None}
    assert {n: p.default for n, p in signature.parameters.items() if p.default is not p.empty} == written_defaults

    unit = ResidualUnit(16, shortcut="exclusive_gating", ordering="original")
    unit.build((None, 8, 8, 16))
    names = set(dir(ResidualUnit)) | set(dir(unit))
    assert not [n for n in names if "legacy" in n] and not names & set(LEGACY_VIEWS)


def test_every_sublayer_is_saved_once_from_the_units_one_list(tmp_path):
    """The saved layout (pinned in tests/data/weights_layout.json): each weight under
    ``residual_unit/_sublayers/<class>[_<rank>]``, in the order ``build`` makes the sublayers."""
    import h5py

    inputs = keras.Input((8, 8, 16))
    model = keras.Model(inputs, ResidualUnit(32, strides=2, ordering="original", shortcut="exclusive_gating")(inputs))
    path = tmp_path / "unit.weights.h5"
    model.save_weights(path)
    with h5py.File(path, "r") as f:
        keys = []
        f.visititems(lambda key, obj: keys.append(key) if isinstance(obj, h5py.Dataset) else None)
    assert len(keys) == len(model.weights) and all(k.startswith("layers/residual_unit/_sublayers/") for k in keys)
    convs = sorted({k.split("/")[3] for k in keys if "/conv2d" in k})
    assert convs == ["conv2d", "conv2d_1", "conv2d_2", "conv2d_3"]  # conv1, conv2, projection, gate


def test_a_unit_made_frozen_runs_its_norms_in_inference_mode(rng):
    """``ResidualUnit(..., trainable=False)`` (as a frozen model's config rebuilds it): its sublayers are frozen
    with it, so in training its batch norms normalize by their moving statistics and leave them as they were."""
    x = random_input(rng) * 3.0 + 2.0  # far from the fresh moving statistics (0, 1)
    unit = unit_on(x, trainable=False)
    moving = [to_numpy(w) for w in unit.non_trainable_weights]
    np.testing.assert_array_equal(to_numpy(unit(x, training=True)), to_numpy(unit(x, training=False)))
    assert unit.trainable_weights == []
    for before, after in zip(moving, unit.non_trainable_weights, strict=True):
        np.testing.assert_array_equal(to_numpy(after), before)
