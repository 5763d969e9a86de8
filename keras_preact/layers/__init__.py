"""Residual-unit layers (paper Fig. 2, Fig. 4): ``ResidualUnit`` and its options, ``UnitConfig``."""

from keras_preact.layers.batch_normalization import BatchNormalization
from keras_preact.layers.convolution import Conv2D
from keras_preact.layers.options import BLOCKS, ORDERINGS, SHORTCUT_TYPES, SHORTCUTS
from keras_preact.layers.residual_unit import ResidualUnit, Step, UnitPlan
from keras_preact.layers.unit_config import UnitConfig

__all__ = [
    "BatchNormalization", "Conv2D", "ResidualUnit", "Step", "UnitPlan", "UnitConfig", "ORDERINGS", "SHORTCUTS",
    "SHORTCUT_TYPES", "BLOCKS",
]
