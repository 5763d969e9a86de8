"""End-to-end runs of ``keras_preact_training.train``: run-directory contract, determinism, NaN, bad input, CLI."""

import csv
import dataclasses
import json
import types

import keras
import numpy as np
import pytest

from keras_preact_training import cli
from keras_preact_training import train as train_lib
from keras_preact_training.data import pipelines, sources
from keras_preact_training.machine import distribute
from keras_preact_training.recipe import configs, schedules
from keras_preact_training.recipe import model as model_lib
from keras_preact_training.run import manifest
from keras_preact_training.run import run_dir as run_files
from support import TRAIN_JIT_COMPILE

TINY = dict(depth=8, image_size=(16, 16), synthetic_train_size=96, synthetic_test_size=32,
            batch_size=16, epochs=2, steps_per_epoch=3, checkpoint_every=2, verbose="0", export=False,
            jit_compile=TRAIN_JIT_COMPILE)


def tiny(tmp_path, **overrides):
    return configs.get_config("synthetic-resnet8", **{"run_dir": str(tmp_path / "run"), **TINY, **overrides})


# The tests that read ``tiny_run`` share one pytest-xdist worker (`--dist loadgroup`): the run trains once.
TINY_RUN_READER = pytest.mark.xdist_group("test_training_train-tiny-run")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """(folder, result) of one ``tiny`` run (seed 0), read by the run-directory and the determinism tests."""
    root = tmp_path_factory.mktemp("tiny")
    return root, train_lib.train(tiny(root))


def trained_weights(run_dir):
    model = keras.saving.load_model(run_dir / "model.keras")
    return [np.asarray(w) for w in model.get_weights()]


@pytest.mark.core
@pytest.mark.notf
@TINY_RUN_READER
def test_run_directory_contract(tiny_run):
    tmp_path, result = tiny_run
    run = tmp_path / "run"
    assert result["run_dir"] == str(run) and (result["epochs"], result["steps"]) == (2, 6)
    for name in ("config.json", "model.keras", "history.csv", "metrics.json", "curves.png", "tensorboard",
                 "checkpoints"):
        assert (run / name).exists(), name
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["name"] == "synthetic-resnet8"
    assert cfg["class_names"] == [f"class_{k}" for k in range(10)]
    assert cfg["format"] == "keras-preact-run/2" and cfg["num_classes"] == 10
    assert cfg["input_config"]["input_size"] == [16, 16, 3] and cfg["input_config"]["crop_fraction"] == 1.0
    assert (cfg["input_config"]["mean"], cfg["input_config"]["std"]) == ([127.5] * 3, [63.75] * 3)
    assert cfg["config"]["normalization"] == tiny(tmp_path).normalization  # the name; its values are above
    assert json.loads((run / "metrics.json").read_text())["test_accuracy"] == pytest.approx(result["test_accuracy"])
    # The config re-runs: the same Config comes back from config.json.
    assert manifest.config_from_run(run) == tiny(tmp_path)
    model = keras.saving.load_model(run / "model.keras", safe_mode=True)
    assert model.get_layer("predictions").dtype_policy.name == "float32"
    # The saved model carries the manifest's input config and class names (export/evaluate need no argument).
    assert model.input_config.to_dict() == cfg["input_config"] and list(model.class_names) == cfg["class_names"]
    rows = (run / "history.csv").read_text().strip().splitlines()
    assert len(rows) == 3 and rows[0].startswith("epoch")
    assert (run / "curves.png").read_bytes()[:4] == b"\x89PNG"
    # The kept backup is the final state, at the last step.
    assert run_files.read_backup(run / "checkpoints" / "backup")["step"] == 6
    # No temporary files are left behind.
    assert not [p for p in run.rglob("*") if ".tmp" in p.name]


