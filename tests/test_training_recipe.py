"""Recipe fidelity: our compiled training step equals torch/optim's ``optim.sgd`` step for step, BN
statistics follow Torch's momentum-0.1 update, and ``--dry-run`` prints the paper's iterations."""

import importlib.util

import keras
import numpy as np
import pytest

from keras_preact.analysis.autodiff import get_autodiff
from keras_preact_training import cli
from keras_preact_training.data import pipelines, sources
from keras_preact_training.recipe import configs, schedules
from keras_preact_training.recipe import model as model_lib
from keras_preact_training.recipe.optimizers import TorchSGD

pytestmark = [pytest.mark.core, pytest.mark.notf]


def tiny_model():
    """A conv (with bias), a BN (as our units build it: Torch's momentum 0.1 = Keras 0.9, eps 1e-5), a dense."""
    inputs = keras.Input((6, 6, 2))
    x = keras.layers.Conv2D(3, 3, name="conv")(inputs)
    x = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name="bn")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(4, activation="softmax", name="dense")(x)
    return keras.Model(inputs, outputs)


def loss_gradients(model, x, y):
    """d(mean cross-entropy)/d(trainable variables) at the current weights, BN in training mode,
    computed apart from ``fit`` (the backend's autodiff on ``stateless_call``)."""
    trainable = [keras.ops.convert_to_tensor(v.value) for v in model.trainable_variables]
    non_trainable = [keras.ops.convert_to_tensor(v.value) for v in model.non_trainable_variables]

    def objective(values):
        outputs, _ = model.stateless_call(values, non_trainable, x, training=True)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, outputs)), ()

    _, _, grads = get_autodiff().value_and_grad(objective, [trainable])
    return [keras.ops.convert_to_numpy(g).astype(np.float64) for g in grads[0]]


def optim_sgd(x, dfdx, state, *, lr, wd, mom, nesterov):
    """torch/optim sgd.lua (L48-82) in numpy, dampening 0."""
    dfdx = dfdx + wd * x
    state["dfdx"] = dfdx.copy() if "dfdx" not in state else mom * state["dfdx"] + dfdx
    dfdx = dfdx + mom * state["dfdx"] if nesterov else state["dfdx"]
    return x - lr * dfdx


