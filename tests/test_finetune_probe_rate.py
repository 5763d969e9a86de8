"""The all-layers rate after a probed head (``keras_preact.models.finetune.rate_after_probe``; ``keras-preact-train
finetune-folder``'s ``--probe-rate-rule``, on under ``--recipe auto`` unless ``--lr`` is given): halved when the
linear probe is right on 99% or more of the training images. On 3 CIFAR-10 classes of a network trained on
CIFAR-10 the probe is right on 99.7% of them, and every layer at the full rate ended under the probed head in one
seed of 3 (docs/fine-tuning.md, "The all-layers rate")."""

import os
import pathlib
import subprocess
import sys

import killing
import numpy as np
import pytest

from keras_preact_training import cli
from support import TRAIN_JIT_COMPILE, write_image_folder

pytestmark = [pytest.mark.notf]

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_the_rule_halves_the_rate_from_99_percent_and_checks_its_arguments():
    from keras_preact.models.finetune import rate_after_probe

    assert [rate_after_probe(0.01, accuracy) for accuracy in (0.0, 0.9899, 0.99, 1.0)] == [0.01, 0.01, 0.005, 0.005]
    with pytest.raises(ValueError, match=r"probe_accuracy=1\.5: a share of the training images in \[0, 1\]"):
        rate_after_probe(0.01, 1.5)
    with pytest.raises(ValueError, match="rate=0: a learning rate > 0"):
        rate_after_probe(0, 0.5)


def test_recipe_auto_turns_the_rule_on_unless_a_rate_is_given():
    from keras_preact_training.recipe import configs, hyperrule

    preset = configs.PRESETS["finetune-folder"]
    assert not preset.probe_rate_rule  # --recipe fixed: the rate is the preset's
    assert hyperrule.apply(preset, 900, (32, 32))[0].probe_rate_rule
    given, _ = hyperrule.apply(preset.replace(base_lr=0.02), 900, (32, 32), given={"base_lr"})
    assert not given.probe_rate_rule and given.base_lr == 0.02


def arguments(data_dir, run_dir, *extra):
    """4 steps of --recipe auto (a probed head, every layer from the first step), a backup at step 2."""
    return ["finetune-folder", "--data-dir", str(data_dir), "--run-dir", str(run_dir), "--epochs", "2",
            "--steps-per-epoch", "2", "--batch-size", "8", "--checkpoint-every", "2", "--no-export", "--verbose", "0",
            "--jit-compile", TRAIN_JIT_COMPILE, *extra]


def weights(run_dir):
    import keras

    import keras_preact.layers  # noqa: F401  (registers the layers for loading)

    model = keras.saving.load_model(pathlib.Path(run_dir) / "model.keras")
    return [np.asarray(w) for w in model.get_weights()]


def resolved_rates(run_dir):
    import json

    schedule = json.loads((pathlib.Path(run_dir) / "config.json").read_text())["resolved_schedule"]
    return schedule["base_lr"], schedule["warmup_lr"]


def test_a_separating_probe_halves_the_rate_and_a_resumed_run_keeps_it(tmp_path, capfd):
    """24 training images, 64 features: the probe is right on all of them. The run trains as one given ``--lr
    0.005`` (bit for bit), says so in one line, and records it; killed after its step-2 backup, it resumes at that
    rate to the same weights. ``--lr`` given: the rate given, no line."""
    data = write_image_folder(tmp_path / "data", ("cat", "dog", "emu"), 8)
    assert cli.main(arguments(data, tmp_path / "rule")) == 0
    out = capfd.readouterr().out
    assert ("[recipe] the probe is right on 100.0% of the 24 training images (99% or more): the features already "
            "separate them, so every layer trains at half the rate, peak 0.005") in out
    assert resolved_rates(tmp_path / "rule") == (0.005, 0.0005)

    assert cli.main(arguments(data, tmp_path / "given", "--lr", "0.005")) == 0
    assert "[recipe] the probe is right on" not in capfd.readouterr().out
    rule, given = weights(tmp_path / "rule"), weights(tmp_path / "given")
    for a, b in zip(rule, given):
        np.testing.assert_array_equal(a, b)
    assert cli.main(arguments(data, tmp_path / "full", "--lr", "0.01")) == 0
    assert resolved_rates(tmp_path / "full") == (0.01, 0.001)
    assert any(np.abs(a - b).max() > 0 for a, b in zip(rule, weights(tmp_path / "full")))

    run = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path]), "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "keras_preact_training.cli", *arguments(data, run)], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert killing.kill_when(proc, killing.backed_up(run, 2)) == -9
    assert not (run / "model.keras").exists()
    assert cli.main(arguments(data, run)) == 0
    assert "resuming at step 2" in capfd.readouterr().out
    for a, b in zip(weights(run), rule):
        np.testing.assert_array_equal(a, b)


def test_a_probe_under_99_percent_leaves_the_rate(tmp_path, capfd):
    """300 images of noise in 2 classes, 64 features: no linear head fits them all, and every layer trains at the
    full rate, as the line says."""
    data = write_image_folder(tmp_path / "noise", ("cat", "dog"), 150)
    assert cli.main(arguments(data, tmp_path / "run", "--epochs", "1", "--steps-per-epoch", "1")) == 0
    out = capfd.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("[recipe] the probe is right on"))
    accuracy = float(line.split("right on ")[1].split("%")[0])
    assert accuracy < 99 and line.endswith("of the 300 training images (under 99%): every layer trains at the "
                                           "peak rate 0.01")
    assert resolved_rates(tmp_path / "run") == (0.01, 0.001)
