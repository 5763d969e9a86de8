"""``ResidualUnit``: one Keras layer for every residual unit of He et al. 2016 (ECCV).

``y = s(h(x)) + r(F(x))`` and ``x_next = f(y)`` (paper Eq. 1-2), where the ordering (Table 2,
Fig. 4) says where normalization and activation sit and the shortcut design (Table 1, Fig. 2) says
what multiplies ``h(x)`` and ``F(x)``. The options are ``UnitConfig``'s; ``build`` compiles them, through
the tables of ``options.py``, into a ``UnitPlan`` of ``Step`` records that ``call`` runs in order.
"""

import dataclasses
import functools

import keras
from keras import ops

from keras_preact.layers import convolution, unit_kernels
from keras_preact.layers import options as opt
from keras_preact.layers.convolution import Conv2D
from keras_preact.layers.unit_config import UnitConfig


@dataclasses.dataclass(frozen=True)
class Step:
    """One operation of a unit.

    ``kind``: ``"norm"``, ``"act"``, ``"dropout"``, ``"pad"``, ``"conv"`` (branch), ``"projection"``,
    ``"subsample"``, ``"zero_channels"`` (shortcut), ``"shortcut_dropout"``, ``"drop_path"``, ``"scale"``.
    ``place``: ``"before"`` / ``"after"`` (the norm and activation before / after branch conv ``conv``),
    ``"branch"`` (the dropout, pad and conv of branch conv ``conv``; with ``conv`` None, on F as a
    whole), ``"shortcut"``, ``"addition"``. ``conv``: 0-based, input side first. ``op``: a Keras layer,
    or a function of the tensor (the activation, option A's zero channels, a constant scaling).

    Examples:
        A full pre-activation basic unit (Fig. 4e): BN and ReLU before each 3x3 conv.

        >>> import keras
        >>> from keras_preact.layers import ResidualUnit
        >>> unit = ResidualUnit(16)
        >>> _ = unit(keras.ops.zeros((1, 4, 4, 16)))
        >>> [(step.kind, step.place, step.conv) for step in unit.steps()]  # doctest: +NORMALIZE_WHITESPACE
        [('norm', 'before', 0), ('act', 'before', 0), ('conv', 'branch', 0),
         ('norm', 'before', 1), ('act', 'before', 1), ('conv', 'branch', 1)]
    """

    kind: str
    place: str
    conv: int
    op: object

    def __call__(self, x, training=None):
        if isinstance(self.op, keras.layers.Layer):
            return self.op(x, training=training)
        return self.op(x)


@dataclasses.dataclass(frozen=True)
class UnitPlan:
    """A built unit: x = ``preactivation``(input), shared by both paths (the official code's
    "projection shortcuts are also with pre-activation"); F = ``branch``(x); h = ``shortcut``(x); a
    gating shortcut's g(x) combines them (``opt.GATES[gate_kind]``, Fig. 2c/d); the output is
    ``addition``(h + F).

    Examples:
        Where the shape changes, the pre-activation is shared and the shortcut is a projection (type B).

        >>> import keras
        >>> from keras_preact.layers import ResidualUnit
        >>> unit = ResidualUnit(32, strides=2)
        >>> _ = unit(keras.ops.zeros((1, 8, 8, 16)))
        >>> plan = unit.plan()
        >>> [s.kind for s in plan.preactivation], [s.kind for s in plan.branch], [s.kind for s in plan.shortcut]
        (['norm', 'act'], ['pad', 'conv', 'norm', 'act', 'conv'], ['projection'])
    """

    preactivation: tuple
    branch: tuple
    shortcut: tuple
    addition: tuple
    gate: keras.layers.Layer = None
    gate_kind: str = "none"

    def steps(self):
        return self.preactivation + self.branch + self.shortcut + self.addition


def _run(steps, x, training):
    """The steps in order; where the backend's convolution takes zero padding inside its kernel
    (``convolution.folds_padding``), a strided conv's ``pad`` step is left to the conv (no padded copy)."""
    fold, padding = convolution.folds_padding(), None
    for i, step in enumerate(steps):
        if fold and step.kind == "pad" and i + 1 < len(steps) and isinstance(steps[i + 1].op, Conv2D):
            padding = step.op.padding
        elif padding is not None:
            x, padding = step.op(x, training=training, input_padding=padding), None
        else:
            x = step(x, training)
    return x


