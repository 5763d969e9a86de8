"""keras_preact.layers.BatchNormalization (the backend's fused training and inference kernels) equals Keras' layer.

Outputs in training and inference mode, the gradients of the input, gamma and beta, and the moving
statistics after several updates equal ``keras.layers.BatchNormalization``'s within float32 rounding
(the fused kernel sums in another order and takes the variance in two passes where Keras' PyTorch and
JAX paths use E[x^2] - E[x]^2; in inference it folds the statistics into one scale and shift: within
``INFERENCE_RTOL`` of the output's largest magnitude), channels_last and channels_first; files move between
the two layers unchanged; the recipe tests hold with it. On backends without a fused kernel the layer is
Keras' path and the comparisons are exact.
"""

import os
import tempfile

import keras
import numpy as np
import pytest

from keras_preact.layers import BatchNormalization
from keras_preact.layers import batch_normalization as fused_lib
from support import to_numpy

pytestmark = [pytest.mark.core, pytest.mark.notf]

# float32: outputs of order 1-5, statistics of order 1-10, gradients summed over 1,024-2,048 values.
TOL = {"rtol": 1e-5, "atol": 2e-5}
GRAD_TOL = {"rtol": 1e-4, "atol": 1e-4}


def pair(axis=-1, **kwargs):
    """Keras' layer and ours, with the same arguments."""
    kwargs = {"axis": axis, "momentum": 0.9, "epsilon": 1e-5, **kwargs}
    return keras.layers.BatchNormalization(**kwargs), BatchNormalization(**kwargs)


def built(layers, shape, rng):
    """The layers built, with the same random gamma and beta."""
    for layer in layers:
        layer.build(shape)
    for i, variable in enumerate(layers[0].trainable_variables):
        value = rng.normal(1.0 if i == 0 and layers[0].scale else 0.0, 0.5, variable.shape).astype("float32")
        for layer in layers:
            layer.trainable_variables[i].assign(value)
    return layers


def features(rng, shape):
    return rng.normal(1.5, 3.0, shape).astype("float32")


SHAPES = {-1: (8, 6, 5, 12), 1: (8, 12, 6, 5)}


@pytest.fixture
def kernel_calls(monkeypatch):
    """How often the backend's fused kernel ran (stays 0 on backends without one)."""
    calls = []
    backend = keras.backend.backend()
    if backend in fused_lib.FUSED_TRAINING:
        kernel = fused_lib.FUSED_TRAINING[backend]
        monkeypatch.setitem(fused_lib.FUSED_TRAINING, backend, lambda *a: calls.append(1) or kernel(*a))
    return calls


def expected_calls(n, kernels=fused_lib.FUSED_TRAINING):
    return n if keras.backend.backend() in kernels else 0


@pytest.fixture
def inference_calls(monkeypatch):
    """How often the backend's fused inference kernel ran (stays 0 on backends without one)."""
    calls = []
    backend = keras.backend.backend()
    if backend in fused_lib.FUSED_INFERENCE:
        kernel = fused_lib.FUSED_INFERENCE[backend]
        monkeypatch.setitem(fused_lib.FUSED_INFERENCE, backend, lambda *a: calls.append(1) or kernel(*a))
    return calls