@pytest.mark.parametrize("scope, nesterov", [("all", True), ("kernels", True), ("all", False)])
def test_three_steps_equal_torch_optim_sgd(scope, nesterov):
    # Warm-up at 0.01 for one iteration, 0.1, then /10 at iteration 2: the lr changes at every step,
    # where Keras' SGD (lr-scaled velocity) would part from Torch's. The config comes from the command line,
    # so --no-nesterov is followed from the flag to the update.
    parser = cli.build_parser()
    args = parser.parse_args(["--preset", "t2-resnet110-full-preact", "--weight-decay", "0.05",
                              "--weight-decay-scope", scope, "--dry-run"] + ([] if nesterov else ["--no-nesterov"]))
    config = cli.config_from_args(args, parser).replace(
        total_steps=3, warmup_steps=1, boundaries=(2,), steps_per_epoch=3, batch_size=8, reference_batch_size=8,
        jit_compile="auto")
    assert config.nesterov is nesterov
    resolved = schedules.resolve(config, train_size=24)
    assert [lr for _, lr in schedules.lr_table(config, resolved)] == [0.01, 0.1, pytest.approx(0.01)]
    model = tiny_model()
    model_lib.compile_model(model, config, resolved, num_classes=4)
    assert isinstance(model.optimizer, TorchSGD) and model.optimizer.nesterov is nesterov
    rng = np.random.default_rng(0)
    reference = [keras.ops.convert_to_numpy(v).astype(np.float64) for v in model.trainable_variables]
    names = [v.name for v in model.trainable_variables]
    other_scope = [w.copy() for w in reference]  # the same steps with the other scope's weight decay
    states, other_states = [{} for _ in reference], [{} for _ in reference]
    for step, lr in enumerate([0.01, 0.1, 0.01]):
        x = rng.normal(size=(8, 6, 6, 2)).astype("float32")
        y = rng.integers(0, 4, 8)
        grads = loss_gradients(model, x, y)
        for i, (w, g) in enumerate(zip(reference, grads)):
            wd = 0.05 if scope == "all" or names[i] == "kernel" else 0.0
            reference[i] = optim_sgd(w, g, states[i], lr=lr, wd=wd, mom=0.9, nesterov=nesterov)
            other_wd = 0.05 if scope == "kernels" or names[i] == "kernel" else 0.0
            other_scope[i] = optim_sgd(other_scope[i], g, other_states[i], lr=lr, wd=other_wd, mom=0.9,
                                       nesterov=nesterov)
        model.train_on_batch(x, y)
        for _name, v, expected in zip(names, model.trainable_variables, reference):
            np.testing.assert_allclose(keras.ops.convert_to_numpy(v), expected, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{v.path} after step {step + 1} ({scope}, nesterov {nesterov})")
    # The comparison tells the scopes apart: with the other scope's decay on BN gamma (gradients given),
    # gamma would have ended elsewhere, beyond the tolerance above.
    gamma = names.index("gamma")
    assert not np.allclose(keras.ops.convert_to_numpy(model.trainable_variables[gamma]), other_scope[gamma],
                           rtol=1e-5, atol=1e-6)


def test_torch_sgd_config_round_trip_and_bad_arguments():
    optimizer = TorchSGD(0.1, momentum=0.9, nesterov=True, coupled_weight_decay=1e-4, weight_decay_scope="kernels")
    again = TorchSGD.from_config(optimizer.get_config())
    assert (again.momentum, again.nesterov, again.coupled_weight_decay, again.weight_decay_scope) == (
        0.9, True, 1e-4, "kernels")
    with pytest.raises(ValueError, match="weight_decay_scope='biases'"):
        TorchSGD(weight_decay_scope="biases")
    with pytest.raises(ValueError, match="nesterov=True with momentum=0"):
        TorchSGD(momentum=0.0, nesterov=True)
    with pytest.raises(ValueError, match="nesterov=True with momentum=0"):
        configs.get_config("synthetic-resnet8", momentum=0.0)


def test_bn_moving_statistics_follow_torch_momentum():
    """Torch: running = 0.9 running + 0.1 batch (momentum 0.1). The mean follows it exactly. Keras
    updates the variance with the biased batch variance where Torch uses the unbiased one: the
    difference is the factor n / (n - 1), n = batch x height x width values per channel."""
    model = tiny_model()
    model.compile(optimizer=TorchSGD(0.0, momentum=0.9), loss="sparse_categorical_crossentropy")
    x = np.random.default_rng(1).normal(2.0, 3.0, (8, 6, 6, 2)).astype("float32")
    features = keras.Model(model.input, model.get_layer("conv").output).predict(x, verbose=0).astype(np.float64)
    model.train_on_batch(x, np.zeros(8, "int32"))
    bn = model.get_layer("bn")
    batch_mean, batch_var = features.mean(axis=(0, 1, 2)), features.var(axis=(0, 1, 2))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(bn.moving_mean), 0.1 * batch_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(bn.moving_variance), 0.9 + 0.1 * batch_var, rtol=1e-5)
    n = features.shape[0] * features.shape[1] * features.shape[2]
    torch_var = 0.9 + 0.1 * batch_var * n / (n - 1)
    assert np.all(np.abs(keras.ops.convert_to_numpy(bn.moving_variance) / torch_var - 1) < 1 / (n - 1))


def test_paper_presets_use_the_official_optimizer_and_the_papers_normalization():
    for name, preset in configs.PRESETS.items():
        assert (preset.nesterov, preset.weight_decay_scope, preset.momentum) == (True, "all", 0.9), name
        if name.startswith(("t1-", "t2-", "t3-", "t4-")):
            assert preset.normalization == "pixel_mean" and preset.warmup_steps == 400, name


