"""``UnitConfig``: every option of a residual unit, once: its default, its validation, its config value.

``ResidualUnit`` takes these options as keyword arguments (its ``__init__`` writes out the same names and
defaults; ``tests/test_unit_config.py`` holds them equal) and keeps them as ``unit.options``; the
backbone validates ``unit_options`` with it and makes its stem and final norm/activation from it; the
builders (``cifar_resnet``, ``imagenet_resnet``) validate their merged options with it and read it.
The tables the options select from are in ``options.py``.
"""

import dataclasses

import keras

from keras_preact.layers import options as opt


@dataclasses.dataclass(frozen=True)
class UnitConfig:
    """The options of a residual unit (paper Eq. 1-2, Fig. 2, Fig. 4, Tables 1-3).

    block: ``"basic"`` (3x3, 3x3), ``"bottleneck"`` (1x1, 3x3, 1x1; inner width ``filters // 4``) or
        ``"one_layer"`` (a single 3x3: Table 3's "1-layer skip").
    ordering: where BN/activation sit, Table 2: ``"original"``, ``"bn_after_addition"``,
        ``"relu_before_addition"``, ``"relu_only_preact"``, ``"full_preact"`` (Fig. 4e).
    shortcut: Table 1: ``"identity"``, ``"constant_scaling"``, ``"exclusive_gating"``,
        ``"shortcut_only_gating"``, ``"conv1x1"``, ``"dropout"``.
    shortcut_type: a change of shape: ``"A"`` strided identity with zero-padded channels, ``"B"`` a 1x1
        projection where the shape changes, ``"C"`` a projection on every unit.
    shortcut_scale, residual_scale: constant scaling (Fig. 2b), defaults 0.5 and 1.0; gate_bias_init: b_g
        of g(x) = sigmoid(1x1 conv(x) + b_g) (Fig. 2c/d), default -6; shortcut_dropout_rate: dropout on h(x)
        (Fig. 2f), default 0.5. Each only with its shortcut (None: the shortcut's default).
    preactivate_shortcut: the shortcut reads the pre-activated input (pre-activation orderings). None:
        where the shortcut changes shape, as the official code ("projection shortcuts are also with
        pre-activation"); the official CIFAR basic net also does it on each stage's first unit (True).
    skip_preactivation: no first pre-activation (after a stem that ends in BN-ReLU, fb.resnet.torch ImageNet).
    stride_position: the ``"first"`` conv of the branch (resnet-pre-act.lua) or the ``"3x3"``
        (fb.resnet.torch, timm).
    output_bias: a bias on the branch's last conv and on the projection (TF-slim layout).
    normalization: ``"batch"``, ``"group"``, ``"layer"``, ``"rms"``; norm_epsilon, norm_momentum: 1e-5
        and 0.9, Torch's BN (the official code's), not Keras' 1e-3 / 0.99; norm_groups: GroupNorm's
        groups (gcd with the channels).
    convolution: ``"standard"`` or ``"weight_standardized"`` (each conv's kernel standardized per output
        channel, as BiT's with ``normalization="group"``): ``options.CONVOLUTIONS``.
    activation: any Keras activation.
    dropout_rate: dropout before every conv of the branch but the first (as Wide ResNets).
    drop_path_rate: stochastic depth: the whole branch is dropped per sample at this rate.
    zero_init_residual: F(x) = 0 at the start: zero gamma of the branch's last norm, or zero kernel of its
        last conv where no norm with a settable scale follows it (as timm).
    kernel_initializer: ``"he_normal_fan_out"`` (the official untruncated N(0, sqrt(2/(k*k*filters)))),
        ``"orthogonal"`` or any Keras initializer; kernel_regularizer: for every conv kernel.

    Examples:
        >>> from keras_preact.layers import UnitConfig
        >>> config = UnitConfig(block="bottleneck", shortcut="constant_scaling")
        >>> config.kernel_sizes, config.widths(256)  # 1x1, 3x3, 1x1; inner width filters // 4
        ((1, 3, 1), [64, 64, 256])
        >>> config.shortcut_options  # Fig. 2b's defaults
        {'shortcut_scale': 0.5, 'residual_scale': 1.0}
        >>> UnitConfig(shortcut_scale=0.5)  # an option of another shortcut is refused by name
        Traceback (most recent call last):
        ...
        ValueError: shortcut_scale=0.5 is only used with shortcut='constant_scaling', not shortcut='identity'.
    """

    block: str = "basic"
    ordering: str = "full_preact"
    shortcut: str = "identity"
    shortcut_type: str = "B"
    shortcut_scale: float = None
    residual_scale: float = None
    gate_bias_init: float = None
    shortcut_dropout_rate: float = None
    preactivate_shortcut: bool = None
    skip_preactivation: bool = False
    stride_position: str = "3x3"
    output_bias: bool = False
    normalization: str = "batch"
    norm_epsilon: float = 1e-5
    norm_momentum: float = 0.9
    norm_groups: int = 32
    convolution: str = "standard"
    activation: object = "relu"
    dropout_rate: float = 0.0
    drop_path_rate: float = 0.0
    zero_init_residual: bool = False
    kernel_initializer: object = "he_normal_fan_out"
    kernel_regularizer: object = None

    def __post_init__(self):
        opt.check_choice("block", self.block, opt.BLOCKS)
        opt.check_choice("ordering", self.ordering, opt.ORDERINGS)
        opt.check_choice("shortcut", self.shortcut, opt.SHORTCUTS)
        opt.check_choice("shortcut_type", self.shortcut_type, opt.SHORTCUT_TYPES)
        opt.check_choice("stride_position", self.stride_position, opt.STRIDE_POSITIONS)
        opt.check_choice("normalization", self.normalization, opt.NORMALIZATIONS)
        opt.check_choice("convolution", self.convolution, opt.CONVOLUTIONS)
        opt.check_choice("preactivate_shortcut", self.preactivate_shortcut, (None, True, False))
        opt.check_rate("dropout_rate", self.dropout_rate)
        opt.check_rate("drop_path_rate", self.drop_path_rate)
        allowed = dict(opt.SHORTCUTS[self.shortcut].options)
        for name in opt.SHORTCUT_OPTION_NAMES:
            value = getattr(self, name)
            if value is not None and name not in allowed:
                users = " or ".join(repr(s) for s, spec in opt.SHORTCUTS.items() if name in dict(spec.options))
                raise ValueError(
                    f"{name}={value!r} is only used with shortcut={users}, not shortcut={self.shortcut!r}."
                )
        for name in ("shortcut_scale", "residual_scale", "gate_bias_init"):
            if getattr(self, name) is not None:
                opt.check_finite(name, getattr(self, name))
        opt.check_finite("norm_epsilon", self.norm_epsilon, low=0.0, low_open=True)
        opt.check_finite("norm_momentum", self.norm_momentum, low=0.0, high=1.0)
        if not isinstance(self.norm_groups, int) or isinstance(self.norm_groups, bool) or self.norm_groups < 1:
            raise ValueError(f"Invalid norm_groups={self.norm_groups!r}: a positive integer is required.")
        if "shortcut_dropout_rate" in allowed:
            opt.check_rate("shortcut_dropout_rate", self.shortcut_options["shortcut_dropout_rate"])
        for name in ("skip_preactivation", "output_bias", "zero_init_residual"):
            object.__setattr__(self, name, bool(getattr(self, name)))
        # Resolved now, so a bad identifier is refused before anything is built.
        opt.get_activation(self.activation)
        opt.get_kernel_initializer(self.kernel_initializer)
        opt.get_regularizer(self.kernel_regularizer)

    @classmethod
    def names(cls):
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_options(cls, options):
        """From a ``unit_options`` mapping; an unknown name is refused, listing the allowed ones."""
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise ValueError(f"Unknown unit option(s) {', '.join(unknown)}. Allowed: {', '.join(cls.names())}.")
        return cls(**options)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to_config(self):
        """Every option as a config value (Keras objects serialized)."""
        return {name: opt.serialize(getattr(self, name)) for name in self.names()}

    # -------------------------------------------------------------- what the options select
    @property
    def ordering_spec(self):
        return opt.ORDERINGS[self.ordering]

    @property
    def shortcut_spec(self):
        return opt.SHORTCUTS[self.shortcut]

    @property
    def shortcut_options(self):
        """The shortcut's own options, given or defaulted (``{}`` for most shortcuts)."""
        return {n: (getattr(self, n) if getattr(self, n) is not None else d)
                for n, d in self.shortcut_spec.options}

    @property
    def kernel_sizes(self):
        return opt.BLOCKS[self.block][0]

    @property
    def width_divisor(self):
        return opt.BLOCKS[self.block][1]

    def widths(self, filters):
        """Output channels of each conv of the branch."""
        return [filters // self.width_divisor] * (len(self.kernel_sizes) - 1) + [filters]

    @property
    def stride_index(self):
        return opt.STRIDE_POSITIONS[self.stride_position](self.kernel_sizes)

    # ------------------------------------------------------------------- layer factories
    def norm(self, channels, *, axis, name, dtype=None, zero=False):
        """The unit's normalization over ``channels`` (GroupNorm: gcd(norm_groups, channels) groups);
        ``zero``: its scale starts at zero (``zero_init_residual``)."""
        layer = opt.make_norm(self.normalization, channels, axis=axis, epsilon=self.norm_epsilon,
                              momentum=self.norm_momentum, groups=self.norm_groups, name=name, dtype=dtype)
        if zero:
            layer.gamma_initializer = keras.initializers.Zeros()
        return layer

    def activation_layer(self, *, name, dtype=None):
        return keras.layers.Activation(opt.get_activation(self.activation), name=name, dtype=dtype)

    def conv(self, filters, kernel_size, strides, *, name, data_format, regularizer, dtype=None, use_bias=False,
             zero=False):
        """A conv of the unit: "same" padding unless strided (the caller pads), its own kernel initializer
        (zeros where ``zero``), ``regularizer`` (``kernel_regularizer`` resolved once per unit)."""
        initializer = keras.initializers.Zeros() if zero else opt.get_kernel_initializer(self.kernel_initializer)
        return opt.CONVOLUTIONS[self.convolution](
            filters=filters,
            kernel_size=kernel_size,
            strides=strides,
            padding="same" if strides == 1 else "valid",
            use_bias=use_bias,
            kernel_initializer=initializer,
            kernel_regularizer=regularizer,
            data_format=data_format,
            name=name,
            dtype=dtype,
        )