def assert_inference_close(got, want):
    """``got`` within ``INFERENCE_RTOL`` of ``want``'s largest magnitude (exact where no kernel is fused)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if keras.backend.backend() not in fused_lib.FUSED_INFERENCE:
        np.testing.assert_array_equal(got, want)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= fused_lib.INFERENCE_RTOL * np.abs(want).max()


def test_fused_kernel_is_used_where_measured_faster():
    assert set(fused_lib.FUSED_TRAINING) == {"torch"}
    assert set(fused_lib.FUSED_INFERENCE) == {"torch"}
    assert issubclass(BatchNormalization, keras.layers.BatchNormalization)
    assert BatchNormalization.__name__ == "BatchNormalization"  # Keras names saved weights after the class


@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("center, scale", [(True, True), (False, False), (True, False)])
def test_training_outputs_and_moving_statistics_equal_keras(axis, center, scale, rng, kernel_calls):
    theirs, ours = built(pair(axis, center=center, scale=scale), SHAPES[axis], rng)
    for _ in range(3):
        x = features(rng, SHAPES[axis])
        np.testing.assert_allclose(to_numpy(ours(x, training=True)), to_numpy(theirs(x, training=True)), **TOL)
        np.testing.assert_allclose(to_numpy(ours.moving_mean), to_numpy(theirs.moving_mean), **TOL)
        np.testing.assert_allclose(to_numpy(ours.moving_variance), to_numpy(theirs.moving_variance), **TOL)
    x = features(rng, SHAPES[axis])
    np.testing.assert_allclose(to_numpy(ours(x, training=False)), to_numpy(theirs(x, training=False)), **TOL)
    np.testing.assert_allclose(to_numpy(ours(x)), to_numpy(theirs(x)), **TOL)
    assert len(kernel_calls) == expected_calls(3)  # training mode only


def test_moving_variance_is_the_biased_batch_variance_with_keras_momentum(rng):
    _, ours = built(pair(momentum=0.8), (16, 3, 3, 4), rng)
    x = features(rng, (16, 3, 3, 4))
    ours(x, training=True)
    batch = x.astype(np.float64).reshape(-1, 4)
    np.testing.assert_allclose(to_numpy(ours.moving_mean), 0.2 * batch.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(to_numpy(ours.moving_variance), 0.8 + 0.2 * batch.var(0), rtol=1e-5)


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("axis", [-1, 1])
def test_gradients_of_input_gamma_and_beta_equal_keras(axis, training, rng):
    """Through either kernel (in inference mode: the moving statistics, as a frozen layer fine-tuned)."""
    from keras_preact.analysis.autodiff import get_autodiff

    layers = with_statistics(built(pair(axis), SHAPES[axis], rng), rng)
    x = features(rng, SHAPES[axis])
    upstream = rng.normal(size=SHAPES[axis]).astype("float32")
    grads = []
    for layer in layers:
        state = [v.value for v in layer.non_trainable_variables]

        def objective(values, layer=layer, state=state):  # stateless: JAX traces it
            y, _ = layer.stateless_call(values[1:], state, values[0], training=training)
            return keras.ops.sum(y * keras.ops.convert_to_tensor(upstream)), None

        inputs = [keras.ops.convert_to_tensor(x), *(v.value for v in layer.trainable_variables)]
        _, _, g = get_autodiff().value_and_grad(objective, [inputs])
        grads.append([to_numpy(t) for t in g[0]])
    assert len(grads[0]) == 3
    for got, want in zip(grads[1], grads[0]):
        np.testing.assert_allclose(got, want, **GRAD_TOL)


def test_other_axes_masks_and_dtypes_take_keras_path(rng, kernel_calls):
    # An axis other than the channel axis, a 3-D input with a mask, float16 compute (upcast as Keras).
    for kwargs, shape in (({"axis": 2}, (4, 3, 5, 2)), ({"axis": -1}, (4, 6, 3))):
        theirs, ours = built(pair(**kwargs), shape, rng)
        x = features(rng, shape)
        mask = rng.random(shape[:-1]) > 0.3 if len(shape) == 3 else None
        np.testing.assert_allclose(to_numpy(ours(x, training=True, mask=mask)),
                                   to_numpy(theirs(x, training=True, mask=mask)), **TOL)
        np.testing.assert_allclose(to_numpy(ours.moving_variance), to_numpy(theirs.moving_variance), **TOL)
    theirs, ours = built(pair(dtype="mixed_float16"), (8, 4, 4, 6), rng)
    x = features(rng, (8, 4, 4, 6))
    got, want = ours(x, training=True), theirs(x, training=True)
    assert keras.backend.standardize_dtype(got.dtype) == "float16"
    np.testing.assert_allclose(to_numpy(got).astype("float32"), to_numpy(want).astype("float32"), atol=1e-2)
    np.testing.assert_allclose(to_numpy(ours.moving_mean), to_numpy(theirs.moving_mean), **TOL)
    assert len(kernel_calls) == expected_calls(1)  # mixed_float16: float32 statistics, as Keras


def with_statistics(layers, rng, mean=1.0):
    """The layers' moving statistics set to the same trained-looking values (means of order ``mean``)."""
    channels = layers[0].moving_mean.shape[0]
    mean_value = rng.normal(0.0, mean, channels).astype("float32")
    variance_value = rng.uniform(0.1, 9.0, channels).astype("float32")
    for layer in layers:
        layer.moving_mean.assign(mean_value)
        layer.moving_variance.assign(variance_value)
    return layers


