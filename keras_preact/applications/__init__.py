"""Keras-Applications-style entry points, ``PreActResNet18`` ... ``PreActResNet200`` (He et al. 2016), their
``preprocess_input``/``decode_predictions`` (from the model's own input config and class names), and
conversion from keras.applications ResNetV2.

Examples:
    >>> from keras_preact.applications import PreActResNet18, preprocess_input
    >>> model = PreActResNet18(classes=10)  # imagenet_resnet(18, num_classes=10)
    >>> model.input_config.resize_size, model.input_config.crop_size  # evaluated on the centre 224 of 256
    (256, (224, 224))
    >>> preprocess_input([[[[123.675, 116.28, 103.53]]]], model).tolist()  # its mean and std, not [-1, 1]
    [[[[0.0, 0.0, 0.0]]]]
"""

from keras_preact.applications.preact_resnet import (
    KERAS_IMAGENET_WEIGHTS,
    PreActResNet18,
    PreActResNet34,
    PreActResNet50,
    PreActResNet101,
    PreActResNet152,
    PreActResNet200,
    preact_resnet,
)
from keras_preact.applications.processing import decode_predictions, preprocess_input, preprocess_input_resnet_v2
from keras_preact.pretrained.convert_keras import from_keras_applications

__all__ = [
    "KERAS_IMAGENET_WEIGHTS",
    "PreActResNet18",
    "PreActResNet34",
    "PreActResNet50",
    "PreActResNet101",
    "PreActResNet152",
    "PreActResNet200",
    "decode_predictions",
    "from_keras_applications",
    "preact_resnet",
    "preprocess_input",
    "preprocess_input_resnet_v2",
]
