"""Gradient-flow diagnostics for residual networks (paper Sec. 3-4, Eq. 4-5, Table 1-2).

Examples:
    Per-unit signal and gradient norms of a network (Eq. 4-5: with identity shortcuts the gradient
    reaches every unit directly):

    >>> import numpy as np
    >>> from keras_preact.analysis import gradient_norms
    >>> from keras_preact.models import cifar_resnet
    >>> model = cifar_resnet(8, input_shape=(8, 8, 3))
    >>> norms = gradient_norms(model, np.ones((2, 8, 8, 3)), np.array([0, 1]))
    >>> norms.units, norms.input_grad.shape
    (('stage1_unit1', 'stage2_unit1', 'stage3_unit1'), (3,))
"""

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
