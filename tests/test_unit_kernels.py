"""ResidualUnit's fast path on PyTorch (``keras_preact.layers.unit_kernels``): the steps' kernels called directly.

Every design the unit builds gives, through the fast path, the numbers of its layers bit for bit: outputs in
training and inference, the input's and every weight's gradient, the moving statistics. The fast path calls no
sublayer's ``Layer.__call__`` where a kernel applies, and is not taken where ``Layer.__call__`` casts (mixed
precision). On other backends there is no fast path.
"""

import keras
import numpy as np
import pytest

from keras_preact.layers import ORDERINGS, SHORTCUTS, ResidualUnit, unit_kernels
from keras_preact.models import create_model

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


def both_paths(filters, strides, shape, **options):
    """The same unit (same seed, same weights) twice: the fast path, then the layers' path."""
    units = []
    for fast in (True, False):
        keras.utils.set_random_seed(7)
        unit = ResidualUnit(filters, strides, **options)
        unit.build(shape)
        if not fast:
            unit._fast = None
        units.append(unit)
    return units


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
    assert fast._fast is not None and layers._fast is None
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
    assert unit._fast is None
    assert keras.backend.standardize_dtype(unit(rng.normal(size=(2, 8, 8, 16)).astype("float32")).dtype) == "float16"


@on_torch
def test_a_float64_input_runs_the_layers(rng):
    import torch

    unit = ResidualUnit(16)
    unit.build((2, 8, 8, 16))
    assert not unit._fast.accepts(torch.zeros((2, 8, 8, 16), dtype=torch.float64))
    assert unit._fast.accepts(torch.zeros((2, 8, 8, 16)))


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="other backends only")
def test_other_backends_have_no_fast_path():
    unit = ResidualUnit(16)
    unit.build((2, 8, 8, 16))
    assert unit._fast is None and unit_kernels.fast_plan(unit.plan(), unit.dtype_policy) is None


def both_backbones(name, **kwargs):
    """The same network (same seed) twice: its chain's kernels called directly, then Keras' functional graph."""
    models = []
    for fast in (True, False):
        keras.utils.set_random_seed(11)
        backbone = create_model(name, **kwargs).backbone
        if not fast:
            backbone._fast_chain = None
        models.append(backbone)
    return models


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
], ids=["full-preact", "original", "relu-only-preact", "imagenet-fb", "imagenet-timm"])
def test_a_backbones_chain_gives_its_graphs_numbers_bit_for_bit(name, kwargs, training, rng):
    size = 32 if name.startswith("cifar") else 64
    fast, graph = both_backbones(name, num_classes=10, input_shape=(size, size, 3), **kwargs)
    assert fast._fast_chain is not None
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
    assert create_model("cifar_resnet20", dtype="mixed_float16").backbone._fast_chain is None
