"""Batch normalization alone: Keras' path against the backend's kernel, in training or inference mode.

The measurement behind ``keras_preact.layers.BatchNormalization``'s per-backend choice
(``FUSED_TRAINING``; with ``--mode inference``, what inference on Keras' path costs). For the three
activation shapes of pre-act ResNet-20 at batch 128 (channels_last), milliseconds per forward + backward
of the normalization in training mode, executed as the backend executes a Keras training step
(``--mode inference``: per forward with the moving statistics, as ``model.evaluate`` and ``predict`` run
it; on torch under ``torch.no_grad``):

- torch (eager): Keras' ``BatchNormalization`` against ``torch.nn.functional.batch_norm``;
- tensorflow (``tf.function``, and with ``--jit`` under XLA): Keras' layer against
  ``tf.compat.v1.nn.fused_batch_norm`` (``FusedBatchNormV3``);
- jax (``jax.jit``, i.e. XLA): Keras' layer against a floor, one multiply-add of the same tensors
  (what any fused normalization must at least read and write) — JAX has no batch-norm primitive.

Rounds alternate the candidates in one process; it prints the median and min-max ms per shape.

    KERAS_BACKEND=torch python benchmarks/batch_norm_kernels.py
    KERAS_BACKEND=torch python benchmarks/batch_norm_kernels.py --mode inference
"""

import argparse
import pathlib
import statistics
import sys

import keras
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.kernel_timing import alternating_rounds  # noqa: E402

SHAPES = ((128, 32, 32, 16), (128, 16, 16, 32), (128, 8, 8, 64))


def keras_layer(shape):
    layer = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)
    layer.build(shape)
    return layer


def torch_candidates(x, shape):
    import torch
    import torch.nn.functional as F

    layer = keras_layer(shape)
    x = torch.tensor(x, requires_grad=True)
    upstream = torch.ones_like(x)
    gamma = torch.ones(shape[-1], requires_grad=True)
    beta = torch.zeros(shape[-1], requires_grad=True)

    def keras_path():
        torch.autograd.grad(layer(x, training=True), [x, layer.gamma.value, layer.beta.value], upstream)

    def fused():
        mean, var = torch.zeros(shape[-1]), torch.ones(shape[-1])
        y = F.batch_norm(torch.movedim(x, -1, 1), mean, var, gamma, beta, True, 1.0, 1e-5)
        torch.autograd.grad(torch.movedim(y, 1, -1), [x, gamma, beta], upstream)

    return {"keras": keras_path, "F.batch_norm": fused}


def torch_inference_candidates(x, shape):
    import torch
    import torch.nn.functional as F

    layer = keras_layer(shape)
    x = torch.tensor(x)
    mean, var = torch.zeros(shape[-1]), torch.ones(shape[-1])
    gamma, beta = torch.ones(shape[-1]), torch.zeros(shape[-1])

    def keras_path():
        with torch.no_grad():
            layer(x, training=False)

    def fused():
        with torch.no_grad():
            torch.movedim(F.batch_norm(torch.movedim(x, -1, 1), mean, var, gamma, beta, False, 0.0, 1e-5), 1, -1)

    return {"keras": keras_path, "F.batch_norm": fused}


def tensorflow_inference_candidates(x, shape, jit):
    import tensorflow as tf

    layer = keras_layer(shape)
    x = tf.constant(x)
    mean, var = tf.zeros(shape[-1]), tf.ones(shape[-1])
    gamma, beta = tf.ones(shape[-1]), tf.zeros(shape[-1])
    keras_path = tf.function(lambda: layer(x, training=False), jit_compile=jit)
    fused = tf.function(lambda: tf.compat.v1.nn.fused_batch_norm(x, gamma, beta, mean, var, epsilon=1e-5,
                                                                 is_training=False)[0], jit_compile=jit)
    return {"keras": lambda: keras_path().numpy(), "fused_batch_norm": lambda: fused().numpy()}


