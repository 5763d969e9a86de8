"""Networks: ``PreActResNetBackbone`` (headless, ``pyramid_outputs``), ``PreActResNetClassifier``, the
CIFAR 6n+2 / 9n+2 / 3n+2 and ImageNet 18-200 builders, and the registry of named networks."""

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

# One helper per registered network, e.g. cifar_resnet20(num_classes=10).
cifar_resnet20 = model_function("cifar_resnet20")
cifar_resnet32 = model_function("cifar_resnet32")
cifar_resnet44 = model_function("cifar_resnet44")
cifar_resnet56 = model_function("cifar_resnet56")
cifar_resnet110 = model_function("cifar_resnet110")
cifar_resnet110_1layer = model_function("cifar_resnet110_1layer")
cifar_resnet164 = model_function("cifar_resnet164")
cifar_resnet1001 = model_function("cifar_resnet1001")
cifar_resnet1202 = model_function("cifar_resnet1202")
imagenet_resnet18 = model_function("imagenet_resnet18")
imagenet_resnet34 = model_function("imagenet_resnet34")
imagenet_resnet50 = model_function("imagenet_resnet50")
imagenet_resnet101 = model_function("imagenet_resnet101")
imagenet_resnet152 = model_function("imagenet_resnet152")
imagenet_resnet200 = model_function("imagenet_resnet200")

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
    "cifar_resnet20",
    "cifar_resnet32",
    "cifar_resnet44",
    "cifar_resnet56",
    "cifar_resnet110",
    "cifar_resnet110_1layer",
    "cifar_resnet164",
    "cifar_resnet1001",
    "cifar_resnet1202",
    "imagenet_resnet18",
    "imagenet_resnet34",
    "imagenet_resnet50",
    "imagenet_resnet101",
    "imagenet_resnet152",
    "imagenet_resnet200",
]
