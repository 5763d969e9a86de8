"""fit's host cost in the training app: the steps per compiled call it chooses, and callbacks that leave the
training loop free of a host synchronisation on every step."""

import keras
import pytest

from keras_preact_training import train as train_lib
from keras_preact_training.machine import execution
from keras_preact_training.recipe import configs
from keras_preact_training.run import run_dir as run_files
from support import TRAIN_JIT_COMPILE

pytestmark = pytest.mark.notf

TINY = dict(depth=8, image_size=(16, 16), synthetic_train_size=96, synthetic_test_size=32, batch_size=16,
            epochs=1, steps_per_epoch=6, checkpoint_every=4, verbose="0", export=False, jit_compile=TRAIN_JIT_COMPILE)


@pytest.mark.parametrize("backend, kind, steps_per_epoch, extra, expected", [
    ("jax", "gpu", 390, {}, 30),  # CIFAR's 50,000 / 128: 390 = 2 * 3 * 5 * 13; the largest divisor <= 32
    ("tensorflow", "tpu", 390, {}, 30),
    ("jax", "gpu", 390, {"checkpoint_every": 20}, 15),  # backups no further apart than asked
    ("jax", "gpu", 390, {"health_every": 10}, 1),  # the health signals measure single steps
    ("jax", "gpu", 97, {}, 1),  # a prime: only 1 splits every epoch into whole calls
    ("jax", "gpu", 6, {}, 6),
    ("jax", "cpu", 390, {}, 1),
    ("tensorflow", "cpu", 390, {}, 1),
    ("torch", "gpu", 390, {}, 1),  # Keras' PyTorch trainer: one step per call
])
def test_the_app_chooses_steps_per_execution_by_device(backend, kind, steps_per_epoch, extra, expected):
    chosen, why = execution.choose_steps_per_execution(None, backend, kind, steps_per_epoch, **extra)
    assert chosen == expected
    assert why


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_an_explicit_steps_per_execution_wins(kind):
    assert execution.choose_steps_per_execution(7, "jax", kind, 390) == (7, "--steps-per-execution")


def test_the_config_leaves_steps_per_execution_to_the_app_and_checks_a_given_one():
    assert configs.get_config("synthetic-resnet8").steps_per_execution is None
    with pytest.raises(ValueError, match="Invalid steps_per_execution=0: a positive integer is required"):
        configs.get_config("synthetic-resnet8", steps_per_execution=0)


@pytest.mark.parametrize("requested", [None, 4])
def test_a_run_compiles_and_announces_the_chosen_steps_per_execution(tmp_path, monkeypatch, capsys, requested):
    """On a (faked) GPU the run takes 3 steps per call (6 steps per epoch, backups every 3), says so in its
    start-up line, and backs up at the epoch's end; ``--steps-per-execution 4`` wins (calls of 4 and 2 steps: the
    epoch still ends at step 6; PyTorch runs one step per call, so 1 there)."""
    monkeypatch.setattr(execution, "device_kind", lambda backend=None: "gpu")
    compiled = []
    original = keras.Model.compile

    def compile(self, *args, **kwargs):
        compiled.append(kwargs.get("steps_per_execution"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "compile", compile)
    torch = keras.backend.backend() == "torch"
    requested = 1 if requested and torch else requested
    config = configs.get_config("synthetic-resnet8", run_dir=str(tmp_path / "run"), steps_per_execution=requested,
                                **{**TINY, "checkpoint_every": 3})
    result = train_lib.train(config)
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("[train] synthetic"))
    expected = requested or (1 if torch else 3)
    assert compiled == [expected]
    why = ("--steps-per-execution" if requested else "Keras' PyTorch trainer runs one step per call" if torch
           else "GPU: the largest divisor of 6 steps per epoch up to 3")
    assert f"6 iterations, {expected} per compiled call ({why}" in line
    assert result["steps"] == 6
    assert run_files.read_backup(tmp_path / "run" / "checkpoints" / "backup")["step"] == 6


def test_the_apps_callbacks_leave_the_batch_end_to_keras_async_dispatch(tmp_path):
    """Keras runs the batch-end callbacks off the training loop (no host synchronisation per step on JAX and
    PyTorch) only when every callback either has no ``on_batch_end``/``on_train_batch_end`` or sets
    ``async_safe`` (``keras.callbacks.CallbackList``): the app's own callbacks do, health signals off. Keras'
    TensorBoard (where TensorFlow is installed) keeps the batch end on the loop: its first batch end reads the
    model, which on JAX is not safe from Keras' dispatch thread."""
    import types

    config = configs.get_config("synthetic-resnet8", needs_data=False)
    run = types.SimpleNamespace(config=config, data=None, files_dir=tmp_path, run_dir=tmp_path, start_step=0,
                                backup=None, is_chief=True,
                                tensorboard_dir=None)
    callbacks = train_lib.make_callbacks(run)
    base = keras.callbacks.Callback
    per_step = [type(c).__name__ for c in callbacks if not getattr(c, "async_safe", False) and (
        type(c).on_train_batch_end is not base.on_train_batch_end or type(c).on_batch_end is not base.on_batch_end)]
    assert per_step == []
    assert {type(c).__name__ for c in callbacks} >= {"AtomicBackup", "CSVLogger", "EpochTimer"}

