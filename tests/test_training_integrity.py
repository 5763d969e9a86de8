"""What belongs together stays together (issue 24): one owner per run directory, a resume that refuses
another design, strict config files, exports that refuse a model of another run, one-line errors."""

import dataclasses
import io
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile

import killing
import pytest

from keras_preact_training import cli
from keras_preact_training import export as export_cli
from keras_preact_training.recipe import configs
from keras_preact_training.run import run_lock
from support import TRAIN_JIT_COMPILE

REPO = pathlib.Path(__file__).resolve().parents[1]


def python_path():
    """This checkout first, then the caller's PYTHONPATH (where a development setup puts the apps' import names)."""
    return os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
FLAGS = ["--depth", "8", "--image-size", "16", "16", "--batch-size", "16", "--synthetic-train-size", "96",
         "--synthetic-test-size", "32", "--steps-per-epoch", "3", "--checkpoint-every", "2", "--verbose", "0",
         "--no-export", "--jit-compile", TRAIN_JIT_COMPILE, "--seed", "5"]


def command(run_dir, *extra, epochs=2):
    return [*FLAGS, "--epochs", str(epochs), "--run-dir", str(run_dir), *extra]


def env():
    return {**os.environ, "PYTHONPATH": python_path(), "TF_CPP_MIN_LOG_LEVEL": "3"}


def spawn(argv, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "keras_preact_training.cli", *argv], cwd=REPO, env=env(), text=True,
                            **kwargs)


def run_cli(argv, kill_when=None, timeout=600):
    """``keras-preact-train argv`` in a process of its own, SIGKILLed from here once ``kill_when()`` holds."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = spawn(argv, stdout=out, stderr=err)
        try:
            if kill_when is None:
                proc.wait(timeout=timeout)
            else:
                killing.kill_when(proc, kill_when, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(), err.read()


def cli_error(argv, capsys, code=2):
    """The one error line of ``keras-preact-train argv`` run in this process."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        sys.exit(cli.main(argv))
    assert e.value.code == code
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith(("usage:", " "))]
    assert len(lines) == 1, lines  # after argparse's usage, one line
    return lines[0]


def trained_run(tmp_path, *extra):
    """A run killed after its last backup (before evaluation), as a SIGKILL leaves it."""
    run = tmp_path / "run"
    code, _, err = run_cli(command(run, *extra), kill_when=killing.backed_up(run, 6))
    assert code == -signal.SIGKILL, err[-3000:]
    return run


