"""Tables of the paper's design choices and factories for the layer types a unit is made of.

Every variant the paper studies is one entry in a table here (Table 2 orderings, Table 1 shortcuts,
normalizations), so the unit code never branches on names. A unit picks one entry of each by name
(``ResidualUnit(filters, ordering=..., shortcut=..., shortcut_type=..., block=...)``).

Examples:
    >>> from keras_preact.layers import BLOCKS, ORDERINGS, SHORTCUT_TYPES, SHORTCUTS
    >>> ORDERINGS["full_preact"].before_conv, ORDERINGS["full_preact"].after_addition  # Fig. 4e
    (('norm', 'act'), ())
    >>> ORDERINGS["original"].after_addition  # Fig. 4a: ReLU after the addition
    ('act',)
    >>> list(SHORTCUTS)  # Table 1 / Fig. 2 (a)-(f)
    ['identity', 'constant_scaling', 'exclusive_gating', 'shortcut_only_gating', 'conv1x1', 'dropout']
    >>> SHORTCUTS["constant_scaling"].options  # the options it reads, with their defaults
    (('shortcut_scale', 0.5), ('residual_scale', 1.0))
    >>> SHORTCUT_TYPES, list(BLOCKS)
    (('A', 'B', 'C'), ['one_layer', 'basic', 'bottleneck'])
"""

import dataclasses
import math

import keras

from keras_preact.layers.batch_normalization import BatchNormalization
from keras_preact.layers.convolution import Conv2D, WeightStandardizedConv2D


@dataclasses.dataclass(frozen=True)
class Ordering:
    """Where normalization ("norm") and activation ("act") sit in a residual unit (paper Fig. 4).

    ``before_conv`` runs before every convolution of the branch, ``after_conv`` after every one but
    the last, ``after_last_conv`` after the last, ``after_addition`` on the sum. ``after_stem`` and
    ``final`` are what a network of these units needs after its stem and after its last unit.
    ``projection_norm``: a projection shortcut is followed by a norm (post-activation designs, where
    every weight layer is followed by BN).
    """

    figure: str
    before_conv: tuple
    after_conv: tuple
    after_last_conv: tuple
    after_addition: tuple
    after_stem: tuple
    final: tuple
    projection_norm: bool

    @property
    def is_preactivation(self):
        return bool(self.before_conv)


NA = ("norm", "act")

# Paper Table 2 / Fig. 4.
ORDERINGS = {
    # conv-BN-ReLU-conv-BN, add, ReLU
    "original": Ordering("4a", (), NA, ("norm",), ("act",), NA, (), True),
    # conv-BN-ReLU-conv, add, BN-ReLU
    "bn_after_addition": Ordering("4b", (), NA, (), NA, NA, (), False),
    # conv-BN-ReLU-conv-BN-ReLU, add
    "relu_before_addition": Ordering("4c", (), NA, NA, (), NA, (), True),
    # ReLU-conv-BN-ReLU-conv-BN, add.  The stem ends in BN so the first ReLU has something to
    # act on; the network ends with a ReLU (the "extra activation" of the paper's Sec. 4.1).
    "relu_only_preact": Ordering("4d", ("act",), ("norm",), ("norm",), (), ("norm",), ("act",), True),
    # BN-ReLU-conv-BN-ReLU-conv, add.  Network ends with BN-ReLU after the last addition.
    "full_preact": Ordering("4e", NA, (), (), (), (), NA, False),
}


@dataclasses.dataclass(frozen=True)
class Shortcut:
    """A shortcut design of paper Table 1 / Fig. 2: what multiplies h(x) and F(x)."""

    figure: str
    gate: str  # "none", "exclusive" (1-g on h, g on F) or "shortcut_only" (1-g on h)
    always_project: bool  # a 1x1 conv on every shortcut
    options: tuple  # the unit arguments this shortcut reads, with their defaults


SHORTCUTS = {
    "identity": Shortcut("2a", "none", False, ()),
    "constant_scaling": Shortcut(
        "2b", "none", False, (("shortcut_scale", 0.5), ("residual_scale", 1.0))
    ),
    "exclusive_gating": Shortcut("2c", "exclusive", False, (("gate_bias_init", -6.0),)),
    "shortcut_only_gating": Shortcut("2d", "shortcut_only", False, (("gate_bias_init", -6.0),)),
    "conv1x1": Shortcut("2e", "none", True, ()),
    "dropout": Shortcut("2f", "none", False, (("shortcut_dropout_rate", 0.5),)),
}

# How a gate g(x) = sigmoid(1x1 conv(x) + b_g) combines the shortcut h and the branch F (Fig. 2c/d).
GATES = {
    "exclusive": lambda g, h, f: ((1.0 - g) * h, g * f),
    "shortcut_only": lambda g, h, f: ((1.0 - g) * h, f),
}

# Every shortcut-specific option name, in table order.
SHORTCUT_OPTION_NAMES = tuple(dict.fromkeys(n for spec in SHORTCUTS.values() for n, _ in spec.options))

# How a shortcut handles a change of shape (original ResNet paper, Sec. 3.3; fb.resnet.torch
# ``shortcutType``): A strided identity + zero channels, B project where the shape changes,
# C project on every unit.
SHORTCUT_TYPES = ("A", "B", "C")