@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("center, scale", [(True, True), (False, False), (True, False), (False, True)])
def test_inference_outputs_equal_keras_within_rtol(axis, center, scale, rng, kernel_calls, inference_calls):
    layers = built(pair(axis, center=center, scale=scale), SHAPES[axis], rng)
    channels = [1] * 4
    channels[axis] = SHAPES[axis][axis]
    for mean in (0.5, 3.0, 10.0):  # moving means far from the spread: the folded shift's worst case
        theirs, ours = with_statistics(layers, rng, mean)
        centre = to_numpy(ours.moving_mean).reshape(channels)
        x = (centre + np.sqrt(to_numpy(ours.moving_variance)).reshape(channels) * rng.normal(size=SHAPES[axis]))
        x = x.astype("float32")
        assert_inference_close(to_numpy(ours(x, training=False)), to_numpy(theirs(x, training=False)))
        assert_inference_close(to_numpy(ours(x)), to_numpy(theirs(x)))
    assert len(inference_calls) == expected_calls(6, fused_lib.FUSED_INFERENCE)
    assert not kernel_calls


def test_a_frozen_layer_runs_in_inference_mode(rng, kernel_calls, inference_calls):
    theirs, ours = with_statistics(built(pair(), (8, 4, 4, 6), rng), rng)
    for layer in (theirs, ours):
        layer.trainable = False
    statistics = to_numpy(ours.moving_mean)
    x = features(rng, (8, 4, 4, 6))
    assert_inference_close(to_numpy(ours(x, training=True)), to_numpy(theirs(x, training=True)))
    np.testing.assert_array_equal(to_numpy(ours.moving_mean), statistics)
    assert (len(kernel_calls), len(inference_calls)) == (0, expected_calls(1, fused_lib.FUSED_INFERENCE))


def test_config_and_regularizers_are_keras(rng):
    theirs, ours = pair(gamma_regularizer="l2", beta_regularizer="l1", gamma_constraint="non_neg", name="bn")
    assert ours.get_config() == theirs.get_config()
    assert BatchNormalization.from_config(ours.get_config()).get_config() == ours.get_config()
    built((theirs, ours), (8, 4, 4, 6), rng)
    np.testing.assert_allclose([float(to_numpy(loss)) for loss in ours.losses],
                               [float(to_numpy(loss)) for loss in theirs.losses], rtol=1e-6)
    assert ours.gamma.constraint is not None


def small_model(norm, seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    x = norm(momentum=0.9, epsilon=1e-5, name="bn")(x)
    x = keras.layers.ReLU()(x)
    x = norm(momentum=0.9, epsilon=1e-5)(x)  # unnamed: weights files name it after the class
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="dense")(x))


def trained(model, rng):
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    model.train_on_batch(features(rng, (8, 6, 6, 3)), rng.integers(0, 3, 8))
    return model