# ------------------------------------------------------------------------------ one owner per run
@pytest.mark.notf
@pytest.mark.any_backend  # the lock and the manifest check come before any backend work
@pytest.mark.once  # nor does an installed TensorFlow change them
def test_a_second_training_on_a_run_dir_exits_at_once_naming_the_owner(tmp_path, capsys):
    run = tmp_path / "run"
    first = spawn(command(run, epochs=100000), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while not (run / "checkpoints" / "backup" / "latest.json").exists() and first.poll() is None:
            assert time.time() < deadline
            time.sleep(0.05)
        # The owner paused (SIGSTOP): it keeps its lock and leaves the cores to the commands refused meanwhile.
        first.send_signal(signal.SIGSTOP)
        files = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
        # The same command in a process of its own (the console script's start), then with another seed through
        # the same entry function in this process (the lock is read before any backend work: no start to repeat).
        for extra in ([], ["--seed", "6"]):
            if extra:
                capsys.readouterr()
                with pytest.raises(SystemExit) as refused:  # argparse's error exit, as the console script's
                    cli.main(command(run, *extra, epochs=100000))
                code, err = refused.value.code, capsys.readouterr().err
            else:
                code, _, err = run_cli(command(run, *extra, epochs=100000), timeout=120)  # refused in seconds
            assert code == 2, err[-3000:]
            last = err.strip().splitlines()[-1]
            assert last.startswith(f"keras-preact-train: error: Invalid run_dir={str(run)!r}: it is in use by "
                                   f"PID {first.pid} (")
            assert "-m keras_preact_training.cli" in last and "--epochs 100000" in last
        # The refused commands wrote nothing: every file of the (stopped) owner's run is as it was.
        assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == files
        first.send_signal(signal.SIGCONT)
        assert first.poll() is None  # the owner goes on
    finally:
        first.kill()
        first.wait()
    # SIGKILL left no stale lock: the same command resumes (and is killed at its next backup).
    step = json.loads((run / "checkpoints" / "backup" / "latest.json").read_text())["step"]
    code, _, err = run_cli(command(run, epochs=100000), kill_when=killing.backed_up(run, step + 1))
    assert code == -signal.SIGKILL, err[-3000:]


# ------------------------------------------------------------------------------ resume
MISMATCHES = [
    (["--unit-options", '{"shortcut": "constant_scaling"}'], ["unit_options: {} in the run, {'shortcut': "
                                                              "'constant_scaling'} now"]),
    (["--unit-options", '{"shortcut": "conv1x1"}'], ["unit_options: {} in the run, {'shortcut': 'conv1x1'} now"]),
    (["--ordering", "original"], ["unit_options: {} in the run, {'ordering': 'original'} now"]),
    (["--depth", "14"], ["depth: 8 in the run, 14 now"]),
    (["--dataset", "cifar10"], ["dataset: 'synthetic' in the run, 'cifar10' now"]),
    (["--normalization", "cifar10"], ["normalization: 'centered' in the run, 'cifar10' now"]),
    (["--batch-size", "8"], ["batch_size: 16 in the run, 8 now"]),
    (["--seed", "6"], ["seed: 5 in the run, 6 now"]),
    (["--epochs", "3"], ["epochs: 2 in the run, 3 now"]),
    (["--schedule", "cosine", "--base-lr", "0.2"], ["schedule: 'piecewise' in the run, 'cosine' now",
                                                    "base_lr: 0.1 in the run, 0.2 now"]),
]


@pytest.mark.notf
@pytest.mark.any_backend  # the lock and the manifest check come before any backend work
@pytest.mark.once  # nor does an installed TensorFlow change them
def test_a_resume_with_another_design_is_refused_and_allowed_changes_are_recorded(tmp_path, capsys):
    run = trained_run(tmp_path)
    manifest = (run / "config.json").read_bytes()
    for extra, differences in MISMATCHES:
        line = cli_error(command(run) + extra, capsys)
        assert line.startswith(f"keras-preact-train: error: Invalid resume of run_dir={str(run)!r} (trained to "
                               "step 6): this command changes what the run trains ("), line
        for difference in differences:
            assert difference in line, line
        assert f"keras-preact-train --config {run / 'config.json'}) or start a new run with another --run-dir" in line
        assert (run / "config.json").read_bytes() == manifest  # never rewritten
    assert not (run / "model.keras").exists()

    # Verbosity, checkpoint frequency, --health-every, --remat and export options may change: resumed and recorded.
    capsys.readouterr()
    allowed = ["--verbose", "2", "--checkpoint-every", "5", "--health-every", "3", "--remat", "units", "--export-dir",
               str(tmp_path / "exports")]
    assert cli.main(command(run) + allowed) == 0
    out = capsys.readouterr().out
    assert (
        "[train] changed on resume, as allowed: remat: None in the run, 'units' now; checkpoint_every: 2 in the run, "
        "5 now; health_every: 0 in the run, 3 now; "
    ) in out
    assert "resuming at step 6" in out
    recorded = json.loads((run / "config.json").read_text())["config"]
    assert (recorded["verbose"], recorded["checkpoint_every"], recorded["health_every"], recorded["remat"]) == (
        "2",
        5,
        3,
        "units",
    )
    assert recorded["export_dir"] == str(tmp_path / "exports")
    assert json.loads((run / "metrics.json").read_text())["steps"] == 6


# ------------------------------------------------------------------------------ config files
@pytest.mark.notf
@pytest.mark.parametrize("values, message", [
    ({"image_size": 32}, "image_size=32: a list [height, width] of integers is required."),
    ({"eval_image_size": "big"}, 'eval_image_size="big": a list [height, width] of integers or null is required.'),
    ({"boundaries": 5}, "boundaries=5: a list of integers is required."),
    ({"unit_options": "x"}, 'unit_options="x": a JSON object is required.'),
    ({"seed": "x"}, 'seed="x": an integer is required.'),
    ({"depth": 8.0}, "depth=8.0: an integer is required."),
    ({"base_lr": "0.1"}, 'base_lr="0.1": a number is required.'),
    ({"export": "false"}, 'export="false": true or false (a JSON boolean, not a string) is required.'),
    ({"nesterov": "no"}, 'nesterov="no": true or false (a JSON boolean, not a string) is required.'),
    ({"deterministic": 1}, "deterministic=1: true or false (a JSON boolean, not a string) is required."),
    ({"dpeth": 20}, "unknown key 'dpeth' (value 20); did you mean 'depth'?"),
    ({"zzz": 1}, "unknown key 'zzz' (value 1); the fields are name, paper, architecture, depth,"),
])
def test_config_file_values_are_checked_against_the_config_types_with_dry_run_too(tmp_path, capsys, values, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"name": "x", **values}))
    for extra in (["--dry-run"], ["--run-dir", str(tmp_path / "run")]):
        line = cli_error(["--config", str(path), *extra], capsys)
        assert line == f"keras-preact-train: error: Invalid config file {str(path)!r}: {message}" or (
            message.endswith(",") and line.startswith(f"keras-preact-train: error: Invalid config file "
                                                      f"{str(path)!r}: {message}")), line
    assert not (tmp_path / "run").exists()


