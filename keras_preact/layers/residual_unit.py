"""``ResidualUnit``: one Keras layer for every residual unit of He et al. 2016 (ECCV).

``y = s(h(x)) + r(F(x))`` and ``x_next = f(y)`` (paper Eq. 1-2), where the ordering (Table 2,
Fig. 4) says where normalization and activation sit and the shortcut design (Table 1, Fig. 2) says
what multiplies ``h(x)`` and ``F(x)``.
"""

import keras
from keras import ops

from keras_preact.layers import options as opt


@keras.saving.register_keras_serializable(package="keras_preact")
class ResidualUnit(keras.layers.Layer):
    """A residual unit (paper Eq. 1-2, Fig. 2 and Fig. 4).

    Args:
        filters: output channels of the unit. A bottleneck's inner width is ``filters // 4``.
        strides: spatial stride of the unit.
        block: ``"basic"`` (3x3, 3x3), ``"bottleneck"`` (1x1, 3x3, 1x1) or ``"one_layer"`` (a single
            3x3: Table 3's "1-layer skip").
        ordering: where BN/activation sit, paper Table 2: ``"original"``, ``"bn_after_addition"``,
            ``"relu_before_addition"``, ``"relu_only_preact"``, ``"full_preact"`` (default, Fig. 4e).
        shortcut: shortcut design, paper Table 1: ``"identity"`` (default), ``"constant_scaling"``,
            ``"exclusive_gating"``, ``"shortcut_only_gating"``, ``"conv1x1"``, ``"dropout"``.
        shortcut_type: how a change of shape is handled: ``"A"`` strided identity with zero-padded
            channels (no parameters), ``"B"`` a 1x1 projection where the shape changes (default),
            ``"C"`` a projection on every unit.
        shortcut_scale, residual_scale: constant scaling (Fig. 2b) of h(x) and F(x);
            defaults 0.5 and 1.0. Only with ``shortcut="constant_scaling"``.
        gate_bias_init: initial bias b_g of the gate g(x) = sigmoid(1x1 conv(x) + b_g) (Fig. 2c/d);
            default -6, the paper's best. Only with the gating shortcuts.
        shortcut_dropout_rate: dropout on h(x) (Fig. 2f); default 0.5, the paper's.
        preactivate_shortcut: whether the shortcut reads the pre-activated input (pre-activation
            orderings only). ``None`` (default): where the shortcut changes shape, as the official
            code does ("projection shortcuts are also with pre-activation"). The official CIFAR
            basic net also does it for the first unit of every stage; its builder passes ``True``.
        skip_preactivation: drop the first pre-activation; for the unit right after a stem that
            already ends in BN-ReLU (fb.resnet.torch ImageNet nets).
        stride_position: ``"first"`` conv of the branch (resnet-pre-act.lua) or the ``"3x3"``
            (default; fb.resnet.torch, timm). Same for a basic block.
        output_bias: a bias on the branch's last conv and on the projection (TF-slim /
            keras.applications ResNetV2 layout); the official code has none.
        normalization: ``"batch"`` (default), ``"group"``, ``"layer"``, ``"rms"``.
        norm_epsilon, norm_momentum: 1e-5 and 0.9, PyTorch/Torch7's BN defaults (the official
            code's), not Keras' 1e-3 / 0.99. ``norm_groups``: GroupNorm groups (gcd with channels).
        activation: any Keras activation; ``"relu"`` default.
        dropout_rate: dropout before every conv of the branch but the first (as Wide ResNets).
        drop_path_rate: stochastic depth: the whole branch is dropped per sample at this rate.
        zero_init_residual: start with F(x) = 0: zero gamma of the branch's last norm, or, where no
            norm follows the last conv (full pre-activation) or the norm's scale is fixed at one
            (Keras' RMSNormalization), zero kernel of that conv (as timm).
        kernel_initializer: ``"he_normal_fan_out"`` (default; the official code's untruncated
            N(0, sqrt(2/(k*k*filters)))), ``"orthogonal"`` or any Keras initializer.
        kernel_regularizer: Keras regularizer for every conv kernel.
        data_format: ``"channels_last"`` or ``"channels_first"``; default Keras' setting.
    """

    def __init__(
        self,
        filters,
        strides=1,
        block="basic",
        ordering="full_preact",
        shortcut="identity",
        shortcut_type="B",
        shortcut_scale=None,
        residual_scale=None,
        gate_bias_init=None,
        shortcut_dropout_rate=None,
        preactivate_shortcut=None,
        skip_preactivation=False,
        stride_position="3x3",
        output_bias=False,
        normalization="batch",
        norm_epsilon=1e-5,
        norm_momentum=0.9,
        norm_groups=32,
        activation="relu",
        dropout_rate=0.0,
        drop_path_rate=0.0,
        zero_init_residual=False,
        kernel_initializer="he_normal_fan_out",
        kernel_regularizer=None,
        data_format=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(filters, int) or filters < 1:
            raise ValueError(f"Invalid filters={filters!r}: a positive integer is required.")
        if not isinstance(strides, int) or strides < 1:
            raise ValueError(f"Invalid strides={strides!r}: a positive integer is required.")
        opt.check_choice("block", block, opt.BLOCKS)
        opt.check_choice("ordering", ordering, opt.ORDERINGS)
        opt.check_choice("shortcut", shortcut, opt.SHORTCUTS)
        opt.check_choice("shortcut_type", shortcut_type, opt.SHORTCUT_TYPES)
        opt.check_choice("stride_position", stride_position, opt.STRIDE_POSITIONS)
        opt.check_choice("normalization", normalization, opt.NORMALIZATIONS)
        opt.check_choice("preactivate_shortcut", preactivate_shortcut, (None, True, False))
        kernel_sizes, divisor = opt.BLOCKS[block]
        if filters % divisor:
            raise ValueError(
                f"Invalid filters={filters} for block={block!r}: must be a multiple of {divisor}."
            )
        opt.check_rate("dropout_rate", dropout_rate)
        opt.check_rate("drop_path_rate", drop_path_rate)
        self._activation_fn = opt.get_activation(activation)

        spec = opt.SHORTCUTS[shortcut]
        given = {
            "shortcut_scale": shortcut_scale,
            "residual_scale": residual_scale,
            "gate_bias_init": gate_bias_init,
            "shortcut_dropout_rate": shortcut_dropout_rate,
        }
        allowed = dict(spec.options)
        for name, value in given.items():
            if value is not None and name not in allowed:
                raise ValueError(
                    f"{name}={value!r} is only used with shortcut="
                    + " or ".join(repr(s) for s, sp in opt.SHORTCUTS.items() if name in dict(sp.options))
                    + f", not shortcut={shortcut!r}."
                )
        resolved = {n: (given[n] if given[n] is not None else d) for n, d in allowed.items()}
        if "shortcut_dropout_rate" in resolved:
            opt.check_rate("shortcut_dropout_rate", resolved["shortcut_dropout_rate"])

        self.filters = filters
        self.strides = strides
        self.block = block
        self.ordering = ordering
        self.shortcut = shortcut
        self.shortcut_type = shortcut_type
        self.shortcut_scale = shortcut_scale
        self.residual_scale = residual_scale
        self.gate_bias_init = gate_bias_init
        self.shortcut_dropout_rate = shortcut_dropout_rate
        self.preactivate_shortcut = preactivate_shortcut
        self.skip_preactivation = bool(skip_preactivation)
        self.stride_position = stride_position
        self.output_bias = bool(output_bias)
        self.normalization = normalization
        self.norm_epsilon = norm_epsilon
        self.norm_momentum = norm_momentum
        self.norm_groups = norm_groups
        self.activation = activation
        self.dropout_rate = dropout_rate
        self.drop_path_rate = drop_path_rate
        self.zero_init_residual = bool(zero_init_residual)
        self.kernel_initializer = kernel_initializer
        self.kernel_regularizer = kernel_regularizer
        data_format = data_format or keras.config.image_data_format()
        opt.check_choice("data_format", data_format, ("channels_last", "channels_first"))
        self.data_format = data_format

        self._ordering = opt.ORDERINGS[ordering]
        self._shortcut = spec
        self._shortcut_options = resolved
        self._kernel_sizes = kernel_sizes
        self._widths = [filters // divisor] * (len(kernel_sizes) - 1) + [filters]
        self._stride_index = opt.STRIDE_POSITIONS[stride_position](kernel_sizes)
        self._channel_axis = -1 if self.data_format == "channels_last" else 1
        opt.get_kernel_initializer(kernel_initializer)  # refused here when unknown; each kernel gets its own
        self._regularizer = opt.get_regularizer(kernel_regularizer)

    # ----------------------------------------------------------------------------------- build
    def _norm(self, channels, name, zero=False):
        layer = opt.make_norm(
            self.normalization,
            channels,
            axis=self._channel_axis,
            epsilon=self.norm_epsilon,
            momentum=self.norm_momentum,
            groups=self.norm_groups,
            name=name,
            dtype=self.dtype_policy,
        )
        if zero:
            layer.gamma_initializer = keras.initializers.Zeros()
        return layer

    def _conv(self, filters, kernel_size, strides, name, use_bias=False, zero=False):
        return keras.layers.Conv2D(
            filters,
            kernel_size,
            strides=strides,
            padding="same" if strides == 1 else "valid",
            use_bias=use_bias,
            kernel_initializer=keras.initializers.Zeros() if zero else opt.get_kernel_initializer(self.kernel_initializer),
            kernel_regularizer=self._regularizer,
            data_format=self.data_format,
            name=name,
            dtype=self.dtype_policy,
        )

    def _ops(self, tokens, channels, prefix, zero_norm=False):
        """Layers for a sequence of "norm"/"act" tokens; None stands for the activation."""
        return [
            self._norm(channels, f"{prefix}_norm", zero=zero_norm) if t == "norm" else None
            for t in tokens
        ]

    def build(self, input_shape):
        in_channels = input_shape[self._channel_axis]
        if in_channels is None:
            raise ValueError("ResidualUnit needs a known number of input channels.")
        order = self._ordering
        shape_changes = self.strides != 1 or in_channels != self.filters
        self._projects = (
            self._shortcut.always_project
            or self.shortcut_type == "C"
            or (self.shortcut_type == "B" and shape_changes)
        )
        if self.shortcut_type == "A" and shape_changes and not self._projects:
            if self.filters < in_channels:
                raise ValueError(
                    f"shortcut_type='A' cannot map {in_channels} input channels to filters="
                    f"{self.filters}: zero-padding only adds channels. Use shortcut_type='B'."
                )
        if self.preactivate_shortcut is None:
            shared = shape_changes or self._projects
        else:
            shared = self.preactivate_shortcut
        self._shared_preact = shared and order.is_preactivation and not self.skip_preactivation

        n = len(self._kernel_sizes)
        last_norm_zero = (
            self.zero_init_residual
            and "norm" in order.after_last_conv
            and self.normalization in opt.NORMS_WITH_SCALE_INIT
        )
        last_conv_zero = self.zero_init_residual and not last_norm_zero
        self._pads, self._convs, self._before, self._after = [], [], [], []
        channels = in_channels
        for i, (k, width) in enumerate(zip(self._kernel_sizes, self._widths)):
            last = i == n - 1
            stride = self.strides if i == self._stride_index else 1
            skip = i == 0 and self.skip_preactivation
            self._before.append([] if skip else self._ops(order.before_conv, channels, f"preact{i + 1}"))
            pad = (k // 2) if stride > 1 and k > 1 else 0
            self._pads.append(
                keras.layers.ZeroPadding2D(pad, data_format=self.data_format, dtype=self.dtype_policy)
                if pad
                else None
            )
            self._convs.append(
                self._conv(
                    width,
                    k,
                    stride,
                    f"conv{i + 1}",
                    use_bias=self.output_bias and last,
                    zero=last and last_conv_zero,
                )
            )
            after = order.after_last_conv if last else order.after_conv
            self._after.append(self._ops(after, width, f"postact{i + 1}", zero_norm=last and last_norm_zero))
            channels = width
        self._dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy)
        self._drop_path = keras.layers.Dropout(
            self.drop_path_rate, noise_shape=(None, 1, 1, 1), dtype=self.dtype_policy
        )
        self._after_addition = self._ops(order.after_addition, self.filters, "addition")

        self._projection = self._projection_norm = self._subsample = None
        self._zero_channels = 0
        if self._projects:
            self._projection = self._conv(
                self.filters, 1, self.strides, "projection", use_bias=self.output_bias
            )
            if order.projection_norm:
                self._projection_norm = self._norm(self.filters, "projection_norm")
        elif shape_changes:  # option A
            if self.strides > 1:
                self._subsample = keras.layers.MaxPooling2D(
                    1, self.strides, data_format=self.data_format, dtype=self.dtype_policy
                )
            self._zero_channels = self.filters - in_channels
        self._gate = None
        if self._shortcut.gate != "none":
            self._gate = keras.layers.Conv2D(
                self.filters,
                1,
                strides=self.strides,
                activation="sigmoid",
                bias_initializer=keras.initializers.Constant(self._shortcut_options["gate_bias_init"]),
                kernel_initializer=opt.get_kernel_initializer(self.kernel_initializer),
                kernel_regularizer=self._regularizer,
                data_format=self.data_format,
                name="gate",
                dtype=self.dtype_policy,
            )
        self._shortcut_dropout = None
        if "shortcut_dropout_rate" in self._shortcut_options:
            self._shortcut_dropout = keras.layers.Dropout(
                self._shortcut_options["shortcut_dropout_rate"], dtype=self.dtype_policy
            )

        # Build sublayers with their input shapes so weights exist before the first call.
        spatial = list(input_shape)
        self._build_chain(spatial, in_channels)

    def _build_chain(self, input_shape, in_channels):
        def with_channels(shape, c):
            shape = list(shape)
            shape[self._channel_axis] = c
            return tuple(shape)

        shape = tuple(input_shape)
        for before, pad, conv, after in zip(self._before, self._pads, self._convs, self._after):
            for layer in before:
                if layer is not None:
                    layer.build(shape)
            if pad is not None:
                shape = pad.compute_output_shape(shape)
            conv.build(shape)
            shape = conv.compute_output_shape(shape)
            for layer in after:
                if layer is not None:
                    layer.build(shape)
        for layer in self._after_addition:
            if layer is not None:
                layer.build(shape)
        if self._projection is not None:
            self._projection.build(tuple(input_shape))
            if self._projection_norm is not None:
                self._projection_norm.build(self._projection.compute_output_shape(tuple(input_shape)))
        if self._gate is not None:
            self._gate.build(tuple(input_shape))

    def get_sublayer(self, name):
        """The sublayer called ``name`` ("conv1", "preact1_norm", "postact2_norm", "projection",
        "projection_norm", "addition_norm", "gate"), e.g. to load converted weights."""
        layers = [layer for group in self._before + [self._convs] + self._after for layer in group]
        layers += [self._projection, self._projection_norm, self._gate] + self._after_addition
        for layer in layers:
            if layer is not None and layer.name == name:
                return layer
        raise KeyError(f"{self.name} has no sublayer {name!r}.")

    # ------------------------------------------------------------------------------------ call
    def _apply(self, layers, x, training):
        for layer in layers:
            x = self._activation_fn(x) if layer is None else layer(x, training=training)
        return x

    def call(self, inputs, training=None):
        x = inputs
        branch = x
        if self._shared_preact:
            x = branch = self._apply(self._before[0], x, training)
        for i, (before, pad, conv, after) in enumerate(
            zip(self._before, self._pads, self._convs, self._after)
        ):
            if not (i == 0 and self._shared_preact):
                branch = self._apply(before, branch, training)
            if i > 0 and self.dropout_rate:
                branch = self._dropout(branch, training=training)
            if pad is not None:
                branch = pad(branch)
            branch = conv(branch)
            branch = self._apply(after, branch, training)

        shortcut = x
        if self._projection is not None:
            shortcut = self._projection(shortcut)
            if self._projection_norm is not None:
                shortcut = self._projection_norm(shortcut, training=training)
        else:
            if self._subsample is not None:
                shortcut = self._subsample(shortcut)
            if self._zero_channels:
                pad = [[0, 0]] * 4
                pad[self._channel_axis] = [0, self._zero_channels]
                shortcut = ops.pad(shortcut, pad)

        if self._shortcut_dropout is not None:
            shortcut = self._shortcut_dropout(shortcut, training=training)
        if self.drop_path_rate:
            branch = self._drop_path(branch, training=training)
        if self._gate is not None:
            gate = self._gate(x)
            shortcut = (1.0 - gate) * shortcut
            if self._shortcut.gate == "exclusive":
                branch = gate * branch
        if "shortcut_scale" in self._shortcut_options:
            shortcut = shortcut * self._shortcut_options["shortcut_scale"]
            branch = branch * self._shortcut_options["residual_scale"]
        return self._apply(self._after_addition, shortcut + branch, training)

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        spatial = [1, 2] if self.data_format == "channels_last" else [2, 3]
        for a in spatial:
            if shape[a] is not None:
                shape[a] = (shape[a] - 1) // self.strides + 1
        shape[self._channel_axis] = self.filters
        return tuple(shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "filters": self.filters,
                "strides": self.strides,
                "block": self.block,
                "ordering": self.ordering,
                "shortcut": self.shortcut,
                "shortcut_type": self.shortcut_type,
                "shortcut_scale": self.shortcut_scale,
                "residual_scale": self.residual_scale,
                "gate_bias_init": self.gate_bias_init,
                "shortcut_dropout_rate": self.shortcut_dropout_rate,
                "preactivate_shortcut": self.preactivate_shortcut,
                "skip_preactivation": self.skip_preactivation,
                "stride_position": self.stride_position,
                "output_bias": self.output_bias,
                "normalization": self.normalization,
                "norm_epsilon": self.norm_epsilon,
                "norm_momentum": self.norm_momentum,
                "norm_groups": self.norm_groups,
                "activation": opt.serialize(self.activation),
                "dropout_rate": self.dropout_rate,
                "drop_path_rate": self.drop_path_rate,
                "zero_init_residual": self.zero_init_residual,
                "kernel_initializer": opt.serialize(self.kernel_initializer),
                "kernel_regularizer": opt.serialize(self.kernel_regularizer),
                "data_format": self.data_format,
            }
        )
        return config
