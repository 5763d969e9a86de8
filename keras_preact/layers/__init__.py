"""Residual-unit layers (paper Fig. 2, Fig. 4)."""

from keras_preact.layers.options import BLOCKS, ORDERINGS, SHORTCUT_TYPES, SHORTCUTS
from keras_preact.layers.residual_unit import ResidualUnit

__all__ = ["ResidualUnit", "ORDERINGS", "SHORTCUTS", "SHORTCUT_TYPES", "BLOCKS"]