@pytest.mark.notf
def test_a_run_manifest_with_a_wrong_type_is_named_before_any_work(tmp_path, capsys):
    from keras_preact.preprocessing import InputConfig
    from keras_preact_training.run.manifest import RunManifest

    config = dataclasses.asdict(configs.get_config(depth=8))
    manifest = RunManifest(name="x", class_names=("a", "b"), config={**config, "seed": "x"},
                           input_config=InputConfig(input_size=(32, 32, 3), mean=(0, 0, 0), std=(1, 1, 1)))
    path = tmp_path / "config.json"
    path.write_text(manifest.to_json())
    line = cli_error(["--config", str(path), "--dry-run"], capsys)
    assert line == f"keras-preact-train: error: Invalid config in {str(path)!r}: seed=\"x\": an integer is required."
    path.write_text(json.dumps({**manifest.to_dict(), "config": "x"}))
    line = cli_error(["--config", str(path), "--dry-run"], capsys)
    assert line == (f"keras-preact-train: error: Invalid run manifest {str(path)!r}: config=\"x\": a JSON object of "
                    "Config fields is required.")
    # Files written by training (dataclasses.asdict) are accepted, as are the older int verbosity and bool jit.
    path.write_text(json.dumps({**config, "verbose": 2, "jit_compile": False}))
    assert cli.main(["--config", str(path), "--dry-run"]) == 0
    with pytest.raises(ValueError, match="Invalid seed='x': an integer is required"):
        configs.get_config(seed="x")


