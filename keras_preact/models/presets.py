"""The package's named networks as data: builder arguments, input config, paper reference, trained weights.

One entry per network (timm's ``default_cfgs``, keras-hub's presets); ``registry`` registers them and
``create_model(name)`` builds them. ``FAMILY_INPUTS`` is each family's input config, the one every builder's
classifier carries by default.

Trained weights are an entry's ``weights`` mapping (``CIFAR_WEIGHTS``), added in the same change as their
file in ``keras_preact/weights/``.
"""

from keras_preact.preprocessing import InputConfig

# fb.resnet.torch datasets/cifar10.lua and datasets/imagenet.lua statistics, in 0-255 pixel units.
CIFAR_INPUT = InputConfig(
    input_size=(32, 32, 3), mean=(125.3, 123.0, 113.9), std=(63.0, 62.1, 66.7), crop_fraction=1.0
)
IMAGENET_INPUT = InputConfig()  # InputConfig's defaults are ImageNet's: 224, these statistics, the centre crop
# Each family's input: its pixel statistics and evaluation crop (CIFAR the whole image, ImageNet the centre
# 224 of 256). Training's normalizations and a run's served input config read them from here.
FAMILY_INPUTS = {"cifar": CIFAR_INPUT, "imagenet": IMAGENET_INPUT}

CIFAR_PAPER = {
    20: "Sec. 4 (fb.resnet.torch preresnet.lua)",
    32: "Sec. 4 (fb.resnet.torch preresnet.lua)",
    44: "Sec. 4 (fb.resnet.torch preresnet.lua)",
    56: "Sec. 4 (fb.resnet.torch preresnet.lua)",
    110: "Tables 1-3",
    164: "Tables 2-3",
    1001: "Tables 3-4",
    1202: "Sec. 4 (original ResNet paper's deepest CIFAR net)",
}
IMAGENET_PAPER = {18: "Sec. 4 (fb.resnet.torch)", 34: "Sec. 4 (fb.resnet.torch)", 50: "Sec. 4 (fb.resnet.torch)",
                  101: "Sec. 4.1", 152: "Table 5", 200: "Table 5"}

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
# Trained weights in keras_preact/weights/, written by `python -m keras_preact_training.publish RUN --model NAME --weights W`;
# top1/top5: keras-preact-evaluate on the 10,000 test images of the CIFAR-10 JPEG folder (REPRODUCTION.md).
CIFAR_WEIGHTS = {
    20: {"cifar10": dict(file="cifar_resnet20_cifar10.weights.h5", class_names=CIFAR10_CLASSES,
                         sha256="0ffb1d756a089e68949d733fbea448c93fd26adf36a68f097201964645dc8dc1",
                         dataset="CIFAR-10 as JPEG q75 (../shared/data/cifar10-jpeg.tar.gz)", top1=0.8715, top5=0.9952,
                         source="keras-preact-train --preset cifar10-folder-resnet20-paper (64,000 iterations; JAX "
                                "on one H100, seed 0; reproduction/cifar10-preact-resnet20-paper/)")},
}

# Test suites check every network at a small input; the deepest ones only under their slow marker.
CIFAR_TEST = dict(test_input_size=(16, 16, 3))
IMAGENET_TEST = dict(test_input_size=(64, 64, 3))
SLOW_FROM_DEPTH = {"cifar": 1001, "imagenet": 101}

MODEL_PRESETS = {
    **{
        f"cifar_resnet{depth}": dict(family="cifar", arguments={"depth": depth}, input_config=CIFAR_INPUT,
                                     paper=paper, slow=depth >= SLOW_FROM_DEPTH["cifar"],
                                     weights=CIFAR_WEIGHTS.get(depth), **CIFAR_TEST)
        for depth, paper in CIFAR_PAPER.items()
    },
    # Table 3's "ResNet-110 (1-layer skip)": 108 units of a single 3x3 conv.
    "cifar_resnet110_1layer": dict(
        family="cifar", arguments={"depth": 110, "block": "one_layer"}, input_config=CIFAR_INPUT, paper="Table 3",
        **CIFAR_TEST,
    ),
    **{
        f"imagenet_resnet{depth}": dict(family="imagenet", arguments={"depth": depth}, input_config=IMAGENET_INPUT,
                                        paper=paper, slow=depth >= SLOW_FROM_DEPTH["imagenet"], **IMAGENET_TEST)
        for depth, paper in IMAGENET_PAPER.items()
    },
}