@pytest.mark.core
@pytest.mark.notf
def test_each_phase_runs_alone(tmp_path):
    """prepare -> build -> fit -> finalise, one ``Run`` record: each phase does its job and no other's."""
    config = tiny(tmp_path)
    run = train_lib.Run(config, distribute.make(config), run_files.prepare_run_dir(config))
    run.files_dir.mkdir(exist_ok=True)
    assert train_lib.prepare(run, None) is None
    assert (run.resolved.total_steps, run.start_step, run.backup) == (6, 0, None)
    assert run.classifier is None and not (run.run_dir / "config.json").exists()
    train_lib.build(run)
    assert run.classifier.class_names == tuple(f"class_{k}" for k in range(10))
    written = json.loads((run.run_dir / "config.json").read_text())
    assert written["input_config"] == run.classifier.input_config.to_dict()
    assert not (run.run_dir / "history.csv").exists()  # building trains nothing
    train_lib.fit(run)
    assert run.backup_callback.step == 6 and len((run.run_dir / "history.csv").read_text().splitlines()) == 3
    assert not (run.run_dir / "metrics.json").exists()  # fitting finalises nothing
    metrics = train_lib.finalise(run)
    assert metrics["steps"] == 6 and (run.run_dir / "model.keras").exists()
    assert json.loads((run.run_dir / "metrics.json").read_text())["test_accuracy"] == metrics["test_accuracy"]
    # Prepared again, the finished run has nothing left to do: its metrics come back.
    again = train_lib.Run(config, distribute.make(config), run.run_dir)
    assert train_lib.prepare(again, None)["test_accuracy"] == pytest.approx(metrics["test_accuracy"])


@pytest.mark.core
@pytest.mark.notf
def test_the_test_set_is_evaluated_once_per_epoch_not_again_at_the_end(tmp_path, monkeypatch, capsys):
    """The last epoch's validation ran on the final weights: ``finalise`` reports those figures (as
    history.csv holds them) instead of evaluating the test set a second time; it says what it saves."""
    calls = []
    evaluate = keras.Model.evaluate
    monkeypatch.setattr(keras.Model, "evaluate", lambda self, *a, **k: calls.append(1) or evaluate(self, *a, **k))
    result = train_lib.train(tiny(tmp_path))
    assert len(calls) == TINY["epochs"]  # fit's validation, once per epoch
    with open(tmp_path / "run" / "history.csv") as rows:
        last = list(csv.DictReader(rows))[-1]
    assert result["test_accuracy"] == pytest.approx(float(last["val_accuracy"]), abs=1e-6)
    assert result["test_loss"] == pytest.approx(float(last["val_loss"]), rel=1e-5)
    assert f"[train] saving {tmp_path / 'run' / 'model.keras'}" in capsys.readouterr().out


@pytest.mark.core
@pytest.mark.notf
def test_chief_and_worker_decisions_are_the_records(tmp_path):
    """Who writes what is read off the ``Run`` record: the chief the shared files, a worker only its own."""
    config = dataclasses.replace(tiny(tmp_path), distribute="data-parallel")
    alone = train_lib.Run(config, distribute.Distribution("default", None, 1, 0, 1), tmp_path)
    chief = train_lib.Run(config, distribute.Distribution("data-parallel", None, 4, 0, 2), tmp_path)
    worker = train_lib.Run(config, distribute.Distribution("data-parallel", None, 4, 1, 2), tmp_path)
    assert (alone.files_dir, chief.files_dir, worker.files_dir) == (tmp_path, tmp_path, tmp_path / "worker-1")
    assert (alone.is_chief, chief.is_chief, worker.is_chief) == (True, True, False)
    assert (alone.may_stop_finished, chief.may_stop_finished, worker.may_stop_finished) == (True, False, False)
    assert (alone.sharded, chief.sharded, worker.sharded) == (False, True, True)
    assert worker.tensorboard_dir is None
    assert chief.tensorboard_dir == (tmp_path / "tensorboard" if train_lib.has_tensorboard() else None)


