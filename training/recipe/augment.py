"""Input on the device: CIFAR augmentation and normalization inside the compiled training step.

With ``pipeline="device"`` the host sends uint8 batches and the network is fit through
``device_training_model``: uint8 pixels -> ``Normalization`` -> ``PadCropFlip`` (training only) ->
the classifier, all Keras layers and ``keras.ops``, so the same code runs on TensorFlow, JAX and
PyTorch, compiled with the step. Only the classifier is saved as ``model.keras``; the export puts the
normalization back in front of it (``keras_preact.export``).
"""

import keras
import numpy as np
from keras import ops


class PadCropFlip(keras.layers.Layer):
    """Zero-pad ``padding`` pixels, crop back to the input size at a random offset, flip left-right
    with probability 1/2; an independent draw for every image (paper Sec. 4, "Training recipe").

    ``keras.layers.RandomCrop`` draws one offset per batch, hence this layer. The draws at training
    call ``k`` depend only on ``seed`` and ``k``: the call counter ``iterations`` is a weight, saved
    and restored with checkpoints, so a resumed run draws exactly what an uninterrupted one does.
    Inference (``training=False``) returns the input unchanged.
    """

    def __init__(self, padding=4, seed=0, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(padding, int) or padding < 0:
            raise ValueError(f"Invalid padding={padding!r}: a whole number >= 0 is required.")
        self.padding = padding
        self.seed = int(seed)
        self._rng = keras.random.SeedGenerator(self.seed)

    def build(self, input_shape):
        self.iterations = self.add_weight(shape=(), dtype="int32", initializer="zeros",
                                          trainable=False, name="iterations")

    def call(self, images, training=None):
        if not training:
            return images
        next_call(self._rng, self.seed, self.iterations, 2)  # two draws per call: the counter at call k is 2k
        batch = ops.shape(images)[0]
        offsets = keras.random.randint((2, batch), 0, 2 * self.padding + 1, seed=self._rng, dtype="int32")
        flip = keras.random.uniform((batch,), seed=self._rng) < 0.5
        return pad_crop_flip(images, offsets, flip, self.padding)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "padding": self.padding, "seed": self.seed}


def pad_crop_flip(images, offsets, flip, padding):
    """Image ``b`` of NHWC ``images``, zero-padded by ``padding``, cropped at rows ``offsets[0, b]`` + (0..H-1)
    and columns ``offsets[1, b]`` + (0..W-1), mirrored left-right where ``flip[b]``.

    One gather of whole pixels: output (i, j) is padded pixel (b, oy + i, ox + j), or (b, oy + i, ox + W-1-j)
    when flipped. Two gathers (along H, then W), a flip and a select give the same values at several times
    the time on PyTorch and TensorFlow.

    Examples:

    >>> x = np.arange(4, dtype="float32").reshape(1, 2, 2, 1)  # [[0, 1], [2, 3]]
    >>> centre = pad_crop_flip(x, np.array([[1], [1]], "int32"), np.array([False]), padding=1)
    >>> ops.convert_to_numpy(centre)[0, :, :, 0].tolist()
    [[0.0, 1.0], [2.0, 3.0]]
    >>> down_right = pad_crop_flip(x, np.array([[1], [0]], "int32"), np.array([True]), padding=1)
    >>> ops.convert_to_numpy(down_right)[0, :, :, 0].tolist()  # rows 1-2, columns 0-1 of the padded, mirrored
    [[0.0, 0.0], [2.0, 0.0]]
    """
    images, offsets, flip = ops.convert_to_tensor(images), ops.convert_to_tensor(offsets), ops.convert_to_tensor(flip)
    height, width, channels = images.shape[1], images.shape[2], images.shape[3]
    padded = ops.pad(images, [[0, 0], [padding, padding], [padding, padding], [0, 0]])
    padded_height, padded_width = height + 2 * padding, width + 2 * padding
    j = ops.arange(width, dtype="int32")[None]
    rows = offsets[0][:, None] + ops.arange(height, dtype="int32")[None]
    cols = offsets[1][:, None] + ops.where(flip[:, None], width - 1 - j, j)
    first = ops.arange(ops.shape(images)[0], dtype="int32")[:, None, None] * (padded_height * padded_width)
    pixels = first + rows[:, :, None] * padded_width + cols[:, None, :]
    out = ops.take(ops.reshape(padded, (-1, channels)), ops.reshape(pixels, (-1,)), axis=0)
    return ops.reshape(out, (-1, height, width, channels))


