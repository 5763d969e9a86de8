"""Networks: ``PreActResNetBackbone`` (headless, ``pyramid_outputs``), ``PreActResNetClassifier``, the
CIFAR 6n+2 / 9n+2 / 3n+2 and ImageNet 18-200 builders, and the registry of named networks (He et al.
2016, "Identity Mappings in Deep Residual Networks").

A registered network is built by name, ``create_model("cifar_resnet20", num_classes=100)``: its family
builder (``cifar_resnet``/``imagenet_resnet``) with the registered arguments. Every path (the registry,
the builders, the backbone and classifier classes, ``keras_preact.applications``) gives the same model
for the same arguments, its input config and class names included.

Examples:
    >>> from keras_preact.models import PreActResNetClassifier, cifar_resnet, create_model
    >>> a = create_model("cifar_resnet20", num_classes=100)
    >>> b = cifar_resnet(20, num_classes=100)
    >>> c = PreActResNetClassifier(cifar_resnet(20, include_top=False), 100)
    >>> a.input_config == b.input_config == c.input_config, a.count_params() == b.count_params() == c.count_params()
    (True, True)
"""

from keras_preact.models.backbone import PreActResNetBackbone
from keras_preact.models.cifar import CIFAR_DEPTHS, cifar_resnet
from keras_preact.models.class_names import imagenet_class_names
from keras_preact.models.classifier import PreActResNetClassifier
from keras_preact.models.finetune import set_trainable
from keras_preact.models.imagenet import IMAGENET_DEPTHS, LAYOUTS, imagenet_resnet
from keras_preact.models.registry import (
    ModelSpec,
    create_model,
    get_input_config,
    list_models,
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
    "imagenet_class_names",
    "imagenet_resnet",
    "list_models",
    "model_spec",
    "register_model",
    "set_trainable",
]
