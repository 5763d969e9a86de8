"""Model builders: CIFAR 6n+2 / 9n+2 nets and ImageNet 18-200 nets (return ``keras.Model``)."""

from keras_preact.models.cifar import (
    CIFAR_DEPTHS,
    cifar_resnet,
    cifar_resnet20,
    cifar_resnet32,
    cifar_resnet44,
    cifar_resnet56,
    cifar_resnet110,
    cifar_resnet164,
    cifar_resnet1001,
    cifar_resnet1202,
)
from keras_preact.models.imagenet import IMAGENET_DEPTHS, LAYOUTS, imagenet_resnet
from keras_preact.models.registry import MODELS, create_model, list_models

__all__ = [
    "CIFAR_DEPTHS",
    "IMAGENET_DEPTHS",
    "LAYOUTS",
    "cifar_resnet",
    "cifar_resnet20",
    "cifar_resnet32",
    "cifar_resnet44",
    "cifar_resnet56",
    "cifar_resnet110",
    "cifar_resnet164",
    "cifar_resnet1001",
    "cifar_resnet1202",
    "imagenet_resnet",
    "MODELS",
    "create_model",
    "list_models",
]
