"""The package's named networks as data: builder arguments, input config, paper reference, trained weights.

One entry per network (timm's ``default_cfgs``, keras-hub's presets); ``registry`` registers them and
``create_model(name)`` builds them. ``FAMILY_INPUTS`` is each family's input config, the one every builder's
classifier carries by default.

Trained weights are an entry's ``weights`` mapping (``CIFAR_WEIGHTS``), added in the same change as their
file in ``keras_preact/weights/``.
"""

from keras_preact.models.class_names import IMAGENET1K_CLASSES
from keras_preact.preprocessing import InputConfig, timm_crop_fraction

# fb.resnet.torch datasets/cifar10.lua and datasets/imagenet.lua statistics, in 0-255 pixel units.
CIFAR_INPUT = InputConfig(
    input_size=(32, 32, 3), mean=(125.3, 123.0, 113.9), std=(63.0, 62.1, 66.7), crop_fraction=1.0
)
IMAGENET_INPUT = InputConfig()  # InputConfig's defaults are ImageNet's: 224, these statistics, the centre crop
# Each family's input: its pixel statistics and evaluation crop (CIFAR the whole image, ImageNet the centre
# 224 of 256). Training's normalizations and a run's served input config read them from here.
# Keyed by the backbone's stem (``imagenet_edge_pool``: the ImageNet stem of timm's layout).
FAMILY_INPUTS = {"cifar": CIFAR_INPUT, "imagenet": IMAGENET_INPUT, "imagenet_edge_pool": IMAGENET_INPUT}

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
# Trained weights in keras_preact/weights/, written by `python -m keras_preact_training.publish RUN --model NAME
# --weights W`; top1/top5: keras-preact-evaluate on the 10,000 test images of the CIFAR-10 JPEG folder
# (REPRODUCTION.md).
CIFAR_WEIGHTS = {
    20: {
        "cifar10": dict(
            file="cifar_resnet20_cifar10.weights.h5",
            class_names=CIFAR10_CLASSES,
            sha256="0ffb1d756a089e68949d733fbea448c93fd26adf36a68f097201964645dc8dc1",
            dataset="CIFAR-10 as JPEG q75 (cifar10-jpeg.tar.gz, sha256 efac85c8ed52f4ea...)",
            top1=0.8715,
            top5=0.9952,
            # This project's own run: its licence (pyproject.toml), its input (the whole 32 x 32 image, CIFAR_INPUT).
            licence="Apache-2.0",
            input_config=CIFAR_INPUT,
            source="keras-preact-train --preset cifar10-folder-resnet20-paper (64,000 iterations; JAX "
            "on one H100, seed 0; reproduction/cifar10-preact-resnet20-paper/)",
        )
    },
}

# Published ImageNet checkpoints of the pre-activation networks (``origin``: the ecosystem whose loader fetches
# them, ``keras_preact.pretrained.sources``). Each entry names the architecture it needs (``arguments``: the layout of
# imagenet_resnet), its preprocessing, licence and published accuracy (fractions; None where the source
# publishes none). Class names: the ImageNet-1k heads carry the 1,000 shipped names (class_names.IMAGENET1K_CLASSES,
# read on first use); the ImageNet-21k heads (21,843 classes) carry none: no names list of them is shipped.
# keras.applications ResNetV2: [-1, 1] pixels (resnet_v2.preprocess_input, mode "tf"), the standard crop in Keras'
# arithmetic (Resizing(crop_to_aspect_ratio=True) to 256, CenterCrop 224); accuracy from keras.io/api/applications.
KERAS_RESNET_V2_INPUT = IMAGENET_INPUT.replace(mean=(127.5, 127.5, 127.5), std=(127.5, 127.5, 127.5),
                                               crop_mode="keras")
# keras-hub's resnet_v2_{50,101}_imagenet presets are timm's resnetv2_{50,101}.a1h_in1k converted by keras-hub
# (tools/checkpoint_conversion/convert_resnet_checkpoints.py, PRESET_MAP). Their ResNetImageConverter is what
# keras-hub's timm loader (utils/timm/preset_loader.py, load_image_converter) makes of timm's pretrained_cfg: image_size
# 224, scale 1 / (255 * 0.5) and offset -1 (mean and std 127.5), interpolation bicubic, and ImageConverter's defaults
# crop_to_aspect_ratio=True, antialias=False: the centred square resized to 224 (crop_fraction 1.0, Keras'
# arithmetic). keras-hub publishes no accuracy (its presets' model card is arXiv 2110.00476); their top1/top5 are
# timm's for the same weights, measured through timm's view (results-imagenet.csv), not through this one.
KERAS_HUB_RESNET_V2_INPUT = InputConfig(mean=(127.5, 127.5, 127.5), std=(127.5, 127.5, 127.5), crop_fraction=1.0,
                                        interpolation="bicubic", crop_mode="keras", antialias=False)