def _subsample(x, strides, channel_axis):
    """Option A's strided identity: every ``strides``-th row and column (original ResNet paper, Sec. 3.3)."""
    every = slice(None, None, strides)
    return x[:, :, every, every] if channel_axis == 1 else x[:, every, every, :]


def _zero_channels(x, channels, axis):
    """Option A's shortcut: ``channels`` zero channels appended (original ResNet paper, Sec. 3.3)."""
    pad = [[0, 0]] * 4
    pad[axis] = [0, channels]
    return ops.pad(x, pad)


def _scale(x, factor):
    return x * factor


def _build_steps(steps, shape):
    """Build the steps' layers in sequence from ``shape`` (weights exist before the first call)."""
    for step in steps:
        if isinstance(step.op, keras.layers.Layer):
            if not step.op.built:
                step.op.build(shape)
            shape = step.op.compute_output_shape(shape)
    return shape


@keras.saving.register_keras_serializable(package="keras_preact")
class ResidualUnit(keras.layers.Layer):
    """A residual unit (paper Eq. 1-2, Fig. 2 and Fig. 4).

    Args:
        filters: output channels of the unit (a bottleneck's inner width is ``filters // 4``).
        strides: spatial stride of the unit.
        options: block, ordering, shortcut, shortcut_type, shortcut_scale, residual_scale, gate_bias_init,
            shortcut_dropout_rate, preactivate_shortcut, skip_preactivation, stride_position, output_bias,
            normalization, norm_epsilon, norm_momentum, norm_groups, convolution, activation, dropout_rate,
            drop_path_rate, zero_init_residual, kernel_initializer, kernel_regularizer: the unit's design, keyword-only;
            their meaning and validation are ``UnitConfig``'s (same names, same defaults). They are kept, validated,
            as ``unit.options`` (a frozen ``UnitConfig``): ``unit.options.ordering``.
        data_format: ``"channels_last"`` or ``"channels_first"``; default Keras' setting.
        **kwargs: Keras' layer arguments (``name``, ``dtype``, ...).

    ``build`` turns the options, through the tables of ``options.py``, into a ``UnitPlan`` of ``Step``
    records (pre-activation, branch, shortcut, addition); ``call`` runs them (on PyTorch, where they apply, as
    direct kernel calls: ``unit_kernels``, the same numbers). Once built, the sublayers are
    reached through the plan: ``convs()``, ``norm(place, conv)``, ``projection()``, ``gate()``,
    ``steps(kind, place)``, ``plan()``.

    Saved weights (``.weights.h5``, ``.keras``): every sublayer is kept, in the order ``build`` makes it, in
    one list, ``_sublayers``; a file addresses a sublayer's weights by its class and its rank among that
    class in the list (``residual_unit/_sublayers/conv2d_1/vars/0``: the second convolution made). The
    layout is pinned by ``tests/test_weights_layout.py``.

    Examples:
        >>> import keras
        >>> from keras_preact.layers import ResidualUnit
        >>> unit = ResidualUnit(64, strides=2, block="bottleneck")  # full pre-activation (Fig. 4e)
        >>> tuple(unit(keras.ops.zeros((2, 8, 8, 32))).shape)
        (2, 4, 4, 64)
        >>> [tuple(conv.kernel.shape) for conv in unit.convs()]  # 1x1, 3x3 (the stride), 1x1
        [(1, 1, 32, 16), (3, 3, 16, 16), (1, 1, 16, 64)]
        >>> tuple(unit.projection().kernel.shape)  # the shape changes: a 1x1 projection shortcut (type B)
        (1, 1, 32, 64)

        The original unit (Fig. 4a) puts a ReLU after the addition; Table 1's shortcuts scale or gate h(x):

        >>> original = ResidualUnit(32, ordering="original", shortcut="exclusive_gating", gate_bias_init=-6.0)
        >>> _ = original(keras.ops.zeros((1, 8, 8, 32)))
        >>> [step.kind for step in original.steps(place="addition")], tuple(original.gate().kernel.shape)
        (['act'], (1, 1, 32, 32))
    """

    def __init__(
        self,
        filters,
        strides=1,
        *,
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
        convolution="standard",
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
        self.options = UnitConfig(
            block=block, ordering=ordering, shortcut=shortcut, shortcut_type=shortcut_type,
            shortcut_scale=shortcut_scale, residual_scale=residual_scale, gate_bias_init=gate_bias_init,
            shortcut_dropout_rate=shortcut_dropout_rate, preactivate_shortcut=preactivate_shortcut,
            skip_preactivation=skip_preactivation, stride_position=stride_position, output_bias=output_bias,
            normalization=normalization, norm_epsilon=norm_epsilon, norm_momentum=norm_momentum,
            norm_groups=norm_groups, convolution=convolution, activation=activation, dropout_rate=dropout_rate,
            drop_path_rate=drop_path_rate, zero_init_residual=zero_init_residual,
            kernel_initializer=kernel_initializer, kernel_regularizer=kernel_regularizer,
        )
        if filters % self.options.width_divisor:
            raise ValueError(f"Invalid filters={filters} for block={self.options.block!r}: must be a multiple "
                             f"of {self.options.width_divisor}.")
        data_format = data_format or keras.config.image_data_format()
        opt.check_choice("data_format", data_format, ("channels_last", "channels_first"))
        self.filters, self.strides, self.data_format = filters, strides, data_format
        self._channel_axis = -1 if data_format == "channels_last" else 1
        self._activation_fn = opt.get_activation(self.options.activation)
        self._regularizer = opt.get_regularizer(self.options.kernel_regularizer)
        self._plan = None
        self._fast = None  # the plan as direct PyTorch calls (unit_kernels), where they apply

    # ----------------------------------------------------------------------------------- build
    def _track(self, layer):
        """Keep a sublayer as it is made, in ``_sublayers`` (see the class docstring: the saved layout)."""
        self._sublayers.append(layer)
        return layer

    def _norm(self, channels, name, zero=False):
        return self._track(self.options.norm(channels, axis=self._channel_axis, name=name, dtype=self.dtype_policy,
                                             zero=zero))

    def _conv(self, filters, kernel_size, strides, name, use_bias=False, zero=False):
        return self._track(self.options.conv(filters, kernel_size, strides, name=name, data_format=self.data_format,
                                             regularizer=self._regularizer, dtype=self.dtype_policy,
                                             use_bias=use_bias, zero=zero))

    def _token_steps(self, tokens, channels, place, conv, prefix, zero_norm=False):
        """An ordering's "norm"/"act" tokens as steps."""
        make = {
            "norm": lambda: self._norm(channels, f"{prefix}_norm", zero=zero_norm),
            "act": lambda: self._activation_fn,
        }
        return [Step(token, place, conv, make[token]()) for token in tokens]

    def _branch_steps(self, in_channels):
        """F, per conv (Fig. 4): (its "before" steps, then its pad, conv and "after" steps)."""
        o, order = self.options, self.options.ordering_spec
        kernels, widths = o.kernel_sizes, o.widths(self.filters)
        last_norm_zero = (o.zero_init_residual and "norm" in order.after_last_conv
                          and o.normalization in opt.NORMS_WITH_SCALE_INIT)
        per_conv, channels = [], in_channels
        for i, (k, width) in enumerate(zip(kernels, widths)):
            last, stride = i == len(kernels) - 1, (self.strides if i == o.stride_index else 1)
            skip = i == 0 and o.skip_preactivation
            before = [] if skip else self._token_steps(order.before_conv, channels, "before", i, f"preact{i + 1}")
            rest = []
            if stride > 1 and k > 1:
                pad = keras.layers.ZeroPadding2D(k // 2, data_format=self.data_format, dtype=self.dtype_policy)
                rest.append(Step("pad", "branch", i, self._track(pad)))
            zero_conv = last and o.zero_init_residual and not last_norm_zero
            conv = self._conv(width, k, stride, f"conv{i + 1}", use_bias=o.output_bias and last, zero=zero_conv)
            rest.append(Step("conv", "branch", i, conv))
            after = order.after_last_conv if last else order.after_conv
            rest += self._token_steps(after, width, "after", i, f"postact{i + 1}", zero_norm=last and last_norm_zero)
            per_conv.append((before, rest))
            channels = width
        return per_conv

    def _shortcut_steps(self, in_channels, shape_changes, projects):
        """h(x): a projection (and its norm where the ordering has one), option A, or the identity."""
        o = self.options
        if projects:
            projection = self._conv(self.filters, 1, self.strides, "projection", use_bias=o.output_bias)
            steps = [Step("projection", "shortcut", None, projection)]
            if o.ordering_spec.projection_norm:
                steps.append(Step("norm", "shortcut", None, self._norm(self.filters, "projection_norm")))
            return steps
        steps = []
        if shape_changes and self.strides > 1:
            subsample = functools.partial(_subsample, strides=self.strides, channel_axis=self._channel_axis)
            steps.append(Step("subsample", "shortcut", None, subsample))
        if shape_changes and self.filters > in_channels:
            zeros = functools.partial(_zero_channels, channels=self.filters - in_channels, axis=self._channel_axis)
            steps.append(Step("zero_channels", "shortcut", None, zeros))
        return steps

    def _gate_layer(self):
        """g(x) = sigmoid(1x1 conv(x) + b_g) of the gating shortcuts (Fig. 2c/d), or None."""
        o = self.options
        if o.shortcut_spec.gate not in opt.GATES:
            return None
        return self._track(Conv2D(
            self.filters, 1, strides=self.strides, activation="sigmoid",
            bias_initializer=keras.initializers.Constant(o.shortcut_options["gate_bias_init"]),
            kernel_initializer=opt.get_kernel_initializer(o.kernel_initializer), kernel_regularizer=self._regularizer,
            data_format=self.data_format, name="gate", dtype=self.dtype_policy,
        ))

    def _check_shapes(self, in_channels):
        """(shape changes, projects), refusing what option A cannot do."""
        o = self.options
        shape_changes = self.strides != 1 or in_channels != self.filters
        projects = (
            o.shortcut_spec.always_project or o.shortcut_type == "C" or (o.shortcut_type == "B" and shape_changes)
        )
        if o.shortcut_type == "A" and shape_changes and not projects and self.filters < in_channels:
            raise ValueError(f"shortcut_type='A' cannot map {in_channels} input channels to filters={self.filters}: "
                             "zero-padding only adds channels. Use shortcut_type='B'.")
        return shape_changes, projects

    def build(self, input_shape):
        in_channels = input_shape[self._channel_axis]
        if in_channels is None:
            raise ValueError("ResidualUnit needs a known number of input channels.")
        o, order = self.options, self.options.ordering_spec
        shape_changes, projects = self._check_shapes(in_channels)
        # The sublayers are made in this order, which is the order of ``weights``, of the keys of a saved
        # file and of the initializers' random draws (pinned by tests/test_weights_layout.py).
        self._sublayers = []

        # 1. The branch F, conv by conv (Fig. 4): the ordering's "before" ops, a pad, the conv, its "after" ops.
        per_conv = self._branch_steps(in_channels)
        # 2. Dropout before every conv but the first, and drop path on the whole of F.
        dropout = self._track(keras.layers.Dropout(o.dropout_rate, dtype=self.dtype_policy))
        drop_path = self._track(keras.layers.Dropout(o.drop_path_rate, noise_shape=(None, 1, 1, 1),
                                                     dtype=self.dtype_policy))
        # 3. What follows the addition h + F.
        addition = self._token_steps(order.after_addition, self.filters, "addition", None, "addition")
        # 4. The shortcut h: a projection, option A's subsampling and zero channels, or the identity;
        #    then a gate g (Fig. 2c/d), a dropout (Fig. 2f) or a constant scaling (Fig. 2b) from Table 1.
        shortcut = self._shortcut_steps(in_channels, shape_changes, projects)
        gate = self._gate_layer()
        shortcut_options = o.shortcut_options
        if "shortcut_dropout_rate" in shortcut_options:
            layer = self._track(
                keras.layers.Dropout(shortcut_options["shortcut_dropout_rate"], dtype=self.dtype_policy)
            )
            shortcut.append(Step("shortcut_dropout", "shortcut", None, layer))

        branch = []
        for i, (before, rest) in enumerate(per_conv):
            dropped = [Step("dropout", "branch", i, dropout)] if i and o.dropout_rate else []
            branch += before + dropped + rest
        if o.drop_path_rate:
            branch.append(Step("drop_path", "branch", None, drop_path))
        if "shortcut_scale" in shortcut_options:
            shortcut_scale = functools.partial(_scale, factor=shortcut_options["shortcut_scale"])
            residual_scale = functools.partial(_scale, factor=shortcut_options["residual_scale"])
            shortcut.append(Step("scale", "shortcut", None, shortcut_scale))
            branch.append(Step("scale", "branch", None, residual_scale))

        # 5. A pre-activation shared by both paths: the first conv's "before" ops, moved out of F.
        shared = (shape_changes or projects) if o.preactivate_shortcut is None else o.preactivate_shortcut
        shared = shared and order.is_preactivation and not o.skip_preactivation
        preactivation = per_conv[0][0] if shared else []
        self._plan = UnitPlan(
            preactivation=tuple(preactivation), branch=tuple(branch[len(preactivation):]), shortcut=tuple(shortcut),
            addition=tuple(addition), gate=gate, gate_kind=o.shortcut_spec.gate,
        )
        shape = _build_steps(self._plan.preactivation, tuple(input_shape))
        _build_steps(self._plan.addition, _build_steps(self._plan.branch, shape))
        _build_steps(self._plan.shortcut, shape)
        if gate is not None:
            gate.build(shape)
        if not self.trainable:  # made frozen (``trainable=False``, a frozen model's config): so are its sublayers
            for layer in self._sublayers:
                layer.trainable = False
        self._fast = unit_kernels.fast_plan(self._plan, self.dtype_policy)

    # ------------------------------------------------------------------------------------ call
    def call(self, inputs, training=None):
        plan, steps, run = self._plan, self._plan, _run
        if self._fast is not None and self._fast.accepts(inputs):  # PyTorch: the steps' kernels, called directly
            steps, run = self._fast, unit_kernels.run
        x = run(steps.preactivation, inputs, training)
        branch = run(steps.branch, x, training)
        shortcut = run(steps.shortcut, x, training)
        if plan.gate is not None:
            shortcut, branch = opt.GATES[plan.gate_kind](plan.gate(x), shortcut, branch)
        return run(steps.addition, shortcut + branch, training)

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        for axis in ([1, 2] if self.data_format == "channels_last" else [2, 3]):
            if shape[axis] is not None:
                shape[axis] = (shape[axis] - 1) // self.strides + 1
        shape[self._channel_axis] = self.filters
        return tuple(shape)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "strides": self.strides,
                "data_format": self.data_format, **self.options.to_config()}

    # ------------------------------------------------------------------- the plan, by role
    def plan(self):
        """The built unit's ``UnitPlan``."""
        if self._plan is None:
            raise ValueError(f"{self.name} is not built yet: call it on an input or build() it first.")
        return self._plan

    def steps(self, kind=None, place=None):
        """The built unit's ``Step`` records in the order they run (of one ``kind`` / ``place``)."""
        return tuple(s for s in self.plan().steps() if kind in (None, s.kind) and place in (None, s.place))

    def convs(self):
        """The branch's convolutions, input side first."""
        return tuple(s.op for s in self.steps("conv"))

    def norm(self, place, conv=None):
        """The norm at ``place``: "before" / "after" branch conv ``conv`` (0-based), "shortcut" (after
        the projection) or "addition"; None where the ordering has none."""
        return next((s.op for s in self.steps("norm", place) if s.conv == conv), None)

    def projection(self):
        """The shortcut's 1x1 projection, or None."""
        return next((s.op for s in self.steps("projection")), None)

    def gate(self):
        """The gating shortcuts' 1x1 conv g(x) (Fig. 2c/d), or None."""
        return self.plan().gate

    @property
    def kernel_plan(self):
        """The built unit's steps as direct PyTorch kernel calls (``unit_kernels.FastPlan``), or None where it
        runs its layers: another backend, mixed precision, ``KERAS_PREACT_FAST_PATH`` below 2 when it was built
        (``fused.fast_path_level``), or not built yet."""
        return self._fast
