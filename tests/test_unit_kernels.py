"""ResidualUnit's fast path on PyTorch (``keras_preact.layers.unit_kernels``): the steps' kernels called directly.

Every design the unit builds gives, through the fast path, the numbers of its layers bit for bit: outputs in
training and inference, the input's and every weight's gradient, the moving statistics. The fast path calls no
sublayer's ``Layer.__call__`` where a kernel applies, and is not taken where ``Layer.__call__`` casts (mixed
precision). On other backends there is no fast path. The layers' path is built with ``KERAS_PREACT_FAST_PATH=1``
(``fused.fast_path_level``), the public switch.
"""

import keras
import numpy as np
import pytest

from keras_preact.layers import ORDERINGS, SHORTCUTS, ResidualUnit, fused, unit_kernels
from keras_preact.layers import batch_normalization as bn_lib
from keras_preact.models import cifar_resnet, create_model

pytestmark = [pytest.mark.core, pytest.mark.notf]
on_torch = pytest.mark.skipif(keras.backend.backend() != "torch", reason="the fast path is PyTorch's")

# (block, strides, input channels, filters, options): identity, option A, projections, bottlenecks, and steps
# the fast path leaves to their layers (weight-standardized convs, GELU, group norm, dropout, gates).
CASES = {
    "basic-identity": ("basic", 1, 16, 16, {}),
    "basic-option-a": ("basic", 2, 16, 32, {"shortcut_type": "A"}),
    "basic-projection": ("basic", 2, 16, 32, {}),
    "bottleneck-projection": ("bottleneck", 2, 32, 64, {"stride_position": "first"}),
    "bottleneck-3x3-stride": ("bottleneck", 2, 32, 64, {"output_bias": True}),
    "weight-standardized-gelu": ("basic", 2, 16, 32, {"convolution": "weight_standardized", "activation": "gelu"}),
    "group-norm-dropout": ("basic", 1, 32, 32, {"normalization": "group", "norm_groups": 8, "dropout_rate": 0.3}),
}


def built_at(level, build):
    """``build()`` with ``KERAS_PREACT_FAST_PATH=level`` (2: the direct kernel calls; 1: the layers' path)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(fused.FAST_PATH_ENV, str(level))
        return build()


def both_paths(filters, strides, shape, trainable=True, **options):
    """The same unit (same seed, same weights) twice: the fast path, then the layers' path."""
    def build():
        keras.utils.set_random_seed(7)
        unit = ResidualUnit(filters, strides, trainable=trainable, **options)
        unit.build(shape)
        return unit

    return built_at(2, build), built_at(1, build)


def step_results(unit, x, training):
    """Output, the input's gradient, the weights after the step and every trainable weight's gradient."""
    import torch

    keras.utils.set_random_seed(3)  # dropout draws the same mask on both paths
    inputs = torch.tensor(x, requires_grad=True)
    outputs = unit(inputs, training=training)
    (outputs * outputs).sum().backward()
    gradients = [v.value.grad for v in unit.trainable_weights]
    return ([outputs.detach().numpy(), inputs.grad.numpy()] + [w.numpy() for w in unit.weights]
            + [g.numpy() for g in gradients if g is not None])


@on_torch
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("ordering", sorted(ORDERINGS))
def test_the_fast_path_gives_the_layers_numbers_bit_for_bit(ordering, case, training, rng):
    block, strides, channels, filters, options = CASES[case]
    x = rng.normal(size=(4, 8, 8, channels)).astype("float32")
    fast, layers = both_paths(filters, strides, x.shape, block=block, ordering=ordering, **options)
    assert fast.kernel_plan is not None and layers.kernel_plan is None
    for step in range(2):  # the second step reads the moving statistics the first one updated
        for got, expected in zip(step_results(fast, x, training), step_results(layers, x, training), strict=True):
            np.testing.assert_array_equal(got, expected, err_msg=f"step {step}")


@on_torch
@pytest.mark.parametrize("shortcut", sorted(SHORTCUTS))
def test_every_shortcut_of_table_1_gives_the_layers_numbers(shortcut, rng):
    x = rng.normal(size=(4, 8, 8, 16)).astype("float32")
    fast, layers = both_paths(16, 1, x.shape, shortcut=shortcut)
    for training in (True, False):
        for got, expected in zip(step_results(fast, x, training), step_results(layers, x, training), strict=True):
            np.testing.assert_array_equal(got, expected)


