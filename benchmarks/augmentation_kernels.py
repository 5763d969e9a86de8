"""The CIFAR augmentation on the device alone: one gather of whole pixels against two gathers, per backend.

The measurement behind ``keras_preact_training.recipe.augment.pad_crop_flip``, which ``PadCropFlip`` (``pipeline="device"``)
runs inside every training step: pad 4, crop 32x32 at a per-image offset, mirror half the images, for a
batch of 128 CIFAR images (NHWC, float32, normalised). Executed as the backend executes a Keras training
step: torch eagerly, JAX under ``jax.jit``, TensorFlow under ``tf.function``. Candidates:

- ``one gather``: the layer's ``pad_crop_flip`` (each output pixel's padded position computed once, then one
  ``take`` of whole pixels);
- ``two gathers``: the layer before it (``take_along_axis`` along H, then W, then ``flip`` and ``where``);
- on torch also ``reference``: ``benchmarks/reference_torch_cifar.py``'s ``augment`` (NCHW ``gather`` twice,
  its own draws), the plain PyTorch trainer's cost for the same work.

Both gathers are first checked to give the same values from the same draws; rounds alternate the
candidates in one process; it prints the median and min-max ms per call.

    KERAS_BACKEND=torch python benchmarks/augmentation_kernels.py
"""

import argparse
import pathlib
import statistics
import sys

import keras
import numpy as np
from keras import ops

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.kernel_timing import alternating_rounds  # noqa: E402
from keras_preact_training.recipe.augment import pad_crop_flip  # noqa: E402

SHAPE, PADDING = (128, 32, 32, 3), 4


def two_gathers(images, offsets, flip, padding):
    """``PadCropFlip`` before the one gather: crop rows, then columns, then mirror and select."""
    batch, height, width, channels = images.shape
    padded = ops.pad(images, [[0, 0], [padding, padding], [padding, padding], [0, 0]])
    rows = offsets[0][:, None] + ops.arange(height, dtype="int32")[None]
    cols = offsets[1][:, None] + ops.arange(width, dtype="int32")[None]
    out = ops.take_along_axis(
        padded, ops.broadcast_to(rows[:, :, None, None], (batch, height, width + 2 * padding, channels)), axis=1
    )
    out = ops.take_along_axis(out, ops.broadcast_to(cols[:, None, :, None], (batch, height, width, channels)), axis=2)
    return ops.where(flip[:, None, None, None], ops.flip(out, axis=2), out)


def compiled(fn):
    """``fn`` as the backend runs a training step's ops."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.jit(fn, static_argnums=3)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, reduce_retracing=True)
    return fn


def candidates(images, offsets, flip):
    """{name: call}; each call returns the augmented batch, ready (JAX's result blocked on)."""
    made = {"one gather": compiled(pad_crop_flip), "two gathers": compiled(two_gathers)}
    ours = {name: (lambda fn=fn: fn(images, offsets, flip, PADDING)) for name, fn in made.items()}
    if keras.backend.backend() == "jax":
        ours = {name: (lambda call=call: call().block_until_ready()) for name, call in ours.items()}
    if keras.backend.backend() == "torch":
        import torch

        from benchmarks.reference_torch_cifar import augment

        nchw = images.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
        generator = torch.Generator().manual_seed(0)
        ours["reference"] = lambda: augment(nchw, generator, channels_last=True)
    return ours


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20, help="calls per candidate per round")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    images = ops.convert_to_tensor(rng.normal(size=SHAPE).astype("float32"))
    offsets = ops.convert_to_tensor(rng.integers(0, 2 * PADDING + 1, (2, SHAPE[0])).astype("int32"))
    flip = ops.convert_to_tensor(rng.random(SHAPE[0]) < 0.5)
    calls = candidates(images, offsets, flip)
    same = np.array_equal(*(ops.convert_to_numpy(fn(images, offsets, flip, PADDING))
                            for fn in (pad_crop_flip, two_gathers)))
    if not same:
        raise AssertionError("one gather and two gathers gave different values from the same draws")
    print(f"backend {keras.backend.backend()}, keras {keras.__version__}; batch {SHAPE}, pad {PADDING}; the same "
          f"values from the same draws: yes; ms per call, median (min-max) of {args.rounds} alternating rounds of "
          f"{args.repeats} calls")
    times = alternating_rounds(calls, args.rounds, args.repeats)
    for name, t in times.items():
        print(f"  {name}: {statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f})")


if __name__ == "__main__":
    main()
