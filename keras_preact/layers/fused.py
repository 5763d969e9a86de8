"""The Keras releases the fused layers (``BatchNormalization``, ``Conv2D``) were checked against.

The fused layers are subclasses of Keras' layers that, on the PyTorch backend, compute the same function
with one PyTorch kernel (``torch.nn.functional.batch_norm``, ``conv2d`` on a channels-last view) instead
of Keras' own ops. They read Keras' layer attributes and must give Keras' numbers, so they are used only
on the Keras releases their equality tests ran on: ``CHECKED_KERAS``, the oldest and the newest
``major.minor`` checked (the oldest is the lowest Keras the package allows). On any other Keras the
layers take Keras' own path and are Keras' layers in all but name.

Examples:
    >>> from keras_preact.layers import fused
    >>> fused.CHECKED_KERAS
    ('3.10', '3.15')
    >>> fused.is_checked("3.12.4"), fused.is_checked("3.16.0"), fused.is_checked("3.9.2")
    (True, False, False)
"""

import functools
import re

import keras

CHECKED_KERAS = ("3.10", "3.15")  # oldest, newest major.minor the fused layers' equality tests ran on


def _minor(version):
    found = re.match(r"(\d+)\.(\d+)", str(version))
    return (int(found[1]), int(found[2])) if found else None


@functools.lru_cache(maxsize=8)
def is_checked(version):
    """Whether Keras ``version`` (e.g. ``"3.15.1"``) is within ``CHECKED_KERAS``."""
    minor = _minor(version)
    return minor is not None and _minor(CHECKED_KERAS[0]) <= minor <= _minor(CHECKED_KERAS[1])


def enabled():
    """Whether the running Keras is one the fused layers were checked on (else they take Keras' path)."""
    return is_checked(keras.version())
