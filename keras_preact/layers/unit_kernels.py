"""A residual unit's steps as direct PyTorch calls: ``ResidualUnit``'s fast path on the PyTorch backend.

Keras runs a model on PyTorch eagerly, and every ``Layer.__call__`` is Python work besides the kernel it launches
(argument binding, name and autocast scopes, input conversion, masks, the call context): about 0.07 ms a call on a
2-core AMD EPYC. A unit of Fig. 4e calls six sublayers, so a CIFAR ResNet-20 forward pass at batch 2, whose
arithmetic is negligible, took 7.8 ms through its layers against 1.8 ms for the same network in plain PyTorch;
through the fast path it takes 4.1 ms (at batch 128: 37.2 ms, 31.1 ms, plain PyTorch 29.7 ms; rounds alternating in
one process, AVX-512 EPYC). ``fast_plan`` turns a built unit's ``UnitPlan`` into functions ``(x, training) -> x``
that call, on the sublayers' own variables, the kernels their layers call (``batch_normalization.FUSED_*``,
``convolution.FAST_CONV``), with the same arguments: the same numbers, without the layer machinery.

- a ``BatchNormalization`` step: its fused kernel (training: the batch statistics, then Keras' update of the
  moving ones; inference: the moving statistics), and when a ReLU follows it, that ReLU in place on the
  kernel's fresh output, one allocation less (the normalization's gradient reads its input, not its output:
  torchvision's ``BatchNorm2d`` then ``ReLU(inplace=True)``);
- a ``Conv2D`` step: ``torch.nn.functional.conv2d`` on channels-last views, a strided conv's zero padding
  inside it;
- a ReLU step: ``torch.relu``; option A's zero channels: ``torch.nn.functional.pad``;
- anything else (dropout, other activations and normalizations, weight-standardized and gating convs, a
  kernel that refuses its input): its layer or function, as ``ResidualUnit`` runs it everywhere.

Used on PyTorch on the Keras releases in ``fused.CHECKED_KERAS``, for a unit whose dtype policy is float32
and a float32 tensor input; otherwise (mixed precision, whose casts are ``Layer.__call__``'s) the unit runs
its steps through their layers. ``KERAS_PREACT_FAST_PATH=1`` (or ``0``) in the environment when a unit is built
turns it off for that unit (``fused.fast_path_level``): ``unit.kernel_plan`` is then None.

Examples:
    >>> import keras
    >>> from keras_preact.layers import ResidualUnit, unit_kernels
    >>> unit = ResidualUnit(16)
    >>> _ = unit(keras.ops.zeros((1, 4, 4, 16)))
    >>> plan = unit_kernels.fast_plan(unit.plan(), unit.dtype_policy)
    >>> (plan is not None) == (keras.backend.backend() == "torch")  # PyTorch's only
    True
"""

import dataclasses
import functools

import keras

from keras_preact.layers import batch_normalization, convolution, fused
from keras_preact.layers.batch_normalization import BatchNormalization
from keras_preact.layers.convolution import Conv2D


@dataclasses.dataclass(frozen=True)
class FastPlan:
    """A ``UnitPlan``'s step tuples as functions ``(x, training) -> x`` (module docstring)."""

    preactivation: tuple
    branch: tuple
    shortcut: tuple
    addition: tuple

    @staticmethod
    def accepts(inputs):
        """Whether ``inputs`` is a float32 PyTorch tensor (else the unit runs its layers)."""
        import torch

        return isinstance(inputs, torch.Tensor) and inputs.dtype == torch.float32


def run(functions, x, training):
    for function in functions:
        x = function(x, training)
    return x


def _float32(policy):
    return policy.compute_dtype == "float32" and policy.variable_dtype == "float32"


def _plain(layer):
    """A sublayer whose ``Layer.__call__`` adds nothing to its ``call``: float32, no activity regularizer."""
    return _float32(layer.dtype_policy) and getattr(layer, "activity_regularizer", None) is None


def _is_relu(op):
    return op is keras.activations.relu


def _norm(layer, relu, x, training):
    """A ``BatchNormalization`` step through its fused kernel (and the ReLU after it, in place)."""
    axis = layer._fused_axis(x, None)
    if axis is None:
        return _through_layers(layer, relu, x, training)
    gamma = layer.gamma.value if layer.scale else None
    beta = layer.beta.value if layer.center else None
    if training and layer.trainable:
        result = batch_normalization.FUSED_TRAINING["torch"](x, gamma, beta, axis, layer.epsilon, relu=relu)
        if result is None:
            return _through_layers(layer, relu, x, training)
        y, mean, variance = result
        layer.update_moving_statistics(mean, variance)
        return y
    y = batch_normalization.FUSED_INFERENCE["torch"](x, layer.moving_mean.value, layer.moving_variance.value,
                                                      gamma, beta, axis, layer.epsilon, relu=relu)
    return _through_layers(layer, relu, x, training) if y is None else y


def _through_layers(layer, relu, x, training):
    y = layer(x, training=training)
    return keras.activations.relu(y) if relu else y


