"""Fine-tuning levers through ``keras-preact-train``: weight EMA (evaluated and saved from the averages, training
on from the raw weights across fits), gradient accumulation (the update of one large batch), mixup and cutmix
(labels mixed alike, draws a function of seed and step), layer-wise decay, all together in one run."""

import json

import keras
import numpy as np
import pytest

from keras_preact.models import create_model
from keras_preact_training import cli
from keras_preact_training.data import mixing
from support import TRAIN_JIT_COMPILE, to_numpy, write_flower_folder

pytestmark = [pytest.mark.notf]  # notf: JAX and PyTorch without TensorFlow; CI runs it on TensorFlow too


@pytest.fixture
def folder(tmp_path):
    return write_flower_folder(tmp_path / "flowers", (16, 16))


@pytest.fixture
def weights(tmp_path):
    keras.utils.set_random_seed(3)
    path = tmp_path / "source.weights.h5"
    create_model("cifar_resnet20", depth=8, num_classes=10, input_shape=(16, 16, 3)).save_weights(path)
    return path


def _train(tmp_path, folder, weights, name, *extra):
    run = tmp_path / name
    argv = ["finetune-folder", "--recipe", "fixed", "--init-weights", str(weights), "--depth", "8", "--image-size",
            "16", "16", "--data-dir", str(folder), "--batch-size", "8", "--run-dir", str(run), "--no-export",
            "--cache-dir", str(tmp_path / "cache"), "--verbose", "0", "--jit-compile", TRAIN_JIT_COMPILE,
            "--schedule", "piecewise", *extra]
    assert cli.main(argv) == 0
    return keras.saving.load_model(run / "model.keras")


def _trainable(model):
    return [to_numpy(v) for v in model.trainable_weights]


def test_ema_run_saves_the_averages_of_the_raw_trajectory(tmp_path, folder, weights):
    """4 steps at a constant rate, the head alone for the first 2 (two fits, the all-layers phase's optimizer
    fresh): the saved weights are Keras' EMA (momentum 0.5) started at the weights the head phase ended with,
    w2/4 + w3/4 + w4/2, of the weights w2, w3, w4 of runs of 2, 3 and 4 steps without EMA. So the all-layers phase
    trained on from the raw weights, not from the head phase's averages (w1/2 + w2/2) that Keras writes in at the
    end of a fit, and its averages started at w2, not at Keras' zeros."""
    def run(name, steps, head_fraction, *extra):
        return _trainable(_train(tmp_path, folder, weights, name, "--epochs", str(steps), "--steps-per-epoch", "1",
                                 "--head-fraction", head_fraction, "--augmentation", "none", *extra))

    raw = [run("raw2", 2, "0.9"), run("raw3", 3, "0.6"), run("raw4", 4, "0.5")]  # the head alone for steps 1-2
    averaged = run("ema", 4, "0.5", "--ema-momentum", "0.5")
    for w2, w3, w4, got in zip(*raw, averaged):
        np.testing.assert_allclose(got, w2 / 4 + w3 / 4 + w4 / 2, rtol=1e-5, atol=1e-6)
    assert any(np.abs(w4 - got).max() > 1e-4 for w4, got in zip(raw[2], averaged))


