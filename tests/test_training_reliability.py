"""What a kill, a full disk, a bad image file or a bad value leaves behind: a finished run re-run keeps
its trained model, every phase resumes, stale temporaries are cleared, every bad file is named."""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import keras
import killing
import numpy as np
import pytest

from keras_preact_training import cli
from keras_preact_training import train as train_lib
from keras_preact_training.data import sources
from keras_preact_training.recipe import configs
from keras_preact_training.run import run_dir as run_files
from support import TRAIN_JIT_COMPILE, tiny_training_command

REPO = pathlib.Path(__file__).resolve().parents[1]


def python_path():
    """This checkout first, then the caller's PYTHONPATH (where a development setup puts the apps' import names)."""
    return os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
TINY = dict(depth=8, image_size=(16, 16), synthetic_train_size=96, synthetic_test_size=32,
            batch_size=16, epochs=2, steps_per_epoch=3, checkpoint_every=2, verbose="0", export=False,
            jit_compile=TRAIN_JIT_COMPILE)


def tiny(tmp_path, **overrides):
    return configs.get_config("synthetic-resnet8", **{"run_dir": str(tmp_path / "run"), **TINY, **overrides})


def model_weights(path):
    import keras_preact.layers  # noqa: F401  (registers ResidualUnit for loading)

    return [np.asarray(w) for w in keras.saving.load_model(path, compile=False).get_weights()]