def randomize(unit, seed=5):
    """Every weight of ``unit`` drawn anew: norm offsets of both signs (a ReLU after a norm changes its output),
    positive moving variances."""
    rng = np.random.default_rng(seed)
    for weight in unit.weights:
        shape = tuple(weight.shape)
        value = rng.uniform(0.5, 2.0, shape) if "variance" in weight.path else rng.normal(size=shape)
        weight.assign(value.astype("float32"))


@on_torch
@pytest.mark.parametrize("ordering", sorted(ORDERINGS))
def test_a_norm_whose_kernel_refuses_the_input_runs_its_layer_and_the_relu_after_it(ordering, rng):
    """One value per channel in training: the fused batch-norm kernel refuses it (no batch variance), the fast path
    runs the norm's layer, and the ReLU that follows it still runs: the layers' numbers bit for bit."""
    x = rng.normal(size=(1, 1, 1, 4)).astype("float32")
    fast, layers = both_paths(4, 1, x.shape, ordering=ordering)
    randomize(fast), randomize(layers)
    import torch

    assert bn_lib.FUSED_TRAINING["torch"](torch.tensor(x), None, None, -1, 1e-3) is None  # the kernel refuses it
    for training in (True, False):
        got, expected = step_results(fast, x, training), step_results(layers, x, training)
        assert np.abs(got[0]).max() > 0.1  # the unit's output is not zero whatever the ReLU does
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"training={training}")


@on_torch
@pytest.mark.parametrize("shape", [(4, 8, 8, 16), (1, 1, 1, 16)], ids=["batch", "one-value-per-channel"])
@pytest.mark.parametrize("ordering", ["full_preact", "original"])
def test_a_frozen_unit_in_training_normalizes_by_its_moving_statistics(ordering, shape, rng):
    """``trainable=False``: Keras runs a frozen batch norm in inference mode, in training too; the fast path
    normalizes by the moving statistics (not the batch's), leaves them as they were and gives the layers'
    numbers bit for bit, the input's gradient included."""
    x = rng.normal(2.0, 3.0, size=shape).astype("float32")  # far from the fresh moving statistics (0, 1)
    fast, layers = both_paths(16, 1, x.shape, trainable=False, ordering=ordering)
    randomize(fast), randomize(layers)
    moving = [w.numpy().copy() for w in fast.non_trainable_weights]
    got = step_results(fast, x, training=True)
    for a, b in zip(got, step_results(layers, x, training=True), strict=True):
        np.testing.assert_array_equal(a, b)
    for before, after in zip(moving, fast.non_trainable_weights, strict=True):
        np.testing.assert_array_equal(after.numpy(), before)
    np.testing.assert_array_equal(got[0], step_results(fast, x, training=False)[0])  # as in inference


@on_torch
def test_the_fast_path_switch_is_read_when_a_unit_or_backbone_is_built(monkeypatch):
    """``KERAS_PREACT_FAST_PATH``: 2 (unset) the units' and backbones' kernel calls; 1 the fused layers only; 0
    Keras' own ops as well; anything else refused, naming the variable and its values."""
    import torch

    def fused_calls(level):
        monkeypatch.setenv(fused.FAST_PATH_ENV, level)
        calls = []
        kernel = bn_lib.FUSED_INFERENCE["torch"]
        monkeypatch.setitem(bn_lib.FUSED_INFERENCE, "torch", lambda *a, **k: calls.append(1) or kernel(*a, **k))
        unit = ResidualUnit(16)
        unit.build((2, 4, 4, 16))
        unit(torch.zeros((2, 4, 4, 16)), training=False)
        return unit.kernel_plan is not None, len(calls)

    monkeypatch.delenv(fused.FAST_PATH_ENV, raising=False)
    assert fused.fast_path_level() == 2 and create_model("cifar_resnet20").backbone.kernel_plan is not None
    assert fused_calls("2") == (True, 2) and fused_calls("1") == (False, 2) and fused_calls("0") == (False, 0)
    monkeypatch.setenv(fused.FAST_PATH_ENV, "off")
    with pytest.raises(ValueError, match=r"^Invalid KERAS_PREACT_FAST_PATH='off': allowed 0 \(off"):
        ResidualUnit(16).build((2, 4, 4, 16))


def layer_calls(monkeypatch, layers, forward):
    """The names of ``layers`` whose ``Layer.__call__`` ran in ``forward()``."""
    inside, called = {id(layer) for layer in layers}, []
    layer_call = keras.layers.Layer.__call__

    def counting(self, *args, **kwargs):
        if id(self) in inside:
            called.append(self.name)
        return layer_call(self, *args, **kwargs)

    monkeypatch.setattr(keras.layers.Layer, "__call__", counting)
    forward()
    return called


