"""keras_preact.layers.Conv2D (Keras' conv without its layout copies on PyTorch) equals Keras' layer.

Outputs and the gradients of the input, kernel and bias equal ``keras.layers.Conv2D``'s within float32
rounding, for strides 1 and 2, "valid" and "same", kernels 1 and 3 (and the calls the fast path leaves
to Keras: even kernels with "same", strided "same", dilation, groups, channels_first); files move
between the two layers with bit-identical outputs; on PyTorch the fast path runs, without an
``aten::copy_`` of the activations. On backends without a fast path the layer is Keras' path.
"""

import os
import tempfile

import keras
import numpy as np
import pytest

from keras_preact.layers import Conv2D
from keras_preact.layers import convolution as conv_lib
from support import to_numpy

pytestmark = [pytest.mark.core, pytest.mark.notf]

# float32: sums of up to 9 * 6 products forward, up to 8 * 9 * 9 backward; the fast path calls the same
# kernel as Keras' on the same values, so the differences are of reassociation at most.
TOL = {"rtol": 1e-5, "atol": 1e-5}
GRAD_TOL = {"rtol": 1e-4, "atol": 1e-4}
SHAPE = (4, 9, 9, 6)


@pytest.fixture
def fast_calls(monkeypatch):
    """How often the backend's fast path ran and applied (stays 0 on backends without one)."""
    calls = []
    backend = keras.backend.backend()
    if backend in conv_lib.FAST_CONV:
        fast = conv_lib.FAST_CONV[backend]

        def counted(*args):
            out = fast(*args)
            if out is not None:
                calls.append(1)
            return out

        monkeypatch.setitem(conv_lib.FAST_CONV, backend, counted)
    return calls


def has_fast_path():
    return keras.backend.backend() in conv_lib.FAST_CONV


def pair(shape, rng, **kwargs):
    """Keras' layer and ours, with the same arguments, built, with the same random kernel and bias."""
    layers = keras.layers.Conv2D(**kwargs), Conv2D(**kwargs)
    for layer in layers:
        layer.build(shape)
    for i, variable in enumerate(layers[0].trainable_variables):
        value = rng.normal(0.0, 0.5, variable.shape).astype("float32")
        for layer in layers:
            layer.trainable_variables[i].assign(value)
    return layers


def gradients(layer, x, upstream, **kwargs):
    """d sum(layer(x, **kwargs) * upstream) / d (x, kernel[, bias]), with the backend's autodiff."""
    from keras_preact.analysis.autodiff import get_autodiff

    def objective(values):  # stateless: JAX traces it
        y, _ = layer.stateless_call(values[1:], [], values[0], **kwargs)
        return keras.ops.sum(y * keras.ops.convert_to_tensor(upstream)), None

    inputs = [keras.ops.convert_to_tensor(x), *(v.value for v in layer.trainable_variables)]
    _, _, g = get_autodiff().value_and_grad(objective, [inputs])
    return [to_numpy(t) for t in g[0]]


def test_fast_path_where_measured_faster():
    assert set(conv_lib.FAST_CONV) == {"torch"}
    assert issubclass(Conv2D, keras.layers.Conv2D)
    assert Conv2D.__name__ == "Conv2D"  # Keras names saved weights after the class


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("strides", [1, 2])
@pytest.mark.parametrize("kernel_size", [1, 3])
def test_outputs_and_gradients_equal_keras(kernel_size, strides, padding, use_bias, rng, fast_calls):
    theirs, ours = pair(SHAPE, rng, filters=5, kernel_size=kernel_size, strides=strides, padding=padding,
                        use_bias=use_bias)
    x = rng.normal(size=SHAPE).astype("float32")
    want = to_numpy(theirs(x))
    got = to_numpy(ours(x))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, **TOL)
    upstream = rng.normal(size=want.shape).astype("float32")
    grads_theirs, grads_ours = gradients(theirs, x, upstream), gradients(ours, x, upstream)
    assert len(grads_ours) == (3 if use_bias else 2)
    for g_ours, g_theirs in zip(grads_ours, grads_theirs):
        np.testing.assert_allclose(g_ours, g_theirs, **GRAD_TOL)
    # Strided "same" is left to Keras (its padding depends on the size); everything else is fast.
    fast = has_fast_path() and (padding == "valid" or strides == 1)
    assert len(fast_calls) == (2 if fast else 0)  # the call and the gradient's call


@pytest.mark.parametrize("padding", [((1, 1), (1, 1)), ((2, 2), (0, 0)), ((0, 1), (0, 1))],
                         ids=["symmetric", "rows only", "asymmetric"])
