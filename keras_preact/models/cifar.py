"""CIFAR networks: basic units for depth 6n+2, bottleneck units for 9n+2 (paper Sec. 4-5), one-layer
units for 3n+2 (Table 3's "1-layer skip")."""

from keras_preact.layers import options as opt
from keras_preact.models.backbone import check_unit_options, unit_name
from keras_preact.models.classifier import FAMILY
from keras_preact.models.network import build_network

# Per block: layers per unit (for depth = layers * 3n + 2), output channels per stage, and the
# official code's defaults (fb.resnet.torch preresnet.lua for basic, resnet-pre-act.lua for bottleneck).
CIFAR_BLOCKS = {
    "basic": dict(layers=2, widths=(16, 32, 64), shortcut_type="A", stride_position="3x3"),
    "bottleneck": dict(layers=3, widths=(64, 128, 256), shortcut_type="B", stride_position="first"),
    # Table 3's "ResNet-110 (1-layer skip)": each unit a single 3x3 conv, the basic net's widths.
    "one_layer": dict(layers=1, widths=(16, 32, 64), shortcut_type="A", stride_position="3x3"),
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
    candidates = [name] if name else ["basic", "bottleneck"]  # one-layer units only when asked for
    for name in candidates:
        layers = CIFAR_BLOCKS[name]["layers"]
        if isinstance(depth, int) and depth > 2 and (depth - 2) % (3 * layers) == 0:
            return name, (depth - 2) // (3 * layers)
    raise ValueError(
        f"Invalid depth={depth!r}"
        + (f" for block={block!r}" if block else "")
        + ": CIFAR nets have depth 6n+2 with basic units (20, 32, 44, 56, 110, 1202) or 9n+2 with "
        "bottleneck units (164, 1001), or 3n+2 with block='one_layer' (110)."
    )


def _check_cifar_unit(config):
    """Refuse a ``UnitConfig`` a CIFAR net cannot use."""
    if config.shortcut_type == "A" and config.block == "bottleneck":
        raise ValueError(
            "shortcut_type='A' cannot be used with block='bottleneck' in a CIFAR net: the first "
            "unit maps 16 to 64 channels and a zero-padded identity carries no signal in 48 of them "
            "at every unit. Use shortcut_type='B' (the official code's)."
        )


def cifar_resnet(depth, num_classes=10, *, block=None, input_shape=(32, 32, 3), include_top=True, pooling=None,
                 classifier_activation="softmax", dropout=0.0, drop_path_rate=0.0, input_tensor=None, data_format=None,
                 dtype=None, remat=None, input_config=FAMILY, class_names=None, name=None, **unit_options):
    """A CIFAR pre-activation ResNet as in the official code (He et al. 2016, "Identity Mappings in Deep
    Residual Networks", Sec. 4-5, Table 3; fb.resnet.torch ``preresnet.lua``).

    Stem: one 3x3 conv 3->16; stages of n units with 16/32/64 output channels (basic, one-layer) or
    64/128/256 (bottleneck), strides 1/2/2; after the last unit the ordering's final ops (BN-ReLU for
    pre-activation), global average pooling, a dense classifier. The first unit of every stage
    pre-activates its shortcut as the official code does (``both_preact``); option A for basic nets, B
    for bottleneck nets; the bottleneck puts the stride on its first 1x1 conv (resnet-pre-act.lua).

    Args:
        depth: 6n+2 (basic units), 9n+2 (bottleneck) or, with ``block="one_layer"``, 3n+2.
        num_classes: classes of the dense layer (with ``include_top``).
        block: ``"basic"``, ``"bottleneck"`` or ``"one_layer"``; default by depth (the paper's choice).
        input_shape: image shape in ``data_format`` order; height and width may be ``None``.
        include_top, pooling, classifier_activation, input_tensor: keras.applications' head semantics:
            the classifier, else the backbone (``pooling=None``) or its ``"avg"``/``"max"`` pooled features.
        dropout: rate before the dense layer. drop_path_rate: stochastic depth, 0 to this over the units.
        data_format, dtype, remat: the ``PreActResNetBackbone``'s (``dtype``: every layer's policy).
        input_config: what the classifier carries, at its input size; default CIFAR's
            (``presets.CIFAR_INPUT``: fb.resnet.torch's statistics, the whole image). class_names: its classes.
        name: the model's name. unit_options: any ``ResidualUnit`` argument, overriding the defaults above.

    Examples:
        >>> from keras_preact.models import cifar_resnet
        >>> model = cifar_resnet(20)  # 6n+2: n = 3 basic units per stage
        >>> [len(stage) for stage in model.backbone.residual_units], model.count_params()
        ([3, 3, 3], 271098)
        >>> model.input_config.input_size, model.input_config.crop_fraction  # CIFAR: the whole image
        ((32, 32, 3), 1.0)
        >>> cifar_resnet(8, block="bottleneck")
        Traceback (most recent call last):
        ...
        ValueError: Invalid depth=8 for block='bottleneck': CIFAR nets have depth 6n+2 with basic units ...
    """
    block, n = cifar_depth_block(depth, block)
    spec = CIFAR_BLOCKS[block]
    unit_options = {
        "block": block,
        "shortcut_type": spec["shortcut_type"],
        "stride_position": spec["stride_position"],
        **unit_options,
    }
    _check_cifar_unit(check_unit_options(unit_options))
    backbone = dict(stackwise_units=[n] * 3, stackwise_filters=list(spec["widths"]), stackwise_strides=[1, 2, 2],
                    stem="cifar", stem_filters=STEM_FILTERS, unit_options=unit_options,
                    unit_overrides={unit_name(s, 0): {"preactivate_shortcut": True} for s in range(3)})
    return build_network(
        backbone,
        default_name=f"preact_resnet{depth}{'_1layer' if block == 'one_layer' else ''}_cifar",
        num_classes=num_classes,
        input_shape=input_shape,
        input_tensor=input_tensor,
        include_top=include_top,
        pooling=pooling,
        classifier_activation=classifier_activation,
        dropout=dropout,
        drop_path_rate=drop_path_rate,
        data_format=data_format,
        dtype=dtype,
        remat=remat,
        input_config=input_config,
        class_names=class_names,
        name=name,
    )


CIFAR_DEPTHS = tuple(sorted(PAPER_DEPTHS))