def assert_same_weights(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ------------------------------------------------------------------------- finished run, phases
@pytest.mark.core
def test_finished_run_rerun_is_a_noop_and_resumes_a_missing_phase_from_trained_weights(tmp_path, capsys):
    config = tiny(tmp_path)
    run = tmp_path / "run"
    first = train_lib.train(config)
    trained = model_weights(run / "model.keras")
    model_bytes = (run / "model.keras").read_bytes()

    # The same command again: nothing is refit, re-evaluated or rewritten.
    capsys.readouterr()
    again = train_lib.train(config)
    out = capsys.readouterr().out
    assert f"run already finished at step 6; nothing to do (metrics in {run / 'metrics.json'})" in out
    assert again["test_accuracy"] == first["test_accuracy"]
    assert (run / "model.keras").read_bytes() == model_bytes

    # Killed before metrics.json / model.keras were written: the re-run fits nothing, and evaluates and
    # saves the trained weights (restored from the last backup, not fresh ones).
    (run / "metrics.json").unlink()
    (run / "model.keras").unlink()
    resumed = train_lib.train(config)
    assert resumed["steps_this_session"] == 0
    assert resumed["test_accuracy"] == first["test_accuracy"]
    assert resumed["test_loss"] == first["test_loss"]
    assert_same_weights(model_weights(run / "model.keras"), trained)


def _command(run_dir, export_dir):
    return tiny_training_command(run_dir, "--checkpoint-every", "2", "--export", "--export-dir", str(export_dir),
                                 "--verbose", "0", "--jit-compile", TRAIN_JIT_COMPILE, "--seed", "5", epochs=2,
                                 steps_per_epoch=3)


def _run(run_dir, export_dir):
    env = {**os.environ, "PYTHONPATH": python_path(), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(_command(run_dir, export_dir), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


def _run_killed(run_dir, export_dir, when):
    """The same command, SIGKILLed from here once ``when(run_dir)`` holds (tests/killing.py)."""
    env = {**os.environ, "PYTHONPATH": python_path(), "TF_CPP_MIN_LOG_LEVEL": "3"}
    with open(run_dir.parent / f"{run_dir.name}-killed.log", "a+") as log:
        proc = subprocess.Popen(_command(run_dir, export_dir), cwd=REPO, env=env, stdout=log, stderr=log)
        code = killing.kill_when(proc, when(run_dir))
        log.seek(0)
        assert code == -signal.SIGKILL, log.read()[-3000:]
    return code


def _run_killed_during_export(run_dir, export_dir):
    """Real SIGKILL while the SavedModel is being written (its scratch folder exists)."""
    env = {**os.environ, "PYTHONPATH": python_path(), "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.Popen(_command(run_dir, export_dir), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    model_dir = export_dir / "synthetic-resnet8"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if model_dir.is_dir() and any(p.name.startswith(".tmp-") for p in model_dir.iterdir()):
            proc.kill()
            break
        time.sleep(0.005)
    proc.wait(timeout=60)
    return proc.returncode


def _serve(version_dir, images):
    import tensorflow as tf

    return (
        tf.saved_model.load(str(version_dir))
        .signatures["serving_default"](tf.constant(images))["probabilities"]
        .numpy()
    )


def test_kill_at_every_phase_then_rerun_equals_an_uninterrupted_run(tmp_path):
    straight_run, straight_export = tmp_path / "straight", tmp_path / "straight-export"
    train_lib.train(cli.config_from_args(*_parsed(_command(straight_run, straight_export)[3:])))

    run, export = tmp_path / "run", tmp_path / "export"
    backup = run / "checkpoints" / "backup"
    # Killed while writing the first backup: its temporary folder is left, nothing else.
    assert _run_killed(run, export, killing.writing_backup) == -signal.SIGKILL
    assert [p.name for p in backup.iterdir()] == [p.name for p in backup.iterdir() if p.name.startswith(".tmp-state")]
    # Killed once the last backup is written, before evaluation: no metrics, no model.
    assert _run_killed(run, export, lambda run: killing.backed_up(run, 6)) == -signal.SIGKILL
    assert run_files.read_backup(backup)["step"] == 6
    assert not (run / "metrics.json").exists() and not (run / "model.keras").exists()
    # Killed while saving model.keras (written to a temporary name, not yet renamed).
    assert _run_killed(run, export, killing.saving_model) == -signal.SIGKILL
    assert not (run / "model.keras").exists()
    # Killed while exporting.
    assert _run_killed_during_export(run, export) == -signal.SIGKILL
    assert not (export / "synthetic-resnet8" / "1").exists()
    # The same command finishes the run from the trained weights.
    last = _run(run, export)
    assert last.returncode == 0, last.stderr[-3000:]
    assert "resuming at step 6" in last.stdout

    metrics = json.loads((run / "metrics.json").read_text())
    reference = json.loads((straight_run / "metrics.json").read_text())
    for key in ("test_accuracy", "test_loss", "steps", "epochs"):
        assert metrics[key] == reference[key], key
    assert_same_weights(model_weights(run / "model.keras"), model_weights(straight_run / "model.keras"))
    assert sorted(p.name for p in (export / "synthetic-resnet8").iterdir()) == ["1"]  # stale scratch cleared
    images = np.random.default_rng(0).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    np.testing.assert_array_equal(_serve(export / "synthetic-resnet8" / "1", images),
                                  _serve(straight_export / "synthetic-resnet8" / "1", images))
    assert not [p for p in run.rglob("*") if p.name.startswith(".tmp-")]

    # A finished run re-run is a no-op that says so.
    stamp = (run / "model.keras").stat().st_mtime_ns
    train_lib.train(cli.config_from_args(*_parsed(_command(run, export)[3:])))
    assert (run / "model.keras").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in (export / "synthetic-resnet8").iterdir()) == ["1"]


def _parsed(argv):
    parser = cli.build_parser()
    return parser.parse_args(argv), parser


# ------------------------------------------------------------------------- disk full, temporaries
def _config_file(tmp_path, config):
    import dataclasses

    path = tmp_path / "config.json"
    path.write_text(json.dumps(dataclasses.asdict(config)))
    return str(path)


# ------------------------------------------------------------------------- a real full file system
# Each run below writes into a tmpfs of its own, mounted in a mount namespace of its own (unshare: as a user
# without root, in a user namespace too), so no mount outlives the run and root is not needed where user
# namespaces are allowed. The kernel's ENOSPC is real: a 1 MB tmpfs fails the space check before the first
# checkpoint; a tmpfs out of inodes passes the check and fails the checkpoint's write itself.
UNSHARE = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]
ON_A_TMPFS = """
options=$1; mount=$2; shift 2
mount -t tmpfs -o "$options" tmpfs "$mount" || exit 97
"$@"; code=$?
echo "@@ temporaries: $(find "$mount" -name '.tmp-*' | wc -l)"
echo "@@ inodes used: $(( $(stat -f -c %c "$mount") - $(stat -f -c %d "$mount") ))"
exit $code
"""


def train_on_a_tmpfs(tmp_path, options, kill_when_exists=None):
    """The tiny training, its run dir on a fresh tmpfs mounted with ``options``: (exit code, stderr, the
    temporaries left in the tmpfs, its inodes in use when the run ended). With ``kill_when_exists`` (a glob
    under the run dir) the run is SIGKILLed once it matches, by a watcher in the tmpfs' mount namespace."""
    mount = tmp_path / f"tmpfs-{options}"
    mount.mkdir()
    command = tiny_training_command(mount / "run", "--checkpoint-every", "2", "--no-export", "--verbose", "0",
                                    "--jit-compile", TRAIN_JIT_COMPILE, epochs=1, steps_per_epoch=4)
    if kill_when_exists:
        command = [sys.executable, killing.__file__, str(mount / "run" / kill_when_exists), "--", *command]
    environment = {**os.environ, "PYTHONPATH": python_path(), "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        done = subprocess.run([*UNSHARE, "sh", "-c", ON_A_TMPFS, "sh", options, str(mount), *command], cwd=REPO,
                              env=environment, capture_output=True, text=True, timeout=600)
    except FileNotFoundError:
        pytest.skip("needs unshare (util-linux) to mount a tmpfs of its own")
    if done.returncode == 97 or "unshare: " in done.stderr:
        pytest.skip(f"no tmpfs can be mounted here, even in a user namespace: {done.stderr.strip()[-300:]}")
    marks = dict(line[3:].split(": ") for line in done.stdout.splitlines() if line.startswith("@@ "))
    return done.returncode, done.stderr, int(marks["temporaries"]), int(marks["inodes used"])


@pytest.mark.notf
@pytest.mark.any_backend  # the file system's answer, not the backend's
@pytest.mark.once  # nor an installed TensorFlow's
def test_a_real_full_tmpfs_fails_the_space_check_before_a_checkpoint_in_one_line(tmp_path):
    code, err, temporaries, _ = train_on_a_tmpfs(tmp_path, "size=1m")
    assert code == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    refused = re.fullmatch(r"keras-preact-train: error: \[Errno 28\] No space left to write \S+/checkpoints/backup/"
                           r"\.tmp-state-\S+/model\.weights\.h5: it needs about (\d\.\d\d) MB free, (\d\.\d\d) MB is "
                           r"available there\. .*the last complete checkpoint is kept\.", last)
    assert refused and float(refused[2]) < float(refused[1]) < 2, err[-3000:]  # ResNet-8 + momentum: 0.8 MB
    assert "Traceback" not in err and temporaries == 0


@pytest.mark.notf
@pytest.mark.any_backend  # the file system's answer, not the backend's
@pytest.mark.once  # nor an installed TensorFlow's
def test_a_real_enospc_while_writing_a_checkpoint_fails_in_one_line_and_removes_the_temporary(tmp_path):
    """Out of inodes: the space check passes, and the kernel refuses the checkpoint's file (ENOSPC). How many
    inodes the run has made when it creates that file is counted by a run killed (tests/killing.py) once the
    file exists."""
    code, err, _, used = train_on_a_tmpfs(tmp_path, "size=64m",
                                          kill_when_exists="checkpoints/backup/.tmp-state-*/model.weights.h5")
    assert code == -signal.SIGKILL or code == 128 + signal.SIGKILL, err[-3000:]
    code, err, temporaries, _ = train_on_a_tmpfs(tmp_path, f"size=64m,nr_inodes={used - 1}")
    assert code == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(r"keras-preact-train: error: \[Errno 28\] No space left to write \S+/checkpoints/backup/"
                        r"\.tmp-state-\S+/model\.weights\.h5: its file system has \d+\.\d+ MB free but no free "
                        r"inode \(`df -i`\): remove some files .*the last complete checkpoint is kept\.", last), \
        err[-3000:]
    assert "Traceback" not in err and temporaries == 0


@pytest.mark.core
def test_stale_temporaries_of_dead_processes_are_cleared_and_live_ones_kept(tmp_path):
    backup = tmp_path / "run" / "checkpoints" / "backup"
    backup.mkdir(parents=True)
    dead = dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        stale = [backup / f".tmp-state-0000000002-{dead}", backup / f".tmp-state-0000000002-pid{dead}",
                 tmp_path / "run" / f".tmp-model-pid{dead}.keras", tmp_path / "run" / f".tmp-metrics.json-pid{dead}-x1"]
        kept = [backup / f".tmp-state-0000000004-pid{live.pid}", tmp_path / "run" / ".tmp-not-ours"]
        for p in stale + kept:
            p.mkdir() if "state" in p.name else p.write_text("x")
        train_lib.train(tiny(tmp_path))
        assert [p for p in stale if p.exists()] == []
        assert [p for p in kept if not p.exists()] == []
    finally:
        live.kill()
        live.wait()


def test_stale_export_scratch_of_a_killed_export_is_cleared(tmp_path):
    from keras_preact.export import export_saved_model
    from keras_preact.models import cifar_resnet

    model_dir = tmp_path / "exp" / "m"
    model_dir.mkdir(parents=True)
    stale = model_dir / f".tmp-1-pid{dead_pid()}-abcd"
    (stale / "saved_model").mkdir(parents=True)
    export_saved_model(cifar_resnet(8, 5, input_shape=(16, 16, 3)), tmp_path / "exp", name="m")
    assert sorted(p.name for p in model_dir.iterdir()) == ["1"]


# -------------------------------------------------------------------------------- bad images
def _tree_with_bad_files(root):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in ("cat", "dog"):
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(12):
                Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(d / f"{i:04d}.png")
    # A PNG named .jpg decodes (the content decides); text, empty and garbage files do not.
    (root / "train" / "dog" / "0000.png").rename(root / "train" / "dog" / "png-named.jpg")
    bad = [root / "train" / "cat" / "text.jpg", root / "train" / "dog" / "empty.png",
           root / "test" / "cat" / "garbage.jpg"]
    bad[0].write_text("this is not an image\n")
    bad[1].write_bytes(b"")
    bad[2].write_bytes(bytes(range(256)) * 4)
    return bad


@pytest.mark.core
def test_bad_image_files_are_named_or_skipped_with_a_count(tmp_path, capsys):
    root = tmp_path / "tree"
    bad = _tree_with_bad_files(root)
    config = tiny(tmp_path, dataset="folder", data_dir=str(root), cache_dir=str(tmp_path / "cache"),
                  normalization="cifar10", steps_per_epoch=2)
    with pytest.raises(sources.DataError) as e:
        train_lib.train(config)
    message = str(e.value)
    assert "2 of 26 image files cannot be decoded" in message
    assert str(bad[0]) in message and str(bad[1]) in message and "--skip-bad-images" in message
    assert not (tmp_path / "run" / "checkpoints" / "backup" / "latest.json").exists()

    capsys.readouterr()
    result = train_lib.train(config.replace(skip_bad_images=True))
    out = capsys.readouterr().out
    assert "[data] skipped 2 of 26 unreadable image files" in out
    assert "[data] skipped 1 of 25 unreadable image files" in out
    assert result["steps"] == 4
    data = sources.folder(root, tmp_path / "cache", skip_bad_images=True)
    assert data.train_size == 24 and len(data.test_labels) == 24
    assert list(data.train_labels) == [0] * 12 + [1] * 12  # labels follow the kept files


@pytest.mark.core
@pytest.mark.skipif(keras.backend.backend() != "jax", reason="the JAX trainer's state sync (jax_state_sync)")
def test_two_runs_in_one_process_on_jax_sync_the_training_state_on_the_loop_only(tmp_path, monkeypatch):
    """On JAX a callback's ``self.model`` syncs the trainer's state into the variables (``jax_state_sync``). From
    the thread Keras dispatches batch ends to, that raced the loop's next step, which donates that state: the
    variables were left holding deleted buffers and the run failed in model.fit ("Array has been deleted"), most
    often the second run of a process. Two runs of a (faked) GPU's 3 steps per compiled call, the first without
    TensorBoard (the batch ends off the loop), the second with it where installed: both finish, and every sync
    happens on the loop's thread."""
    import threading

    from keras_preact_training.machine import execution

    monkeypatch.setattr(execution, "device_kind", lambda backend=None: "gpu")
    loop, off_loop = threading.current_thread(), []
    original = keras.Model.jax_state_sync

    def jax_state_sync(self):
        if threading.current_thread() is not loop:
            off_loop.append(threading.current_thread().name)
        return original(self)

    monkeypatch.setattr(keras.Model, "jax_state_sync", jax_state_sync)
    config = tiny(tmp_path, epochs=1, steps_per_epoch=6, checkpoint_every=3)
    with monkeypatch.context() as without_tensorboard:
        without_tensorboard.setattr(train_lib, "has_tensorboard", lambda: False)
        assert train_lib.train(config.replace(run_dir=str(tmp_path / "first")))["steps"] == 6
    assert train_lib.train(config.replace(run_dir=str(tmp_path / "second")))["steps"] == 6
    assert off_loop == []


# -------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("argv, message", [
    (["--lr", "nan"], "base_lr=nan: a finite non-negative number is required"),
    (["--lr", "inf"], "base_lr=inf: a finite"),
    (["--weight-decay", "nan"], "weight_decay=nan"),
    (["--batch-size", str(2**31)], f"batch_size={2**31}: at most 2147483647"),
])
def test_cli_non_finite_and_out_of_range_values_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_every_float_field_must_be_finite():
    for field in ("warmup_lr", "lr_decay", "momentum", "drop_path_rate"):
        with pytest.raises(ValueError, match=f"Invalid {field}=nan"):
            configs.get_config(**{field: float("nan")})
    with pytest.raises(ValueError, match="unit_options\\['shortcut_scale'\\]=inf"):
        configs.get_config(unit_options={"shortcut_scale": float("inf")})


