"""A fused ``BatchNormalization``: Keras' layer, trained with the backend's fused kernel where that is faster.

Keras' training-mode batch normalization is backend-neutral arithmetic: ``ops.moments`` (a mean and a
mean of squares), then ``ops.batch_normalization`` (subtract, rsqrt, multiply, add), about ten separate
ops forward and as many backward. Where the backend compiles the step (JAX under XLA; TensorFlow's
graph) that costs little; on PyTorch, which runs the step eagerly, every op is a kernel launch and a
pass over the activation, against one fused kernel for ``torch.nn.BatchNorm2d``.

``BatchNormalization`` here is a subclass of Keras' layer with the same constructor, variables, config
and saved paths (Keras names a layer's weights in a file after the snake-cased class name, so the class
keeps Keras' name: ``.keras`` and ``.weights.h5`` files move between the two layers unchanged). In
training mode it calls the backend's fused kernel when the backend has an entry in ``FUSED_TRAINING``,
and Keras' own path everywhere else (inference, masks, an axis other than the channel axis, a dtype the
kernel refuses, batch renormalization, ``synchronized=True``, fewer than two values per channel), and on a
Keras release outside ``fused.CHECKED_KERAS`` (the releases the equality tests ran on).

Per backend, as measured with ``benchmarks/batch_norm_kernels.py`` (the normalization alone, forward +
backward, batch 128, ResNet-20's three shapes, on a 2-core AMD EPYC):

- PyTorch: ``torch.nn.functional.batch_norm`` (the native CPU kernel, cuDNN on CUDA) on a channels-last
  view of a ``channels_last`` input (a permutation, no copy): about 4x faster than Keras' eager ops.
- TensorFlow: Keras' path. Its step is a graph (no XLA on CPU by default), and the CPU
  ``FusedBatchNormV3`` kernel is Eigen expressions of the same reductions and arithmetic: as fast as
  Keras' graph or slower (also under XLA), so nothing to gain.
- JAX: Keras' path. JAX has no batch-norm primitive to call, and XLA already fuses Keras' moments and
  arithmetic into a few loops.

Inference stays on Keras' path on every backend. PyTorch's inference kernel is faster (``--mode inference``:
about 2.5x per layer) but computes x * (gamma / sigma) + (beta - mean * gamma / sigma), which rounds differently
from Keras' (x - mean) * (gamma / sigma) + beta; on Keras' path a model gives the outputs of the same weights in
Keras' layer bit for bit.

The kernel's semantics are Keras': the output and gradients are those of the normalization with the
**biased** batch variance, and the moving statistics follow Keras' convention
``moving = moving * momentum + batch * (1 - momentum)`` with the biased variance (PyTorch's own running
variance is the unbiased one, with the opposite momentum convention: the kernel's running statistics
are only used to read the batch's).
"""

import keras
from keras import ops

from keras_preact.layers import fused

_RANKS = (2, 3, 4, 5)
_DTYPES = ("float32", "float64")


def _torch_training(x, gamma, beta, channel_axis, epsilon):
    """``(output, batch mean, biased batch variance)`` from one fused kernel; None where it does not apply."""
    import torch
    import torch.nn.functional as F

    if x.dtype not in (torch.float32, torch.float64):
        return None
    channels_last = channel_axis != 1
    if channels_last:
        x = torch.movedim(x, -1, 1)  # a view: NHWC memory seen as channels-last NCHW
    count = x.numel() // x.shape[1]
    if count < 2:
        return None
    # With momentum 1 the kernel's "running" statistics are the batch's own mean and unbiased variance.
    mean = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
    unbiased = torch.ones(x.shape[1], dtype=x.dtype, device=x.device)
    y = F.batch_norm(x, mean, unbiased, gamma, beta, training=True, momentum=1.0, eps=epsilon)
    if channels_last:
        y = torch.movedim(y, 1, -1)
    return y, mean, unbiased * ((count - 1) / count)


# backend name -> fused training kernel (x, gamma or None, beta or None, channel axis, epsilon).
FUSED_TRAINING = {"torch": _torch_training}


@keras.saving.register_keras_serializable(package="keras_preact")
class BatchNormalization(keras.layers.BatchNormalization):
    """A fused layer: ``keras.layers.BatchNormalization`` trained with the backend's fused kernel (module docstring).

    Same arguments, variables, config and weights files as Keras' layer; only the training-mode
    computation differs, and only in float32 rounding, on PyTorch and the Keras releases in
    ``fused.CHECKED_KERAS`` (elsewhere it is Keras' layer). The networks' builders use it by default.

    Examples:
        >>> import keras
        >>> from keras_preact.layers import BatchNormalization
        >>> layer = BatchNormalization(momentum=0.9, epsilon=1e-5)  # Torch's BN, the official code's
        >>> tuple(layer(keras.ops.ones((4, 2, 2, 8)), training=True).shape)
        (4, 2, 2, 8)
        >>> isinstance(layer, keras.layers.BatchNormalization), [w.name for w in layer.weights]
        (True, ['gamma', 'beta', 'moving_mean', 'moving_variance'])
    """

    def _fused_axis(self, inputs, mask):
        """The input's channel axis (1 or the last) if the fused kernel applies to this call, else None."""
        rank = len(inputs.shape)
        # ``renorm`` exists from Keras 3.14 on.
        if mask is not None or getattr(self, "renorm", False) or self.synchronized or rank not in _RANKS:
            return None
        axis = self.axis % rank
        return axis if axis in (1, rank - 1) else None

    def call(self, inputs, training=None, mask=None):
        kernel = FUSED_TRAINING.get(keras.backend.backend()) if fused.enabled() else None
        axis = None if kernel is None or not (training and self.trainable) else self._fused_axis(inputs, mask)
        if axis is None:
            return super().call(inputs, training=training, mask=mask)
        compute_dtype = keras.backend.result_type(inputs.dtype, "float32")
        x = ops.cast(inputs, compute_dtype)  # as Keras: statistics in float32 at least
        if keras.backend.standardize_dtype(x.dtype) not in _DTYPES:
            return super().call(inputs, training=training, mask=mask)
        gamma = ops.cast(self.gamma, x.dtype) if self.scale else None
        beta = ops.cast(self.beta, x.dtype) if self.center else None
        result = kernel(x, gamma, beta, axis, self.epsilon)
        if result is None:
            return super().call(inputs, training=training, mask=mask)
        outputs, mean, variance = result
        moving_mean = ops.cast(self.moving_mean, x.dtype)
        moving_variance = ops.cast(self.moving_variance, x.dtype)
        self.moving_mean.assign(moving_mean * self.momentum + mean * (1.0 - self.momentum))
        self.moving_variance.assign(moving_variance * self.momentum + variance * (1.0 - self.momentum))
        return ops.cast(outputs, self.compute_dtype)