def test_files_move_between_keras_layer_and_ours(rng):
    x = features(rng, (4, 6, 6, 3))
    keras_model = trained(small_model(keras.layers.BatchNormalization), rng)
    expected = to_numpy(keras_model(x, training=False))
    with tempfile.TemporaryDirectory() as d:
        keras_file, weights_file = os.path.join(d, "keras_bn.keras"), os.path.join(d, "keras_bn.weights.h5")
        keras_model.save(keras_file)
        keras_model.save_weights(weights_file)
        for path in (keras_file, weights_file):
            ours = small_model(BatchNormalization, seed=1)
            ours.load_weights(path)
            assert_same_weights(ours, keras_model)
            assert_inference_close(to_numpy(ours(x, training=False)), expected)
        # Ours saved (whole and weights only): read back as ours, and into Keras' layer.
        ours_file, ours_weights = os.path.join(d, "ours.keras"), os.path.join(d, "ours.weights.h5")
        ours.save(ours_file)
        ours.save_weights(ours_weights)
        again = keras.saving.load_model(ours_file)
        assert type(again.get_layer("bn")) is BatchNormalization
        assert_same_weights(again, keras_model)
        assert_inference_close(to_numpy(again(x, training=False)), expected)
        for path in (ours_file, ours_weights):
            back = small_model(keras.layers.BatchNormalization, seed=2)
            back.load_weights(path)
            assert_same_weights(back, keras_model)
            np.testing.assert_array_equal(to_numpy(back(x, training=False)), expected)  # Keras' layer: exact


def assert_same_weights(model, other):
    """The same variables in the same order, bit for bit."""
    assert [w.name for w in model.weights] == [w.name for w in other.weights]
    for a, b in zip(model.weights, other.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=a.path)


def test_one_training_step_equals_keras(rng):
    theirs = trained(small_model(keras.layers.BatchNormalization), np.random.default_rng(3))
    ours = trained(small_model(BatchNormalization), np.random.default_rng(3))
    for a, b in zip(ours.weights, theirs.weights):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=1e-5, atol=1e-5, err_msg=a.path)


def test_builders_default_to_it():
    from keras_preact.models import create_model

    model = create_model("cifar_resnet20")
    norms = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]
    assert norms and all(type(layer) is BatchNormalization for layer in norms)


@pytest.mark.parametrize("scope", ["all", "kernels"])
def test_recipe_stays_exact_with_it(scope, monkeypatch):
    """tests/test_training_recipe.py's three compiled steps against numpy optim.sgd (1e-6), with this layer."""
    import test_training_recipe as recipe

    monkeypatch.setattr(keras.layers, "BatchNormalization", BatchNormalization)
    assert type(recipe.tiny_model().get_layer("bn")) is BatchNormalization
    recipe.test_three_steps_equal_torch_optim_sgd(scope, nesterov=True)
    recipe.test_bn_moving_statistics_follow_torch_momentum()


@pytest.mark.parametrize("mode", ["training", "inference"])
def test_kernel_benchmark_times_both_candidates_for_every_shape(mode, capsys):
    """benchmarks/batch_norm_kernels.py, the measurement behind FUSED_TRAINING: one row per ResNet-20 shape with
    Keras' path and the backend's candidate, in either mode."""
    import re
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed
    from benchmarks import batch_norm_kernels

    batch_norm_kernels.main(["--rounds", "1", "--repeats", "1", "--mode", mode])
    out = capsys.readouterr().out.splitlines()
    assert ("training mode" if mode == "training" else "inference mode") in out[0]
    other = {"torch": "F.batch_norm", "tensorflow": "fused_batch_norm", "jax": "multiply-add floor"}
    for line, shape in zip(out[1:], batch_norm_kernels.SHAPES):
        times = re.fullmatch(rf"  \({', '.join(map(str, shape))}\): keras ([\d.]+) \(.*\), "
                             rf"{other[keras.backend.backend()]} ([\d.]+) \(.*\)", line)
        assert times and all(float(t) > 0 for t in times.groups()), line
    assert len(out) == 1 + len(batch_norm_kernels.SHAPES)
