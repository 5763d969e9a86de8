"""Keras-Applications-style entry points: ``PreActResNet18`` ... ``PreActResNet200`` (He et al. 2016,
"Identity Mappings in Deep Residual Networks"), with keras.applications' arguments."""

import os

from keras_preact.layers import options as opt
from keras_preact.models.imagenet import LAYOUTS, imagenet_resnet
from keras_preact.models.presets import KERAS_RESNET_V2_INPUT  # noqa: F401 - what Keras' ResNetV2 weights expect
from keras_preact.pretrained.sources import KERAS_IMAGENET_WEIGHTS  # depths with Keras' published ResNetV2 weights


def _input_shape(input_shape, input_tensor, include_top, weights):
    """keras.applications' rules: 224x224 by default with the top, any size >= 32 without it."""
    if input_tensor is not None and input_shape is None:
        return tuple(input_tensor.shape[1:])
    if input_shape is None:
        return (224, 224, 3) if include_top else (None, None, 3)
    input_shape = tuple(input_shape)
    if weights == "imagenet" and include_top and input_shape != (224, 224, 3):
        raise ValueError(
            f"Invalid input_shape={input_shape}: with weights='imagenet' and include_top=True it must "
            "be (224, 224, 3). Use include_top=False for other sizes."
        )
    if len(input_shape) == 3 and input_shape[-1] != 3 and weights == "imagenet":
        raise ValueError(f"Invalid input_shape={input_shape}: ImageNet weights take 3 channels.")
    return input_shape


def keras_weights_file(depth, include_top):
    """The file name of Keras' ResNet{depth}V2 ImageNet weights (with or without the top)."""
    return f"resnet{depth}v2_weights_tf_dim_ordering_tf_kernels{'' if include_top else '_notop'}.h5"


def _loader(depth, weights):
    """The ``keras_preact.pretrained.loader.Loader`` of ``weights`` for ``imagenet_resnet{depth}`` (``"imagenet"``:
    its registered keras.applications weights, fetched with Keras' md5 and converted once; another library's
    checkpoint by path), or None for None and a keras-preact ``.weights.h5`` (loaded as it is)."""
    if weights is None or str(weights).endswith(".weights.h5"):
        return None
    from keras_preact.pretrained.loader import get_loader

    return get_loader(f"imagenet_resnet{depth}", weights)


def _load(model, loader, weights, include_top):
    """The weights into the model built: a loader's whole classifier (its backbone without the top), or a
    keras-preact ``.weights.h5`` file."""
    if loader is None:
        model.load_weights(weights)
    elif include_top:
        loader.load(model)
    else:
        loader.load_backbone(getattr(model, "backbone", model))
    return model


def _check_weights(weights, depth, layout, include_top, classes, unit_options):
    """keras.applications' rules for ``weights``, checked before anything is built."""
    if weights == "imagenet":
        if depth not in KERAS_IMAGENET_WEIGHTS:
            raise ValueError(
                f"weights='imagenet' is available for depth {', '.join(map(str, KERAS_IMAGENET_WEIGHTS))} "
                "(Keras' ResNetV2 weights), "
                f"not PreActResNet{depth}. Use weights=None or a path to a weights file."
            )
        if layout not in (None, "tf_slim"):
            raise ValueError(
                f"weights='imagenet' needs layout='tf_slim' (the layout of Keras' ResNetV2 weights), "
                f"not layout={layout!r}."
            )
        if include_top and classes != 1000:
            raise ValueError(
                f"Invalid classes={classes}: weights='imagenet' with include_top=True needs classes=1000."
            )
        if unit_options:
            raise ValueError(
                f"weights='imagenet' fixes the architecture; unit options {sorted(unit_options)} "
                "cannot be changed with it."
            )
    elif not (weights is None or (isinstance(weights, (str, os.PathLike)) and os.path.exists(weights))):
        raise ValueError(
            f"Invalid weights={weights!r}: use None, 'imagenet', or the path to an existing weights file."
        )


