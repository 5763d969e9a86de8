"""``--label-smoothing`` is the loss a run computes: the test loss a run reports is the cross-entropy against
labels smoothed by the value asked (Szegedy et al. 2016: ``(1 - e) * one_hot + e / K``), computed here from the
saved model's probabilities; a smoothing ignored, halved or doubled would report another loss."""

import json

import numpy as np
import pytest

from keras_preact_training import cli
from keras_preact_training.data import sources
from support import TRAIN_JIT_COMPILE

pytestmark = [pytest.mark.notf]


def smoothed_loss(probabilities, labels, smoothing):
    """The mean cross-entropy of ``probabilities`` [N, K] against the labels smoothed by ``smoothing``."""
    count = probabilities.shape[1]
    target = np.eye(count)[labels] * (1 - smoothing) + smoothing / count
    clipped = np.clip(probabilities.astype(np.float64), 1e-7, 1 - 1e-7)  # Keras' epsilon
    return float(np.mean(-np.sum(target * np.log(clipped), axis=1)))


def test_the_reported_test_loss_is_the_cross_entropy_smoothed_by_the_value_asked(tmp_path):
    import keras

    import keras_preact.layers  # noqa: F401  (registers the layers for loading)

    run = tmp_path / "run"
    assert cli.main(["--synthetic-train-size", "64", "--synthetic-test-size", "64", "--batch-size", "16",
                     "--epochs", "1", "--steps-per-epoch", "2", "--label-smoothing", "0.3", "--run-dir", str(run),
                     "--no-export", "--verbose", "0", "--jit-compile", TRAIN_JIT_COMPILE]) == 0
    config = json.loads((run / "config.json").read_text())["config"]
    data = sources.synthetic(config["synthetic_train_size"], config["synthetic_test_size"],
                             config["synthetic_num_classes"], tuple(config["image_size"]), config["seed"])
    model = keras.saving.load_model(run / "model.keras")
    probabilities = np.asarray(model.predict((data.test_images.astype("float32") - 127.5) / 63.75, verbose=0))
    reported = json.loads((run / "metrics.json").read_text())["test_loss"]
    losses = {e: smoothed_loss(probabilities, data.test_labels, e) for e in (0.0, 0.15, 0.3, 0.6)}
    # Two steps leave the probabilities near uniform: the losses part by about 5e-4, the reported one is within
    # float32's rounding (1e-7 here) of the value asked.
    assert reported == pytest.approx(losses[0.3], abs=2e-5)
    assert all(abs(losses[e] - losses[0.3]) > 10 * 2e-5 for e in (0.0, 0.15, 0.6)), losses
