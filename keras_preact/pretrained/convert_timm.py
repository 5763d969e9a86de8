"""Convert timm's pre-activation ``resnetv2_*`` checkpoints and keras-hub's ResNetV2 into keras-preact models.

timm's ``ResNetV2`` (``resnetv2_18/34/50/101``: BatchNorm; ``resnetv2_50x1_bit``/``resnetv2_101x1_bit``: Big
Transfer's GroupNorm and weight-standardized convolutions, Kolesnikov et al. 2020) is He et al. 2016's full
pre-activation network in ``imagenet_resnet``'s ``layout="timm"`` (BN) or ``layout="bit"`` (GN): the converter
reads its state dict, a ``{name: numpy array}`` mapping under timm's parameter names (``stem.conv.weight``,
``stages.0.blocks.0.norm1.running_mean``, ``head.fc.weight`` ...), as ``safetensors`` or ``torch.load`` give it.
keras-hub's ``ResNetBackbone(use_pre_activation=True)`` (its ``resnet_v2_*`` presets) has timm's layout under
Keras layer names.

Every variable of the converted model comes from the source and every source tensor is used: a checkpoint
of another shape is refused by name.
"""

import re

import numpy as np

from keras_preact.models.imagenet import IMAGENET_DEPTHS, IMAGENET_WIDTHS, imagenet_resnet
from keras_preact.pretrained.reading import CheckpointError, check_tensors

# The source's name of each of our unit's sublayers: (our role, conv index), timm's suffix, keras-hub's suffix.
UNIT_PARTS = (
    (("before", 0), "norm1", "pre_activation_bn"),
    (("conv", 0), "conv1", "1_conv"),
    (("before", 1), "norm2", "1_bn"),
    (("conv", 1), "conv2", "2_conv"),
    (("before", 2), "norm3", "2_bn"),
    (("conv", 2), "conv3", "3_conv"),
    (("projection", None), "downsample.conv", "0_conv"),
)
NORM_FIELDS = {"batch": ("weight", "bias", "running_mean", "running_var"), "group": ("weight", "bias")}


def _unit_layer(unit, role, index):
    if role == "conv":
        convs = unit.convs()
        return convs[index] if index < len(convs) else None
    if role == "projection":
        return unit.projection()
    return unit.norm(role, index)


def _conv_kernel(weight):
    """PyTorch's (out, in, kh, kw) -> Keras' (kh, kw, in, out)."""
    return np.transpose(weight, (2, 3, 1, 0))


def timm_architecture(state, path=None, *, allow_non_finite=False):
    """``{"depth", "layout", "num_classes"}`` of the timm ``resnetv2`` network a state dict belongs to
    (``num_classes`` None without a head), its tensors checked against that network's (``timm_state_shapes``,
    ``reading.check_tensors``, with its ``allow_non_finite``); a ``CheckpointError`` naming ``path`` (the file
    read) for anything else."""
    units, blocks = [], {}
    for key in state:
        match = re.match(r"stages\.(\d+)\.blocks\.(\d+)\.", key)
        if match:
            blocks.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
    units = tuple(len(blocks[s]) for s in sorted(blocks))
    bottleneck = "stages.0.blocks.0.conv3.weight" in state
    depth = next((d for d, (block, u) in IMAGENET_DEPTHS.items()
                  if u == units and (block == "bottleneck") == bottleneck), None)
    stem = getattr(state.get("stem.conv.weight"), "shape", None)
    if depth is None or stem is None or stem[0] != 64:
        raise CheckpointError(f"Invalid {_what(path)}: not a timm resnetv2 state dict of width 1 (units per stage "
                              f"{units}, stem conv {stem}); keras-preact reads resnetv2_18/34/50/101/152/200 and "
                              "resnetv2_50x1_bit/101x1_bit.")
    layout = "timm" if "norm.running_mean" in state else "bit"
    head = state.get("head.fc.weight")
    arch = {"depth": depth, "layout": layout, "num_classes": None if head is None else int(head.shape[0])}
    expected = timm_state_shapes(**arch)
    if head is not None and np.ndim(head) == 2:  # a Linear head's (classes, features), as a 1x1 conv's
        expected["head.fc.weight"] = expected["head.fc.weight"][:2]
    check_tensors(state, expected, path=path, allow_non_finite=allow_non_finite)
    return arch


def _what(path):
    return f"checkpoint {str(path)!r}" if path else "state dict"