def preact_resnet(
    depth,
    include_top=True,
    weights=None,
    input_tensor=None,
    input_shape=None,
    pooling=None,
    classes=1000,
    classifier_activation="softmax",
    name=None,
    layout=None,
    remat=None,
    dtype=None,
    **unit_options,
):
    """An ImageNet pre-activation ResNet (He et al. 2016, Table 5) with keras.applications' argument
    semantics: ``imagenet_resnet(depth, ...)``, the same model for the same arguments.

    ``weights``: ``None``, ``"imagenet"`` (Keras' published ResNetV2 weights, depth 50/101/152; the
    model then uses ``layout="tf_slim"`` and carries their input config, [-1, 1] pixels:
    ``preprocess_input(x, model)``), or a path to a weights file. ``layout``: ``"fb"`` (default without
    ImageNet weights) or ``"tf_slim"``. ``remat``: rematerialisation of the residual units in training
    (``None``, ``"units"``, ``"stages"``, ``"segments:<k>"``; see ``PreActResNetBackbone``); any
    weights load with any value. ``dtype``: every layer's dtype policy (e.g. ``"mixed_bfloat16"``).

    Examples:
        >>> from keras_preact.applications import preact_resnet
        >>> features = preact_resnet(18, include_top=False, pooling="avg", input_shape=(160, 160, 3))
        >>> features.output_shape  # pooled features of the last stage
        (None, 512)
        >>> preact_resnet(18, weights="imagenet")
        Traceback (most recent call last):
        ...
        ValueError: weights='imagenet' is available for depth 50, 101, 152 (Keras' ResNetV2 weights),
        not PreActResNet18. ...
    """
    opt.check_choice("layout", layout, (None, *LAYOUTS))
    _check_weights(weights, depth, layout, include_top, classes, unit_options)
    input_shape = _input_shape(input_shape, input_tensor, include_top, weights)
    loader = _loader(depth, weights)  # checked, fetched and converted before the network is built
    if loader is not None and include_top and loader.num_classes != classes:
        raise ValueError(f"Invalid classes={classes}: weights={weights!r} has {loader.num_classes} classes; "
                         "use include_top=False for another head.")
    layout = layout or (loader.arguments.get("layout", "fb") if loader is not None else "fb")
    extra = {"input_config": loader.input_config} if loader is not None and loader.input_config else {}
    if loader is not None and include_top and loader.class_names:  # e.g. the ImageNet-1k classes of Keras' heads
        extra["class_names"] = loader.class_names
    model = imagenet_resnet(
        depth,
        classes,
        layout=layout,
        input_shape=input_shape,
        input_tensor=input_tensor,
        include_top=include_top,
        pooling=pooling,
        classifier_activation=classifier_activation,
        name=name or f"preact_resnet{depth}",
        remat=remat,
        dtype=dtype,
        **extra,
        **unit_options,
    )
    return model if weights is None else _load(model, loader, weights, include_top)


# keras.applications' signature, one function per depth; the paper's depths (Table 5 and fb.resnet.torch).
def PreActResNet18(include_top=True, weights=None, input_tensor=None, input_shape=None, pooling=None, classes=1000,
                   classifier_activation="softmax", name="preact_resnet18", **kwargs):
    """Pre-activation ResNet-18 (He et al. 2016, "Identity Mappings in Deep Residual Networks";
    fb.resnet.torch ``preresnet.lua``): basic units, 2-2-2-2. Arguments: ``preact_resnet``'s.

    Examples:
        >>> from keras_preact.applications import PreActResNet18
        >>> model = PreActResNet18(classes=10)  # imagenet_resnet(18, num_classes=10): 224, centre crop of 256
        >>> model.name, model.input_shape, model.output_shape
        ('preact_resnet18', (None, 224, 224, 3), (None, 10))
    """
    return preact_resnet(18, include_top, weights, input_tensor, input_shape, pooling, classes,
                         classifier_activation, name, **kwargs)


def PreActResNet34(include_top=True, weights=None, input_tensor=None, input_shape=None, pooling=None, classes=1000,
                   classifier_activation="softmax", name="preact_resnet34", **kwargs):
    """Pre-activation ResNet-34 (He et al. 2016, "Identity Mappings in Deep Residual Networks";
    fb.resnet.torch ``preresnet.lua``): basic units, 3-4-6-3. Arguments: ``preact_resnet``'s.

    Examples:
        >>> from keras_preact.applications import PreActResNet34
        >>> features = PreActResNet34(include_top=False, pooling="max", input_shape=(128, 128, 3))
        >>> [len(stage) for stage in features.backbone.residual_units], features.output_shape
        ([3, 4, 6, 3], (None, 512))
    """
    return preact_resnet(34, include_top, weights, input_tensor, input_shape, pooling, classes,
                         classifier_activation, name, **kwargs)