class StepRandAugment(keras.layers.Layer):
    """Keras' ``RandAugment`` (Cubuk et al. 2020; 2 ops at ``factor``, pixels in 0-255) with the draws of training
    call ``k`` a function of ``seed`` and ``k`` only, as ``PadCropFlip``'s: its generator's state is set from the
    call counter ``iterations``, a weight saved with the checkpoints, so a resumed run draws as an uninterrupted one.
    Keras' layer picks the ops once per batch. Inference returns the input unchanged."""

    STRIDE = 2**16  # draws a call may take from the generator before the next call's

    def __init__(self, factor=0.5, seed=0, **kwargs):
        super().__init__(**kwargs)
        self.factor, self.seed = float(factor), int(seed)
        self.augment = keras.layers.RandAugment(value_range=(0, 255), factor=self.factor, seed=self.seed)

    def build(self, input_shape):
        self.iterations = self.add_weight(shape=(), dtype="int32", initializer="zeros",
                                          trainable=False, name="iterations")

    def call(self, images, training=None):
        if not training:
            return images
        next_call(self.augment.generator, self.seed, self.iterations, self.STRIDE)
        return ops.cast(self.augment(images, training=True), images.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "factor": self.factor, "seed": self.seed}


AUGMENTATION_LAYERS = {"cifar": lambda seed: PadCropFlip(4, seed=seed, name="pad_crop_flip")}


def device_training_model(classifier, *, augmentation, mean, std, seed, mixed=False, rand_augment=0.0):
    """uint8 pixels -> RandAugment (``rand_augment`` > 0, training only) -> (x - mean) / std -> augmentation
    (training only) -> ``classifier``.

    ``augmentation``: ``"cifar"`` (pad 4 with the mean, crop, flip) or ``"none"``; ``mean``/``std`` per
    channel in 0-255 units, or a mean image. The classifier's variables are shared. ``mixed``: float32
    pixels in (mixup and cutmix blend uint8 images on the host: ``keras_preact_training.data.mixing``).
    """
    if augmentation not in (*AUGMENTATION_LAYERS, "none"):
        raise ValueError(
            f"Invalid augmentation={augmentation!r} for pipeline='device': allowed "
            f"{sorted((*AUGMENTATION_LAYERS, 'none'))} (ImageNet augmentation streams through tf.data)."
        )
    images = keras.Input(classifier.input_shape[1:], dtype="float32" if mixed else "uint8", name="images")
    mean, std = np.asarray(mean, np.float32), np.asarray(std, np.float32)
    axis = (1, 2, 3) if mean.ndim == 3 else -1  # a mean image (per-pixel mean) or per-channel statistics
    x = images
    if rand_augment:  # on pixels in 0-255, before the normalization
        x = StepRandAugment(rand_augment, seed=seed, name="rand_augment")(ops.cast(x, "float32"))
    x = keras.layers.Normalization(mean=mean, variance=np.broadcast_to(std * std, mean.shape), axis=axis,
                                   dtype="float32", name="normalize")(x)
    if augmentation != "none":  # after normalization: the padding is the mean, as fb.resnet.torch
        x = AUGMENTATION_LAYERS[augmentation](seed)(x)
    return keras.Model(images, classifier(x), name=f"{classifier.name}_device_input")


def next_call(generator, seed, iterations, draws):
    """Set ``generator`` (a ``keras.random.SeedGenerator``) to ``(seed, draws * iterations)`` and count the call: a
    layer's draws at call k depend on its seed and k alone, so a resumed run (``iterations`` restored) repeats them."""
    state = generator.state
    state.assign(ops.cast(ops.stack([ops.convert_to_tensor(seed, "int32"), draws * iterations]), state.dtype))
    iterations.assign_add(ops.convert_to_tensor(1, "int32"))
