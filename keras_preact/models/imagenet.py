"""ImageNet networks, depth 18-200 (paper Table 5), in the fb.resnet.torch layout by default."""

import dataclasses

from keras_preact.layers import options as opt
from keras_preact.models.backbone import check_unit_options, unit_name
from keras_preact.models.classifier import FAMILY
from keras_preact.models.network import build_network

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

    ``timm``: timm's ``resnetv2_*`` (and keras-hub's ResNetV2): 7x7/2 conv without bias and no BN-ReLU, a
    max-pool padded with -inf (``stem="imagenet_edge_pool"``); the stride on the first unit of stages 2-4;
    every unit pre-activates (its shortcut reads the pre-activated input where it projects).

    ``bit``: Big Transfer (Kolesnikov et al. 2020; timm's ``resnetv2_*x1_bit``): ``timm``'s units with
    GroupNorm (32 groups) and weight-standardized convolutions everywhere, the max-pool zero-padded.
    """

    stem_bias: bool
    stem_ops: str  # "norm_act" always, or "ordering": what the unit ordering says after a stem
    stage_strides: tuple
    stride_on_last_unit: bool
    unit_defaults: dict
    stem: str = "imagenet"


LAYOUTS = {
    "fb": Layout(False, "norm_act", (1, 2, 2, 2), False, {}),
    "tf_slim": Layout(
        True, "ordering", (2, 2, 2, 1), True, {"output_bias": True, "norm_epsilon": 1.001e-5}
    ),
    "timm": Layout(False, "ordering", (1, 2, 2, 2), False, {}, stem="imagenet_edge_pool"),
    "bit": Layout(False, "ordering", (1, 2, 2, 2), False,
                  {"normalization": "group", "norm_groups": 32, "convolution": "weight_standardized"}),
}


def _unit_overrides(spec, units, ordering, stem_ops):
    """The units that differ from the rest in a ``spec`` layout net."""
    overrides = {}
    for s, (n, stride) in enumerate(zip(units, spec.stage_strides)):
        if spec.stride_on_last_unit and stride > 1:
            # keras.applications: strided identity (1x1 max-pool) on the raw input.
            overrides[unit_name(s, n - 1)] = {"shortcut_type": "A", "preactivate_shortcut": False}
    stem_norm = stem_ops == "norm_act" or "norm" in ordering.after_stem
    if not spec.stride_on_last_unit and ordering.is_preactivation and stem_norm:
        overrides[unit_name(0, 0)] = {"skip_preactivation": True}  # fb.resnet.torch 'no_preact'
    return overrides


def imagenet_resnet(depth, num_classes=1000, *, layout="fb", input_shape=(224, 224, 3), include_top=True,
                    pooling=None, classifier_activation="softmax", dropout=0.0, drop_path_rate=0.0, input_tensor=None,
                    data_format=None, dtype=None, remat=None, input_config=FAMILY, class_names=None, name=None,
                    **unit_options):
    """An ImageNet pre-activation ResNet (He et al. 2016, "Identity Mappings in Deep Residual Networks",
    Table 5; fb.resnet.torch ``preresnet.lua``).

    Stem 7x7/2 conv, BN-ReLU, 3x3/2 max-pool; four stages of 64/128/256/512 (basic) or
    256/512/1024/2048 (bottleneck) output channels; final BN-ReLU, global average pooling, dense.
    Shortcut type B and the stride on the 3x3 conv, as the official code (``UnitConfig``'s defaults).

    Args:
        depth: 18, 34 (basic units), 50, 101, 152 or 200 (bottleneck).
        num_classes: classes of the dense layer (with ``include_top``).
        layout: ``"fb"`` (fb.resnet.torch), ``"tf_slim"`` (keras.applications ResNetV2), ``"timm"`` (timm's
            and keras-hub's ResNetV2) or ``"bit"`` (Big Transfer); see ``Layout``.
        input_shape: image shape in ``data_format`` order; height and width may be ``None``.
        include_top, pooling, classifier_activation, input_tensor: keras.applications' head semantics:
            the classifier, else the backbone (``pooling=None``) or its ``"avg"``/``"max"`` pooled features.
        dropout: rate before the dense layer. drop_path_rate: stochastic depth, 0 to this over the units.
        data_format, dtype, remat: the ``PreActResNetBackbone``'s (``dtype``: every layer's policy).
        input_config: what the classifier carries, at its input size; default ImageNet's
            (``presets.IMAGENET_INPUT``: shorter side 256, centre 224, fb.resnet.torch's statistics).
        class_names: its classes. name: the model's name.
        unit_options: any ``ResidualUnit`` argument, overriding the defaults above.

    Examples:
        >>> from keras_preact.models import imagenet_resnet
        >>> model = imagenet_resnet(18, num_classes=10, input_shape=(64, 64, 3))
        >>> [info["stride"] for info in model.backbone.feature_info], model.count_params()
        ([4, 8, 16, 32], 11187658)
        >>> model.input_config.resize_size  # the centre 64 x 64 of the shorter side at 64 / 0.875
        74
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
    unit_options = {"block": block, **spec.unit_defaults, **unit_options}
    ordering = check_unit_options(unit_options).ordering_spec
    backbone = dict(stackwise_units=list(units), stackwise_filters=list(IMAGENET_WIDTHS[block]),
                    stackwise_strides=list(spec.stage_strides), stem=spec.stem, stem_filters=STEM_FILTERS,
                    stem_bias=spec.stem_bias, stem_ops=spec.stem_ops, stride_on_last_unit=spec.stride_on_last_unit,
                    unit_options=unit_options, unit_overrides=_unit_overrides(spec, units, ordering, spec.stem_ops))
    return build_network(backbone, default_name=f"preact_resnet{depth}", num_classes=num_classes,
                         input_shape=input_shape, input_tensor=input_tensor, include_top=include_top, pooling=pooling,
                         classifier_activation=classifier_activation, dropout=dropout, drop_path_rate=drop_path_rate,
                         data_format=data_format, dtype=dtype, remat=remat, input_config=input_config,
                         class_names=class_names, name=name)
