"""One flat functional builder for every network of the package: stem, stages of units, head."""

import dataclasses
import inspect

import keras

from keras_preact.layers import ResidualUnit
from keras_preact.layers import options as opt

UNIT_OPTIONS = tuple(
    p
    for p in inspect.signature(ResidualUnit.__init__).parameters
    if p not in ("self", "filters", "strides", "kwargs", "data_format")
)


@dataclasses.dataclass(frozen=True)
class Stage:
    """``units`` residual units of ``filters`` output channels; the stride sits on one unit."""

    units: int
    filters: int
    strides: int


def check_unit_options(unit_options):
    unknown = sorted(set(unit_options) - set(UNIT_OPTIONS))
    if unknown:
        raise ValueError(
            f"Unknown unit option(s) {', '.join(unknown)}. Allowed: {', '.join(UNIT_OPTIONS)}."
        )
    # Constructing one unit validates every option (ordering, shortcut, rates, ...) up front.
    ResidualUnit(filters=64, **unit_options)


def check_input_shape(input_shape, total_stride, argument="input_shape"):
    if input_shape is None or len(input_shape) != 3:
        raise ValueError(f"Invalid {argument}={input_shape!r}: expected (height, width, channels).")
    for size in input_shape[:2]:
        if size is not None and size < total_stride:
            raise ValueError(
                f"Invalid {argument}={tuple(input_shape)}: height and width must be at least "
                f"{total_stride}, the network's total stride."
            )


def apply_ops(x, tokens, unit_options, name):
    """Norm/activation tokens of an ``Ordering`` applied as layers (stem and network end)."""
    norm = unit_options.get("normalization", "batch")
    for i, token in enumerate(tokens):
        if token == "norm":
            x = opt.make_norm(
                norm,
                x.shape[-1],
                axis=-1,
                epsilon=unit_options.get("norm_epsilon", 1e-5),
                momentum=unit_options.get("norm_momentum", 0.9),
                groups=unit_options.get("norm_groups", 32),
                name=f"{name}_norm",
                dtype=None,
            )(x)
        else:
            activation = unit_options.get("activation", "relu")
            x = keras.layers.Activation(opt.get_activation(activation), name=f"{name}_act")(x)
    return x


def build_resnet(
    inputs,
    x,
    stages,
    *,
    unit_options,
    stage_unit_options,
    drop_path_rate,
    stride_on_last_unit,
    include_top,
    pooling,
    num_classes,
    classifier_activation,
    name,
):
    """Stack ``stages`` on the stem output ``x`` and add the network's end and head.

    ``stage_unit_options(stage_index, unit_index)`` gives per-unit options such as the official
    code's first-unit handling. Stochastic depth grows linearly to ``drop_path_rate`` (Huang et al.).
    """
    ordering = opt.ORDERINGS[unit_options.get("ordering", "full_preact")]
    total = sum(s.units for s in stages)
    index = 0
    for s, stage in enumerate(stages):
        for u in range(stage.units):
            stride_unit = stage.units - 1 if stride_on_last_unit else 0
            options = dict(unit_options)
            options.update(stage_unit_options(s, u))
            if drop_path_rate:
                options["drop_path_rate"] = drop_path_rate * index / max(total - 1, 1)
            x = ResidualUnit(
                stage.filters,
                strides=stage.strides if u == stride_unit else 1,
                name=f"stage{s + 1}_unit{u + 1}",
                **options,
            )(x)
            index += 1
    x = apply_ops(x, ordering.final, unit_options, "final")
    if include_top:
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
        x = keras.layers.Dense(num_classes, name="logits")(x)
        # The classifier output is float32 under mixed precision.
        x = keras.layers.Activation(classifier_activation or "linear", dtype="float32", name="predictions")(x)
    elif pooling == "avg":
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    elif pooling == "max":
        x = keras.layers.GlobalMaxPooling2D(name="max_pool")(x)
    return keras.Model(inputs, x, name=name)


def check_head(include_top, pooling, num_classes, argument="num_classes"):
    opt.check_choice("pooling", pooling, (None, "avg", "max"))
    if include_top and (not isinstance(num_classes, int) or num_classes < 1):
        raise ValueError(f"Invalid {argument}={num_classes!r}: a positive integer is required.")


def make_inputs(input_shape, input_tensor):
    if input_tensor is None:
        return keras.Input(shape=input_shape, name="images")
    if not keras.backend.is_keras_tensor(input_tensor):
        return keras.Input(tensor=input_tensor, shape=input_shape, name="images")
    return input_tensor
