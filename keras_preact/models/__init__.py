"""Networks: ``PreActResNetBackbone`` (headless, ``pyramid_outputs``), ``PreActResNetClassifier``, the
CIFAR 6n+2 / 9n+2 / 3n+2 and ImageNet 18-200 builders, and the registry of named networks.

Every registered network is also a function of this module, ``cifar_resnet20(num_classes=10)``,
``create_model`` bound to its name: the registry is the only list (``presets.MODEL_PRESETS``, and any
``register_model`` call, whose network is a function here from then on)."""

from keras_preact.models.backbone import PreActResNetBackbone
from keras_preact.models.cifar import CIFAR_DEPTHS, cifar_resnet
from keras_preact.models.classifier import PreActResNetClassifier
from keras_preact.models.imagenet import IMAGENET_DEPTHS, LAYOUTS, imagenet_resnet
from keras_preact.models.registry import (
    ModelSpec,
    create_model,
    get_input_config,
    list_models,
    model_function,
    model_spec,
    register_model,
)

__all__ = [
    "CIFAR_DEPTHS",
    "IMAGENET_DEPTHS",
    "LAYOUTS",
    "ModelSpec",
    "PreActResNetBackbone",
    "PreActResNetClassifier",
    "cifar_resnet",
    "create_model",
    "get_input_config",
    "imagenet_resnet",
    "list_models",
    "model_function",
    "model_spec",
    "register_model",
]
__all__ += list_models()  # the registered networks' functions (__getattr__ below)


def __getattr__(name):
    """A registered network's function (PEP 562): ``keras_preact.models.cifar_resnet20``."""
    if name in list_models():
        return model_function(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(list_models()))
