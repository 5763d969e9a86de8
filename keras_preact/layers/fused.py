"""The Keras releases the fused layers (``BatchNormalization``, ``Conv2D``) were checked against.

The fused layers are subclasses of Keras' layers that, on the PyTorch backend, compute the same function
with one PyTorch kernel (``torch.nn.functional.batch_norm``, ``conv2d`` on a channels-last view) instead
of Keras' own ops. They read Keras' layer attributes and must give Keras' numbers, so they are used only
on the Keras releases their equality tests ran on: ``CHECKED_KERAS``, the oldest and the newest
``major.minor`` checked (the oldest is the lowest Keras the package allows). On any other Keras the
layers take Keras' own path and are Keras' layers in all but name.

The environment variable ``KERAS_PREACT_FAST_PATH`` (``FAST_PATH_ENV``, read by ``fast_path_level``) switches
the fast paths, as timm's ``TIMM_FUSED_ATTN`` does its fused attention: ``2`` (the default) the fused layers, and
residual units and backbones calling the layers' kernels directly (``unit_kernels``); ``1`` the fused layers only,
units and backbones running their sublayers; ``0`` off, Keras' own ops everywhere. Layers read it when called and
units and backbones when built, so set it before building a model (e.g. to rule the fast path out when a number
looks wrong: ``KERAS_PREACT_FAST_PATH=0 python train.py``).

Examples:
    >>> from keras_preact.layers import fused
    >>> fused.CHECKED_KERAS
    ('3.10', '3.15')
    >>> fused.is_checked("3.12.4"), fused.is_checked("3.16.0"), fused.is_checked("3.9.2")
    (True, False, False)
"""

import functools
import os
import re

import keras

CHECKED_KERAS = ("3.10", "3.15")  # oldest, newest major.minor the fused layers' equality tests ran on
FAST_PATH_ENV = "KERAS_PREACT_FAST_PATH"
FAST_PATH_LEVELS = {"0": "off: Keras' own ops", "1": "the fused layers only",
                    "2": "the fused layers and the units' direct kernel calls (the default)"}


def _minor(version):
    found = re.match(r"(\d+)\.(\d+)", str(version))
    return (int(found[1]), int(found[2])) if found else None


@functools.lru_cache(maxsize=8)
def is_checked(version):
    """Whether Keras ``version`` (e.g. ``"3.15.1"``) is within ``CHECKED_KERAS``."""
    minor = _minor(version)
    return minor is not None and _minor(CHECKED_KERAS[0]) <= minor <= _minor(CHECKED_KERAS[1])


def fast_path_level():
    """The fast paths switched on by ``KERAS_PREACT_FAST_PATH`` (module docstring): 2 (unset: the default), 1 or
    0; any other value is refused, naming the variable and its values.

    Examples:
        >>> import os
        >>> from keras_preact.layers import fused
        >>> os.environ.get(fused.FAST_PATH_ENV, "2"), fused.fast_path_level()
        ('2', 2)
    """
    value = os.environ.get(FAST_PATH_ENV, "2").strip() or "2"
    if value not in FAST_PATH_LEVELS:
        allowed = "; ".join(f"{k} ({v})" for k, v in FAST_PATH_LEVELS.items())
        raise ValueError(f"Invalid {FAST_PATH_ENV}={value!r}: allowed {allowed}.")
    return int(value)


def enabled():
    """Whether the fused layers take their kernels: the running Keras is one they were checked on, and
    ``KERAS_PREACT_FAST_PATH`` is not 0 (else they take Keras' path)."""
    return is_checked(keras.version()) and fast_path_level() >= 1