def timm_state_shapes(depth, layout, num_classes=None):
    """``{name: shape}`` of timm's ``resnetv2_<depth>`` (``layout="timm"``: BatchNorm) or ``resnetv2_<depth>x1_bit``
    (``"bit"``: GroupNorm) state dict, with its ``head.fc`` where ``num_classes`` is given.

    Examples:
        >>> from keras_preact.pretrained.convert_timm import timm_state_shapes
        >>> shapes = timm_state_shapes(18, "timm", 1000)
        >>> shapes["stem.conv.weight"], shapes["stages.1.blocks.0.downsample.conv.weight"], shapes["head.fc.weight"]
        ((64, 3, 7, 7), (128, 64, 1, 1), (1000, 512, 1, 1))
    """
    block, units = IMAGENET_DEPTHS[depth]
    fields = NORM_FIELDS["batch" if layout == "timm" else "group"]
    shapes = {"stem.conv.weight": (64, 3, 7, 7)}

    def norm(prefix, channels):
        shapes.update({f"{prefix}.{field}": (channels,) for field in fields})

    channels = 64
    for s, (n, width) in enumerate(zip(units, IMAGENET_WIDTHS[block])):
        for b in range(n):
            p = f"stages.{s}.blocks.{b}."
            stride = 2 if s and not b else 1
            if channels != width or stride != 1:
                shapes[p + "downsample.conv.weight"] = (width, channels, 1, 1)
            norm(p + "norm1", channels)
            mid = width // 4 if block == "bottleneck" else width
            convs = [(mid, channels, 1), (mid, mid, 3), (width, mid, 1)] if block == "bottleneck" else [
                (width, channels, 3), (width, width, 3)]
            for i, (out, inputs, k) in enumerate(convs):
                shapes[f"{p}conv{i + 1}.weight"] = (out, inputs, k, k)
                if i:
                    norm(f"{p}norm{i + 1}", inputs)
            channels = width
    norm("norm", channels)
    if num_classes is not None:
        shapes.update({"head.fc.weight": (num_classes, channels, 1, 1), "head.fc.bias": (num_classes,)})
    return shapes


def _assign(layer, values, copied, source):
    try:
        layer.set_weights([np.asarray(v) for v in values])
    except ValueError as error:
        raise ValueError(f"Invalid weights: {source} does not fit {layer.name} ({error})") from None
    copied.extend(layer.weights)


def load_timm_state_dict(model, state):
    """Copy a timm ``resnetv2`` state dict (``{name: array}``) into ``model``, built by ``imagenet_resnet``
    with ``timm_architecture(state)``'s depth and layout (with or without its head).

    Examples:
        A checkpoint as ``safetensors.numpy.load_file`` reads it (a 100 MB download, so not run here):

        >>> from safetensors.numpy import load_file  # doctest: +SKIP
        >>> from keras_preact.pretrained.convert_timm import load_timm_state_dict, timm_architecture
        >>> from keras_preact.models import imagenet_resnet
        >>> state = load_file("resnetv2_50.a1h_in1k/model.safetensors")  # doctest: +SKIP
        >>> arch = timm_architecture(state)  # {'depth': 50, 'layout': 'timm', 'num_classes': 1000}  # doctest: +SKIP
        >>> model = imagenet_resnet(arch["depth"], arch["num_classes"], layout=arch["layout"])  # doctest: +SKIP
        >>> load_timm_state_dict(model, state)  # doctest: +SKIP
    """
    backbone = getattr(model, "backbone", model)
    kind = backbone.residual_units[0][0].options.normalization
    used, copied = set(), []

    def take(prefix, layer, norm=False):
        names = [f"{prefix}.{f}" for f in NORM_FIELDS[kind]] if norm else [f"{prefix}.weight"]
        if not norm and layer.use_bias:
            names.append(f"{prefix}.bias")
        missing = [n for n in names if n not in state]
        if missing:
            raise ValueError(f"Invalid weights: {', '.join(missing)} missing for {layer.name}.")
        values = [state[n] for n in names]
        if not norm:
            values[0] = _conv_kernel(values[0])
        _assign(layer, values, copied, prefix)
        used.update(names)

    take("stem.conv", backbone.get_layer("stem_conv"))
    for s, stage in enumerate(backbone.residual_units):
        for b, unit in enumerate(stage):
            for (role, index), timm_name, _ in UNIT_PARTS:
                layer = _unit_layer(unit, role, index)
                if layer is not None:
                    take(f"stages.{s}.blocks.{b}.{timm_name}", layer, norm=role in ("before",))
    take("norm", backbone.get_layer("final_norm"), norm=True)
    if model is not backbone and "logits" in [layer.name for layer in model.layers]:
        weight, bias = state.get("head.fc.weight"), state.get("head.fc.bias")
        if weight is None or bias is None:
            raise ValueError("Invalid weights: head.fc.weight/bias missing; build the model with include_top=False.")
        _assign(model.get_layer("logits"), [np.reshape(weight, weight.shape[:2]).T, bias], copied, "head.fc")
        used.update(("head.fc.weight", "head.fc.bias"))
    _check_complete(model, copied, set(state) - used - {k for k in state if k.endswith("num_batches_tracked")},
                    head_ok="logits" not in [layer.name for layer in model.layers])