@on_torch
@pytest.mark.parametrize("ordering", sorted(ORDERINGS))
def test_a_unit_calls_no_norm_or_conv_layer_of_its_own(ordering, monkeypatch):
    """The point of the fast path: the unit's norms and convs run without their ``Layer.__call__``."""
    unit = ResidualUnit(32, 2, ordering=ordering)
    unit.build((2, 8, 8, 16))
    x = np.zeros((2, 8, 8, 16), "float32")
    assert layer_calls(monkeypatch, unit._sublayers, lambda: (unit(x, training=False), unit(x, training=True))) == []


@on_torch
def test_mixed_precision_units_run_their_layers(rng):
    unit = ResidualUnit(16, dtype="mixed_float16")
    unit.build((2, 8, 8, 16))
    assert unit.kernel_plan is None
    assert keras.backend.standardize_dtype(unit(rng.normal(size=(2, 8, 8, 16)).astype("float32")).dtype) == "float16"


@on_torch
def test_a_float64_input_runs_the_layers(rng):
    import torch

    unit = ResidualUnit(16)
    unit.build((2, 8, 8, 16))
    assert not unit.kernel_plan.accepts(torch.zeros((2, 8, 8, 16), dtype=torch.float64))
    assert unit.kernel_plan.accepts(torch.zeros((2, 8, 8, 16)))


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="other backends only")
def test_other_backends_have_no_fast_path():
    unit = ResidualUnit(16)
    unit.build((2, 8, 8, 16))
    assert unit.kernel_plan is None and unit_kernels.fast_plan(unit.plan(), unit.dtype_policy) is None


def both_backbones(name, **kwargs):
    """The same network (same seed) twice: its chain's kernels called directly, then Keras' functional graph."""
    def build():
        keras.utils.set_random_seed(11)
        return (cifar_resnet(8, **kwargs) if name == "cifar_resnet8" else create_model(name, **kwargs)).backbone

    return built_at(2, build), built_at(1, build)


def forward_results(model, x, training):
    import torch

    inputs = torch.tensor(x, requires_grad=True)
    outputs = model(inputs, training=training)
    (outputs * outputs).sum().backward()
    return ([outputs.detach().numpy(), inputs.grad.numpy()] + [w.numpy() for w in model.weights]
            + [v.value.grad.numpy() for v in model.trainable_weights if v.value.grad is not None])


@on_torch
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("name, kwargs", [
    ("cifar_resnet20", {}),
    ("cifar_resnet20", {"ordering": "original"}),
    ("cifar_resnet20", {"ordering": "relu_only_preact"}),
    ("imagenet_resnet18", {"layout": "fb"}),  # a padded 7x7/2 stem conv, BN-ReLU, a zero-padded max-pool
    ("imagenet_resnet18", {"layout": "timm"}),  # the stem conv alone, an edge-padded max-pool
    ("cifar_resnet8", {"activation": "gelu"}),  # the final op a GELU Activation layer: not run as a ReLU
], ids=["full-preact", "original", "relu-only-preact", "imagenet-fb", "imagenet-timm", "gelu"])
def test_a_backbones_chain_gives_its_graphs_numbers_bit_for_bit(name, kwargs, training, rng):
    size = 16 if name == "cifar_resnet8" else 32 if name.startswith("cifar") else 64
    fast, graph = both_backbones(name, num_classes=10, input_shape=(size, size, 3), **kwargs)
    assert fast.kernel_plan is not None and graph.kernel_plan is None
    x = rng.normal(size=(2, size, size, 3)).astype("float32")
    for step in range(2):
        for got, expected in zip(forward_results(fast, x, training), forward_results(graph, x, training), strict=True):
            np.testing.assert_array_equal(got, expected, err_msg=f"step {step}")


@on_torch
def test_a_backbone_forward_calls_only_its_own_layer_call(monkeypatch):
    """No layer inside the backbone (stem, units, their sublayers, the final norm) runs ``Layer.__call__``."""
    model = create_model("cifar_resnet20", num_classes=10)
    x = np.zeros((2, 32, 32, 3), "float32")
    inside = model.backbone._flatten_layers(include_self=False)
    assert layer_calls(monkeypatch, inside, lambda: (model(x, training=False), model(x, training=True))) == []


@on_torch
def test_mixed_precision_backbones_run_their_graph():
    assert create_model("cifar_resnet20", dtype="mixed_float16").backbone.kernel_plan is None