def PreActResNet50(include_top=True, weights=None, input_tensor=None, input_shape=None, pooling=None, classes=1000,
                   classifier_activation="softmax", name="preact_resnet50", **kwargs):
    """Pre-activation ResNet-50 (He et al. 2016, "Identity Mappings in Deep Residual Networks";
    fb.resnet.torch ``preresnet.lua``): bottleneck units, 3-4-6-3. ``weights="imagenet"``: Keras'
    ResNet50V2 weights (TF-slim layout). Arguments: ``preact_resnet``'s.

    Examples:
        Keras' ImageNet weights (downloaded once into Keras' cache) load into the TF-slim layout:

        >>> from keras_preact.applications import PreActResNet50, preprocess_input
        >>> model = PreActResNet50(weights="imagenet")  # doctest: +SKIP
        >>> probabilities = model(preprocess_input(images, model))  # [-1, 1] pixels, as the weights  # doctest: +SKIP

        Their rules are checked before anything is built or downloaded:

        >>> PreActResNet50(weights="imagenet", classes=10)
        Traceback (most recent call last):
        ...
        ValueError: Invalid classes=10: weights='imagenet' with include_top=True needs classes=1000.
    """
    return preact_resnet(50, include_top, weights, input_tensor, input_shape, pooling, classes,
                         classifier_activation, name, **kwargs)


def PreActResNet101(include_top=True, weights=None, input_tensor=None, input_shape=None, pooling=None, classes=1000,
                    classifier_activation="softmax", name="preact_resnet101", **kwargs):
    """Pre-activation ResNet-101 (He et al. 2016, "Identity Mappings in Deep Residual Networks",
    Sec. 4.1): bottleneck units, 3-4-23-3. ``weights="imagenet"``: Keras' ResNet101V2 weights.
    Arguments: ``preact_resnet``'s.

    Examples:
        >>> from keras_preact.applications import PreActResNet101
        >>> from keras_preact.models import IMAGENET_DEPTHS
        >>> IMAGENET_DEPTHS[101]  # units per stage
        ('bottleneck', (3, 4, 23, 3))
        >>> backbone = PreActResNet101(include_top=False, input_shape=(None, None, 3))  # doctest: +SKIP
    """
    return preact_resnet(101, include_top, weights, input_tensor, input_shape, pooling, classes,
                         classifier_activation, name, **kwargs)


def PreActResNet152(include_top=True, weights=None, input_tensor=None, input_shape=None, pooling=None, classes=1000,
                    classifier_activation="softmax", name="preact_resnet152", **kwargs):
    """Pre-activation ResNet-152 (He et al. 2016, "Identity Mappings in Deep Residual Networks",
    Table 5): bottleneck units, 3-8-36-3. ``weights="imagenet"``: Keras' ResNet152V2 weights.
    Arguments: ``preact_resnet``'s.

    Examples:
        >>> from keras_preact.applications import PreActResNet152
        >>> from keras_preact.models import IMAGENET_DEPTHS
        >>> IMAGENET_DEPTHS[152]  # units per stage
        ('bottleneck', (3, 8, 36, 3))
        >>> model = PreActResNet152(classes=100, remat="stages")  # doctest: +SKIP
    """
    return preact_resnet(152, include_top, weights, input_tensor, input_shape, pooling, classes,
                         classifier_activation, name, **kwargs)


def PreActResNet200(include_top=True, weights=None, input_tensor=None, input_shape=None, pooling=None, classes=1000,
                    classifier_activation="softmax", name="preact_resnet200", **kwargs):
    """Pre-activation ResNet-200 (He et al. 2016, "Identity Mappings in Deep Residual Networks",
    Table 5): bottleneck units, 3-24-36-3. Arguments: ``preact_resnet``'s.

    Examples:
        >>> from keras_preact.applications import PreActResNet200
        >>> from keras_preact.models import IMAGENET_DEPTHS
        >>> IMAGENET_DEPTHS[200]  # units per stage
        ('bottleneck', (3, 24, 36, 3))
        >>> model = PreActResNet200(dtype="mixed_bfloat16")  # doctest: +SKIP
    """
    return preact_resnet(200, include_top, weights, input_tensor, input_shape, pooling, classes,
                         classifier_activation, name, **kwargs)
