"""Convert keras.applications ResNet50V2 / ResNet101V2 / ResNet152V2 into keras-preact models."""

import os
import pathlib
import re
import tempfile
import zipfile

from keras_preact.models.imagenet import IMAGENET_DEPTHS, imagenet_resnet
from keras_preact.pretrained import reading

KERAS_RESNET_V2 = {50: "ResNet50V2", 101: "ResNet101V2", 152: "ResNet152V2"}  # keras.applications' builders


def _unit_pairs(unit):
    """(our sublayer, keras.applications' layer suffix) in a full pre-activation bottleneck unit: the
    BN before each conv ("preact_bn", "1_bn", "2_bn"), the convs ("1_conv" ...), the projection."""
    yield unit.norm("before", 0), "preact_bn"
    for i, conv in enumerate(unit.convs()):
        yield conv, f"{i + 1}_conv"
        if i:
            yield unit.norm("before", i), f"{i}_bn"
    yield unit.projection(), "0_conv"


def _stage_units(model):
    """Units per stage of a keras.applications ResNetV2, read off its layer names."""
    units = {}
    for layer in model.layers:
        match = re.fullmatch(r"conv(\d)_block(\d+)_out", layer.name)
        if match:
            stage, block = int(match.group(1)), int(match.group(2))
            units[stage] = max(units.get(stage, 0), block)
    return tuple(units[s] for s in sorted(units))


def _copy(src, dst, copied):
    dst.set_weights(src.get_weights())
    copied.extend(dst.weights)


def checked_file(path, depth=None, *, allow_non_finite=False):
    """``reading.keras_resnet_v2_file(path)`` of a keras.applications ResNetV2 file (of ``depth``, where given),
    its tensors checked; one ``CheckpointError`` line for any other file (NaN or infinite values too, unless
    ``allow_non_finite``)."""
    found = reading.keras_resnet_v2_file(path, values=True, allow_non_finite=allow_non_finite)
    if found is None or found["depth"] != (depth or found["depth"]):
        what = "another network's" if found is None else f"a depth-{found['depth']}"
        wanted = f"ResNet{depth}V2's" if depth else "ResNet50V2's, ResNet101V2's or ResNet152V2's"
        raise reading.CheckpointError(f"Invalid checkpoint {str(path)!r}: {what} Keras file, not a keras.applications "
                                      f"{wanted} (.h5, .weights.h5 or .keras).")
    return found


def keras_applications_model(path, input_shape=None, *, depth=None, allow_non_finite=False, found=None):
    """The keras.applications ResNet50V2/101V2/152V2 saved in ``path`` (of ``depth``, where given): a legacy
    ``.h5`` (keras.applications' own weights files, ``model.save("x.h5")``), Keras 3's ``save_weights``
    ``.weights.h5`` or ``model.save`` ``.keras`` (its weights: no layer of its config is deserialized). It is
    built by keras.applications with the file's depth and classes at ``input_shape`` (keras.applications'
    default where None), then loaded; the file is checked first (``checked_file``; ``found``: what it gave
    already)."""
    import keras

    path = pathlib.Path(path)
    found = found or checked_file(path, depth, allow_non_finite=allow_non_finite)
    builder = getattr(keras.applications, KERAS_RESNET_V2[found["depth"]])
    top = {"classes": found["num_classes"]} if found["num_classes"] else {"include_top": False}
    shape = input_shape or (None if found["num_classes"] else (None, None, 3))
    if path.suffix != ".keras":
        return builder(weights=str(path), input_shape=shape, **top)
    with tempfile.TemporaryDirectory() as folder, zipfile.ZipFile(path) as archive:  # Keras reads it 3x faster
        return builder(weights=archive.extract("model.weights.h5", folder), input_shape=shape, **top)


