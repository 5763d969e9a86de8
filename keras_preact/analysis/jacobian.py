"""Singular values of the input-to-output Jacobian of a stack of residual units at initialisation.

The "dynamical isometry" view of the paper's Eq. 4-5: with clean identity paths
(``x_L = x_l + sum F``) the Jacobian is ``I + (terms of the branches)``, its singular values stay
around 1 and the condition number grows slowly with depth; a ReLU after the addition (Fig. 4a)
zeroes directions, constant scaling (Fig. 2b) shrinks every singular value by lambda per unit.
"""

import dataclasses

import keras
import numpy as np

from keras_preact.analysis.autodiff import get_autodiff
from keras_preact.layers import ResidualUnit


def unit_stack(depth, channels=8, size=4, **unit_options):
    """``depth`` equal-shape ``ResidualUnit``s (``channels`` in and out, ``size`` x ``size``) as a
    functional model: the stack whose Jacobian ``jacobian_spectrum`` measures.

    Examples:
        >>> from keras_preact.analysis import unit_stack
        >>> stack = unit_stack(3, channels=8, size=4, ordering="original")  # unit options: Fig. 4a units
        >>> [layer.name for layer in stack.layers[1:]], stack.output_shape
        (['stage1_unit1', 'stage1_unit2', 'stage1_unit3'], (None, 4, 4, 8))
    """
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"Invalid depth={depth!r}: a positive integer is required.")
    inputs = keras.Input((size, size, channels), name="images")
    x = inputs
    for i in range(depth):
        x = ResidualUnit(channels, name=f"stage1_unit{i + 1}", **unit_options)(x)
    return keras.Model(inputs, x, name=f"unit_stack{depth}")


@dataclasses.dataclass(frozen=True)
class Spectrum:
    """Singular values (descending) of d vec(outputs) / d vec(inputs) for a whole batch.

    Examples:
        >>> import numpy as np
        >>> from keras_preact.analysis import Spectrum
        >>> Spectrum(np.array([2.0, 1.0, 0.5])).condition_number
        4.0
        >>> Spectrum(np.array([1.0, 0.0])).condition_number  # a direction lost
        inf
    """

    singular_values: np.ndarray

    @property
    def condition_number(self):
        """sigma_max / sigma_min (``inf`` where a direction is lost)."""
        smallest = self.singular_values[-1]
        return float(self.singular_values[0] / smallest) if smallest > 0 else float("inf")


def jacobian_spectrum(model, inputs, *, training=True):
    """Singular values of the Jacobian of ``model`` at ``inputs`` (a small batch).

    With ``training=True`` (default) normalization uses the batch's statistics, as in a training
    step, so samples interact and the Jacobian is taken of the whole batch map
    (``batch*H*W*C`` square for a shape-preserving stack). Keep inputs small: 4 x (4, 4, 8) is a
    512 x 512 Jacobian.

    Examples:
        >>> import numpy as np
        >>> from keras_preact.analysis import jacobian_spectrum, unit_stack
        >>> inputs = np.random.default_rng(0).standard_normal((2, 2, 2, 4))
        >>> spectrum = jacobian_spectrum(unit_stack(2, channels=4, size=2), inputs)
        >>> spectrum.singular_values.shape, bool(spectrum.condition_number >= 1.0)  # 2 * 2 * 2 * 4 values
        ((32,), True)
    """
    inputs = np.asarray(inputs, dtype=model.inputs[0].dtype)
    variables = model.variables

    def forward(x):
        # Stateless: batch statistics and dropout seeds are not written back to the model.
        with keras.StatelessScope(state_mapping=[(v, v.value) for v in variables]):
            return model(x, training=training)

    jac = keras.ops.convert_to_numpy(get_autodiff().jacobian(forward, inputs))
    n_in = inputs.size
    jac = jac.reshape(-1, n_in).astype(np.float64)
    return Spectrum(np.linalg.svd(jac, compute_uv=False))


def stack_spectra(variants, depths, *, channels=8, size=4, batch=4, seed=0, training=True):
    """``{(variant, depth): Spectrum}`` for unit stacks built from ``variants`` (name -> unit
    options) at each depth, on the same standard-normal input batch, weights seeded by ``seed``.

    Examples:
        Constant scaling (Fig. 2b) shrinks every singular value by its factor per unit (Eq. 5's lambda):

        >>> import numpy as np
        >>> from keras_preact.analysis import stack_spectra
        >>> variants = {"identity": {}, "scaling 0.5": {"shortcut": "constant_scaling", "residual_scale": 0.5}}
        >>> spectra = stack_spectra(variants, depths=[2], channels=2, size=2, batch=2)
        >>> sorted(spectra)
        [('identity', 2), ('scaling 0.5', 2)]
        >>> medians = {name: np.median(spectra[(name, 2)].singular_values) for name in variants}
        >>> bool(medians["scaling 0.5"] < medians["identity"] / 2)  # 0.5 per unit, two units
        True
    """
    rng = np.random.default_rng(seed)
    inputs = rng.standard_normal((batch, size, size, channels)).astype("float32")
    spectra = {}
    for name, options in variants.items():
        for depth in depths:
            keras.utils.set_random_seed(seed)
            model = unit_stack(depth, channels, size, **options)
            spectra[(name, depth)] = jacobian_spectrum(model, inputs, training=training)
    return spectra
