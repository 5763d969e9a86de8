"""Keras-Applications-style entry points: ``PreActResNet18`` ... ``PreActResNet200``."""

import functools
import os
import socket

import keras

from keras_preact.applications.convert import from_keras_applications
from keras_preact.layers import options as opt
from keras_preact.models.imagenet import LAYOUTS, imagenet_resnet
from keras_preact.models.registry import list_models, model_spec

# Depths with published Keras ImageNet weights (keras.applications ResNetV2, TF-slim layout).
KERAS_IMAGENET_WEIGHTS = {
    50: "ResNet50V2",
    101: "ResNet101V2",
    152: "ResNet152V2",
}
DOWNLOAD_TIMEOUT_S = 30


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


def _keras_imagenet_source(depth, include_top, input_shape, timeout=DOWNLOAD_TIMEOUT_S):
    """keras.applications ResNet{depth}V2 with weights='imagenet', failing fast when offline."""
    builder = getattr(keras.applications, KERAS_IMAGENET_WEIGHTS[depth])
    cache = os.path.join(os.environ.get("KERAS_HOME", os.path.expanduser("~/.keras")), "models")
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout)
    try:
        return builder(weights="imagenet", include_top=include_top, input_shape=input_shape)
    except Exception as e:  # keras.utils.get_file raises a bare Exception on URL failures
        raise OSError(
            f"Could not load the Keras ImageNet weights of {KERAS_IMAGENET_WEIGHTS[depth]} through "
            f"keras.utils.get_file ({type(e).__name__}: {e}). On an offline machine, copy the file "
            f"(resnet{depth}v2_weights_tf_dim_ordering_tf_kernels{'' if include_top else '_notop'}.h5 "
            f"from keras-applications' releases) into {cache} and retry."
        ) from e
    finally:
        socket.setdefaulttimeout(previous)


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
    **unit_options,
):
    """An ImageNet pre-activation ResNet with keras.applications' argument semantics.

    ``weights``: ``None``, ``"imagenet"`` (Keras' published ResNetV2 weights, depth 50/101/152; the
    model then uses ``layout="tf_slim"`` and expects ``preprocess_input``'s [-1, 1] pixels), or a path
    to a weights file. ``layout``: ``"fb"`` (default without ImageNet weights) or ``"tf_slim"``.
    ``remat``: rematerialisation of the residual units in training (``None``, ``"units"``,
    ``"stages"``, ``"segments:<k>"``; see ``PreActResNetBackbone``); any weights load with any value.
    """
    opt.check_choice("layout", layout, (None, *LAYOUTS))
    _check_weights(weights, depth, layout, include_top, classes, unit_options)
    input_shape = _input_shape(input_shape, input_tensor, include_top, weights)
    layout = layout or ("tf_slim" if weights == "imagenet" else "fb")
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
        **unit_options,
    )
    if weights == "imagenet":
        source = _keras_imagenet_source(depth, include_top, input_shape)
        model.set_weights(from_keras_applications(source).get_weights())
    elif weights is not None:
        model.load_weights(weights)
    return model


def _entry_point(model_name):
    """``PreActResNet{depth}`` from the registered ``imagenet_resnet{depth}``."""
    spec = model_spec(model_name)
    depth = spec.arguments["depth"]
    builder = functools.partial(preact_resnet, depth)
    builder.__name__ = builder.__qualname__ = f"PreActResNet{depth}"
    builder.__doc__ = (
        f"Pre-activation ResNet-{depth} ({spec.paper}; fb.resnet.torch layout), keras.applications "
        f"semantics; input {spec.input_config.input_size}. See ``preact_resnet`` for the arguments."
    )
    return builder


def entry_points():
    """``{"PreActResNet{depth}": function}`` for every registered ImageNet network of a plain depth."""
    found = {}
    for name in list_models("imagenet_resnet*"):
        arguments = model_spec(name).arguments
        if set(arguments) == {"depth"}:
            found[f"PreActResNet{arguments['depth']}"] = _entry_point(name)
    return found


APPLICATIONS = entry_points()
globals().update(APPLICATIONS)  # PreActResNet18 ... PreActResNet200, from the registry


def preprocess_input(x):
    """Pixels in [0, 255] to [-1, 1], the input of Keras' ResNetV2 ImageNet weights."""
    return keras.applications.resnet_v2.preprocess_input(x)
