"""Keras-Applications-style entry points and conversion from keras.applications ResNetV2.

``PreActResNet{depth}`` exists for every registered ``imagenet_resnet{depth}`` (18, 34, 50, 101, 152, 200)."""

from keras_preact.applications.convert import from_keras_applications
from keras_preact.applications.preact_resnet import (
    APPLICATIONS,
    KERAS_IMAGENET_WEIGHTS,
    preact_resnet,
    preprocess_input,
)

globals().update(APPLICATIONS)

__all__ = [
    "KERAS_IMAGENET_WEIGHTS",
    "from_keras_applications",
    "preact_resnet",
    "preprocess_input",
    *APPLICATIONS,
]
