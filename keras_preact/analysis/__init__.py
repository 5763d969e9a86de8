"""Gradient-flow diagnostics for residual networks (paper Sec. 3-4, Eq. 4-5, Table 1-2)."""

from keras_preact.analysis.autodiff import AUTODIFF, get_autodiff
from keras_preact.analysis.health import TrainingHealthCallback, weight_groups
from keras_preact.analysis.jacobian import Spectrum, jacobian_spectrum, stack_spectra, unit_stack
from keras_preact.analysis.plots import plot_gradient_norms, plot_spectra
from keras_preact.analysis.signals import (
    GradientNorms,
    UnitSignals,
    gradient_norms,
    residual_units,
    unit_signals,
)

__all__ = [
    "AUTODIFF",
    "GradientNorms",
    "Spectrum",
    "TrainingHealthCallback",
    "UnitSignals",
    "get_autodiff",
    "jacobian_spectrum",
    "plot_gradient_norms",
    "plot_spectra",
    "stack_spectra",
    "unit_stack",
    "gradient_norms",
    "residual_units",
    "unit_signals",
    "weight_groups",
]