def _conv(layer, input_padding, x, training):
    """A ``Conv2D`` step through ``convolution.FAST_CONV`` (``input_padding``: a strided conv's zeros)."""
    y = convolution.FAST_CONV["torch"](x, layer.kernel, layer.strides, layer.padding, layer.data_format,
                                       layer.dilation_rate, input_padding)
    if y is None:
        return layer(x, input_padding=input_padding)
    return y + layer.bias.value if layer.use_bias else y


def _padded_layer(layer, input_padding, x, training):
    return layer(x, training=training, input_padding=input_padding)


def _relu(x, training):
    import torch

    return torch.relu(x)


def _zero_channels(channels, axis, x, training):
    import torch.nn.functional as F

    pad = [0, 0] * (x.dim() - axis % x.dim() - 1) + [0, channels]  # F.pad lists the last axis first
    return F.pad(x, pad)


def _step(step, x, training):
    return step(x, training)


def _unit(unit, x, training):
    """A ``ResidualUnit`` with a fast plan, through its ``call`` (float32: its ``Layer.__call__`` adds nothing)."""
    return unit.call(x, training=training)


def _fast_conv_layer(op):
    return (type(op) is Conv2D and _plain(op) and op.groups == 1 and op.activation is keras.activations.linear
            and getattr(op, "quantization_mode", None) is None)


def _is_zero_channels(step):
    """Option A's zero channels (``residual_unit``'s ``functools.partial`` of ``channels`` and ``axis``)."""
    op = step.op
    return step.kind == "zero_channels" and isinstance(op, functools.partial) and set(op.keywords) == {"channels",
                                                                                                        "axis"}


def _functions(steps, fold_padding=True):
    """One function per step, a norm and the ReLU after it as one, a pad folded into the conv after it (where
    ``fold_padding``, as ``ResidualUnit`` runs its strided convs on every path)."""
    functions, i = [], 0
    while i < len(steps):
        step, following = steps[i], steps[i + 1] if i + 1 < len(steps) else None
        op = step.op
        if step.kind == "norm" and type(op) is BatchNormalization and _plain(op):
            relu = following is not None and following.kind == "act" and _is_relu(following.op)
            functions.append(functools.partial(_norm, op, relu))
            i += 2 if relu else 1
            continue
        if step.kind == "pad" and fold_padding and following is not None and isinstance(following.op, Conv2D):
            padding = tuple(tuple(int(p) for p in pair) for pair in op.padding)
            if _fast_conv_layer(following.op):
                functions.append(functools.partial(_conv, following.op, padding))
            else:
                functions.append(functools.partial(_padded_layer, following.op, padding))
            i += 2
            continue
        if step.kind == "unit":
            functions.append(functools.partial(_unit, op))
        elif step.kind in ("conv", "projection") and _fast_conv_layer(op):
            functions.append(functools.partial(_conv, op, None))
        elif step.kind == "act" and _is_relu(op):
            functions.append(_relu)
        elif _is_zero_channels(step):
            functions.append(functools.partial(_zero_channels, op.keywords["channels"], op.keywords["axis"]))
        else:
            functions.append(functools.partial(_step, step))
        i += 1
    return tuple(functions)


def _applies(dtype_policy):
    return (keras.backend.backend() == "torch" and fused.fast_path_level() >= 2 and convolution.folds_padding()
            and _float32(dtype_policy))


def fast_plan(plan, dtype_policy):
    """The ``FastPlan`` of a built unit's ``plan``, or None where the unit runs its layers (module docstring)."""
    if not _applies(dtype_policy):
        return None
    return FastPlan(*(_functions(steps) for steps in (plan.preactivation, plan.branch, plan.shortcut, plan.addition)))


@dataclasses.dataclass(frozen=True)
class _ChainStep:
    """A layer of a chain, as ``_functions`` reads a unit's ``Step`` (``kind``, ``op``, called on ``x``)."""

    kind: str
    op: object

    def __call__(self, x, training=None):
        return self.op(x, training=training)


@dataclasses.dataclass(frozen=True)
class FastChain:
    """A chain of layers (a backbone's stem, units and final ops) as functions ``(x, training) -> x``."""

    functions: tuple
    accepts = staticmethod(FastPlan.accepts)

    def __call__(self, x, training):
        return run(self.functions, x, training)


def chain_plan(layers, dtype_policy):
    """The ``FastChain`` of a linear chain of built ``layers``, or None where a unit in it has no fast plan: units
    through their ``call``, the stem's and the end's norms, ReLUs and convs as the units' steps; padding and
    pooling layers through their layers (a stem's padding is not folded into its conv: the layers' numbers). A unit
    is a layer with a ``kernel_plan`` attribute (``ResidualUnit``'s ``FastPlan``)."""
    if not _applies(dtype_policy):
        return None
    steps = []
    for layer in layers:
        if hasattr(layer, "kernel_plan"):
            if not isinstance(layer.kernel_plan, FastPlan):
                return None
            steps.append(_ChainStep("unit", layer))
        elif isinstance(layer, keras.layers.Activation) and _plain(layer) and _is_relu(layer.activation):
            steps.append(_ChainStep("act", keras.activations.relu))
        else:
            kind = "norm" if isinstance(layer, BatchNormalization) else "conv" if isinstance(layer, Conv2D) else "layer"
            steps.append(_ChainStep(kind, layer))
    return FastChain(_functions(steps, fold_padding=False))
