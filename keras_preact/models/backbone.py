"""``PreActResNetBackbone``: the headless network (stem, stages of residual units, final ops).

keras-hub's convention: a functional model whose constructor arguments are its config, exposing
``pyramid_outputs`` (``"P{n}"``: the output of the last stage at stride 2^n, taken before the
ordering's final BN-ReLU as keras-hub's ResNetBackbone and timm do) and ``feature_info`` (timm's
``features_only`` description). Classifiers, analysis and conversion read stages from these, never
from layer names.
"""

import dataclasses
import math

import keras

from keras_preact.layers import ResidualUnit, UnitConfig, unit_kernels
from keras_preact.layers import options as opt
from keras_preact.layers.padding import EdgePadding2D
from keras_preact.models import remat as remat_lib

UNIT_OPTIONS = UnitConfig.names()
DATA_FORMATS = ("channels_last", "channels_first")


@dataclasses.dataclass(frozen=True)
class Stem:
    """The layers before the first unit: a ``kernel_size``/``strides`` conv (with symmetric explicit
    padding where ``explicit_padding``, as Torch and TF-slim pad), then optionally a 3x3/2 max-pool whose
    one pixel of padding is zeros or, with ``pool_padding="edge"``, the border repeated (PyTorch's -inf
    padding, for a stem whose output can be negative)."""

    kernel_size: int
    strides: int
    explicit_padding: bool
    max_pool: bool
    pool_padding: str = "zeros"

    @property
    def total_stride(self):
        return self.strides * (2 if self.max_pool else 1)


STEMS = {
    "cifar": Stem(3, 1, False, False),  # fb.resnet.torch preresnet.lua, CIFAR: 3x3 conv
    "imagenet": Stem(7, 2, True, True),  # 7x7/2 conv, 3x3/2 max-pool
    # timm's pre-activation ResNetV2 and keras-hub's ResNetV2: the max-pool pads with -inf (no BN-ReLU before it).
    "imagenet_edge_pool": Stem(7, 2, True, True, pool_padding="edge"),
}
# What follows the stem conv: the ordering's ``after_stem`` ops (None), or always BN-ReLU (fb.resnet.torch's
# ImageNet stem, whatever the unit ordering).
STEM_OPS = {"ordering": None, "norm_act": opt.NA}


def check_unit_options(unit_options):
    """The ``UnitConfig`` of ``unit_options``: every option checked up front, unknown names refused."""
    return UnitConfig.from_options(unit_options)


def check_data_format(data_format):
    data_format = data_format or keras.config.image_data_format()
    opt.check_choice("data_format", data_format, DATA_FORMATS)
    return data_format


def check_input_shape(input_shape, total_stride, data_format="channels_last", argument="input_shape"):
    layout = "(height, width, channels)" if data_format == "channels_last" else "(channels, height, width)"
    if input_shape is None or len(input_shape) != 3:
        raise ValueError(f"Invalid {argument}={input_shape!r}: expected {layout} ({data_format}).")
    spatial = input_shape[:2] if data_format == "channels_last" else input_shape[1:]
    channels = input_shape[2] if data_format == "channels_last" else input_shape[0]
    if channels is None:
        raise ValueError(f"Invalid {argument}={tuple(input_shape)}: the channel count {layout} must be known.")
    for size in spatial:
        if size is not None and size < total_stride:
            raise ValueError(
                f"Invalid {argument}={tuple(input_shape)}: height and width must be at least "
                f"{total_stride}, the network's total stride."
            )


def _image_shape_argument(input_shape, image_shape):
    """``input_shape``, or keras-hub's vision backbones' name for it, ``image_shape``: one of them given."""
    if image_shape is None:
        return input_shape
    if input_shape != (None, None, 3) and tuple(input_shape) != tuple(image_shape):
        raise ValueError(f"Invalid image_shape={tuple(image_shape)!r} with input_shape={tuple(input_shape)!r}: "
                         "they name one argument (image_shape is keras-hub's name); give one.")
    return image_shape


