"""A fused ``Conv2D``: Keras' layer, computed on PyTorch by one ``conv2d`` call on channels-last views.

Keras' torch ``conv()`` (3.10 to 3.13 and 3.15; 3.14 copies only the kernel) turns a ``channels_last``
(NHWC) input into an NCHW-contiguous tensor (``permute(...).contiguous()``, a copy), then back into
``channels_last`` memory (``contiguous(memory_format=torch.channels_last)``, a second copy), and autograd
replays both copies for the gradient. A bare ``permute(0, 3, 1, 2)`` of an NHWC tensor already *is* a ``channels_last``
NCHW tensor, so ``torch.nn.functional.conv2d`` can take it as it is, and its output permuted back is a
contiguous NHWC tensor: no copy either way.

``Conv2D`` here is a subclass of Keras' layer with the same constructor, variables, config and saved
paths (Keras names a layer's weights in a file after the snake-cased class name, so the class keeps
Keras' name: ``.keras`` and ``.weights.h5`` files move between the two layers unchanged). Its
``convolution_op`` takes the backend's fast path when the backend has an entry in ``FAST_CONV`` and the
call is one it covers, and Keras' own ``convolution_op`` everywhere else.

The PyTorch fast path covers 4-D ``channels_last`` inputs, ``groups=1``, no dilation, and padding
``"valid"`` (0) or ``"same"`` where Keras' ``_apply_same_padding`` would pass a symmetric padding to
torch: stride 1 and an odd kernel (``k // 2`` each side). Anything else (even kernels or strides with
``"same"``, ``channels_first``, dilation, groups, quantized layers, TensorFlow, JAX) is Keras' path, and
so is every call on a Keras release outside ``fused.CHECKED_KERAS`` (the releases the equality tests ran on).
Measured with ``benchmarks/conv_kernels.py`` (forward + backward, batch 128, ResNet-20's shapes).

A residual unit's strided convolution is a ``ZeroPadding2D`` (the official code's symmetric padding) then a
"valid" conv. On the fast path the unit leaves that padding to the conv (``Conv2D.call``'s ``input_padding``):
``conv2d`` pads inside its kernel instead of the pad layer writing a padded copy of the activation (for
ResNet-20's 32x32x16 batch of 128, a 9.5 MB buffer zero-filled and copied each forward, sliced back in the
backward pass).
"""

import contextvars

import keras

from keras_preact.layers import fused

# The zero padding of the input being convolved (``Conv2D.call``'s ``input_padding``): ((top, bottom), (left, right)).
_INPUT_PADDING = contextvars.ContextVar("keras_preact_input_padding", default=None)


def folds_padding():
    """Whether this backend's fast path zero-pads inside the convolution (``Conv2D.call``'s ``input_padding``)."""
    return keras.backend.backend() in FAST_CONV and fused.enabled()


def _channels_last_kernel(kernel):
    """A Keras kernel ``(kh, kw, in, out)`` as PyTorch's ``(out, in, kh, kw)`` in ``channels_last`` memory.

    That memory is ``[out][kh][kw][in]``, the transpose of the kernel seen as a ``(kh * kw * in, out)`` matrix:
    one 2-D transpose copy (the permuted view alone measured slower, ``benchmarks/conv_kernels.py``). The same
    values in the same memory as ``kernel.permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)``,
    whose 4-D strided copy PyTorch splits across threads from 32,768 values on (a 64 x 64 x 3 x 3 kernel): on a
    loaded 2-core CPU that copy measured 24 ms a call against 0.1 ms for the transpose.
    """
    kh, kw, cin, cout = kernel.shape
    matrix = kernel.reshape(kh * kw * cin, cout).t().contiguous()  # (out, kh * kw * in)
    return matrix.view(cout, kh, kw, cin).permute(0, 3, 1, 2)