def _check_complete(model, copied, unused, head_ok):
    if head_ok:
        unused = {k for k in unused if not k.startswith(("head.", "output_dense"))}
    if unused:
        raise ValueError(f"Invalid weights: {len(unused)} source tensors have no place in {model.name} "
                         f"(e.g. {sorted(unused)[0]}): the architectures differ.")
    if len(copied) != len(model.weights):
        raise ValueError(f"Invalid weights: converted {len(copied)} of {len(model.weights)} variables of "
                         f"{model.name}: the architectures differ.")


def keras_hub_architecture(backbone):
    """``{"depth", "layout"}`` of a keras-hub ``ResNetBackbone`` with ``use_pre_activation=True``."""
    block = {"basic_block": "basic", "bottleneck_block": "bottleneck"}.get(getattr(backbone, "block_type", None))
    units = tuple(getattr(backbone, "stackwise_num_blocks", ()))
    depth = next((d for d, (b, u) in IMAGENET_DEPTHS.items() if b == block and u == units), None)
    if (depth is None or not getattr(backbone, "use_pre_activation", False)
            or list(backbone.stackwise_num_strides) != [1, 2, 2, 2] or list(backbone.input_conv_filters) != [64]):
        raise ValueError(f"Invalid weights: {getattr(backbone, 'name', backbone)!r} is not a keras-hub ResNetV2 "
                         "(ResNetBackbone with use_pre_activation=True, depth 18-200, one 7x7 stem conv).")
    return {"depth": depth, "layout": "timm"}


def load_keras_hub_backbone(model, source, classifier=None):
    """Copy a keras-hub ResNetV2 ``ResNetBackbone`` (and the ``output_dense`` of its ``ImageClassifier``
    ``classifier``, into the model's head) into ``model``, built by ``imagenet_resnet`` with
    ``keras_hub_architecture(source)``'s depth and layout.

    Examples:
        >>> import keras_hub  # doctest: +SKIP
        >>> from keras_preact.pretrained.convert_timm import keras_hub_architecture, load_keras_hub_backbone
        >>> source = keras_hub.models.Backbone.from_preset("resnet_v2_50_imagenet")  # doctest: +SKIP
        >>> arch = keras_hub_architecture(source)  # doctest: +SKIP
        >>> from keras_preact.models import imagenet_resnet
        >>> model = imagenet_resnet(arch["depth"], include_top=False, layout="timm")  # doctest: +SKIP
        >>> load_keras_hub_backbone(model, source)  # doctest: +SKIP
    """
    backbone = getattr(model, "backbone", model)
    names = {layer.name for layer in source.layers}
    copied = []
    _assign(backbone.get_layer("stem_conv"), source.get_layer("conv1_conv").get_weights(), copied, "conv1_conv")
    for s, stage in enumerate(backbone.residual_units):
        for b, unit in enumerate(stage):
            for (role, index), _, hub_name in UNIT_PARTS:
                layer, name = _unit_layer(unit, role, index), f"stack{s}_block{b}_{hub_name}"
                if (layer is None) != (name not in names):
                    raise ValueError(f"Invalid weights: {name} and {unit.name} disagree: the architectures differ.")
                if layer is not None:
                    _assign(layer, source.get_layer(name).get_weights(), copied, name)
    _assign(backbone.get_layer("final_norm"), source.get_layer("post_bn").get_weights(), copied, "post_bn")
    if model is not backbone and "logits" in [layer.name for layer in model.layers]:
        if classifier is None:
            raise ValueError("Invalid weights: a keras-hub backbone has no head; build the model with "
                             "include_top=False or give the ImageClassifier.")
        _assign(model.get_layer("logits"), classifier.output_dense.get_weights(), copied, "output_dense")
    _check_complete(model, copied, set(), head_ok=True)


def from_timm_state_dict(state, *, input_shape=(224, 224, 3), include_top=True, name=None, **arguments):
    """An ``imagenet_resnet`` of the checkpoint's depth and layout, its weights those of ``state``."""
    arch = timm_architecture(state)
    include_top = include_top and arch["num_classes"] is not None
    model = imagenet_resnet(arch["depth"], arch["num_classes"] or 1000, layout=arch["layout"],
                            input_shape=input_shape, include_top=include_top, name=name, **arguments)
    load_timm_state_dict(model, state)
    return model