def check_model_kwargs(model, kwargs):
    """Keras' own keyword arguments a model accepts beyond its signature (``trainable``, from configs);
    anything else, a typo included, is refused by name."""
    unknown = sorted(set(kwargs) - {"trainable"})
    if unknown:
        raise TypeError(f"{model} got unexpected keyword argument(s) {', '.join(unknown)}: its arguments are "
                        "listed in its docstring (and dtype, name, trainable).")


def _positive_ints(argument, values):
    if not isinstance(values, (list, tuple)) or not values or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values
    ):
        raise ValueError(f"Invalid {argument}={values!r}: a non-empty list of positive integers is required.")
    return list(values)


def apply_ops(x, tokens, unit_config, name, axis, dtype=None):
    """An ordering's "norm"/"act" tokens applied as layers (stem and network end), as the units make theirs."""
    make = {
        "norm": lambda x: unit_config.norm(x.shape[axis], axis=axis, name=f"{name}_norm", dtype=dtype),
        "act": lambda x: unit_config.activation_layer(name=f"{name}_act", dtype=dtype),
    }
    for token in tokens:
        x = make[token](x)(x)
    return x


def unit_name(stage_index, unit_index):
    return f"stage{stage_index + 1}_unit{unit_index + 1}"


def _check_stages(stackwise_units, stackwise_filters, stackwise_strides):
    units = _positive_ints("stackwise_units", stackwise_units)
    filters = _positive_ints("stackwise_filters", stackwise_filters)
    strides = _positive_ints("stackwise_strides", stackwise_strides)
    if not len(units) == len(filters) == len(strides):
        raise ValueError(
            f"Invalid stackwise_units={units}, stackwise_filters={filters}, stackwise_strides={strides}: "
            "one value per stage is required in each."
        )
    return units, filters, strides


def _check_overrides(unit_overrides, unit_options, units):
    """``unit_overrides`` as dicts, each naming a unit and valid over ``unit_options``."""
    unit_overrides = {k: dict(v) for k, v in (unit_overrides or {}).items()}
    names = [unit_name(s, u) for s, n in enumerate(units) for u in range(n)]
    unknown = sorted(set(unit_overrides) - set(names))
    if unknown:
        raise ValueError(
            f"Invalid unit_overrides: no unit named {', '.join(unknown)} (units are stage1_unit1 ...)."
        )
    for overrides in unit_overrides.values():
        check_unit_options({**unit_options, **overrides})
    return unit_overrides