@pytest.mark.core
@pytest.mark.notf
def test_prepare_alone_reads_the_data_and_writes_nothing(tmp_path):
    config = tiny(tmp_path, normalization="pixel_mean")  # statistics of the data given
    run = train_lib.Run(config, distribute.make(config), run_files.prepare_run_dir(config))
    given = sources.synthetic(48, 16, 3, (16, 16))
    assert train_lib.prepare(run, given) is None
    assert run.data.num_classes == 3 and run.data.train_size == 48  # the data given, not config.dataset
    assert (run.resolved.total_steps, run.resolved.steps_per_epoch, run.start_step) == (6, 3, 0)
    np.testing.assert_array_equal(run.mean, given.mean_image)
    assert [p.name for p in run.run_dir.rglob("*")] == ["checkpoints"]  # no manifest, history or backup yet


@pytest.mark.core
@pytest.mark.notf
def test_finalise_alone_on_a_fitted_model(tmp_path, capsys):
    """finalise evaluates what it is given: a worker saves only its model.keras, the chief also writes
    metrics.json and curves and prints the summary."""
    config = tiny(tmp_path)
    run = train_lib.Run(config, distribute.make(config), run_files.prepare_run_dir(config))
    train_lib.prepare(run, None)
    train_lib.build(run)
    train_stream, run.test_stream = train_lib.input_streams(run)
    run.model.fit(train_stream(0), epochs=1, steps_per_epoch=2, verbose=0, shuffle=False)  # fitted here, not by fit()
    run.backup_callback, run.wall_s = types.SimpleNamespace(step=2), 4.0
    expected = run.model.evaluate(run.test_stream, verbose=0, return_dict=True)
    chief_dist = run.dist
    run.dist = dataclasses.replace(chief_dist, process_index=1, process_count=2)
    run.files_dir.mkdir()
    as_worker = train_lib.finalise(run)
    assert (run.run_dir / "worker-1" / "model.keras").exists() and not (run.run_dir / "metrics.json").exists()
    run.dist = chief_dist
    metrics = train_lib.finalise(run)
    assert metrics == as_worker == json.loads((run.run_dir / "metrics.json").read_text())
    assert metrics["test_accuracy"] == pytest.approx(expected["accuracy"])
    assert metrics["test_loss"] == pytest.approx(expected["loss"])
    assert (metrics["steps"], metrics["steps_this_session"], metrics["train_images_per_s"]) == (2, 2, 8.0)
    assert "train_loss" not in metrics  # no history.csv: fit() did not run
    assert (run.run_dir / "curves.png").exists() and "[train] summary" in capsys.readouterr().out
    saved = keras.saving.load_model(run.run_dir / "model.keras")
    images = np.random.default_rng(0).normal(size=(4, *run.classifier.input_shape[1:])).astype("float32")
    np.testing.assert_allclose(saved.predict(images, verbose=0), run.classifier.predict(images, verbose=0), atol=1e-6)


@pytest.mark.core
@pytest.mark.notf
@TINY_RUN_READER
def test_same_seed_gives_identical_weights(tiny_run, tmp_path):
    def weights(sub, seed):
        train_lib.train(tiny(tmp_path / sub, seed=seed))
        return trained_weights(tmp_path / sub / "run")

    a = trained_weights(tiny_run[0] / "run")  # seed 0, the default
    b, c = weights("b", 0), weights("c", 2)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, z) for x, z in zip(a, c))