# timm's resnetv2 cfgs (timm/models/resnetv2.py default_cfgs: a1h bicubic crop_pct 0.95, ra4 bicubic 0.9, BiT-M
# in21k _cfg's bilinear 0.875, BiT-M in21k_ft_in1k 448 x 448 at crop_pct 1.0, none with crop_mode "squash"):
# IMAGENET_INCEPTION_MEAN/STD (0.5, in 0-255 units 127.5); the resize to timm's
# floor(size / crop_pct) (timm_crop_fraction) in torchvision's arithmetic (crop_mode "torchvision", InputConfig's
# default: timm's eval transform is torchvision's Resize and CenterCrop, PIL's antialiased resize); accuracy from
# timm's results/results-imagenet.csv at that size. The ImageNet-21k heads have no published ImageNet-1k accuracy
# (top1 None).
TIMM_A1H_INPUT = InputConfig(mean=(127.5, 127.5, 127.5), std=(127.5, 127.5, 127.5),
                             crop_fraction=timm_crop_fraction(224, 0.95), interpolation="bicubic")
TIMM_RA4_INPUT = InputConfig(mean=(127.5, 127.5, 127.5), std=(127.5, 127.5, 127.5),
                             crop_fraction=timm_crop_fraction(224, 0.9), interpolation="bicubic")
TIMM_BIT_IN21K_INPUT = InputConfig(mean=(127.5, 127.5, 127.5), std=(127.5, 127.5, 127.5), crop_fraction=0.875)
TIMM_BIT_448_INPUT = InputConfig(input_size=(448, 448, 3), mean=(127.5, 127.5, 127.5), std=(127.5, 127.5, 127.5),
                                 crop_fraction=1.0)
KERAS_URL = "https://storage.googleapis.com/tensorflow/keras-applications/resnet/"
IMAGENET1K_HEAD = dict(num_classes=1000, class_names=IMAGENET1K_CLASSES)  # an ImageNet-1k checkpoint's head

