"""Jacobian spectra of unit stacks and the analysis figures."""

import numpy as np
import pytest

from keras_preact.analysis import (
    GradientNorms,
    jacobian_spectrum,
    plot_gradient_norms,
    plot_spectra,
    stack_spectra,
    unit_stack,
)

SMALL = dict(channels=4, size=2)


def inputs(seed=0, batch=2):
    return np.random.default_rng(seed).standard_normal((batch, 2, 2, 4)).astype("float32")


@pytest.mark.core
@pytest.mark.parametrize("training", [True, False])
def test_clean_identity_path_is_an_isometry(training):
    """Full pre-activation with F = 0 at init (zero_init_residual): J = I, every sigma = 1."""
    model = unit_stack(5, zero_init_residual=True, **SMALL)
    spectrum = jacobian_spectrum(model, inputs(), training=training)
    assert spectrum.singular_values.shape == (32,)
    np.testing.assert_allclose(spectrum.singular_values, 1.0, rtol=0, atol=1e-12)
    assert spectrum.condition_number == pytest.approx(1.0, abs=1e-12)


@pytest.mark.core
def test_constant_scaling_shrinks_every_direction_by_lambda_per_unit():
    model = unit_stack(4, shortcut="constant_scaling", shortcut_scale=0.5, zero_init_residual=True, **SMALL)
    sv = jacobian_spectrum(model, inputs()).singular_values
    np.testing.assert_allclose(sv, 0.5**4, rtol=0, atol=1e-12)


@pytest.mark.core
def test_relu_after_addition_loses_the_negative_directions():
    """Original unit (Fig. 4a) with F = 0: x_{l+1} = ReLU(x_l), J = diag(x > 0)."""
    x = inputs(seed=3)
    model = unit_stack(3, ordering="original", zero_init_residual=True, **SMALL)
    spectrum = jacobian_spectrum(model, x)
    sv = spectrum.singular_values
    positive = int((x > 0).sum())
    assert 0 < positive < x.size
    np.testing.assert_allclose(sv[:positive], 1.0, atol=1e-12)
    np.testing.assert_allclose(sv[positive:], 0.0, atol=1e-12)
    assert spectrum.condition_number == float("inf")


@pytest.mark.core
def test_stack_spectra_and_figures(tmp_path):
    variants = {"full_preact": {}, "original": {"ordering": "original"}}
    spectra = stack_spectra(variants, [1, 2], batch=2, **SMALL)
    assert sorted(spectra) == [("full_preact", 1), ("full_preact", 2), ("original", 1), ("original", 2)]
    for s in spectra.values():
        assert s.singular_values.shape == (32,) and np.all(np.diff(s.singular_values) <= 0)
    # Weights are seeded: the same call gives the same spectra.
    again = stack_spectra({"original": {"ordering": "original"}}, [1], batch=2, **SMALL)
    np.testing.assert_array_equal(again[("original", 1)].singular_values,
                                  spectra[("original", 1)].singular_values)
    png = plot_spectra(spectra, tmp_path / "spectra.png")
    assert open(png, "rb").read(4) == b"\x89PNG"

    norms = GradientNorms(units=("a", "b", "c"), signal=np.array([1.0, 2.0, 3.0]),
                          input_grad=np.array([0.5, 0.25, 0.0]), weight_grad=np.ones(3),
                          output_signal=3.0, output_grad=1.0, loss=2.3)
    png = plot_gradient_norms({"three units": norms}, tmp_path / "norms.png")
    assert open(png, "rb").read(4) == b"\x89PNG"
    with pytest.raises(ValueError, match="results"):
        plot_gradient_norms({}, tmp_path / "empty.png")
    assert not (tmp_path / "empty.png").exists()


@pytest.mark.core
def test_bad_depth():
    with pytest.raises(ValueError, match="depth"):
        unit_stack(0)