@pytest.mark.parametrize("strides", [1, 2])
def test_input_padding_equals_zero_padding_then_the_conv(padding, strides, rng, fast_calls):
    """Our "valid" conv called with ``input_padding=p`` equals ``ZeroPadding2D(p)`` then Keras' conv, outputs and
    gradients; a symmetric padding runs inside the fast path's ``conv2d`` (no padded copy), an asymmetric one
    takes ``keras.ops.pad`` and Keras' path."""
    theirs_conv, ours = pair((4, 9 + sum(padding[0]), 9 + sum(padding[1]), 6), rng, filters=5, kernel_size=3,
                             strides=strides)
    theirs = keras.Sequential([keras.layers.ZeroPadding2D(padding), theirs_conv])
    x = rng.normal(size=SHAPE).astype("float32")
    want = to_numpy(theirs(x))
    got = to_numpy(ours(x, input_padding=padding))
    upstream = rng.normal(size=want.shape).astype("float32")
    grads_ours = gradients(ours, x, upstream, input_padding=padding)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, **TOL)
    for g_ours, g_theirs in zip(grads_ours, gradients(theirs, x, upstream)):
        np.testing.assert_allclose(g_ours, g_theirs, **GRAD_TOL)
    symmetric = padding[0][0] == padding[0][1] and padding[1][0] == padding[1][1]
    assert len(fast_calls) == (2 if has_fast_path() and symmetric else 0)
    np.testing.assert_allclose(to_numpy(ours(x)), to_numpy(theirs_conv(x)), **TOL)  # no padding left over


def test_a_strided_unit_pads_inside_its_conv_on_pytorch(rng, monkeypatch):
    """On PyTorch a unit's strided 3x3 conv takes its ``ZeroPadding2D`` inside ``conv2d`` (``input_padding``):
    forward and backward make no padded copy of the activation (``aten::constant_pad_nd``), and the unit's
    outputs and gradients equal those of Keras' path (the fused layers off: the pad layer, then the conv)."""
    if not has_fast_path():
        pytest.skip("no fast path on this backend")
    import torch
    from torch.profiler import ProfilerActivity, profile

    from keras_preact.layers import ResidualUnit, fused

    unit = ResidualUnit(16, strides=2)
    x = rng.normal(size=(4, 10, 10, 8)).astype("float32")
    unit(x)
    for variable in unit.weights:  # BN statistics and scales away from their initial 0/1
        variable.assign(rng.uniform(0.5, 1.5, variable.shape).astype("float32"))
    upstream = torch.tensor(rng.normal(size=(4, 5, 5, 16)).astype("float32"))

    def run():
        inputs = torch.tensor(x, requires_grad=True)
        y = unit(inputs, training=False)
        grads = torch.autograd.grad(y, [inputs, *[v.value for v in unit.trainable_weights]], upstream)
        return [to_numpy(t) for t in (y, *grads)]

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        got = run()
    assert [e.name for e in prof.events() if e.name == "aten::constant_pad_nd"] == []
    monkeypatch.setattr(fused, "enabled", lambda: False)
    for g, w in zip(got, run(), strict=True):
        np.testing.assert_allclose(g, w, **GRAD_TOL)


@pytest.mark.parametrize("kwargs, shape", [
    ({"kernel_size": 2, "padding": "same"}, SHAPE),              # even kernel: asymmetric padding
    ({"kernel_size": 3, "strides": 2, "padding": "same"}, SHAPE),
    ({"kernel_size": 3, "dilation_rate": 2, "padding": "same"}, SHAPE),
    ({"kernel_size": 3, "groups": 2}, SHAPE),
    ({"kernel_size": 3, "data_format": "channels_first", "padding": "same"}, (4, 6, 9, 9)),
])
def test_other_calls_take_keras_path(kwargs, shape, rng, fast_calls):
    if kwargs.get("data_format") == "channels_first" and keras.backend.backend() == "tensorflow":
        pytest.skip("TensorFlow's CPU Conv2D supports NHWC only (Keras' layer fails alike)")
    theirs, ours = pair(shape, rng, filters=4, **kwargs)
    x = rng.normal(size=shape).astype("float32")
    np.testing.assert_array_equal(to_numpy(ours(x)), to_numpy(theirs(x)))
    assert fast_calls == []