IMAGENET_RESNET18_WEIGHTS = {
    "timm_ra4_in1k": dict(
        origin="timm",
        checkpoint="timm/resnetv2_18.ra4_e3600_r224_in1k",
        **IMAGENET1K_HEAD,
        arguments={"layout": "timm"},
        input_config=TIMM_RA4_INPUT,
        licence="Apache-2.0",
        dataset="ImageNet-1k",
        top1=0.73572,
        top5=0.91356,
        source="timm resnetv2_18.ra4_e3600_r224_in1k",
    ),
}
IMAGENET_RESNET34_WEIGHTS = {
    "timm_ra4_in1k": dict(
        origin="timm",
        checkpoint="timm/resnetv2_34.ra4_e3600_r224_in1k",
        **IMAGENET1K_HEAD,
        arguments={"layout": "timm"},
        input_config=TIMM_RA4_INPUT,
        licence="Apache-2.0",
        dataset="ImageNet-1k",
        top1=0.77626,
        top5=0.93518,
        source="timm resnetv2_34.ra4_e3600_r224_in1k",
    ),
}
IMAGENET_RESNET50_WEIGHTS = {
    "imagenet": dict(
        origin="keras",
        checkpoint="resnet50v2_weights_tf_dim_ordering_tf_kernels.h5",
        checksum="md5:3ef43a0b657b3be2300d5770ece849e0",
        **IMAGENET1K_HEAD,
        arguments={"layout": "tf_slim"},
        input_config=KERAS_RESNET_V2_INPUT,
        licence="Apache-2.0",
        dataset="ImageNet-1k",
        top1=0.760,
        top5=0.930,
        source=f"keras.applications.ResNet50V2(weights='imagenet'), {KERAS_URL}",
    ),
    "timm_a1h_in1k": dict(
        origin="timm",
        checkpoint="timm/resnetv2_50.a1h_in1k",
        **IMAGENET1K_HEAD,
        arguments={"layout": "timm"},
        input_config=TIMM_A1H_INPUT,
        licence="Apache-2.0",
        dataset="ImageNet-1k",
        top1=0.80410,
        top5=0.95082,
        source="timm resnetv2_50.a1h_in1k",
    ),
    "timm_bit_in21k": dict(
        origin="timm",
        checkpoint="timm/resnetv2_50x1_bit.goog_in21k",
        num_classes=21843,
        arguments={"layout": "bit"},
        input_config=TIMM_BIT_IN21K_INPUT,
        licence="Apache-2.0",
        dataset="ImageNet-21k",
        top1=None,  # a 21,843-class head: no ImageNet-1k accuracy is published
        source="timm resnetv2_50x1_bit.goog_in21k (Big Transfer, BiT-M)",
    ),
    "timm_bit_in21k_ft_in1k": dict(
        origin="timm",
        checkpoint="timm/resnetv2_50x1_bit.goog_in21k_ft_in1k",
        **IMAGENET1K_HEAD,
        arguments={"layout": "bit"},
        input_config=TIMM_BIT_448_INPUT,
        licence="Apache-2.0",
        dataset="ImageNet-21k, fine-tuned on ImageNet-1k at 448",
        top1=0.80386,
        top5=0.95694,
        source="timm resnetv2_50x1_bit.goog_in21k_ft_in1k",
    ),
    "keras_hub_imagenet": dict(
        origin="keras_hub",
        checkpoint="kaggle://keras/resnetv2/keras/resnet_v2_50_imagenet/3",
        **IMAGENET1K_HEAD,
        arguments={"layout": "timm"},
        input_config=KERAS_HUB_RESNET_V2_INPUT,
        licence="Apache-2.0",
        dataset="ImageNet-1k",
        top1=0.80410,  # timm resnetv2_50.a1h_in1k's (the same weights), at timm's view
        top5=0.95082,
        source="keras-hub preset resnet_v2_50_imagenet",
    ),
}
IMAGENET_RESNET101_WEIGHTS = {
    "imagenet": dict(
        origin="keras",
        checkpoint="resnet101v2_weights_tf_dim_ordering_tf_kernels.h5",
        checksum="md5:6343647c601c52e1368623803854d971",
        **IMAGENET1K_HEAD,
        arguments={"layout": "tf_slim"},
        input_config=KERAS_RESNET_V2_INPUT,
        licence="Apache-2.0",
        dataset="ImageNet-1k",
        top1=0.772,
        top5=0.938,
        source=f"keras.applications.ResNet101V2(weights='imagenet'), {KERAS_URL}",
    ),
    "timm_a1h_in1k": dict(
        origin="timm",
        checkpoint="timm/resnetv2_101.a1h_in1k",
        **IMAGENET1K_HEAD,
        arguments={"layout": "timm"},
        input_config=TIMM_A1H_INPUT,
        licence="Apache-2.0",
        dataset="ImageNet-1k",
        top1=0.82042,
        top5=0.95866,
        source="timm resnetv2_101.a1h_in1k",
    ),
    "timm_bit_in21k": dict(
        origin="timm",
        checkpoint="timm/resnetv2_101x1_bit.goog_in21k",
        num_classes=21843,
        arguments={"layout": "bit"},
        input_config=TIMM_BIT_IN21K_INPUT,
        licence="Apache-2.0",
        dataset="ImageNet-21k",
        top1=None,  # a 21,843-class head: no ImageNet-1k accuracy is published
        source="timm resnetv2_101x1_bit.goog_in21k (Big Transfer, BiT-M)",
    ),
    "timm_bit_in21k_ft_in1k": dict(
        origin="timm",
        checkpoint="timm/resnetv2_101x1_bit.goog_in21k_ft_in1k",
        **IMAGENET1K_HEAD,
        arguments={"layout": "bit"},
        input_config=TIMM_BIT_448_INPUT,
        licence="Apache-2.0",
        dataset="ImageNet-21k, fine-tuned on ImageNet-1k at 448",
        top1=0.82332,
        top5=0.96524,
        source="timm resnetv2_101x1_bit.goog_in21k_ft_in1k",
    ),
    "keras_hub_imagenet": dict(
        origin="keras_hub",
        checkpoint="kaggle://keras/resnetv2/keras/resnet_v2_101_imagenet/3",
        **IMAGENET1K_HEAD,
        arguments={"layout": "timm"},
        input_config=KERAS_HUB_RESNET_V2_INPUT,
        licence="Apache-2.0",
        dataset="ImageNet-1k",
        top1=0.82042,  # timm resnetv2_101.a1h_in1k's (the same weights), at timm's view
        top5=0.95866,
        source="keras-hub preset resnet_v2_101_imagenet",
    ),
}
IMAGENET_RESNET152_WEIGHTS = {
    "imagenet": dict(
        origin="keras",
        checkpoint="resnet152v2_weights_tf_dim_ordering_tf_kernels.h5",
        checksum="md5:a49b44d1979771252814e80f8ec446f9",
        **IMAGENET1K_HEAD,
        arguments={"layout": "tf_slim"},
        input_config=KERAS_RESNET_V2_INPUT,
        licence="Apache-2.0",
        dataset="ImageNet-1k",
        top1=0.780,
        top5=0.942,
        source=f"keras.applications.ResNet152V2(weights='imagenet'), {KERAS_URL}",
    ),
}
IMAGENET_WEIGHTS = {18: IMAGENET_RESNET18_WEIGHTS, 34: IMAGENET_RESNET34_WEIGHTS, 50: IMAGENET_RESNET50_WEIGHTS,
                    101: IMAGENET_RESNET101_WEIGHTS, 152: IMAGENET_RESNET152_WEIGHTS}

