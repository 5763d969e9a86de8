"""Every published checkpoint in the registry says its licence, published accuracy and input config, the input
config in its source library's arithmetic (torchvision's for timm, Keras' for keras.applications and keras-hub)."""

import pytest

from keras_preact.models import list_models, model_spec
from keras_preact.models.presets import KERAS_HUB_RESNET_V2_INPUT
from keras_preact.preprocessing import InputConfig, input_config_from_image_converter

pytestmark = [pytest.mark.core, pytest.mark.notf, pytest.mark.any_backend]
CROP_MODES = {"timm": "torchvision", "keras": "keras", "keras_hub": "keras", "package": "torchvision"}


def published():
    for name in list_models(pretrained=True):
        network, weights = name.split(".")
        yield name, model_spec(network).weights[weights]


def test_every_published_checkpoint_carries_licence_top1_and_input_config():
    names = []
    for name, spec in published():
        names.append(name)
        assert spec.licence in ("Apache-2.0",), name
        assert isinstance(spec.input_config, InputConfig), name
        assert spec.input_config.crop_mode == CROP_MODES[spec.origin], name
        if spec.num_classes == 21843:  # ImageNet-21k heads: no ImageNet-1k accuracy is published
            assert spec.top1 is None, name
        else:
            assert 0.5 < spec.top1 < 1 and spec.top1 < spec.top5 < 1, name
    assert {"cifar_resnet20.cifar10", "imagenet_resnet50.keras_hub_imagenet",
            "imagenet_resnet101.keras_hub_imagenet"} <= set(names)


def test_the_keras_hub_entries_are_their_image_converters():
    """keras-hub's timm loader makes ResNetImageConverter(image_size=224, scale=1 / (255 * 0.5), offset=-1,
    interpolation="bicubic") of resnetv2_50.a1h_in1k's pretrained_cfg, with ImageConverter's defaults."""
    converter = {"image_size": [224, 224], "scale": [1 / 255 / 0.5] * 3, "offset": [-0.5 / 0.5] * 3,
                 "interpolation": "bicubic", "antialias": False, "crop_to_aspect_ratio": True,
                 "pad_to_aspect_ratio": False}
    config = input_config_from_image_converter(converter, InputConfig())
    assert config == KERAS_HUB_RESNET_V2_INPUT
    for depth in (50, 101):
        assert model_spec(f"imagenet_resnet{depth}").weights["keras_hub_imagenet"].input_config == config
    with pytest.raises(ValueError, match="pad_to_aspect_ratio=True or crop_to_aspect_ratio=False"):
        input_config_from_image_converter({**converter, "crop_to_aspect_ratio": False}, InputConfig())
    with pytest.raises(ValueError, match="scale="):
        input_config_from_image_converter({**converter, "scale": 0.0}, InputConfig())