def test_gradient_accumulation_is_the_update_of_the_whole_batch(tmp_path, folder, weights):
    """The head phase (BN in inference mode, no augmentation): 2 batches of 4 accumulated make the step of one
    batch of the same 8 images."""
    common = ("--epochs", "1", "--head-fraction", "0.9", "--augmentation", "none")
    whole = _train(tmp_path, folder, weights, "whole", "--steps-per-epoch", "1", *common)
    accumulated = _train(tmp_path, folder, weights, "accumulated", "--steps-per-epoch", "2", "--batch-size", "4",
                         "--gradient-accumulation", "2", *common)
    for a, b in zip(_trainable(whole), _trainable(accumulated)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    single = _train(tmp_path, folder, weights, "single", "--steps-per-epoch", "1", "--batch-size", "4", *common)
    assert not np.allclose(to_numpy(single.get_layer("logits").kernel), to_numpy(whole.get_layer("logits").kernel))


LEVERS = ("--epochs", "2", "--steps-per-epoch", "2", "--head-fraction", "0.5", "--layer-decay", "0.5",
          "--ema-momentum", "0.9", "--gradient-accumulation", "2", "--mixup", "0.2", "--cutmix", "1",
          "--rand-augment", "0.5", "--freeze-norm", "true", "--pipeline", "device", "--checkpoint-every", "1")


def test_every_lever_together_trains_and_resumes_exactly(tmp_path, folder, weights, capsys, monkeypatch):
    """Every lever on: the run trains; stopped after the backup of step 3 (inside the all-layers phase, half way
    through an accumulation), the same command resumes to the weights of the run never stopped."""
    from keras_preact_training.run import run_dir as run_files

    whole = _train(tmp_path, folder, weights, "all", *LEVERS)
    assert whole.output_shape == (None, 3)
    metrics = json.loads((tmp_path / "all" / "metrics.json").read_text())
    assert metrics["steps"] == 4 and 0 <= metrics["test_accuracy"] <= 1
    assert "head phase done at step 2" in capsys.readouterr().out
    save = run_files.AtomicBackup._save_model

    def stop_after_step_3(self):
        save(self)
        if self.step == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(run_files.AtomicBackup, "_save_model", stop_after_step_3)
    with pytest.raises(KeyboardInterrupt):
        _train(tmp_path, folder, weights, "stopped", *LEVERS)
    monkeypatch.setattr(run_files.AtomicBackup, "_save_model", save)
    resumed = _train(tmp_path, folder, weights, "stopped", *LEVERS)
    for a, b in zip(resumed.weights, whole.weights):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=0, atol=1e-6, err_msg=a.path)


@pytest.mark.parametrize("flag, value, message", [
    ("--ema-momentum", "1", "Invalid ema_momentum=1.0: a number in [0, 1) (0: off) is required."),
    ("--layer-decay", "0", "Invalid layer_decay=0.0: a number in (0, 1] is required (1: off)."),
    ("--gradient-accumulation", "0", "Invalid gradient_accumulation=0: a positive integer is required."),
    ("--mixup", "-1", "Invalid mixup=-1.0: a number >= 0 (0: off) is required."),
    ("--recipe", "bit", "argument --recipe: invalid choice: 'bit'"),
    ("--rand-augment", "2", "Invalid rand_augment=2.0: a magnitude in [0, 1] is required (0: off)."),
])
def test_bad_lever_flags_exit_2_naming_them(tmp_path, folder, flag, value, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["finetune-folder", "--data-dir", str(folder), "--run-dir", str(tmp_path / "run"), flag, value])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_mixup_mixes_images_and_labels_alike():
    x = np.random.default_rng(0).uniform(0, 255, (6, 8, 8, 3)).astype("float32")
    y = np.array([0, 1, 2, 0, 1, 2])
    images, labels = mixing.mix_batch(x, y, 3, mixup=0.4, cutmix=0, rng=np.random.default_rng(1))
    rng = np.random.default_rng(1)
    lam, perm = rng.beta(0.4, 0.4), rng.permutation(6)
    np.testing.assert_allclose(images, lam * x + (1 - lam) * x[perm], rtol=1e-6)
    np.testing.assert_allclose(labels, lam * np.eye(3)[y] + (1 - lam) * np.eye(3)[y][perm], rtol=1e-6)


def test_cutmix_labels_are_the_pasted_area():
    x = np.stack([np.full((10, 10, 1), float(i)) for i in range(4)]).astype("float32")
    y = np.arange(4) % 2
    images, labels = mixing.mix_batch(x, y, 2, mixup=0, cutmix=1.0, rng=np.random.default_rng(5))
    for i in range(4):
        own = np.mean(images[i] == i) if np.any(images[i] != i) else 1.0
        kept = labels[i, y[i]] if not np.allclose(labels[i], np.eye(2)[y[i]]) else 1.0
        assert np.isclose(own, kept) or np.allclose(labels[i], np.eye(2)[y[i]])
    np.testing.assert_allclose(labels.sum(-1), 1, rtol=1e-6)