# One function per family fills the fields its networks share; test suites check every network at a small input
# (16x16 CIFAR, 64x64 ImageNet), the deepest ones (``slow``) only under their slow marker.
def _cifar(arguments, paper, *, slow=False, weights=None):
    return dict(family="cifar", arguments=arguments, input_config=CIFAR_INPUT, paper=paper, slow=slow,
                weights=weights, test_input_size=(16, 16, 3))


def _imagenet(arguments, paper, *, slow=False, weights=None):
    return dict(family="imagenet", arguments=arguments, input_config=IMAGENET_INPUT, paper=paper, slow=slow,
                weights=weights, test_input_size=(64, 64, 3))


# Each registered network: its builder arguments, where the paper (or fb.resnet.torch) uses it, its trained weights.
MODEL_PRESETS = {
    "cifar_resnet20": _cifar({"depth": 20}, "Sec. 4 (fb.resnet.torch preresnet.lua)", weights=CIFAR_WEIGHTS[20]),
    "cifar_resnet32": _cifar({"depth": 32}, "Sec. 4 (fb.resnet.torch preresnet.lua)"),
    "cifar_resnet44": _cifar({"depth": 44}, "Sec. 4 (fb.resnet.torch preresnet.lua)"),
    "cifar_resnet56": _cifar({"depth": 56}, "Sec. 4 (fb.resnet.torch preresnet.lua)"),
    "cifar_resnet110": _cifar({"depth": 110}, "Tables 1-3"),
    "cifar_resnet164": _cifar({"depth": 164}, "Tables 2-3"),
    "cifar_resnet1001": _cifar({"depth": 1001}, "Tables 3-4", slow=True),
    "cifar_resnet1202": _cifar({"depth": 1202}, "Sec. 4 (original ResNet paper's deepest CIFAR net)", slow=True),
    # Table 3's "ResNet-110 (1-layer skip)": 108 units of a single 3x3 conv.
    "cifar_resnet110_1layer": _cifar({"depth": 110, "block": "one_layer"}, "Table 3"),
    "imagenet_resnet18": _imagenet({"depth": 18}, "Sec. 4 (fb.resnet.torch)", weights=IMAGENET_WEIGHTS[18]),
    "imagenet_resnet34": _imagenet({"depth": 34}, "Sec. 4 (fb.resnet.torch)", weights=IMAGENET_WEIGHTS[34]),
    "imagenet_resnet50": _imagenet({"depth": 50}, "Sec. 4 (fb.resnet.torch)", weights=IMAGENET_WEIGHTS[50]),
    "imagenet_resnet101": _imagenet({"depth": 101}, "Sec. 4.1", slow=True, weights=IMAGENET_WEIGHTS[101]),
    "imagenet_resnet152": _imagenet({"depth": 152}, "Table 5", slow=True, weights=IMAGENET_WEIGHTS[152]),
    "imagenet_resnet200": _imagenet({"depth": 200}, "Table 5", slow=True),
}