def _stem(x, spec, unit_config, *, filters, bias, ops, axis, data_format, dtype):
    """The stem conv (``spec``), its ``ops`` (norm/act made from ``unit_config``), the max-pool."""
    if spec.explicit_padding:
        x = keras.layers.ZeroPadding2D(spec.kernel_size // 2, data_format=data_format, name="stem_pad", dtype=dtype)(x)
    x = opt.CONVOLUTIONS[unit_config.convolution](
        filters=filters,
        kernel_size=spec.kernel_size,
        strides=spec.strides,
        padding="valid" if spec.explicit_padding else "same",
        use_bias=bias,
        kernel_initializer=opt.get_kernel_initializer(unit_config.kernel_initializer),
        kernel_regularizer=opt.get_regularizer(unit_config.kernel_regularizer),
        data_format=data_format,
        name="stem_conv",
        dtype=dtype,
    )(x)
    x = apply_ops(x, ops, unit_config, "stem", axis, dtype)
    if spec.max_pool:
        pad = EdgePadding2D if spec.pool_padding == "edge" else keras.layers.ZeroPadding2D
        x = pad(1, data_format=data_format, name="stem_pool_pad", dtype=dtype)(x)
        x = keras.layers.MaxPooling2D(3, strides=2, data_format=data_format, name="stem_pool", dtype=dtype)(x)
    return x


def _stages(x, units, filters, strides, *, stride, stride_on_last_unit, unit_options, unit_overrides,
            drop_path_rate, data_format, dtype):
    """The residual units, stage by stage: (each stage's output, feature_info, each stage's unit names)."""
    stage_outputs, feature_info, stage_unit_names = [], [], []
    index, total = 0, sum(units)
    for s, (n, width, stage_stride) in enumerate(zip(units, filters, strides)):
        stride_unit = n - 1 if stride_on_last_unit else 0
        stage_names = []
        for u in range(n):
            options = {**unit_options, **unit_overrides.get(unit_name(s, u), {})}
            if drop_path_rate:
                options["drop_path_rate"] = drop_path_rate * index / max(total - 1, 1)
            x = ResidualUnit(
                width,
                strides=stage_stride if u == stride_unit else 1,
                data_format=data_format,
                name=unit_name(s, u),
                dtype=dtype,
                **options,
            )(x)
            stage_names.append(unit_name(s, u))
            index += 1
        stride *= stage_stride
        stage_outputs.append(x)
        stage_unit_names.append(stage_names)
        feature_info.append(
            {"stage": f"stage{s + 1}", "layer": stage_names[-1], "channels": width, "stride": stride,
             "level": f"P{int(math.log2(stride))}" if stride & (stride - 1) == 0 else None}
        )
    return stage_outputs, feature_info, stage_unit_names


def linear_chain(model):
    """The layers of a functional ``model`` whose graph is one chain, input side first (a backbone's:
    stem, units, final ops; each unit's branch and shortcut are inside its layer)."""
    chain = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    previous = model.inputs[0]
    for layer in chain:
        nodes = layer._inbound_nodes
        if len(nodes) != 1 or [id(t) for t in nodes[0].input_tensors] != [id(previous)]:
            raise ValueError(f"{model.name} is not a chain of layers at {layer.name}.")
        previous = nodes[0].output_tensors[0]
    return chain


@keras.saving.register_keras_serializable(package="keras_preact")
class PreActResNetBackbone(keras.Model):
    """Images -> features after the last unit and the ordering's final ops (paper Fig. 4; for
    pre-activation, the extra BN-ReLU of Sec. 4.1).

    Args:
        stackwise_units, stackwise_filters, stackwise_strides: per stage, the number of residual
            units, their output channels and the stage's stride (on the first unit, or on the last
            with ``stride_on_last_unit``).
        stem: ``"cifar"`` (3x3 conv), ``"imagenet"`` (7x7/2 conv, 3x3/2 max-pool) or ``"imagenet_edge_pool"``
            (the same, the pool padded as PyTorch's -inf: timm's ResNetV2); ``stem_filters``
            output channels, ``stem_bias`` a conv bias, ``stem_ops`` what follows the conv:
            ``"ordering"`` (the ordering's ``after_stem``) or ``"norm_act"`` (always BN-ReLU).
        unit_options: ``ResidualUnit`` arguments shared by every unit (block, ordering, shortcut, ...).
        unit_overrides: ``{"stage{s}_unit{u}": {argument: value}}`` for single units (the official
            code's first-unit rules, TF-slim's strided identity).
        drop_path_rate: stochastic depth, growing linearly to this rate over the units (Huang et al.).
        input_shape: image shape in ``data_format`` order; height and width may be ``None``.
        image_shape: keras-hub's name for ``input_shape`` (its vision backbones'), accepted as well; give one.
        data_format: ``"channels_last"`` or ``"channels_first"``; default Keras' setting.
        dtype: dtype policy of every layer (e.g. ``"mixed_bfloat16"``), as keras-hub backbones take
            it; default Keras' global policy.
        remat: rematerialisation of the residual units in training (``remat.REMAT_POLICIES``):
            ``None`` (store every activation), ``"units"`` (each unit recomputed from its input),
            ``"stages"`` (each stage from its input) or ``"segments:<k>"`` (runs of k consecutive
            units). Same loss, gradients and weights; less memory, more compute. Not part of the
            model's math: inference and export run without it.

    Examples:
        >>> from keras_preact.models import PreActResNetBackbone
        >>> backbone = PreActResNetBackbone([2, 2, 2], [16, 32, 64], [1, 2, 2], input_shape=(32, 32, 3),
        ...                                 unit_options={"ordering": "full_preact"}, remat="units")
        >>> {level: tensor.shape for level, tensor in backbone.pyramid_outputs.items()}
        {'P0': (None, 32, 32, 16), 'P1': (None, 16, 16, 32), 'P2': (None, 8, 8, 64)}
        >>> backbone.output_shape  # after the last unit's ordering's final BN-ReLU (Sec. 4.1)
        (None, 8, 8, 64)
    """

    # keras-hub's Backbone attribute: a text backbone's token embedding layer, None for an image backbone.
    token_embedding = None

    def __init__(
        self,
        stackwise_units,
        stackwise_filters,
        stackwise_strides,
        *,
        stem="cifar",
        stem_filters=16,
        stem_bias=False,
        stem_ops="ordering",
        stride_on_last_unit=False,
        unit_options=None,
        unit_overrides=None,
        drop_path_rate=0.0,
        input_shape=(None, None, 3),
        data_format=None,
        dtype=None,
        remat=None,
        name=None,
        **kwargs,
    ):
        input_shape = _image_shape_argument(input_shape, kwargs.pop("image_shape", None))
        check_model_kwargs(type(self).__name__, kwargs)
        remat_lib.parse_remat(remat)
        units, filters, strides = _check_stages(stackwise_units, stackwise_filters, stackwise_strides)
        opt.check_choice("stem", stem, STEMS)
        opt.check_choice("stem_ops", stem_ops, STEM_OPS)
        _positive_ints("stem_filters", [stem_filters])
        unit_options = dict(unit_options or {})
        unit_config = check_unit_options(unit_options)
        unit_overrides = _check_overrides(unit_overrides, unit_options, units)
        opt.check_rate("drop_path_rate", drop_path_rate)
        data_format = check_data_format(data_format)
        stem_spec = STEMS[stem]
        check_input_shape(input_shape, stem_spec.total_stride * math.prod(strides), data_format)
        axis = -1 if data_format == "channels_last" else 1

        inputs = keras.Input(shape=tuple(input_shape), name="images")
        ops = STEM_OPS[stem_ops] or unit_config.ordering_spec.after_stem
        x = _stem(inputs, stem_spec, unit_config, filters=stem_filters, bias=stem_bias, ops=ops, axis=axis,
                  data_format=data_format, dtype=dtype)
        stage_outputs, feature_info, stage_unit_names = _stages(
            x, units, filters, strides, stride=stem_spec.total_stride, stride_on_last_unit=stride_on_last_unit,
            unit_options=unit_options, unit_overrides=unit_overrides, drop_path_rate=drop_path_rate,
            data_format=data_format, dtype=dtype,
        )
        outputs = apply_ops(stage_outputs[-1], unit_config.ordering_spec.final, unit_config, "final", axis, dtype)
        super().__init__(inputs=inputs, outputs=outputs, name=name, **kwargs)
        if dtype is not None:  # a functional model drops dtype=; set as keras-hub's Backbone does
            self.dtype_policy = keras.dtype_policies.get(dtype)
        # The deepest stage at each stride (with the stride on a stage's last unit, two can share one).
        self.pyramid_outputs = {info["level"]: out for info, out in zip(feature_info, stage_outputs) if info["level"]}
        self.feature_info, self.stage_unit_names = feature_info, stage_unit_names
        self.stackwise_units, self.stackwise_filters, self.stackwise_strides = units, filters, strides
        self.stem, self.stem_filters, self.stem_bias, self.stem_ops = stem, stem_filters, stem_bias, stem_ops
        self.stride_on_last_unit, self.drop_path_rate, self.remat = stride_on_last_unit, drop_path_rate, remat
        self.unit_options, self.unit_overrides = unit_options, unit_overrides
        self.image_shape, self.data_format = tuple(input_shape), data_format
        self._plan_chain()

    def _plan_chain(self):
        """The layer chain's names, the remat groups' positions in it and, on PyTorch, the chain as direct kernel
        calls (``unit_kernels.chain_plan``: the graph's numbers without its machinery)."""
        # Layer names, not layers: a list of layers set on a model would be tracked as its layers again.
        self._chain_names = tuple(layer.name for layer in linear_chain(self))
        position = {name: i for i, name in enumerate(self._chain_names)}
        flat_names = [n for stage in self.stage_unit_names for n in stage]
        self._remat_groups = tuple(tuple(position[flat_names[u]] for u in group)
                                   for group in remat_lib.unit_groups(self.remat, self.stackwise_units))
        self._fast_chain = unit_kernels.chain_plan([self.get_layer(n) for n in self._chain_names], self.dtype_policy)

    def call(self, inputs, training=None, mask=None, **kwargs):
        """The functional graph (on PyTorch, its chain's kernels called directly: ``unit_kernels.chain_plan``); in
        training with ``remat``, its units grouped into checkpoints."""
        remat = training and self._remat_groups
        fast = self._fast_chain
        if fast is not None and not remat and mask is None and not kwargs and fast.accepts(inputs):
            return fast(inputs, training)
        if not remat or mask is not None or kwargs:
            return super().call(inputs, training=training, mask=mask, **kwargs)
        chain = [self.get_layer(name) for name in self._chain_names]
        return remat_lib.run_chain(chain, self._remat_groups, inputs, training)

    @property
    def kernel_plan(self):
        """The backbone's layer chain as direct PyTorch kernel calls (``unit_kernels.FastChain``), or None where
        ``call`` runs the functional graph: another backend, mixed precision, ``KERAS_PREACT_FAST_PATH`` below 2
        when it was built (``keras_preact.layers.fused.fast_path_level``)."""
        return self._fast_chain

    def group_matcher(self):
        """The backbone's layer names by group, in the order they run (timm's ``group_matcher``, for freezing
        and per-group learning rates): ``"stem"`` (the layers before the first unit), ``"stage1"`` ... (each
        stage's units) and ``"final"`` (the ordering's final ops, Sec. 4.1; empty where it has none).

        Examples:
            >>> from keras_preact.models import cifar_resnet
            >>> groups = cifar_resnet(8, include_top=False).group_matcher()
            >>> {group: len(names) for group, names in groups.items()}
            {'stem': 1, 'stage1': 1, 'stage2': 1, 'stage3': 1, 'final': 2}
            >>> groups["stage2"], groups["final"]
            (('stage2_unit1',), ('final_norm', 'final_act'))
        """
        chain = self._chain_names
        first, last = chain.index(self.stage_unit_names[0][0]), chain.index(self.stage_unit_names[-1][-1])
        groups = {"stem": chain[:first]}
        groups.update({f"stage{s + 1}": tuple(names) for s, names in enumerate(self.stage_unit_names)})
        groups["final"] = chain[last + 1:]
        return groups

    @property
    def residual_units(self):
        """Per stage, the stage's ``ResidualUnit`` layers, input side first."""
        return [[self.get_layer(n) for n in stage] for stage in self.stage_unit_names]

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "stackwise_units": self.stackwise_units,
            "stackwise_filters": self.stackwise_filters,
            "stackwise_strides": self.stackwise_strides,
            "stem": self.stem,
            "stem_filters": self.stem_filters,
            "stem_bias": self.stem_bias,
            "stem_ops": self.stem_ops,
            "stride_on_last_unit": self.stride_on_last_unit,
            "unit_options": {k: opt.serialize(v) for k, v in self.unit_options.items()},
            "unit_overrides": self.unit_overrides,
            "drop_path_rate": self.drop_path_rate,
            "input_shape": self.image_shape,
            "data_format": self.data_format,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
            "remat": self.remat,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)
