"""Every named network of the package, so tools (and tests) can enumerate them."""

import functools

from keras_preact.models.cifar import CIFAR_DEPTHS, cifar_resnet
from keras_preact.models.imagenet import IMAGENET_DEPTHS, imagenet_resnet

MODELS = {
    **{f"cifar_resnet{d}": functools.partial(cifar_resnet, d) for d in CIFAR_DEPTHS},
    **{f"imagenet_resnet{d}": functools.partial(imagenet_resnet, d) for d in IMAGENET_DEPTHS},
}


def list_models():
    """Names accepted by ``create_model``."""
    return sorted(MODELS)


def create_model(name, **kwargs):
    """Build a named network, e.g. ``create_model("cifar_resnet164", num_classes=100)``."""
    if name not in MODELS:
        raise ValueError(f"Unknown model name={name!r}. Available: {', '.join(list_models())}.")
    return MODELS[name](**kwargs)
