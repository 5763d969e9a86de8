"""A fine-tuning run (``keras-preact-train finetune-folder``) SIGKILLed at the end of its head phase, its backup
written at that step and nothing after, resumes to the weights of a run never stopped, bit for bit on the run's
backend. The backup there holds the head phase's optimizer (the head's few variables): restored into a model of
every layer it was skipped ("Skipping variable loading for optimizer"), the schedule started again at step 0."""

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
STEPS_PER_EPOCH, HEAD_STEPS = 2, 2  # the head phase is the first epoch


def write_folder(root, classes=("cat", "dog", "emu"), per_class=8):
    return write_image_folder(root, classes, per_class)


def arguments(data_dir, run_dir):
    return ["finetune-folder", "--data-dir", str(data_dir), "--run-dir", str(run_dir), "--epochs", "2",
            "--steps-per-epoch", str(STEPS_PER_EPOCH), "--head-fraction", "0.5", "--batch-size", "8",
            "--checkpoint-every", "100", "--no-export", "--verbose", "0", "--jit-compile", TRAIN_JIT_COMPILE]


def weights(run_dir):
    import keras

    import keras_preact.layers  # noqa: F401  (registers the layers for loading)

    model = keras.saving.load_model(pathlib.Path(run_dir) / "model.keras")
    return [np.asarray(w) for w in model.get_weights()]


def test_a_finetuning_run_killed_at_the_phase_boundary_resumes_to_the_uninterrupted_weights(tmp_path, capfd):
    data = write_folder(tmp_path / "data")
    run = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path]), "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "keras_preact_training.cli", *arguments(data, run)], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert killing.kill_when(proc, killing.backed_up(run, HEAD_STEPS)) == -9
    backups = sorted(p.name for p in (run / "checkpoints" / "backup").glob("state-*"))
    assert backups[-1] == f"state-{HEAD_STEPS:010d}" and not (run / "model.keras").exists()

    assert cli.main(arguments(data, run)) == 0
    out, err = capfd.readouterr()
    assert f"resuming at step {HEAD_STEPS}" in out
    assert f"head phase done at step {HEAD_STEPS}: every layer trains from here" in out
    assert "Skipping variable loading for optimizer" not in out + err
    assert cli.main(arguments(data, tmp_path / "straight")) == 0
    resumed, straight = weights(run), weights(tmp_path / "straight")
    assert len(resumed) == len(straight)
    for a, b in zip(resumed, straight):
        np.testing.assert_array_equal(a, b)