def jax_inference_candidates(x, shape):
    import jax
    import jax.numpy as jnp

    layer = keras_layer(shape)
    x = jnp.asarray(x)
    variables = [v.value for v in layer.trainable_variables], [v.value for v in layer.non_trainable_variables]
    keras_path = jax.jit(lambda x: layer.stateless_call(*variables, x, training=False)[0])
    gamma, beta = jnp.ones(shape[-1]), jnp.zeros(shape[-1])
    floor = jax.jit(lambda x: x * gamma + beta)
    return {"keras": lambda: keras_path(x).block_until_ready(),
            "multiply-add floor": lambda: floor(x).block_until_ready()}


def tensorflow_candidates(x, shape, jit):
    import tensorflow as tf

    layer = keras_layer(shape)
    x = tf.constant(x)
    gamma, beta = tf.Variable(tf.ones(shape[-1])), tf.Variable(tf.zeros(shape[-1]))

    @tf.function(jit_compile=jit)
    def keras_path():
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
        return tape.gradient(y, [x, layer.gamma.value, layer.beta.value])

    @tf.function(jit_compile=jit)
    def fused():
        with tf.GradientTape() as tape:
            tape.watch(x)
            y, mean, var = tf.compat.v1.nn.fused_batch_norm(x, gamma, beta, epsilon=1e-5, is_training=True)
        return tape.gradient(y, [x, gamma, beta]), mean, var

    return {"keras": lambda: keras_path()[0].numpy(), "fused_batch_norm": lambda: fused()[0][0].numpy()}


def jax_candidates(x, shape):
    import jax
    import jax.numpy as jnp

    layer = keras_layer(shape)
    x = jnp.asarray(x)
    gamma, beta = jnp.ones(shape[-1]), jnp.zeros(shape[-1])
    state = [v.value for v in layer.non_trainable_variables]

    def keras_loss(x, gamma, beta):
        y, _ = layer.stateless_call([gamma, beta], state, x, training=True)
        return jnp.sum(y)

    def floor_loss(x, gamma, beta):
        return jnp.sum(x * gamma + beta)

    keras_grad = jax.jit(jax.grad(keras_loss, argnums=(0, 1, 2)))
    floor_grad = jax.jit(jax.grad(floor_loss, argnums=(0, 1, 2)))
    return {"keras": lambda: keras_grad(x, gamma, beta)[0].block_until_ready(),
            "multiply-add floor": lambda: floor_grad(x, gamma, beta)[0].block_until_ready()}


# (mode, backend) -> candidates(x, shape, jit): {name: call}; ``jit`` is TensorFlow's XLA switch.
CANDIDATES = {
    ("training", "torch"): lambda x, shape, jit: torch_candidates(x, shape),
    ("training", "jax"): lambda x, shape, jit: jax_candidates(x, shape),
    ("training", "tensorflow"): tensorflow_candidates,
    ("inference", "torch"): lambda x, shape, jit: torch_inference_candidates(x, shape),
    ("inference", "jax"): lambda x, shape, jit: jax_inference_candidates(x, shape),
    ("inference", "tensorflow"): tensorflow_inference_candidates,
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=10, help="calls per candidate per round")
    p.add_argument("--jit", action="store_true", help="tensorflow: compile both with XLA")
    p.add_argument("--mode", choices=["training", "inference"], default="training",
                   help="training: forward + backward with the batch statistics (default); inference: forward with "
                        "the moving statistics")
    args = p.parse_args(argv)
    backend = keras.backend.backend()
    rng = np.random.default_rng(0)
    what = "forward + backward, training mode" if args.mode == "training" else "forward, inference mode"
    print(f"backend {backend}, keras {keras.__version__}; ms per {what}, median (min-max) of "
          f"{args.rounds} alternating rounds of {args.repeats} calls")
    for shape in SHAPES:
        x = rng.normal(size=shape).astype("float32")
        candidates = CANDIDATES[args.mode, backend](x, shape, args.jit)
        times = alternating_rounds(candidates, args.rounds, args.repeats)
        row = ", ".join(f"{n} {statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f})" for n, t in times.items())
        print(f"  {shape}: {row}")


if __name__ == "__main__":
    main()
