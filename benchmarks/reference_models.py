"""Plain hand-written Keras pre-activation ResNets: the speed reference for ``core_speed.py``.

Flat functional builders in the style of ``keras.applications`` (Conv2D, BatchNormalization,
Activation, Add, ZeroPadding2D, MaxPooling2D; one Lambda for option A's zero channels) with exactly
the architecture that ``keras_preact.models.cifar_resnet(depth)`` and ``imagenet_resnet(depth)``
build with default options (paper Sec. 4-5 and Table 5; fb.resnet.torch ``preresnet.lua``,
``resnet-pre-act.lua``). No ``keras_preact`` import: this is the independent baseline.

Layer names follow the package's weight paths with ``_`` for ``/`` (``stage2_unit1_conv1`` holds
what ``stage2_unit1/conv1`` holds), so weights can be copied across by name.
"""

import keras
from keras import layers, ops

BN_EPSILON = 1e-5  # Torch's BN defaults, the official code's
BN_MOMENTUM = 0.9

# Blocks: output channels per stage. Bottleneck inner width is a quarter of the output.
CIFAR_WIDTHS = {"basic": (16, 32, 64), "bottleneck": (64, 128, 256)}
IMAGENET_WIDTHS = {"basic": (64, 128, 256, 512), "bottleneck": (256, 512, 1024, 2048)}
IMAGENET_STAGES = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
    200: ("bottleneck", (3, 24, 36, 3)),
}
CIFAR_BOTTLENECK_DEPTHS = (164, 1001)  # the paper's 9n+2 nets; other 6n+2 depths are basic


def he_normal_fan_out():
    """The official code's init: untruncated N(0, sqrt(2 / (k*k*filters_out)))."""
    return keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal")


def bn_relu(x, name):
    x = layers.BatchNormalization(epsilon=BN_EPSILON, momentum=BN_MOMENTUM, name=f"{name}_norm")(x)
    return layers.Activation("relu", name=f"{name}_act")(x)