def test_the_draws_of_a_step_do_not_depend_on_where_the_stream_started():
    data = [(np.full((4, 4, 4, 3), s, np.float32), np.arange(4) % 2) for s in range(5)]

    def from_step(step):
        return mixing.mixed_train(iter(data[step:]), 2, mixup=0.3, cutmix=1.0, seed=9, start_step=step)

    whole = list(from_step(0))
    resumed = list(from_step(3))
    for (a, la), (b, lb) in zip(whole[3:], resumed):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)


@pytest.mark.parametrize("count, size, architecture, expected", [
    (3_900, (32, 32), "cifar", "3,900 images of 32x32: 500 steps at 32 px (warm-up 100, evaluated every 60), "
                               "mixup 0.1, head from a linear probe, BN frozen"),
    # a pass over 500 images is 7 steps: evaluated every 50 (10 times), not 71 times
    (500, (32, 32), "cifar", "500 images of 32x32: 500 steps at 32 px (warm-up 100, evaluated every 50), mixup 0.1"),
    (45_000, (32, 32), "cifar", "45,000 images of 32x32: 10000 steps at 32 px (warm-up 500, evaluated every 1000), "
                                "mixup 0.1, head from a linear probe, BN trained"),
    (600_000, (64, 64), "imagenet", "600,000 images of 64x64: 20000 steps at 128 px (warm-up 500, evaluated every "
                                    "9375), mixup 0.1"),
    (600_000, (300, 400), "imagenet", "600,000 images of 300x400: 20000 steps at 224 px (warm-up 500, evaluated "
                                      "every 9375), mixup 0.1"),
])
def test_hyperrule_plans_from_the_folder(count, size, architecture, expected):
    from keras_preact_training.recipe import configs, hyperrule

    base = configs.PRESETS["finetune-folder"].replace(
        architecture=architecture, image_size=(224, 224) if architecture == "imagenet" else (32, 32))
    config, line = hyperrule.apply(base, count, size)
    assert expected in line
    from keras_preact_training.recipe import schedules

    resolved = schedules.resolve(config, count)
    assert resolved.total_steps == int(line.split(": ")[2].split(" steps")[0])
    assert config.mixup == 0.1  # at every size: measured on CIFAR's halves (docs/fine-tuning.md)
    given, line = hyperrule.apply(base.replace(mixup=0.2, epochs=3), count, size, given={"epochs", "mixup"})
    assert given.epochs == 3 and given.mixup == 0.2  # flags given win, and the line says what the run does
    steps = schedules.resolve(given, count).total_steps
    assert f"{steps} steps at" in line and "mixup 0.2" in line and "given: --epochs, --mixup)" in line


def test_recipe_auto_is_printed_before_any_work(tmp_path, folder, capsys):
    assert cli.main(["finetune-folder", "--data-dir", str(folder), "--dry-run"]) == 0
    out = capsys.readouterr().out
    line = ("[recipe] auto: 21 images of 16x16: 500 steps at 32 px (warm-up 100, evaluated every 50), mixup 0.1, "
            "head from a linear probe, BN frozen (BiT")
    assert line in out and out.index(line) < out.index("preset finetune-folder")  # before the recipe's work
    assert "iterations: 500 = " in out


def test_rand_augment_draws_are_a_function_of_seed_and_call():
    """Call k of ``StepRandAugment`` draws from (seed, k) only: a fresh layer with its counter at 1 repeats the
    second call of one that ran twice; inference returns the images."""
    from keras_preact_training.recipe.augment import StepRandAugment

    x = np.random.default_rng(0).uniform(0, 255, (4, 16, 16, 3)).astype("float32")
    layer = StepRandAugment(0.8, seed=3)
    first, second = (to_numpy(layer(x, training=True)) for _ in range(2))
    assert not np.allclose(first, second) and not np.allclose(first, x)
    again = StepRandAugment(0.8, seed=3)
    again.build(x.shape)
    again.iterations.assign(1)
    np.testing.assert_allclose(to_numpy(again(x, training=True)), second, rtol=1e-5, atol=1e-3)
    np.testing.assert_array_equal(to_numpy(layer(x, training=False)), x)