def test_fast_path_copies_no_activation(rng, fast_calls):
    """On PyTorch: the permutes are views, the output is contiguous NHWC, and forward + backward copy
    only the kernel (Keras' path copies the input twice each way)."""
    if not has_fast_path():
        pytest.skip("no fast path on this backend")
    import torch
    from torch.profiler import ProfilerActivity, profile

    shape = (8, 16, 16, 8)
    theirs, ours = pair(shape, rng, filters=8, kernel_size=3, padding="same")
    x = torch.tensor(rng.normal(size=shape).astype("float32"), requires_grad=True)
    copied = {}
    for name, layer in (("keras", theirs), ("ours", ours)):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            y = layer(x)
            torch.autograd.grad(y, [x, layer.kernel.value], torch.ones_like(y))
        copied[name] = [e.input_shapes for e in prof.events() if e.name == "aten::copy_"]
        if name == "ours":
            assert y.is_contiguous()
    big = [s for s in copied["ours"] if s and list(s[0]) and np.prod(s[0]) >= np.prod(shape)]
    assert big == [], copied["ours"]
    assert len(copied["keras"]) > len(copied["ours"])
    assert len(fast_calls) == 1


def test_the_kernel_is_made_channels_last_by_one_2d_transpose(rng, fast_calls):
    """On PyTorch: the kernel's one copy is a 2-D transpose (PyTorch splits a 4-D strided copy of a 64 x 64 x 3 x 3
    kernel across threads: 24 ms a call on a loaded 2-core CPU), into the same channels_last memory, so the output
    is bit for bit that of ``permute(...).contiguous(memory_format=torch.channels_last)``."""
    if not has_fast_path():
        pytest.skip("no fast path on this backend")
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    shape = (2, 5, 5, 64)
    _, ours = pair(shape, rng, filters=64, kernel_size=3, padding="same")
    x = torch.tensor(rng.normal(size=shape).astype("float32"))
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        got = ours(x)
    copies = [e.input_shapes[0] for e in prof.events() if e.name == "aten::copy_"]
    assert copies == [[64, 576]], copies
    kernel = ours.kernel.value
    w = kernel.permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
    want = F.conv2d(x.permute(0, 3, 1, 2), w, ours.bias.value, padding=1).permute(0, 2, 3, 1)
    np.testing.assert_array_equal(to_numpy(got), to_numpy(want))
    assert len(fast_calls) == 1


def test_config_is_keras(rng):
    kwargs = {"filters": 4, "kernel_size": 3, "strides": 2, "kernel_regularizer": "l2", "name": "conv"}
    theirs, ours = keras.layers.Conv2D(**kwargs), Conv2D(**kwargs)
    assert ours.get_config() == theirs.get_config()
    assert Conv2D.from_config(ours.get_config()).get_config() == ours.get_config()


def small_model(conv, seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    x = conv(4, 3, padding="same", name="conv")(inputs)
    x = keras.layers.ReLU()(x)
    x = conv(6, 3, strides=2, use_bias=False)(x)  # unnamed: weights files name it after the class
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="dense")(x))


def test_files_move_between_keras_layer_and_ours(rng):
    x = rng.normal(size=(4, 8, 8, 3)).astype("float32")
    keras_model = small_model(keras.layers.Conv2D)
    expected = to_numpy(keras_model(x))
    with tempfile.TemporaryDirectory() as d:
        keras_file, weights_file = os.path.join(d, "keras_conv.keras"), os.path.join(d, "keras_conv.weights.h5")
        keras_model.save(keras_file)
        keras_model.save_weights(weights_file)
        for path in (keras_file, weights_file):
            ours = small_model(Conv2D, seed=1)
            ours.load_weights(path)
            np.testing.assert_array_equal(to_numpy(ours(x)), expected)
        ours_file, ours_weights = os.path.join(d, "ours.keras"), os.path.join(d, "ours.weights.h5")
        ours.save(ours_file)
        ours.save_weights(ours_weights)
        again = keras.saving.load_model(ours_file)
        assert type(again.get_layer("conv")) is Conv2D
        np.testing.assert_array_equal(to_numpy(again(x)), expected)
        for path in (ours_file, ours_weights):
            back = small_model(keras.layers.Conv2D, seed=2)
            back.load_weights(path)
            np.testing.assert_array_equal(to_numpy(back(x)), expected)


def test_builders_use_it():
    from keras_preact.models import create_model

    model = create_model("cifar_resnet20")
    convs = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.Conv2D)]
    assert convs and all(type(layer) is Conv2D for layer in convs)


@pytest.mark.parametrize("scope", ["all", "kernels"])
def test_recipe_stays_exact_with_it(scope, monkeypatch):
    """tests/test_training_recipe.py's three compiled steps against numpy optim.sgd (1e-6), with this layer."""
    import test_training_recipe as recipe

    monkeypatch.setattr(keras.layers, "Conv2D", Conv2D)
    assert type(recipe.tiny_model().get_layer("conv")) is Conv2D
    recipe.test_three_steps_equal_torch_optim_sgd(scope, nesterov=True)