# ------------------------------------------------------------------------------ messages
@pytest.mark.notf
def test_run_dir_that_is_a_file_says_so(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    for run_dir in (target, target / "run"):
        line = cli_error(["--run-dir", str(run_dir), "--depth", "8"], capsys)
        assert line == (f"keras-preact-train: error: Invalid run_dir={str(run_dir)!r}: {target} is a file, not a "
                        "directory; pass --run-dir DIR (a directory, created when missing).")


# ------------------------------------------------------------------------------ exports
# On one pytest-xdist worker (CI's --dist loadgroup), so the run is trained once, not once per worker.
SHARES_THE_FINISHED_RUN = pytest.mark.xdist_group("test_training_integrity_finished_run")


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory):
    """One finished run of ``command``, trained once for the export tests: each works on a copy of it."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert cli.main(command(run)) == 0
    return run


@pytest.fixture
def finished_run(trained_once, tmp_path, capsys):
    """A finished run of its own (a copy of ``trained_once``: config.json, model.keras, metrics.json, backups)."""
    run = tmp_path / "run"
    shutil.copytree(trained_once, run)
    capsys.readouterr()
    return run


def export_error(run, tmp_path, capsys, code=2):
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        export_cli.main([str(run), "--export-dir", str(tmp_path / "exp")])
    assert e.value.code == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert not (tmp_path / "exp" / "synthetic-resnet8" / "1").exists()
    return lines[-1]


@SHARES_THE_FINISHED_RUN
def test_export_refuses_a_model_that_is_not_the_runs(finished_run, tmp_path, capsys):
    import keras

    run = finished_run
    # A plain Keras model of the same input and output shapes, and a run's model of another design.
    inputs = keras.Input((16, 16, 3))
    plain = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(keras.layers.Flatten()(inputs)))
    from keras_preact.models import cifar_resnet

    other = cifar_resnet(8, 10, input_shape=(16, 16, 3), shortcut="constant_scaling")
    for model, kind in ((plain, "Functional"), (other, "PreActResNetClassifier")):
        model.save(run / "model.keras")
        line = export_error(run, tmp_path, capsys)
        assert line.startswith(f"keras-preact-export: error: Invalid model file {str(run / 'model.keras')!r}: it is "
                               "not the model this run trained (config.json records a PreActResNetClassifier of "
                               f"75,770 parameters, fingerprint "), line
        assert f"the file holds a {kind} of " in line


@SHARES_THE_FINISHED_RUN
def test_export_names_a_corrupt_weights_file_inside_a_valid_keras_zip(finished_run, tmp_path, capsys):
    import h5py

    run = finished_run
    model = run / "model.keras"
    with zipfile.ZipFile(model) as z:
        members = {n: z.read(n) for n in z.namelist()}
    foreign = io.BytesIO()
    with h5py.File(foreign, "w") as h5:
        h5.create_group("layers")
    for weights in (foreign.getvalue(), members["model.weights.h5"][:4000]):
        with zipfile.ZipFile(model, "w") as z:
            for name, data in members.items():
                z.writestr(name, weights if name == "model.weights.h5" else data)
        line = export_error(run, tmp_path, capsys)
        assert line.startswith(f"keras-preact-export: error: Invalid model file {str(model)!r}: "), line
        assert "re-run the training command with the same --run-dir" in line


@SHARES_THE_FINISHED_RUN
def test_disk_filling_during_the_savedmodel_write_is_one_line(finished_run, tmp_path, capsys, monkeypatch):
    import tensorflow as tf

    from keras_preact.export import saved_model

    run = finished_run

    def full(path, *args, **kwargs):  # the SavedModel write, cut short by a full disk
        pathlib.Path(path).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(path) / "saved_model.pb").write_bytes(b"\0" * 1000)
        raise tf.errors.ResourceExhaustedError(None, None, f"{path}/variables; No space left on device")

    monkeypatch.setattr(saved_model, "_write_archive", full)
    line = export_error(run, tmp_path, capsys, code=1)
    model_dir = tmp_path / "exp" / "synthetic-resnet8"
    assert line.startswith(f"keras-preact-export: error: [Errno 28] No space left to write {model_dir}: it needs "
                           "about "), line
    assert "Free some space (or choose another --export-dir)" in line
    assert list(model_dir.iterdir()) == []  # nothing partial


@SHARES_THE_FINISHED_RUN
def test_a_second_export_of_a_run_waits_for_the_first(finished_run, tmp_path, capsys):
    run = finished_run
    exp = tmp_path / "exp"
    with run_lock.owned(run / run_lock.EXPORT_LOCK, "an export"):  # an export of this run is under way
        proc = subprocess.Popen(
            [sys.executable, "-m", "keras_preact_training.export", str(run), "--export-dir", str(exp)],
            cwd=REPO,
            env=env(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        waiting = ""
        while "waiting" not in waiting and proc.poll() is None:
            waiting = proc.stderr.readline()
        assert waiting.startswith(f"[export] waiting for PID {os.getpid()} ("), waiting
        assert waiting.rstrip().endswith(f"to finish exporting {run}")
        time.sleep(1)
        assert proc.poll() is None and not exp.exists()
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert out.strip() == str(exp / "synthetic-resnet8" / "1")
    assert export_cli.main([str(run), "--export-dir", str(exp)]) == 0  # the next export takes the next version
    assert sorted(p.name for p in (exp / "synthetic-resnet8").iterdir()) == ["1", "2"]
