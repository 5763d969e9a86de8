"""``python -m keras_preact_training.publish``: a run's weights become a registry network's weights, loaded by
sha256."""

import json

import keras
import numpy as np
import pytest

from keras_preact.models import cifar_resnet, create_model, get_input_config, register_model
from keras_preact.models.registry import unregister_model
from keras_preact_training import publish
from keras_preact_training.run.manifest import RunManifest
from support import misnamed_metrics, randomize_statistics, to_numpy

NAME = "test_publish_tiny"
CLASSES = [f"c{k}" for k in range(6)]
CIFAR16 = get_input_config("cifar_resnet20").replace(input_size=(16, 16, 3))


@pytest.fixture
def tiny():
    register_model(NAME, family="cifar", arguments={"depth": 8}, input_config=CIFAR16)
    yield NAME
    unregister_model(NAME)


def _run_dir(path, depth=8, input_config=CIFAR16):
    """A finished run as keras-preact-train leaves it: config.json, model.keras (a plain functional
    classifier named after the preset) and metrics.json."""
    keras.utils.set_random_seed(5)
    model = randomize_statistics(cifar_resnet(depth, len(CLASSES), input_shape=(16, 16, 3), name="some-preset"),
                                 seed=5)
    path.mkdir()
    model.save(path / "model.keras")
    manifest = RunManifest(name="some-preset", class_names=tuple(CLASSES), input_config=input_config,
                           config={"dataset": "folder"})
    (path / "config.json").write_text(manifest.to_json())
    (path / "metrics.json").write_text(json.dumps({"test_accuracy": 0.51234, "test_top5_accuracy": 0.9}))
    return model


def _publish(capsys, *argv):
    code = publish.main([str(a) for a in argv])
    return code, capsys.readouterr()


@pytest.mark.notf
def test_published_weights_load_by_sha256_and_give_the_runs_outputs(tiny, tmp_path, capsys):
    trained = _run_dir(tmp_path / "run")
    code, out = _publish(capsys, tmp_path / "run", "--model", tiny, "--weights", "toy", "--out", tmp_path / "w")
    assert code == 0, out.err
    entry = json.loads(out.out.split("presets.py):\n", 1)[1])["toy"]
    assert entry["class_names"] == CLASSES and entry["top1"] == 0.5123 and entry["top5"] == 0.9
    assert misnamed_metrics(entry) == []  # the registry's top1/top5: fractions, as metrics.json's accuracies
    assert entry["dataset"] == "folder" and "some-preset" in entry["source"]
    assert entry["file"] == str(tmp_path / "w" / f"{tiny}_toy.weights.h5")
    assert [p.name for p in (tmp_path / "w").iterdir()] == [f"{tiny}_toy.weights.h5"]  # no temporary left
    register_model("test_publish_loaded", family="cifar", arguments={"depth": 8}, input_config=CIFAR16,
                   weights={"toy": entry})
    try:
        loaded = create_model("test_publish_loaded", weights="toy")
    finally:
        unregister_model("test_publish_loaded")
    images = np.random.default_rng(1).normal(size=(3, 16, 16, 3)).astype(np.float32)
    np.testing.assert_array_equal(to_numpy(loaded(images)), to_numpy(trained(images)))
    assert loaded.class_names == tuple(CLASSES) and loaded.input_config == CIFAR16


@pytest.mark.notf
@pytest.mark.parametrize("depth, input_config, message", [
    (14, CIFAR16, "the run's network is not test_publish_tiny"),
    (8, CIFAR16.replace(mean=(0.0, 0.0, 0.0)), "trained with input config"),
])
def test_a_run_of_another_network_is_refused_before_anything_is_written(tiny, tmp_path, capsys, depth,
                                                                         input_config, message):
    _run_dir(tmp_path / "run", depth=depth, input_config=input_config)
    with pytest.raises(SystemExit) as exit_info:
        publish.main([str(tmp_path / "run"), "--model", tiny, "--weights", "toy", "--out", str(tmp_path / "w")])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
