"""``keras-preact-evaluate --tta flip``: every image's prediction is the mean of the model's on it and on its
mirror image; the loss and top-1 written are those of the averaged probabilities."""

import json

import numpy as np
import pytest
from test_evaluate import CIFAR16, NAME, _normalized, _run, registered  # noqa: F401 - the fixture

from support import to_numpy

pytestmark = [pytest.mark.core, pytest.mark.notf]


def test_flip_tta_evaluates_the_mean_of_the_image_and_its_mirror(registered, tmp_path, capsys):  # noqa: F811
    model, data_dir, images, labels = registered
    x = _normalized(images, CIFAR16)
    probabilities = (to_numpy(model(x)) + to_numpy(model(x[:, :, ::-1]))) / 2
    expected_loss = float(np.mean(-np.log(probabilities[np.arange(len(labels)), labels])))
    common = [NAME, "--weights", "toy", "--data-dir", data_dir, "--cache-dir", tmp_path / "cache", "--batch-size", 5]
    _run(capsys, *common, "--json", tmp_path / "plain.json")
    _run(capsys, *common, "--json", tmp_path / "tta.json", "--tta", "flip")
    plain, tta = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("plain", "tta"))
    assert tta["top1_accuracy"] == float(np.mean(probabilities.argmax(-1) == labels))
    np.testing.assert_allclose(tta["loss"], expected_loss, rtol=1e-5)
    assert abs(tta["loss"] - plain["loss"]) > 1e-3  # the mirror images count


def test_a_bad_tta_is_refused_in_one_line(registered, tmp_path, capsys):  # noqa: F811
    _, data_dir, _, _ = registered
    with pytest.raises(SystemExit) as exit_:
        _run(capsys, NAME, "--weights", "toy", "--data-dir", data_dir, "--tta", "crop")
    assert exit_.value.code == 2
    assert "argument --tta: invalid choice: 'crop' (choose from 'none', 'flip')" in capsys.readouterr().err