def conv(x, filters, kernel_size, strides, name):
    """Conv without bias; a strided conv gets explicit symmetric padding (as Torch pads)."""
    if strides > 1 and kernel_size > 1:
        x = layers.ZeroPadding2D(kernel_size // 2, name=f"{name}_pad")(x)
    return layers.Conv2D(
        filters,
        kernel_size,
        strides=strides,
        padding="same" if strides == 1 else "valid",
        use_bias=False,
        kernel_initializer=he_normal_fan_out(),
        name=name,
    )(x)


def shortcut_path(x, preact, filters, strides, kind, name):
    """h(x): ``identity`` of the raw input, ``preact_identity`` of the pre-activated input,
    ``zero_pad`` (option A: 1x1 max-pool subsample + zero channels of the pre-activated input) or
    ``projection`` (option B: 1x1 conv of the pre-activated input)."""
    if kind == "identity":
        return x
    if kind == "preact_identity":
        return preact
    if kind == "projection":
        return conv(preact, filters, 1, strides, f"{name}_projection")
    y = layers.MaxPooling2D(1, strides, name=f"{name}_subsample")(preact) if strides > 1 else preact
    extra = filters - y.shape[-1]
    return layers.Lambda(
        lambda t: ops.pad(t, [[0, 0], [0, 0], [0, 0], [0, extra]]), name=f"{name}_zero_channels"
    )(y)


def basic_unit(x, filters, strides, shortcut, name, skip_preactivation=False):
    """BN-ReLU-conv3x3-BN-ReLU-conv3x3, add (paper Fig. 4e); the stride on the first conv."""
    preact = x if skip_preactivation else bn_relu(x, f"{name}_preact1")
    y = conv(preact, filters, 3, strides, f"{name}_conv1")
    y = bn_relu(y, f"{name}_preact2")
    y = conv(y, filters, 3, 1, f"{name}_conv2")
    return layers.Add(name=f"{name}_add")([shortcut_path(x, preact, filters, strides, shortcut, name), y])


def bottleneck_unit(x, filters, strides, shortcut, name, stride_on_first=False, skip_preactivation=False):
    """BN-ReLU-conv1x1-BN-ReLU-conv3x3-BN-ReLU-conv1x1, add; the stride on the 3x3 (fb.resnet.torch)
    or on the first 1x1 (``stride_on_first``, resnet-pre-act.lua)."""
    preact = x if skip_preactivation else bn_relu(x, f"{name}_preact1")
    y = conv(preact, filters // 4, 1, strides if stride_on_first else 1, f"{name}_conv1")
    y = bn_relu(y, f"{name}_preact2")
    y = conv(y, filters // 4, 3, 1 if stride_on_first else strides, f"{name}_conv2")
    y = bn_relu(y, f"{name}_preact3")
    y = conv(y, filters, 1, 1, f"{name}_conv3")
    return layers.Add(name=f"{name}_add")([shortcut_path(x, preact, filters, strides, shortcut, name), y])


def head(inputs, x, num_classes, name):
    x = bn_relu(x, "final")
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    x = layers.Dense(num_classes, name="logits")(x)
    x = layers.Activation("softmax", dtype="float32", name="predictions")(x)
    return keras.Model(inputs, x, name=name)


def cifar_block(depth):
    """(block, units per stage): 6n+2 basic, 9n+2 bottleneck (164 and 1001 are bottleneck)."""
    if depth > 2 and (depth - 2) % 6 == 0 and depth not in CIFAR_BOTTLENECK_DEPTHS:
        return "basic", (depth - 2) // 6
    if depth > 2 and (depth - 2) % 9 == 0:
        return "bottleneck", (depth - 2) // 9
    raise ValueError(f"Invalid depth={depth!r}: CIFAR nets have depth 6n+2 (basic) or 9n+2 (bottleneck).")


def cifar_preact_resnet(depth, num_classes=10, input_shape=(32, 32, 3)):
    """CIFAR pre-act ResNet: 3x3 stem conv, 3 stages of n units, BN-ReLU, pool, dense.

    Basic nets use option A shortcuts; bottleneck nets option B with the stride on the first 1x1.
    The first unit of each stage shares its pre-activation with the shortcut (official code).
    """
    block, units = cifar_block(depth)
    inputs = keras.Input(input_shape, name="images")
    x = conv(inputs, 16, 3, 1, "stem_conv")
    for s, filters in enumerate(CIFAR_WIDTHS[block]):
        for u in range(units):
            name = f"stage{s + 1}_unit{u + 1}"
            strides = 2 if s > 0 and u == 0 else 1
            if block == "basic":
                shortcut = "identity" if u else ("zero_pad" if s else "preact_identity")
                x = basic_unit(x, filters, strides, shortcut, name)
            else:
                shortcut = "identity" if u else "projection"
                x = bottleneck_unit(x, filters, strides, shortcut, name, stride_on_first=True)
    return head(inputs, x, num_classes, f"plain_preact_resnet{depth}_cifar")


def imagenet_preact_resnet(depth, num_classes=1000, input_shape=(224, 224, 3)):
    """ImageNet pre-act ResNet (fb.resnet.torch): 7x7/2 conv, BN-ReLU, 3x3/2 max-pool, 4 stages,
    BN-ReLU, pool, dense. Option B shortcuts, stride on the 3x3 of each stage's first unit; the
    very first unit skips its pre-activation (the stem ends in BN-ReLU)."""
    if depth not in IMAGENET_STAGES:
        raise ValueError(f"Invalid depth={depth!r}: one of {', '.join(map(str, IMAGENET_STAGES))}.")
    block, units = IMAGENET_STAGES[depth]
    unit = basic_unit if block == "basic" else bottleneck_unit
    inputs = keras.Input(input_shape, name="images")
    x = layers.ZeroPadding2D(3, name="stem_pad")(inputs)
    x = layers.Conv2D(
        64, 7, strides=2, use_bias=False, kernel_initializer=he_normal_fan_out(), name="stem_conv"
    )(x)
    x = bn_relu(x, "stem")
    x = layers.ZeroPadding2D(1, name="stem_pool_pad")(x)
    x = layers.MaxPooling2D(3, strides=2, name="stem_pool")(x)
    for s, (n, filters) in enumerate(zip(units, IMAGENET_WIDTHS[block])):
        for u in range(n):
            name = f"stage{s + 1}_unit{u + 1}"
            first = s == 0 and u == 0
            projects = u == 0 and x.shape[-1] != filters
            x = unit(
                x,
                filters,
                2 if s > 0 and u == 0 else 1,
                "projection" if projects else "identity",
                name,
                skip_preactivation=first,
            )
    return head(inputs, x, num_classes, f"plain_preact_resnet{depth}")


def copy_weights_by_path(source, target):
    """Assign every weight of a ``keras_preact`` model to the same-named weight of its reference
    (``stage1_unit1/conv1/kernel`` -> ``stage1_unit1_conv1/kernel``); both must have the same set
    of names and shapes, else ValueError."""
    targets = {w.path: w for w in target.weights}
    for w in source.weights:
        owner, leaf = w.path.rsplit("/", 1)
        path = f"{owner.replace('/', '_')}/{leaf}"
        if path not in targets:
            raise ValueError(f"{target.name} has no weight {path!r} for {source.name}'s {w.path!r}.")
        if tuple(targets[path].shape) != tuple(w.shape):
            raise ValueError(
                f"{target.name}'s {path!r} has shape {tuple(targets[path].shape)}, "
                f"{source.name}'s {w.path!r} {tuple(w.shape)}."
            )
        targets.pop(path).assign(keras.ops.convert_to_numpy(w))  # a copy: JAX donates buffers
    if targets:
        raise ValueError(f"{target.name} has weights {sorted(targets)} that {source.name} lacks.")