def test_pixel_mean_is_the_mean_training_image():
    data = sources.synthetic(64, 16, image_size=(8, 8), seed=3)
    config = configs.get_config("synthetic-resnet8", normalization="pixel_mean", image_size=(8, 8))
    mean, std = pipelines.pixel_stats(config, data)
    assert mean.shape == (8, 8, 3) and std.tolist() == [1.0, 1.0, 1.0]
    np.testing.assert_allclose(mean, data.train_images.astype(np.float64).mean(axis=0), rtol=1e-6)
    with pytest.raises(sources.DataError, match="pixel_mean"):
        pipelines.pixel_stats(config)
    # On the device the same mean image is subtracted (then the pad-crop-flip, training only).
    from keras_preact.models import cifar_resnet
    from keras_preact_training.recipe import augment

    classifier = cifar_resnet(8, 10, input_shape=(8, 8, 3))
    model = augment.device_training_model(classifier, augmentation="cifar", mean=mean, std=std, seed=0)
    x = data.test_images[:4]
    np.testing.assert_allclose(model.predict(x, verbose=0), classifier.predict(x.astype("float32") - mean, verbose=0),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "preset, expected",
    [
        # CIFAR, batch 128: warm-up 0.01 for 400 iterations, 0.1, /10 at 32k and 48k, stop at 64k.
        ("t3-cifar10-resnet110-preact", [(0, 0.01), (400, 0.1), (32000, 0.01), (48000, 0.001), (64000, None)]),
        ("t2-resnet164-full-preact", [(0, 0.01), (400, 0.1), (32000, 0.01), (48000, 0.001), (64000, None)]),
        # Batch 64 (Table 4): the same epochs, twice the iterations, the same lr (as the paper's run).
        ("t4-cifar10-resnet1001-preact-batch64",
         [(0, 0.01), (800, 0.1), (64000, 0.01), (96000, 0.001), (128000, None)]),
        # ImageNet: 0.1, /10 at epochs 30 and 60, 90 epochs of 1,281,167 // 256 = 5004 iterations.
        ("t5-resnet200-preact", [(0, 0.1), (30 * 5004, 0.01), (60 * 5004, 0.001), (90 * 5004, None)]),
    ],
)
def test_dry_run_prints_the_papers_schedule(preset, expected, capsys):
    assert cli.main(["--preset", preset, "--dry-run"]) == 0
    out = capsys.readouterr().out
    rows = out.split("from iteration:\n")[1].strip().splitlines()
    parsed = [(int(r.split()[0]), None if "stop" in r else float(r.split()[1])) for r in rows]
    assert parsed == [(i, None if lr is None else pytest.approx(lr)) for i, lr in expected]
    assert "nesterov True" in out and "scope all" in out and "weight decay 0.0001" in out


def test_dry_run_reads_no_data_and_trains_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert cli.main(["--preset", "t5-resnet152-preact", "--dry-run", "--run-dir", str(run_dir)]) == 0
    assert not run_dir.exists() and "1281167 training images" in capsys.readouterr().out


def test_dry_run_needs_no_folder(tmp_path, capsys):
    """A folder preset without --data-dir: the size of the dataset its statistics name, said so; with
    --data-dir the folder is counted; a folder of unknown statistics needs --steps-per-epoch."""
    assert cli.main(["--preset", "cifar10-folder-resnet20-short", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "50000 training images (assumed: the size of cifar10" in out and "5850 = 15 epochs x 390" in out
    argv = ["--dataset", "folder", "--normalization", "centered", "--dry-run"]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and "pass --data-dir" in capsys.readouterr().err
    assert cli.main([*argv, "--steps-per-epoch", "7", "--epochs", "2"]) == 0
    assert "iterations: 14 = 2 epochs x 7" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # training itself still needs the folder
        cli.main(["--preset", "cifar10-folder-resnet20-short", "--run-dir", str(tmp_path / "run")])
    assert e.value.code == 2
    assert "needs --data-dir" in capsys.readouterr().err and not (tmp_path / "run").exists()


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="SavedModel export needs TensorFlow")
def test_export_carries_the_mean_image(tmp_path):
    import tensorflow as tf

    from keras_preact.export import export_saved_model
    from keras_preact.models import cifar_resnet

    model = cifar_resnet(8, 10, input_shape=(8, 8, 3))
    mean = np.random.default_rng(2).uniform(100, 150, (8, 8, 3)).astype("float32")
    path = export_saved_model(model, tmp_path, name="m", mean=mean, std=[1.0, 1.0, 1.0])
    pixels = np.random.default_rng(3).integers(0, 256, (2, 8, 8, 3)).astype("uint8")
    served = tf.saved_model.load(str(path)).signatures["serving_default"](images=tf.constant(pixels))
    expected = model.predict(pixels.astype("float32") - mean, verbose=0)
    np.testing.assert_allclose(served["probabilities"].numpy(), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"mean=.*\[8, 8, 3\] image"):
        export_saved_model(model, tmp_path, name="bad", mean=np.zeros((4, 4, 3)))


def test_compat_variable_index():
    """``keras_preact_training.machine.compat.variable_index`` uses Keras' private ``Optimizer._get_variable_index``
    (checked against Keras ``compat.CHECKED_AGAINST``): every variable, Keras or backend, maps to its position."""
    from keras_preact_training.machine import compat

    model = tiny_model()
    optimizer = TorchSGD(0.1, momentum=0.9, coupled_weight_decay=1e-4)
    optimizer.build(model.trainable_variables)
    assert hasattr(keras.optimizers.Optimizer, "_get_variable_index"), (
        f"Keras {keras.version()} has no Optimizer._get_variable_index (checked against "
        f"{compat.CHECKED_AGAINST}): update training/machine/compat.py's variable_index.")
    for i, variable in enumerate(model.trainable_variables):
        assert compat.variable_index(optimizer, variable) == i
        if keras.backend.backend() == "tensorflow":  # update_step may get the backend's variable there
            assert compat.variable_index(optimizer, variable.value) == i