def test_linear_probe_run_fits_the_head_alone_without_training(tmp_path, folder, weights, capsys):
    """``--linear-probe``: one forward pass and the closed-form head; no ``model.fit`` (no history), the backbone
    (BN statistics included) exactly the source's, the head the ridge regression on the training features."""
    from keras_preact.models import levers
    from keras_preact_training.data import sources
    from keras_preact_training.recipe import configs

    model = _train(tmp_path, folder, weights, "probe", "--linear-probe")
    assert "[train] linear probe: the head in closed form on the features of 21 training images" in (
        capsys.readouterr().out)
    assert not (tmp_path / "probe" / "history.csv").exists()
    source = create_model("cifar_resnet20", depth=8, num_classes=10, input_shape=(16, 16, 3))
    source.load_weights(weights)
    for a, b in zip(model.backbone.weights, source.backbone.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    config = configs.get_config("finetune-folder", data_dir=str(folder), depth=8, image_size=(16, 16),
                                init_weights=None, cache_dir=str(tmp_path / "cache"))
    data = sources.load(config)
    mean, std = np.asarray(model.input_config.mean, "float32"), np.asarray(model.input_config.std, "float32")
    kernel, bias = levers.ridge_head(levers.features(model, (data.train_images - mean) / std), data.train_labels, 3)
    np.testing.assert_allclose(to_numpy(model.get_layer("logits").kernel), kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(to_numpy(model.get_layer("logits").bias), bias, rtol=1e-4, atol=1e-5)
    metrics = json.loads((tmp_path / "probe" / "metrics.json").read_text())
    assert metrics["steps"] == 0 and 0 <= metrics["test_accuracy"] <= 1


def test_head_init_probe_starts_the_new_head_from_the_linear_probe(tmp_path, folder, weights, capsys):
    """``--head-init probe`` (``--recipe auto``'s): before the first step the new head is the closed-form probe on
    the frozen features (LP-FT), so a step at a vanishing rate ends with ``--linear-probe``'s head; ``random``
    keeps the initialiser's."""
    def head(model):
        return np.concatenate([to_numpy(v).ravel() for v in model.get_layer("logits").weights])

    probe = head(_train(tmp_path, folder, weights, "probe", "--linear-probe"))
    one_step = ("--epochs", "1", "--steps-per-epoch", "1", "--lr", "1e-12", "--augmentation", "none")
    started = head(_train(tmp_path, folder, weights, "lpft", *one_step, "--head-init", "probe"))
    assert ("[train] head: fitted in closed form on the features of 21 training images before the first step"
            in capsys.readouterr().out)
    np.testing.assert_allclose(started, probe, rtol=1e-4, atol=1e-5)
    random = head(_train(tmp_path, folder, weights, "random", *one_step, "--head-init", "random"))
    assert np.abs(random - probe).max() > 0.05
    assert "[train] head: fitted" not in capsys.readouterr().out


@pytest.mark.parametrize("head_fraction, head_init, frozen", [(0.2, "random", True), (0.0, "probe", True),
                                                             (0.0, "random", False)])
def test_the_batch_norm_rule_holds_for_a_probed_head_without_a_head_phase(head_fraction, head_init, frozen):
    """``--freeze-norm auto`` freezes the statistics when fine-tuning on a small set: a head phase, or (``--recipe
    auto``) a probed head with every layer training from the first step; from weights without either (a run
    trained on), they train."""
    from keras_preact_training.recipe import configs, schedules

    config = configs.PRESETS["finetune-folder"].replace(head_fraction=head_fraction, head_init=head_init)
    assert schedules.frozen_norm(config, 900) is frozen
