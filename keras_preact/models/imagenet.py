"""ImageNet networks, depth 18-200 (paper Table 5), in the fb.resnet.torch layout by default."""

import dataclasses

import keras

from keras_preact.layers import options as opt
from keras_preact.models import backbone
from keras_preact.models.backbone import Stage

IMAGENET_DEPTHS = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
    200: ("bottleneck", (3, 24, 36, 3)),
}
IMAGENET_WIDTHS = {"basic": (64, 128, 256, 512), "bottleneck": (256, 512, 1024, 2048)}
STEM_FILTERS = 64


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a layout puts strides, biases and the stem's activation.

    ``fb``: fb.resnet.torch ``preresnet.lua`` (the paper's ImageNet code): 7x7/2 conv without bias,
    BN-ReLU, 3x3/2 max-pool; the stride on the first unit of stages 2-4; the first unit of stage 1
    skips its pre-activation because the stem already ends in one.

    ``tf_slim``: keras.applications ResNet50V2/101V2/152V2 (TF-slim): 7x7/2 conv with bias and no
    BN-ReLU, max-pool; the stride on the last unit of stages 1-3 with a strided identity (1x1
    max-pool) shortcut on the raw input; biases on each unit's last conv and projection; BN epsilon
    1.001e-5. Same parameter budget within biases, different function: use it for Keras' weights.
    """

    stem_bias: bool
    stem_ops: str  # "norm_act" always, or "ordering": what the unit ordering says after a stem
    stage_strides: tuple
    stride_on_last_unit: bool
    unit_defaults: dict


LAYOUTS = {
    "fb": Layout(False, "norm_act", (1, 2, 2, 2), False, {}),
    "tf_slim": Layout(
        True, "ordering", (2, 2, 2, 1), True, {"output_bias": True, "norm_epsilon": 1.001e-5}
    ),
}


def imagenet_resnet(
    depth,
    num_classes=1000,
    *,
    layout="fb",
    input_shape=(224, 224, 3),
    input_tensor=None,
    include_top=True,
    pooling=None,
    classifier_activation="softmax",
    drop_path_rate=0.0,
    name=None,
    **unit_options,
):
    """An ImageNet pre-activation ResNet (paper Table 5; fb.resnet.torch ``preresnet.lua``).

    Stem 7x7/2 conv, BN-ReLU, 3x3/2 max-pool; four stages of 64/128/256/512 (basic) or
    256/512/1024/2048 (bottleneck) output channels; final BN-ReLU, global average pooling, dense.
    Shortcut type B and the stride on the 3x3 conv, as the official code. ``layout="tf_slim"``
    reproduces keras.applications ResNetV2 (see ``Layout``). ``unit_options``: any
    ``ResidualUnit`` argument.
    """
    if depth not in IMAGENET_DEPTHS:
        raise ValueError(
            f"Invalid depth={depth!r}: ImageNet nets have depth "
            + ", ".join(str(d) for d in IMAGENET_DEPTHS)
            + "."
        )
    opt.check_choice("layout", layout, LAYOUTS)
    spec = LAYOUTS[layout]
    block, units = IMAGENET_DEPTHS[depth]
    unit_options = {
        "block": block,
        "shortcut_type": "B",
        "stride_position": "3x3",
        **spec.unit_defaults,
        **unit_options,
    }
    backbone.check_unit_options(unit_options)
    backbone.check_head(include_top, pooling, num_classes)
    backbone.check_input_shape(input_shape, 32)
    opt.check_rate("drop_path_rate", drop_path_rate)
    ordering = opt.ORDERINGS[unit_options.get("ordering", "full_preact")]
    stages = [Stage(n, w, s) for n, w, s in zip(units, IMAGENET_WIDTHS[block], spec.stage_strides)]

    inputs = backbone.make_inputs(input_shape, input_tensor)
    # Explicit symmetric padding as Torch and TF-slim pad, not Keras' "same" (asymmetric at stride 2).
    x = keras.layers.ZeroPadding2D(3, name="stem_pad")(inputs)
    x = keras.layers.Conv2D(
        STEM_FILTERS,
        7,
        strides=2,
        use_bias=spec.stem_bias,
        kernel_initializer=opt.get_kernel_initializer(
            unit_options.get("kernel_initializer", "he_normal_fan_out")
        ),
        kernel_regularizer=opt.get_regularizer(unit_options.get("kernel_regularizer")),
        name="stem_conv",
    )(x)
    stem_ops = ("norm", "act") if spec.stem_ops == "norm_act" else ordering.after_stem
    x = backbone.apply_ops(x, stem_ops, unit_options, "stem")
    x = keras.layers.ZeroPadding2D(1, name="stem_pool_pad")(x)
    x = keras.layers.MaxPooling2D(3, strides=2, name="stem_pool")(x)

    def per_unit(stage_index, unit_index):
        options = {}
        if spec.stride_on_last_unit:
            stage = stages[stage_index]
            if unit_index == stage.units - 1 and stage.strides > 1:
                # keras.applications: strided identity (1x1 max-pool) on the raw input.
                options.update(shortcut_type="A", preactivate_shortcut=False)
        elif stage_index == 0 and unit_index == 0 and ordering.is_preactivation and "norm" in stem_ops:
            options["skip_preactivation"] = True  # fb.resnet.torch 'no_preact'
        return options

    return backbone.build_resnet(
        inputs,
        x,
        stages,
        unit_options=unit_options,
        stage_unit_options=per_unit,
        drop_path_rate=drop_path_rate,
        stride_on_last_unit=spec.stride_on_last_unit,
        include_top=include_top,
        pooling=pooling,
        num_classes=num_classes,
        classifier_activation=classifier_activation,
        name=name or f"preact_resnet{depth}",
    )
