"""CIFAR networks: basic units for depth 6n+2, bottleneck units for 9n+2 (paper Sec. 4-5)."""

import keras

from keras_preact.layers import options as opt
from keras_preact.models import backbone
from keras_preact.models.backbone import Stage

# Per block: layers per unit (for depth = layers * 3n + 2), output channels per stage, and the
# official code's defaults (fb.resnet.torch preresnet.lua for basic, resnet-pre-act.lua for bottleneck).
CIFAR_BLOCKS = {
    "basic": dict(layers=2, widths=(16, 32, 64), shortcut_type="A", stride_position="3x3"),
    "bottleneck": dict(layers=3, widths=(64, 128, 256), shortcut_type="B", stride_position="first"),
}
STEM_FILTERS = 16


# The paper's named depths; many depths are both 6n+2 and 9n+2 (20, 56, 110, 164, ...), so the
# paper's choice decides for these and basic units decide for any other depth that is 6n+2.
PAPER_DEPTHS = {20: "basic", 32: "basic", 44: "basic", 56: "basic", 110: "basic", 1202: "basic",
                164: "bottleneck", 1001: "bottleneck"}


def cifar_depth_block(depth, block=None):
    """(block, units per stage) for a CIFAR depth: 6n+2 basic, 9n+2 bottleneck, validated."""
    if block is not None:
        opt.check_choice("block", block, CIFAR_BLOCKS)
    name = block or PAPER_DEPTHS.get(depth)
    candidates = [name] if name else list(CIFAR_BLOCKS)
    for name in candidates:
        layers = CIFAR_BLOCKS[name]["layers"]
        if isinstance(depth, int) and depth > 2 and (depth - 2) % (3 * layers) == 0:
            return name, (depth - 2) // (3 * layers)
    raise ValueError(
        f"Invalid depth={depth!r}"
        + (f" for block={block!r}" if block else "")
        + ": CIFAR nets have depth 6n+2 with basic units (20, 32, 44, 56, 110, 1202) or 9n+2 with "
        "bottleneck units (164, 1001)."
    )


def cifar_resnet(
    depth,
    num_classes=10,
    *,
    block=None,
    input_shape=(32, 32, 3),
    input_tensor=None,
    include_top=True,
    pooling=None,
    classifier_activation="softmax",
    drop_path_rate=0.0,
    name=None,
    **unit_options,
):
    """A CIFAR ResNet as in the official code (paper Sec. 4-5, Table 3).

    Stem: one 3x3 conv 3->16; stages of n units with 16/32/64 output channels (basic) or 64/128/256
    (bottleneck), strides 1/2/2; after the last unit the ordering's final ops (BN-ReLU for
    pre-activation), global average pooling, a dense classifier.

    The first unit of every stage pre-activates its shortcut as the official code does
    (``both_preact``); option A for basic nets, B for bottleneck nets; the bottleneck puts the
    stride on its first 1x1 conv (resnet-pre-act.lua). Every default can be overridden through
    ``unit_options`` (any ``ResidualUnit`` argument).
    """
    block, n = cifar_depth_block(depth, block)
    spec = CIFAR_BLOCKS[block]
    unit_options = {
        "block": block,
        "shortcut_type": spec["shortcut_type"],
        "stride_position": spec["stride_position"],
        **unit_options,
    }
    backbone.check_unit_options(unit_options)
    backbone.check_head(include_top, pooling, num_classes)
    backbone.check_input_shape(input_shape, 4)
    opt.check_rate("drop_path_rate", drop_path_rate)
    if unit_options["shortcut_type"] == "A" and block == "bottleneck":
        raise ValueError(
            "shortcut_type='A' cannot be used with block='bottleneck' in a CIFAR net: the first "
            "unit maps 16 to 64 channels and a zero-padded identity carries no signal in 48 of them "
            "at every unit. Use shortcut_type='B' (the official code's)."
        )
    ordering = opt.ORDERINGS[unit_options.get("ordering", "full_preact")]
    stages = [Stage(n, w, s) for w, s in zip(spec["widths"], (1, 2, 2))]

    inputs = backbone.make_inputs(input_shape, input_tensor)
    x = keras.layers.Conv2D(
        STEM_FILTERS,
        3,
        padding="same",
        use_bias=False,
        kernel_initializer=opt.get_kernel_initializer(
            unit_options.get("kernel_initializer", "he_normal_fan_out")
        ),
        kernel_regularizer=opt.get_regularizer(unit_options.get("kernel_regularizer")),
        name="stem_conv",
    )(inputs)
    x = backbone.apply_ops(x, ordering.after_stem, unit_options, "stem")

    def first_unit_preacts(stage_index, unit_index):
        return {"preactivate_shortcut": True} if unit_index == 0 else {}

    return backbone.build_resnet(
        inputs,
        x,
        stages,
        unit_options=unit_options,
        stage_unit_options=first_unit_preacts,
        drop_path_rate=drop_path_rate,
        stride_on_last_unit=False,
        include_top=include_top,
        pooling=pooling,
        num_classes=num_classes,
        classifier_activation=classifier_activation,
        name=name or f"preact_resnet{depth}_cifar",
    )


def _named(depth):
    def builder(num_classes=10, **kwargs):
        return cifar_resnet(depth, num_classes, **kwargs)

    builder.__name__ = f"cifar_resnet{depth}"
    builder.__doc__ = f"CIFAR ResNet-{depth} (see ``cifar_resnet``)."
    return builder


CIFAR_DEPTHS = (20, 32, 44, 56, 110, 164, 1001, 1202)
cifar_resnet20 = _named(20)
cifar_resnet32 = _named(32)
cifar_resnet44 = _named(44)
cifar_resnet56 = _named(56)
cifar_resnet110 = _named(110)
cifar_resnet164 = _named(164)
cifar_resnet1001 = _named(1001)
cifar_resnet1202 = _named(1202)