def from_keras_applications(model, *, classifier_activation=None, name=None, input_shape=None):
    """An equivalent keras-preact model (``layout="tf_slim"``) with ``model``'s weights.

    ``model`` is a keras.applications ResNet50V2, ResNet101V2 or ResNet152V2 with any weights, input
    shape, ``include_top`` and ``pooling``, or the path of a file one was saved to (``.h5``, ``.weights.h5``,
    ``.keras``: ``keras_applications_model``, built at ``input_shape``). The result gives the same outputs (to
    float rounding). ``classifier_activation`` defaults to the source's ("softmax" unless changed).

    Examples:
        Two 25M-parameter networks, so not run here:

        >>> import keras
        >>> from keras_preact.applications import from_keras_applications
        >>> source = keras.applications.ResNet50V2(weights="imagenet")  # doctest: +SKIP
        >>> model = from_keras_applications(source)  # preact_resnet50_from_resnet50v2  # doctest: +SKIP

        Any other network is refused by name:

        >>> from keras_preact.models import create_model
        >>> from_keras_applications(create_model("cifar_resnet20"))
        Traceback (most recent call last):
        ...
        ValueError: from_keras_applications expects a keras.applications ResNet50V2, ResNet101V2 or ResNet152V2;
        got 'preact_resnet20_cifar' with units per stage unknown.
    """
    if isinstance(model, (str, os.PathLike)):
        model = keras_applications_model(model, input_shape)
    units = _stage_units(model)
    depth = next((d for d, (b, u) in IMAGENET_DEPTHS.items() if b == "bottleneck" and u == units), None)
    if depth is None or "post_bn" not in [layer.name for layer in model.layers]:
        raise ValueError(
            f"from_keras_applications expects a keras.applications ResNet50V2, ResNet101V2 or "
            f"ResNet152V2; got {model.name!r} with units per stage {units or 'unknown'}."
        )
    names = {layer.name for layer in model.layers}
    include_top = "predictions" in names
    pooling = None
    if not include_top:
        pooling = "avg" if "avg_pool" in names else "max" if "max_pool" in names else None
    num_classes = 1000
    if include_top:
        top = model.get_layer("predictions")
        num_classes = top.units
        if classifier_activation is None:
            classifier_activation = top.activation
    converted = imagenet_resnet(
        depth,
        num_classes,
        layout="tf_slim",
        input_shape=tuple(model.input_shape[1:]),
        include_top=include_top,
        pooling=pooling,
        classifier_activation=classifier_activation,
        name=name or f"preact_resnet{depth}_from_{model.name}",
    )
    return load_keras_applications(converted, model)


def load_keras_applications(target, source):
    """Copy the keras.applications ResNetV2 ``source`` into ``target``, an ``imagenet_resnet`` of its depth in the
    ``"tf_slim"`` layout: a classifier of its classes (its head from ``predictions``), or a backbone or headless
    network (``predictions`` dropped). Every variable of ``target`` comes from ``source``. Returns ``target``."""
    names = {layer.name for layer in source.layers}
    head = "logits" in [layer.name for layer in target.layers]
    if head and "predictions" not in names:
        raise ValueError(f"Invalid weights: {source.name} has no top (include_top=False); load it under a new head.")
    backbone = getattr(target, "backbone", target)
    copied = []
    _copy(source.get_layer("conv1_conv"), backbone.get_layer("stem_conv"), copied)
    for s, stage in enumerate(backbone.residual_units):
        for b, unit in enumerate(stage):
            prefix = f"conv{s + 2}_block{b + 1}_"
            for ours, theirs in _unit_pairs(unit):
                if prefix + theirs not in names:
                    continue
                if ours is None:
                    raise RuntimeError(f"{unit.name} has no counterpart of {prefix + theirs}: the layouts disagree.")
                _copy(source.get_layer(prefix + theirs), ours, copied)
    _copy(source.get_layer("post_bn"), backbone.get_layer("final_norm"), copied)
    if head:
        _copy(source.get_layer("predictions"), target.get_layer("logits"), copied)
    if len(copied) != len(target.weights):  # every variable must come from the source
        raise RuntimeError(f"Converted {len(copied)} of {len(target.weights)} variables: the layouts disagree.")
    return target