BLOCKS = {
    # name: (kernel sizes, width divisor of the output channels for all but the last conv)
    "one_layer": ((3,), 1),  # Table 3's "1-layer skip": a single 3x3 conv per unit
    "basic": ((3, 3), 1),
    "bottleneck": ((1, 3, 1), 4),
}

STRIDE_POSITIONS = {
    # Which convolution of the branch carries the stride.
    "first": lambda kernel_sizes: 0,  # resnet-pre-act.lua (CIFAR bottleneck nets)
    "3x3": lambda kernel_sizes: kernel_sizes.index(3),  # fb.resnet.torch, timm
}


def _group_norm(channels_axis, epsilon, groups, **kwargs):
    return keras.layers.GroupNormalization(groups=groups, axis=channels_axis, epsilon=epsilon, **kwargs)


NORMALIZATIONS = {
    "batch": lambda axis, epsilon, momentum, groups, **kw: BatchNormalization(
        axis=axis, epsilon=epsilon, momentum=momentum, **kw
    ),
    # GroupNorm's group count is gcd(norm_groups, channels) so every width of a net is valid.
    "group": lambda axis, epsilon, momentum, groups, **kw: _group_norm(axis, epsilon, groups, **kw),
    "layer": lambda axis, epsilon, momentum, groups, **kw: keras.layers.LayerNormalization(
        axis=axis, epsilon=epsilon, **kw
    ),
    "rms": lambda axis, epsilon, momentum, groups, **kw: keras.layers.RMSNormalization(
        axis=axis, epsilon=epsilon, **kw
    ),
}


# The convolution of every weight layer of a unit and of the stem: Keras' (through ``Conv2D``), or with its kernel
# standardized per output channel (Qiao et al. 2019; BiT's with GroupNorm, Kolesnikov et al. 2020: its default
# epsilon, BiT's 1e-8, written once, in the layer).
CONVOLUTIONS = {
    "standard": lambda **kw: Conv2D(**kw),
    "weight_standardized": lambda **kw: WeightStandardizedConv2D(**kw),
}


# Normalizations whose scale initializer can be set (zero_init_residual zeroes it). Keras'
# RMSNormalization always starts its scale at one, so with it the last conv kernel is zeroed instead.
NORMS_WITH_SCALE_INIT = ("batch", "group", "layer")


def make_norm(kind, channels, *, axis, epsilon, momentum, groups, name, dtype):
    groups = math.gcd(groups, channels)
    return NORMALIZATIONS[kind](axis, epsilon, momentum, groups, name=name, dtype=dtype)


def check_choice(argument, value, allowed):
    if value not in allowed:
        raise ValueError(
            f"Invalid {argument}={value!r}. Allowed values: {', '.join(repr(a) for a in allowed)}."
        )


def check_finite(argument, value, low=None, high=None, low_open=False):
    """``value`` a finite real number (not a bool) within ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if (
        not finite
        or (low is not None and (value <= low if low_open else value < low))
        or (high is not None and value > high)
    ):
        bounds = "" if low is None and high is None else (
            f" > {low}" if high is None and low_open else f" in {'(' if low_open else '['}{low}, {high}]")
        raise ValueError(f"Invalid {argument}={value!r}: a finite number{bounds} is required.")


def check_rate(argument, value):
    if not isinstance(value, (int, float)) or not 0.0 <= float(value) < 1.0:
        raise ValueError(f"Invalid {argument}={value!r}: it must be a number in [0, 1).")


def get_activation(activation):
    """Resolve an activation identifier, naming the argument when it is unknown."""
    try:
        fn = keras.activations.get(activation)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"Invalid activation={activation!r}: not a Keras activation "
            f"(e.g. 'relu', 'gelu', 'silu', or a callable). {e}"
        ) from None
    if fn is None:
        raise ValueError("Invalid activation=None: a residual unit needs an activation, e.g. 'relu'.")
    return fn


# He et al.'s initialisation as in the official code: N(0, sqrt(2 / (k*k*filters_out))),
# i.e. fan-out, untruncated. Keras' "he_normal" is fan-in and truncated, so it is not the default.
KERNEL_INITIALIZERS = {
    "he_normal_fan_out": lambda: keras.initializers.VarianceScaling(
        scale=2.0, mode="fan_out", distribution="untruncated_normal"
    ),
}


def get_kernel_initializer(identifier):
    """A new initializer object for every kernel. Keras' unseeded initializers draw their seed once,
    when made, so one object shared by two kernels of one shape gives them equal values; the official
    code draws every kernel independently. A given ``Initializer`` object is copied from its config
    (a seeded one stays seeded: the user's choice)."""
    if isinstance(identifier, str) and identifier in KERNEL_INITIALIZERS:
        return KERNEL_INITIALIZERS[identifier]()
    if isinstance(identifier, keras.initializers.Initializer):
        return identifier.__class__.from_config(identifier.get_config())
    try:
        return keras.initializers.get(identifier)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"Invalid kernel_initializer={identifier!r}: use 'he_normal_fan_out' (the official "
            f"code's), 'orthogonal', or any Keras initializer. {e}"
        ) from None


def get_regularizer(identifier):
    try:
        return keras.regularizers.get(identifier)
    except (ValueError, TypeError) as e:
        raise ValueError(f"Invalid kernel_regularizer={identifier!r}: {e}") from None


def serialize(obj):
    """Config value for an argument that may be a string or a Keras object."""
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return keras.saving.serialize_keras_object(obj)