def test_batch_size_beyond_the_training_set_states_the_limit(tmp_path):
    with pytest.raises(sources.DataError, match="batch_size=97: larger than the 96 training images; at most 96"):
        train_lib.train(tiny(tmp_path, batch_size=97))


@pytest.mark.parametrize("text, message", [
    ('{"name": "x",\n  "depth": }', "not valid JSON (Expecting value at line 2, column 12)"),
    ("[]", "it must hold a JSON object of config fields"),
])
def test_cli_bad_config_file_is_named(tmp_path, capsys, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(SystemExit) as e:
        cli.main(["--config", str(path)])
    assert e.value.code == 2
    assert f"Invalid config file {str(path)!r}: {message}" in capsys.readouterr().err


def test_export_dir_that_is_a_file_is_rejected_before_training(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(SystemExit) as e:
        cli.main(["--depth", "8", "--export", "--export-dir", str(target), "--run-dir", str(tmp_path / "run")])
    assert e.value.code == 2
    assert f"Invalid export_dir={str(target)!r}: {target} is a file, not a directory" in capsys.readouterr().err
    assert not (tmp_path / "run" / "history.csv").exists()
    assert not (tmp_path / "run" / "checkpoints" / "backup" / "latest.json").exists()


def test_truncated_model_keras_is_reported_as_corrupt(tmp_path, capsys):
    from keras_preact_training import export as cli

    config = tiny(tmp_path)
    train_lib.train(config)
    run = tmp_path / "run"
    trained = model_weights(run / "model.keras")
    whole = (run / "model.keras").read_bytes()
    (run / "model.keras").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(SystemExit) as e:
        cli.main([str(run), "--export-dir", str(tmp_path / "exp")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{str(run / 'model.keras')!r}: it is corrupt or truncated" in err and "File not found" not in err
    assert not (tmp_path / "exp" / "synthetic-resnet8" / "1").exists()
    # The training re-run sees the truncated file as missing and writes it again from the backup.
    train_lib.train(config)
    assert_same_weights(model_weights(run / "model.keras"), trained)


def test_export_to_a_full_disk_fails_in_one_line_and_writes_nothing(tmp_path, monkeypatch):
    from keras_preact.export import export_saved_model
    from keras_preact.models import cifar_resnet

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=500_000))
    with pytest.raises(OSError) as e:
        export_saved_model(cifar_resnet(8, 5, input_shape=(16, 16, 3)), tmp_path / "exp", name="m")
    assert e.value.errno == 28
    assert f"No space left to export to {tmp_path / 'exp' / 'm'}: it needs about 2.4 MB free, 0.5 MB" in str(e.value)
    assert list((tmp_path / "exp" / "m").iterdir()) == []


@pytest.mark.core
@pytest.mark.parametrize("decoder", ["tensorflow", "pillow"])
def test_folder_names_bad_files_with_either_decoder(tmp_path, monkeypatch, decoder):
    if decoder == "pillow":
        monkeypatch.setitem(sys.modules, "tensorflow", None)  # as on a machine without TensorFlow
    root = tmp_path / "tree"
    bad = _tree_with_bad_files(root)
    with pytest.raises(sources.DataError, match="2 of 26 image files cannot be decoded") as e:
        sources.folder(root, tmp_path / "cache")
    assert str(bad[0]) in str(e.value) and str(bad[1]) in str(e.value)
    data = sources.folder(root, tmp_path / "cache", skip_bad_images=True)
    assert (data.train_size, len(data.test_labels)) == (24, 24)
    assert list(data.train_labels) == [0] * 12 + [1] * 12
    assert not list((tmp_path / "cache").glob("*.npy"))  # only complete decodes are cached (both splits lack files)


def test_streamed_folder_names_a_non_image_file_or_skips_it(tmp_path):
    import tensorflow as tf

    root = tmp_path / "tree"
    bad = _tree_with_bad_files(root)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Not an image file") as e:
        list(sources.folder_stream(root).make("train"))
    assert str(bad[0]) in str(e.value) or str(bad[1]) in str(e.value)
    kept = list(sources.folder_stream(root, skip_bad_images=True).make("train"))
    assert len(kept) == 24  # 26 files, the text and the empty one left out