def _torch_conv2d(inputs, kernel, strides, padding, data_format, dilation_rate, input_padding=None):
    """NHWC conv2d through channels_last views (after ``input_padding``'s zeros); None where it does not apply."""
    import torch
    import torch.nn.functional as F

    if data_format != "channels_last" or tuple(dilation_rate) != (1, 1):
        return None
    if not isinstance(inputs, torch.Tensor) or inputs.ndim != 4:
        return None
    kernel = keras.ops.convert_to_tensor(kernel)
    if kernel.ndim != 4 or kernel.shape[2] != inputs.shape[3] or kernel.dtype != inputs.dtype:
        return None  # groups > 1, or a dtype Keras' path would reconcile
    kh, kw = kernel.shape[0], kernel.shape[1]
    strides = tuple(strides)
    if input_padding is not None:
        (top, bottom), (left, right) = input_padding
        if padding != "valid" or top != bottom or left != right:
            return None
        pad = (top, left)
    elif padding == "valid":
        pad = (0, 0)
    elif padding == "same" and strides == (1, 1) and kh % 2 == 1 and kw % 2 == 1:
        pad = (kh // 2, kw // 2)
    else:
        return None
    x = inputs.permute(0, 3, 1, 2)  # a view: NHWC memory seen as channels_last NCHW
    w = _channels_last_kernel(kernel)
    y = F.conv2d(x, w, stride=strides, padding=pad)
    return y.permute(0, 2, 3, 1)  # channels_last NCHW output seen as NHWC: contiguous, no copy


# backend name -> fast conv (inputs, kernel, strides, padding, data_format, dilation_rate) or None.
FAST_CONV = {"torch": _torch_conv2d}


@keras.saving.register_keras_serializable(package="keras_preact")
class Conv2D(keras.layers.Conv2D):
    """A fused layer: ``keras.layers.Conv2D`` computed on PyTorch without Keras' layout copies (module docstring).

    Same arguments, variables, config and weights files as Keras' layer; only how the convolution is
    called differs, on the PyTorch backend and the Keras releases in ``fused.CHECKED_KERAS`` (elsewhere it
    is Keras' layer). The networks' builders use it by default.

    Examples:
        >>> import keras
        >>> from keras_preact.layers import Conv2D
        >>> conv = Conv2D(8, 3, padding="same", use_bias=False)
        >>> tuple(conv(keras.ops.ones((1, 4, 4, 3))).shape), tuple(conv.kernel.shape)
        ((1, 4, 4, 8), (3, 3, 3, 8))
        >>> isinstance(conv, keras.layers.Conv2D)
        True
    """

    def call(self, inputs, input_padding=None):
        """Keras' call; ``input_padding`` (``((top, bottom), (left, right))``, as ``keras.layers.ZeroPadding2D``
        holds it) zero-pads the input first: inside ``conv2d`` on the fast path (a symmetric padding with
        ``padding="valid"``: no padded copy of the activation), else with ``keras.ops.pad``."""
        if input_padding is None:
            return super().call(inputs)
        token = _INPUT_PADDING.set(tuple(tuple(int(p) for p in pair) for pair in input_padding))
        try:
            return super().call(inputs)
        finally:
            _INPUT_PADDING.reset(token)

    def convolution_op(self, inputs, kernel):
        input_padding = _INPUT_PADDING.get()
        fast = FAST_CONV.get(keras.backend.backend()) if fused.enabled() else None
        if fast is not None and self.groups == 1 and getattr(self, "quantization_mode", None) is None:
            outputs = fast(inputs, kernel, self.strides, self.padding, self.data_format, self.dilation_rate,
                           input_padding)
            if outputs is not None:
                return outputs
        if input_padding is not None:
            spatial = [*input_padding, (0, 0)] if self.data_format == "channels_last" else [(0, 0), *input_padding]
            inputs = keras.ops.pad(inputs, [(0, 0), *spatial])
        return super().convolution_op(inputs, kernel)


@keras.saving.register_keras_serializable(package="keras_preact")
class WeightStandardizedConv2D(Conv2D):
    """A convolution whose kernel is standardized per output channel before use (Qiao et al. 2019,
    "Weight Standardization"; Kolesnikov et al. 2020, "Big Transfer (BiT)", with GroupNorm).

    ``kernel_hat = (kernel - mean) / sqrt(var + epsilon)``, mean and (biased) variance over the kernel's
    height, width and input channels, as timm's ``StdConv2d``. The stored variable is the raw kernel, so
    checkpoints of such convolutions load unchanged; ``epsilon`` defaults to BiT's 1e-8.

    Examples:
        >>> import keras
        >>> from keras_preact.layers import WeightStandardizedConv2D
        >>> conv = WeightStandardizedConv2D(4, 3, padding="same", use_bias=False)
        >>> tuple(conv(keras.ops.ones((1, 5, 5, 2))).shape)
        (1, 5, 5, 4)
        >>> w = keras.ops.convert_to_numpy(conv.standardized_kernel())
        >>> bool(abs(w.mean(axis=(0, 1, 2))).max() < 1e-6), bool(abs(w.std(axis=(0, 1, 2)) - 1).max() < 1e-4)
        (True, True)
    """

    def __init__(self, *args, epsilon=1e-8, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(epsilon, (int, float)) or isinstance(epsilon, bool) or not epsilon > 0:
            raise ValueError(f"Invalid epsilon={epsilon!r}: a positive number is required.")
        self.epsilon = float(epsilon)

    def standardized_kernel(self, kernel=None):
        """The kernel as the convolution uses it: zero mean, unit variance per output channel."""
        kernel = self.kernel if kernel is None else kernel
        axes = tuple(range(len(kernel.shape) - 1))
        mean = keras.ops.mean(kernel, axis=axes, keepdims=True)
        variance = keras.ops.mean(keras.ops.square(kernel - mean), axis=axes, keepdims=True)
        return (kernel - mean) * keras.ops.rsqrt(variance + self.epsilon)

    def convolution_op(self, inputs, kernel):
        return super().convolution_op(inputs, self.standardized_kernel(kernel))

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}