@pytest.mark.notf
def test_nan_loss_stops_with_message_and_keeps_last_good_checkpoint(tmp_path):
    # Finite for the first steps at lr 0.01 (warm-up), then lr 1e30 blows it up.
    config = tiny(tmp_path, warmup_steps=300, total_steps=600, boundaries=(), warmup_lr=0.01, base_lr=1e30,
                  epochs=3, steps_per_epoch=4, checkpoint_every=1)
    with pytest.raises(
        train_lib.TrainingDiverged, match=r"NaN/inf.*Last good checkpoint: .*model\.weights\.h5 \(step \d+\)"
    ):
        train_lib.train(config)
    backup = run_files.read_backup(tmp_path / "run" / "checkpoints" / "backup")
    assert backup is not None and 1 <= backup["step"] < 12
    resolved = schedules.resolve(config, 96)
    mean, std = pipelines.pixel_stats(config)
    _, model = model_lib.build_model(config, 10, resolved, pipeline=pipelines.resolve_pipeline(config), mean=mean,
                                     std=std)
    model.optimizer.build(model.trainable_variables)
    model.load_weights(backup["weights"])
    assert all(np.isfinite(np.asarray(w)).all() for w in model.get_weights())
    assert not (tmp_path / "run" / "model.keras").exists()


def test_batch_not_divisible_by_replicas():
    dist = distribute.Distribution("mirrored", None, 2)
    with pytest.raises(ValueError, match="batch_size=33.*divisible by the 2 replicas"):
        distribute.check_batch(33, dist)


def test_unwritable_run_dir_fails_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="Invalid run_dir=.*file is a file, not a directory"):
        train_lib.train(tiny(tmp_path, run_dir=str(blocker / "run")))


def test_image_size_mismatch_and_bad_user_data(tmp_path):
    with pytest.raises(sources.DataError, match=r"image_size=\[16, 16\]"):
        train_lib.train(tiny(tmp_path), data=sources.synthetic(32, 8, 10, (8, 8)))
    bad = sources.synthetic(32, 8, 10, (16, 16))
    bad.test_labels[:] = 12
    with pytest.raises(sources.DataError, match="test labels out of range"):
        train_lib.train(tiny(tmp_path), data=bad)


def test_distribution_backend_is_checked(tmp_path):
    wrong = "data-parallel" if keras.backend.backend() == "tensorflow" else "mirrored"
    with pytest.raises(ValueError, match=f"distribute='{wrong}' needs KERAS_BACKEND"):
        train_lib.train(tiny(tmp_path, distribute=wrong))


def test_cli_help_lists_presets(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in ("synthetic-resnet8", "t2-resnet164-full-preact", "t5-resnet200-preact", "--distribute", "--precision"):
        assert name in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--preset", "nope"], "invalid choice: 'nope'"),
        (["nope"], "invalid choice: 'nope'"),
        (["--dataset", "folder"], "needs --data-dir"),
        (["--distribute", "horovod"], "invalid choice: 'horovod'"),
        (["--batch-size", "0"], "batch_size=0"),
        (["--ordering", "sideways"], "ordering='sideways'"),
    ],
)
def test_cli_bad_input_exits_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_missing_folder_and_unknown_dataset(tmp_path, capsys):
    for argv, message in ((["--dataset", "folder", "--data-dir", str(tmp_path / "none")], "is not a directory"),
                          (["--dataset", "no_such_set"], "Unknown dataset='no_such_set'")):
        with pytest.raises(SystemExit) as e:
            cli.main(argv + ["--run-dir", str(tmp_path / "run")])
        assert e.value.code == 2
        assert message in capsys.readouterr().err


def test_mixed_bfloat16_trains(tmp_path):
    result = train_lib.train(tiny(tmp_path, precision="mixed_bfloat16", epochs=1))
    assert result["steps"] == 3 and np.isfinite(result["test_loss"])


@pytest.mark.notf
def test_health_every_logs_training_health_to_history(tmp_path):
    train_lib.train(tiny(tmp_path, health_every=2))
    header, *rows = (tmp_path / "run" / "history.csv").read_text().strip().splitlines()
    columns = header.split(",")
    for stage in ("stem", "stage1", "stage3", "head"):
        assert f"health/{stage}/grad_norm" in columns
    values = dict(zip(columns, rows[-1].split(",")))
    assert float(values["health/stage1/grad_norm"]) > 0
    with pytest.raises(ValueError, match="health_every"):
        tiny(tmp_path, health_every=-1)
