"""A fused ``BatchNormalization``: Keras' layer, run with the backend's fused kernels where they are faster.

Keras' training-mode batch normalization is backend-neutral arithmetic: ``ops.moments`` (a mean and a
mean of squares), then ``ops.batch_normalization`` (subtract, rsqrt, multiply, add), about ten separate
ops forward and as many backward. Where the backend compiles the step (JAX under XLA; TensorFlow's
graph) that costs little; on PyTorch, which runs the step eagerly, every op is a kernel launch and a
pass over the activation, against one fused kernel for ``torch.nn.BatchNorm2d``.

``BatchNormalization`` here is a subclass of Keras' layer with the same constructor, variables, config
and saved paths (Keras names a layer's weights in a file after the snake-cased class name, so the class
keeps Keras' name: ``.keras`` and ``.weights.h5`` files move between the two layers unchanged). In
training mode it calls the backend's fused kernel when the backend has an entry in ``FUSED_TRAINING``, in
inference mode the one in ``FUSED_INFERENCE`` (below), and Keras' own path everywhere else (masks, an axis
other than the channel axis, a dtype the kernel refuses, batch renormalization, ``synchronized=True``, fewer
than two values per channel in training), and on a Keras release outside ``fused.CHECKED_KERAS`` (the
releases the equality tests ran on).

Per backend, as measured with ``benchmarks/batch_norm_kernels.py`` (the normalization alone, forward +
backward, batch 128, ResNet-20's three shapes, on a 2-core AMD EPYC):

- PyTorch: ``torch.nn.functional.batch_norm`` (the native CPU kernel, cuDNN on CUDA) on a channels-last
  view of a ``channels_last`` input (a permutation, no copy): about 4x faster than Keras' eager ops.
- TensorFlow: Keras' path. Its step is a graph (no XLA on CPU by default), and the CPU
  ``FusedBatchNormV3`` kernel is Eigen expressions of the same reductions and arithmetic: as fast as
  Keras' graph or slower (also under XLA), so nothing to gain.
- JAX: Keras' path. JAX has no batch-norm primitive to call, and XLA already fuses Keras' moments and
  arithmetic into a few loops.

In inference mode (and for a frozen layer, which Keras runs in inference mode) the layer calls the backend's
kernel in ``FUSED_INFERENCE``: on PyTorch, ``torch.nn.functional.batch_norm(training=False)`` on the same
channels-last view, one pass over the activation where Keras' ``(x - mean) * (gamma / sigma) + beta`` makes three
(``--mode inference``: about 2.5x per layer; an evaluation batch of ResNet-20 spends most of its
non-convolution time there). The kernel computes ``x * (gamma / sigma) + (beta - mean * gamma / sigma)``,
which rounds differently: its outputs differ from Keras' layer by at most about 2e-7 of the output's largest
magnitude (``INFERENCE_RTOL``, 1e-6, is what the equality tests hold it to). The variables, and so the weights
files, are Keras' either way. TensorFlow and JAX keep Keras' path (a graph, XLA: fused already).

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


def _torch_training(x, gamma, beta, channel_axis, epsilon, relu=False):
    """``(output, batch mean, biased batch variance)`` from one fused kernel; None where it does not apply.
    ``relu``: the output's ReLU in place (the kernel's gradient reads its input, not its output)."""
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
    if relu:
        y = F.relu(y, inplace=True)
    if channels_last:
        y = torch.movedim(y, 1, -1)
    return y, mean, unbiased * ((count - 1) / count)


def _torch_inference(x, mean, variance, gamma, beta, channel_axis, epsilon, relu=False):
    """The normalization by the moving statistics from one fused kernel; None where it does not apply.
    ``relu``: the output's ReLU in place."""
    import torch
    import torch.nn.functional as F

    if x.dtype not in (torch.float32, torch.float64):
        return None
    rank = x.dim()
    channels_last = channel_axis != 1
    if channels_last:  # a view: NHWC memory seen as channels-last NCHW (explicit permutations: ONNX export
        x = x.permute(0, rank - 1, *range(1, rank - 1))  # writes torch.movedim's negative axis as a bad perm)
    y = F.batch_norm(x, mean, variance, gamma, beta, training=False, momentum=0.0, eps=epsilon)
    if relu:
        y = F.relu(y, inplace=True)
    return y.permute(0, *range(2, rank), 1) if channels_last else y


# backend name -> fused training kernel (x, gamma or None, beta or None, channel axis, epsilon, relu=False).
FUSED_TRAINING = {"torch": _torch_training}
# backend name -> fused inference kernel (x, moving mean, moving variance, gamma or None, beta or None,
# channel axis, epsilon, relu=False).
FUSED_INFERENCE = {"torch": _torch_inference}
# The largest difference from Keras' layer the inference kernels may make, relative to the output's largest magnitude.
INFERENCE_RTOL = 1e-6


@keras.saving.register_keras_serializable(package="keras_preact")
class BatchNormalization(keras.layers.BatchNormalization):
    """A fused layer: ``keras.layers.BatchNormalization`` run with the backend's fused kernels (module docstring).

    Same arguments, variables, config and weights files as Keras' layer; only the computation differs, and
    only in float32 rounding, on PyTorch and the Keras releases in ``fused.CHECKED_KERAS`` (elsewhere it is
    Keras' layer). The networks' builders use it by default.

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
        training = bool(training and self.trainable)  # as Keras: a frozen layer normalizes by its moving statistics
        kernels = FUSED_TRAINING if training else FUSED_INFERENCE
        kernel = kernels.get(keras.backend.backend()) if fused.enabled() else None
        axis = None if kernel is None else self._fused_axis(inputs, mask)
        if axis is None:
            return super().call(inputs, training=training, mask=mask)
        compute_dtype = keras.backend.result_type(inputs.dtype, "float32")
        x = ops.cast(inputs, compute_dtype)  # as Keras: statistics in float32 at least
        if keras.backend.standardize_dtype(x.dtype) not in _DTYPES:
            return super().call(inputs, training=training, mask=mask)
        gamma = ops.cast(self.gamma, x.dtype) if self.scale else None
        beta = ops.cast(self.beta, x.dtype) if self.center else None
        moving_mean = ops.cast(self.moving_mean, x.dtype)
        moving_variance = ops.cast(self.moving_variance, x.dtype)
        if not training:
            outputs = kernel(x, moving_mean, moving_variance, gamma, beta, axis, self.epsilon)
            if outputs is None:
                return super().call(inputs, training=training, mask=mask)
            return ops.cast(outputs, self.compute_dtype)
        result = kernel(x, gamma, beta, axis, self.epsilon)
        if result is None:
            return super().call(inputs, training=training, mask=mask)
        outputs, mean, variance = result
        self.update_moving_statistics(mean, variance, moving_mean, moving_variance)
        return ops.cast(outputs, self.compute_dtype)

    def update_moving_statistics(self, mean, variance, moving_mean=None, moving_variance=None):
        """Keras' update of the moving statistics by a training batch's ``mean`` and biased ``variance``:
        ``moving = moving * momentum + batch * (1 - momentum)`` (``moving_*``: their values, if already read)."""
        moving_mean = self.moving_mean.value if moving_mean is None else moving_mean
        moving_variance = self.moving_variance.value if moving_variance is None else moving_variance
        self.moving_mean.assign(moving_mean * self.momentum + mean * (1.0 - self.momentum))
        self.moving_variance.assign(moving_variance * self.momentum + variance * (1.0 - self.momentum))
