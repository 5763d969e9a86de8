"""Fault tolerance: SIGKILL a real training process mid-epoch, re-run the same command, check it
completes with the same epochs and steps -- and the same weights as a run that was never killed."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
STEPS_PER_EPOCH, EPOCHS = 20, 2


def command(run_dir):
    return [sys.executable, "-m", "training.cli", "--depth", "8", "--image-size", "16", "16", "--batch-size", "32", "--epochs", str(EPOCHS),
            "--steps-per-epoch", str(STEPS_PER_EPOCH), "--checkpoint-every", "4", "--run-dir", str(run_dir),
            "--verbose", "0", "--no-export", "--jit-compile", "false", "--seed", "3"]


def env():
    return {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}


def weights(run_dir):
    import keras

    import keras_preact.layers  # noqa: F401  (registers ResidualUnit for loading)

    model = keras.saving.load_model(pathlib.Path(run_dir) / "model.keras")
    return [np.asarray(w) for w in model.get_weights()]


@pytest.mark.notf
def test_sigkill_mid_epoch_then_same_command_resumes(tmp_path):
    run_dir = tmp_path / "killed"
    pointer = run_dir / "checkpoints" / "backup" / "latest.json"
    proc = subprocess.Popen(command(run_dir), cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    killed_at = None
    while time.time() < deadline and proc.poll() is None:
        try:
            step = json.loads(pointer.read_text())["step"]
        except (OSError, ValueError, KeyError):
            step = 0
        if step > STEPS_PER_EPOCH and step % STEPS_PER_EPOCH:
            proc.send_signal(signal.SIGKILL)
            killed_at = step
            break
        time.sleep(0.01)
    proc.wait(timeout=60)
    assert killed_at is not None, f"the run ended before it could be killed:\n{proc.stdout.read()[-3000:]}"
    assert proc.returncode == -signal.SIGKILL
    assert not (run_dir / "model.keras").exists()

    again = subprocess.run(command(run_dir), cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    resumed = int(again.stdout.split("resuming at step ")[1].split()[0].rstrip(";"))
    assert resumed >= killed_at and resumed % STEPS_PER_EPOCH  # resumed inside an epoch
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert (metrics["epochs"], metrics["steps"]) == (EPOCHS, EPOCHS * STEPS_PER_EPOCH)
    assert metrics["steps_this_session"] == EPOCHS * STEPS_PER_EPOCH - resumed
    epochs_logged = [line.split(",")[0] for line in (run_dir / "history.csv").read_text().splitlines()[1:]]
    assert epochs_logged == [str(e) for e in range(EPOCHS)]

    # The resumed run continued the exact data stream and optimizer state: same weights as an
    # uninterrupted run of the same command.
    straight = tmp_path / "straight"
    done = subprocess.run(command(straight), cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for a, b in zip(weights(run_dir), weights(straight)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
