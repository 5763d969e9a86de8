"""TrainingHealthCallback: per-stage health signals during fit, CSV/TensorBoard, distribution."""

import csv
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_preact.analysis import TrainingHealthCallback, unit_signals, weight_groups
from keras_preact.models import cifar_resnet

SHAPE = (16, 16, 3)


def data(n=48, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 1, (n,) + SHAPE).astype("float32"), rng.integers(0, 10, n)


def model_and_fit(callbacks, learning_rate=0.0, epochs=2, batch_size=8):
    model = cifar_resnet(8, input_shape=SHAPE)  # ResNet-8: one unit per stage
    model.compile(optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    x, y = data()
    model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return model


@pytest.mark.core
def test_values_are_exact_with_frozen_weights(tmp_path):
    """lr = 0: no update (ratio exactly 0), and the probe values equal a direct computation."""
    probe = data(8, seed=1)
    health = TrainingHealthCallback(probe, every_n_steps=4)
    csv_path = tmp_path / "history.csv"
    model = model_and_fit([health, keras.callbacks.CSVLogger(str(csv_path))])

    groups = list(weight_groups(model))
    assert groups == ["stem", "stage1", "stage2", "stage3", "head"]
    for group in groups:
        assert health.latest[f"health/{group}/update_ratio"] == 0.0
    # 6 steps per epoch: every 4th global step and the last step of each epoch.
    assert health.measured_steps == [0, 4, 5, 8, 11]

    signals = unit_signals(model, *probe, training=True)
    for s, grads in enumerate(signals.weight_grads):
        expected = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads))
        assert health.latest[f"health/stage{s + 1}/grad_norm"] == pytest.approx(expected, rel=1e-4)
        unit = model.backbone.get_layer(f"stage{s + 1}_unit1")
        out = keras.ops.convert_to_numpy(keras.Model(model.backbone.input, unit.output)(probe[0], training=True))
        assert health.latest[f"health/stage{s + 1}/act_mean"] == pytest.approx(out.mean(), rel=1e-4, abs=1e-6)
        assert health.latest[f"health/stage{s + 1}/act_std"] == pytest.approx(out.std(), rel=1e-4)

    rows = list(csv.DictReader(open(csv_path)))
    assert len(rows) == 2
    for key, value in health.latest.items():
        assert float(rows[-1][key]) == pytest.approx(value, rel=1e-6)


@pytest.mark.core
def test_update_ratio_positive_when_training():
    health = TrainingHealthCallback(data(8, seed=1), every_n_steps=100)
    model_and_fit([health], learning_rate=0.1, epochs=1)
    assert health.measured_steps == [0, 5]
    for group in ("stem", "stage1", "stage2", "stage3", "head"):
        assert 0.0 < health.latest[f"health/{group}/update_ratio"] < 1.0
        assert np.isfinite(health.latest[f"health/{group}/grad_norm"])


def test_tensorboard_scalars(tmp_path):
    tf = pytest.importorskip("tensorflow")
    health = TrainingHealthCallback(data(8), every_n_steps=3, log_dir=tmp_path / "health")
    model_and_fit([health], epochs=1)
    tags = {}
    for path in (tmp_path / "health").iterdir():
        for record in tf.data.TFRecordDataset(str(path)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(event.step)
                assert value.metadata.plugin_data.plugin_name == "scalars"
    assert set(tags) == set(health.latest)
    assert tags["health/stage2/grad_norm"] == [0, 3, 5]


@pytest.mark.core
def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="every_n_steps"):
        TrainingHealthCallback(data(4), every_n_steps=0)
    with pytest.raises(ValueError, match="data"):
        TrainingHealthCallback(42)
    with pytest.raises(ValueError, match="data"):
        TrainingHealthCallback((np.zeros((4,) + SHAPE), np.zeros(3)))


MIRRORED = textwrap.dedent(
    """
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras, numpy as np
    from keras_preact.analysis import TrainingHealthCallback
    from keras_preact.models import cifar_resnet
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (32, 16, 16, 3)).astype("float32"); y = rng.integers(0, 10, 32)
    with strategy.scope():
        model = cifar_resnet(8, input_shape=(16, 16, 3))
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    health = TrainingHealthCallback((x[:8], y[:8]), every_n_steps=2)
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[health])
    assert health.measured_steps == [0, 2, 3, 4, 6, 7], health.measured_steps
    for key in health.latest:
        values = history.history[key]
        assert len(values) == 2 and np.all(np.isfinite(values)), key
    assert all(history.history[f"health/{g}/update_ratio"][-1] > 0 for g in ("stem", "stage1", "head"))
    print("MIRRORED-OK")
    """
)


def test_mirrored_strategy(tmp_path):
    pytest.importorskip("tensorflow")
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", MIRRORED], env=env, capture_output=True,
                            text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert "MIRRORED-OK" in result.stdout, result.stderr[-3000:]
