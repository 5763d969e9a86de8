"""The backend's automatic differentiation, behind one small table (TensorFlow, JAX, PyTorch).

Every function here takes a pure function of backend tensors; the model's variables are passed in
as values through ``keras.StatelessScope`` or ``stateless_call`` by the callers, so nothing here
knows about Keras layers.
"""

import dataclasses
from collections.abc import Callable

import keras

from keras_preact.layers import options as opt


def _tf_value_and_grad(fn, args):
    import tensorflow as tf

    args = keras.tree.map_structure(tf.convert_to_tensor, args)
    with tf.GradientTape() as tape:
        tape.watch(args)
        value, aux = fn(*args)
    return value, aux, tape.gradient(value, args)


def _tf_jacobian(fn, x):
    import tensorflow as tf

    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.jacobian(y, x)


def _jax_value_and_grad(fn, args):
    import jax

    (value, aux), grads = jax.value_and_grad(lambda a: fn(*a), has_aux=True)(tuple(args))
    return value, aux, list(grads)


def _jax_jacobian(fn, x):
    import jax

    return jax.jacrev(fn)(x)


def _torch_value_and_grad(fn, args):
    import torch

    args = keras.tree.map_structure(
        lambda a: keras.ops.convert_to_tensor(a).detach().requires_grad_(True), args
    )
    value, aux = fn(*args)
    flat = keras.tree.flatten(args)
    grads = torch.autograd.grad(value, flat, allow_unused=True)
    grads = [torch.zeros_like(a) if g is None else g for a, g in zip(flat, grads)]
    return value, aux, keras.tree.pack_sequence_as(args, grads)


def _torch_jacobian(fn, x):
    import torch

    return torch.autograd.functional.jacobian(fn, keras.ops.convert_to_tensor(x))


def _tf_compile(fn):
    import tensorflow as tf

    return tf.function(fn, reduce_retracing=True)


def _jax_compile(fn):
    import jax

    return jax.jit(fn)


@dataclasses.dataclass(frozen=True)
class Autodiff:
    """``value_and_grad(fn, args)``: ``fn(*args) -> (scalar, aux)``; returns ``(scalar, aux,
    grads)`` with ``grads`` shaped like ``args``. ``jacobian(fn, x)``: ``d fn(x) / d x`` with shape
    ``fn(x).shape + x.shape``. ``compile(fn)``: the backend's graph compiler for a pure function of
    tensors (tf.function, jax.jit; eager for torch)."""

    value_and_grad: Callable
    jacobian: Callable
    compile: Callable


AUTODIFF = {
    "tensorflow": Autodiff(_tf_value_and_grad, _tf_jacobian, _tf_compile),
    "jax": Autodiff(_jax_value_and_grad, _jax_jacobian, _jax_compile),
    "torch": Autodiff(_torch_value_and_grad, _torch_jacobian, lambda fn: fn),
}


def get_autodiff(backend=None):
    """The autodiff entry for ``backend`` (default: the running Keras backend).

    Examples:
        >>> import keras
        >>> from keras_preact.analysis import get_autodiff
        >>> def objective(x):  # (a scalar, anything else)
        ...     return keras.ops.sum(x * x), None
        >>> _, _, grads = get_autodiff().value_and_grad(objective, [keras.ops.ones((3,))])
        >>> keras.ops.convert_to_numpy(grads[0]).tolist()
        [2.0, 2.0, 2.0]
    """
    backend = backend or keras.backend.backend()
    opt.check_choice("backend", backend, AUTODIFF)
    return AUTODIFF[backend]
