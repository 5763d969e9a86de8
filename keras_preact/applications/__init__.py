"""Keras-Applications-style entry points and conversion from keras.applications ResNetV2."""

from keras_preact.applications.convert import from_keras_applications
from keras_preact.applications.preact_resnet import (
    KERAS_IMAGENET_WEIGHTS,
    PreActResNet18,
    PreActResNet34,
    PreActResNet50,
    PreActResNet101,
    PreActResNet152,
    PreActResNet200,
    preact_resnet,
    preprocess_input,
)

__all__ = [
    "KERAS_IMAGENET_WEIGHTS",
    "PreActResNet18",
    "PreActResNet34",
    "PreActResNet50",
    "PreActResNet101",
    "PreActResNet152",
    "PreActResNet200",
    "from_keras_applications",
    "preact_resnet",
    "preprocess_input",
]
