"""Residual-unit layers (paper Fig. 2, Fig. 4): ``ResidualUnit`` and its options, ``UnitConfig``; the tables
a unit's options choose from (``ORDERINGS``: Table 2, ``SHORTCUTS``: Table 1, ``SHORTCUT_TYPES``, ``BLOCKS``).

Examples:
    >>> import keras
    >>> from keras_preact.layers import ORDERINGS, ResidualUnit
    >>> list(ORDERINGS)  # Fig. 4 (a)-(e)
    ['original', 'bn_after_addition', 'relu_before_addition', 'relu_only_preact', 'full_preact']
    >>> unit = ResidualUnit(32, strides=2, ordering="full_preact")
    >>> tuple(unit(keras.ops.zeros((1, 8, 8, 16))).shape)
    (1, 4, 4, 32)
"""

from keras_preact.layers.batch_normalization import BatchNormalization
from keras_preact.layers.convolution import Conv2D, WeightStandardizedConv2D
from keras_preact.layers.eval_view import EvalView
from keras_preact.layers.options import BLOCKS, CONVOLUTIONS, ORDERINGS, SHORTCUT_TYPES, SHORTCUTS
from keras_preact.layers.padding import EdgePadding2D
from keras_preact.layers.residual_unit import ResidualUnit, Step, UnitPlan
from keras_preact.layers.unit_config import UnitConfig

__all__ = [
    "BatchNormalization",
    "Conv2D",
    "EdgePadding2D",
    "EvalView",
    "WeightStandardizedConv2D",
    "ResidualUnit",
    "Step",
    "UnitPlan",
    "UnitConfig",
    "ORDERINGS",
    "SHORTCUTS",
    "SHORTCUT_TYPES",
    "BLOCKS",
    "CONVOLUTIONS",
]
