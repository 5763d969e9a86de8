"""Mixup and cutmix of training batches with their labels, on the host (``config.mixup``, ``config.cutmix``).

Mixup (Zhang et al. 2018, "mixup: Beyond Empirical Risk Minimization"): each batch is blended with a permutation
of itself, ``lam * x + (1 - lam) * x[perm]``, ``lam ~ Beta(alpha, alpha)``, the one-hot labels alike. Cutmix (Yun
et al. 2019): a box of the permuted images pasted in, the labels mixed by the box's area. With both, one of the
two per batch, each with probability 1/2 (timm's ``Mixup(switch_prob=0.5)``).

The draws of global batch ``step`` are a function of ``(seed, step)`` only, so a resumed run mixes exactly as an
uninterrupted one; Keras' ``MixUp``/``CutMix`` layers draw from a generator whose position a resume does not
restore, hence this module. The mixed images are float32 in the batch's units (0-255 pixels on the device
pipeline, whose crop and flip then run on the mixed images in the step; normalized ones on the numpy pipeline).
"""

import itertools

import keras
import numpy as np

MIX_STREAM = 7  # the draws' stream key beside the seed: other host draws use other keys


def mix_batch(images, labels, num_classes, *, mixup, cutmix, rng):
    """(mixed float32 images, mixed one-hot labels) of one batch (see the module docstring).

    Examples:
        >>> x = np.stack([np.zeros((2, 2, 1)), np.ones((2, 2, 1))]).astype("float32")
        >>> images, labels = mix_batch(x, np.array([0, 1]), 2, mixup=1.0, cutmix=0.0, rng=np.random.default_rng(0))
        >>> bool(np.allclose(images[:, 0, 0, 0], labels[:, 1]))  # each image is as much image 1 as its label
        True
    """
    one_hot = np.eye(num_classes, dtype=np.float32)[np.asarray(labels).reshape(-1)]
    images = np.asarray(images, np.float32)
    use_cutmix = cutmix > 0 and (mixup <= 0 or rng.random() < 0.5)
    lam = float(rng.beta(cutmix, cutmix) if use_cutmix else rng.beta(mixup, mixup))
    perm = rng.permutation(len(images))
    if use_cutmix:
        images, lam = paste_box(images, perm, lam, rng)
    else:
        images = lam * images + (1 - lam) * images[perm]
    return images, lam * one_hot + (1 - lam) * one_hot[perm]


def paste_box(images, perm, lam, rng):
    """Cutmix's box (area ``1 - lam`` of the image, centre uniform, clipped to the image) of ``images[perm]`` pasted
    into ``images``; returns (images, the kept fraction ``1 - box area / image area``)."""
    height, width = images.shape[1:3]
    cut_h, cut_w = int(height * np.sqrt(1 - lam)), int(width * np.sqrt(1 - lam))
    cy, cx = rng.integers(height), rng.integers(width)
    top, bottom = np.clip([cy - cut_h // 2, cy + cut_h // 2], 0, height)
    left, right = np.clip([cx - cut_w // 2, cx + cut_w // 2], 0, width)
    out = images.copy()
    out[:, top:bottom, left:right] = images[perm, top:bottom, left:right]
    return out, 1 - (bottom - top) * (right - left) / (height * width)


def mixed_train(stream, num_classes, *, mixup, cutmix, seed, start_step=0):
    """The training ``stream`` (a generator or an infinite ``keras.utils.PyDataset`` of global batches from
    ``start_step``) with every batch mixed (``mix_batch``), the draws of batch ``step`` from ``(seed, step)``."""
    batches = (stream[i] for i in itertools.count()) if isinstance(stream, keras.utils.PyDataset) else stream
    for step, (images, labels) in enumerate(batches, start_step):
        rng = np.random.default_rng([seed, MIX_STREAM, step])
        yield mix_batch(images, labels, num_classes, mixup=mixup, cutmix=cutmix, rng=rng)


class OneHotBatches(keras.utils.PyDataset):
    """The evaluation batches of ``batches`` (a finite ``PyDataset``) with one-hot labels, for a model compiled
    with the mixed labels' categorical loss."""

    def __init__(self, batches, num_classes):
        super().__init__()
        self.batches, self.num_classes = batches, num_classes

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, index):
        images, labels = self.batches[index]
        return images, np.eye(self.num_classes, dtype=np.float32)[np.asarray(labels).reshape(-1)]


def mixed_stream(train_stream, num_classes, config):
    """``train_stream(step)`` (``train.input_streams``' maker of the stream from global ``step``) mixed by
    ``config.mixup``/``config.cutmix`` with ``config.seed``."""

    def stream(step):
        return mixed_train(train_stream(step), num_classes, mixup=config.mixup, cutmix=config.cutmix,
                           seed=config.seed, start_step=step)

    return stream
