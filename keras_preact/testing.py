"""Reusable checks for layers and models (keras-hub style ``run_*_test`` helpers)."""

import inspect
import os
import tempfile

import keras
import numpy as np


def trainable_params(model):
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def zero_branch(unit):
    """Set every convolution kernel of a unit's residual branch to zero."""
    for i in range(1, len(unit._convs) + 1):
        conv = unit.get_sublayer(f"conv{i}")
        conv.kernel.assign(np.zeros(conv.kernel.shape, "float32"))


def _tf_vjp(fn, x, upstream):
    import tensorflow as tf

    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x, output_gradients=tf.convert_to_tensor(upstream))


def _jax_vjp(fn, x, upstream):
    import jax

    _, vjp = jax.vjp(fn, jax.numpy.asarray(x))
    return vjp(jax.numpy.asarray(upstream))[0]


def _torch_vjp(fn, x, upstream):
    import torch

    x = torch.tensor(x, requires_grad=True)
    y = fn(x)
    y.backward(torch.tensor(upstream))
    return x.grad


VJP = {"tensorflow": _tf_vjp, "jax": _jax_vjp, "torch": _torch_vjp}


def vector_jacobian_product(fn, x, upstream):
    """``upstream^T d fn / d x`` with the current backend's autodiff."""
    return to_numpy(VJP[keras.backend.backend()](fn, x, upstream))


def run_config_echo_test(cls, instance):
    """Every constructor argument is echoed by ``get_config`` and ``from_config`` rebuilds it."""
    config = instance.get_config()
    arguments = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "kwargs")]
    missing = [a for a in arguments if a not in config]
    assert not missing, f"get_config misses {missing}"
    clone = cls.from_config(config)
    assert clone.get_config() == config


def run_saving_test(model, inputs, atol=0.0):
    """A ``.keras`` round trip with ``safe_mode=True`` gives the same outputs."""
    expected = to_numpy(model(inputs, training=False))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.keras")
        model.save(path)
        restored = keras.saving.load_model(path, safe_mode=True)
    actual = to_numpy(restored(inputs, training=False))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=atol)
    return restored
