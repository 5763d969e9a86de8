"""Fault tolerance: SIGKILL a real training process mid-epoch; the same command resumes it, and so does another
machine from what ``keras_preact_training.carry`` copied out (here with ``--part-mb``, the backup in parts, as for
storage with a per-file size limit: the run directory and the first machine are gone, the data lives at another
path). Both end with the weights of a run that was never stopped."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from keras_preact_training import carry, cli
from support import TRAIN_JIT_COMPILE

REPO = pathlib.Path(__file__).resolve().parents[1]
STEPS_PER_EPOCH, EPOCHS = 8, 2


def write_folder(root, per_class=40, classes=("cat", "dog", "emu")):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("test", 8)):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(
                    root / split / c / f"{i:04d}.png"
                )
    return root


def command(run_dir, data_dir, config=None):
    recipe = ["--config", str(config)] if config else [
        "--dataset", "folder", "--normalization", "centered", "--depth", "8", "--image-size", "16", "16",
        "--batch-size", "8", "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS_PER_EPOCH), "--seed", "5"]
    return [
        sys.executable,
        "-m",
        "keras_preact_training.cli",
        *recipe,
        "--data-dir",
        str(data_dir),
        "--run-dir",
        str(run_dir),
        "--checkpoint-every",
        "3",
        "--verbose",
        "0",
        "--no-export",
        "--jit-compile",
        TRAIN_JIT_COMPILE,
    ]


def env():
    return {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}


def weights(run_dir):
    import keras

    import keras_preact.layers  # noqa: F401  (registers the layers for loading)

    model = keras.saving.load_model(pathlib.Path(run_dir) / "model.keras")
    return [np.asarray(w) for w in model.get_weights()]


def train_until_killed(run_dir, data_dir):
    """Start the run and SIGKILL it once a backup inside the second epoch exists (a session ending)."""
    pointer = run_dir / "checkpoints" / "backup" / "latest.json"
    proc = subprocess.Popen(command(run_dir, data_dir), cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        try:
            step = json.loads(pointer.read_text())["step"]
        except (OSError, ValueError, KeyError):
            step = 0
        if step > STEPS_PER_EPOCH and step % STEPS_PER_EPOCH:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
            return step
        time.sleep(0.01)
    proc.wait(timeout=60)
    raise AssertionError(f"the run ended before it could be killed:\n{proc.stdout.read()[-3000:]}")


@pytest.mark.notf
def test_a_run_killed_mid_epoch_resumes_in_place_and_on_another_machine_from_the_carried_files(tmp_path, capsys):
    """The killed run and both resumes are processes of their own (``keras-preact-train``); the carry, the
    refusal and the straight reference run in this process, through the same entry points' ``main``."""
    first, second = tmp_path / "first-machine", tmp_path / "second-machine"
    killed_at = train_until_killed(first / "run", write_folder(first / "data"))
    assert not (first / "run" / "model.keras").exists()

    # The backup in parts of at most 0.1 MiB (--part-mb; by default the weights file is copied whole).
    weights_bytes = (
        (first / "run" / "checkpoints" / "backup" / f"state-{killed_at:010d}" / "model.weights.h5").stat().st_size
    )
    assert carry.main([str(first / "run"), str(tmp_path / "committed"), "--part-mb", "0.1"]) == 0
    done = capsys.readouterr()
    assert f"step {killed_at}" in done.out and "keras-preact-train --config RUN/config.json" in done.out
    carried = sorted(str(p.relative_to(tmp_path / "committed")) for p in (tmp_path / "committed").rglob("*")
                     if p.is_file())
    state = f"checkpoints/backup/state-{killed_at:010d}"
    count = -(-weights_bytes // (2**20 // 10))
    assert count >= 3 and carried == ["checkpoints/backup/latest.json",
                                      *(f"{state}/model.weights.h5.part-{k:03d}" for k in range(count)),
                                      f"{state}/model.weights.h5.parts.json", "config.json", "history.csv"]
    assert max((tmp_path / "committed" / p).stat().st_size for p in carried) <= 2**20 // 10

    # The same command on the same machine resumes inside the epoch where the kill left it.
    again = subprocess.run(command(first / "run", first / "data"), cwd=REPO, env=env(), capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"resuming at step {killed_at}" in again.stdout and killed_at % STEPS_PER_EPOCH
    metrics = json.loads((first / "run" / "metrics.json").read_text())
    assert (metrics["epochs"], metrics["steps"]) == (EPOCHS, EPOCHS * STEPS_PER_EPOCH)
    assert metrics["steps_this_session"] == EPOCHS * STEPS_PER_EPOCH - killed_at
    epochs_logged = [line.split(",")[0] for line in (first / "run" / "history.csv").read_text().splitlines()[1:]]
    assert epochs_logged == [str(e) for e in range(EPOCHS)]
    resumed_in_place = weights(first / "run")

    # Another machine: the carried files (a git checkout) and the data at another path; the first is gone.
    shutil.copytree(first / "data", second / "data")
    shutil.rmtree(first)
    shutil.copytree(tmp_path / "committed", second / "run")
    assert carry.main([str(second / "run"), str(tmp_path / "carried-again")]) == 0  # a carry not resumed yet
    assert sorted(p.name for p in (tmp_path / "carried-again" / state).iterdir()) == sorted(
        p.name for p in (tmp_path / "committed" / state).iterdir())
    carried_config = second / "run" / "config.json"
    other = write_folder(second / "other-data", classes=("cat", "dog", "fox"))
    with pytest.raises(SystemExit) as refused:
        cli.main(command(second / "run", other, config=carried_config)[3:])
    assert refused.value.code == 2
    assert ("the data has classes ['cat', 'dog', 'fox'], the run was trained on ['cat', 'dog', 'emu']; pass the "
            "--data-dir of the run's data set") in capsys.readouterr().err
    resumed = subprocess.run(command(second / "run", second / "data", config=carried_config),
                             cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resuming at step {killed_at}" in resumed.stdout  # from the joined parts
    assert "changed on resume, as allowed: data_dir" in resumed.stdout
    history = (second / "run" / "history.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in history[1:]] == [str(e) for e in range(EPOCHS)]

    # Both resumes continued the exact data stream and optimizer state: the weights of a run never stopped.
    assert cli.main(command(tmp_path / "straight", second / "data")[3:]) == 0
    expected = weights(tmp_path / "straight")
    for got in (resumed_in_place, weights(second / "run")):
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.notf
@pytest.mark.parametrize("make, message", [
    (lambda root: root.mkdir(), "no config.json"),
    (lambda root: (root.mkdir(), (root / "config.json").write_text("{}")), "no complete backup"),
])
def test_carry_of_a_folder_that_is_no_resumable_run_names_it(tmp_path, make, message, capsys):
    make(tmp_path / "run")
    assert carry.main([str(tmp_path / "run"), str(tmp_path / "dest")]) == 2
    err = capsys.readouterr().err
    assert "run_dir=" in err and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "dest").exists() and not list(tmp_path.glob(".tmp-*"))


@pytest.mark.notf
def test_carry_copies_the_weights_whole_unless_a_part_size_is_asked(tmp_path, capsys):
    """No per-file limit is assumed: a 2.4 MB backup (ResNet-20's size) is one file unless ``--part-mb`` is given."""
    run = tmp_path / "run"
    state = run / "checkpoints" / "backup" / "state-0000000006"
    state.mkdir(parents=True)
    data = bytes(range(256)) * (2_400_000 // 256)
    (state / "model.weights.h5").write_bytes(data)
    (run / "checkpoints" / "backup" / "latest.json").write_text(
        json.dumps({"state": state.name, "step": 6, "epoch": 0})
    )
    (run / "config.json").write_text("{}")
    assert carry.main([str(run), str(tmp_path / "whole")]) == 0
    assert sorted(p.name for p in (tmp_path / "whole" / "checkpoints" / "backup" / state.name).iterdir()) == [
        "model.weights.h5"]
    assert (tmp_path / "whole" / "checkpoints" / "backup" / state.name / "model.weights.h5").read_bytes() == data
    assert carry.main([str(run), str(tmp_path / "parts"), "--part-mb", "1"]) == 0
    assert sorted(p.name for p in (tmp_path / "parts" / "checkpoints" / "backup" / state.name).iterdir()) == [
        "model.weights.h5.part-000", "model.weights.h5.part-001", "model.weights.h5.part-002",
        "model.weights.h5.parts.json"]
    with pytest.raises(ValueError, match=r"Invalid part_bytes=0: None \(no split\) or a whole number of bytes"):
        carry.carry(run, tmp_path / "none", part_bytes=0)


@pytest.mark.notf
def test_carry_replaces_an_earlier_carry_whole(tmp_path):
    run = tmp_path / "run"
    for step in (3, 6):
        state = run / "checkpoints" / "backup" / f"state-{step:010d}"
        state.mkdir(parents=True, exist_ok=True)
        (state / "model.weights.h5").write_bytes(bytes([step]) * 10)
        (run / "checkpoints" / "backup" / "latest.json").write_text(json.dumps({"state": state.name, "step": step,
                                                                                 "epoch": 0}))
        (run / "config.json").write_text("{}")
        carry.carry(run, tmp_path / "dest")
    kept = sorted(p.name for p in (tmp_path / "dest" / "checkpoints" / "backup").iterdir())
    assert kept == ["latest.json", "state-0000000006"]
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.notf
def test_carried_parts_join_to_the_file_and_a_missing_or_damaged_part_is_named(tmp_path):
    from keras_preact_training.run import parts

    data = bytes(range(256)) * 41  # 10,496 bytes: parts of 4,096, 4,096 and 2,304
    (tmp_path / "w.h5").write_bytes(data)
    names = parts.split(tmp_path / "w.h5", tmp_path / "carried", part_bytes=4096)
    assert names == ["w.h5.part-000", "w.h5.part-001", "w.h5.part-002"]
    assert [(tmp_path / "carried" / n).stat().st_size for n in names] == [4096, 4096, 2304]
    damaged = tmp_path / "damaged"
    shutil.copytree(tmp_path / "carried", damaged)
    assert parts.join(tmp_path / "carried" / "w.h5").read_bytes() == data
    assert parts.join(tmp_path / "carried" / "w.h5").read_bytes() == data  # an existing file is kept

    (damaged / "w.h5.part-001").write_bytes(b"x" * 4096)
    with pytest.raises(ValueError, match=r"join to 10496 bytes that are not the file it records .*a part is damaged"):
        parts.join(damaged / "w.h5")
    (damaged / "w.h5.part-002").unlink()
    with pytest.raises(ValueError, match=r"lists parts that are not there: w\.h5\.part-002"):
        parts.join(damaged / "w.h5")
    (damaged / "w.h5.parts.json").unlink()
    with pytest.raises(ValueError, match=r"neither .*w\.h5 nor a readable index"):
        parts.join(damaged / "w.h5")
    assert not (damaged / "w.h5").exists() and not list(damaged.glob(".tmp-*"))  # nothing half-written
    with pytest.raises(ValueError, match=r"Invalid part_bytes=0"):
        parts.split(tmp_path / "w.h5", tmp_path / "none", part_bytes=0)


@pytest.mark.notf
@pytest.mark.parametrize("size, part_bytes, expected", [
    (0, 4, [0]),  # an empty file is one empty part: the index still names a part to join
    (8, 4, [4, 4]),  # a whole number of parts: no empty last part
    (9, 4, [4, 4, 1]),
    (3, 4, [3]),
])
def test_split_cuts_at_part_bytes_and_joins_back(tmp_path, size, part_bytes, expected):
    from keras_preact_training.run import parts

    data = bytes(range(size))
    (tmp_path / "w.h5").write_bytes(data)
    names = parts.split(tmp_path / "w.h5", tmp_path / "carried", part_bytes=part_bytes)
    assert [(tmp_path / "carried" / n).stat().st_size for n in names] == expected
    assert parts.join(tmp_path / "carried" / "w.h5").read_bytes() == data


@pytest.mark.notf
@pytest.mark.parametrize("part_mb", ["0", "-1", "inf", "nan"])
def test_carry_refuses_a_part_size_that_is_not_a_finite_byte_or_more(tmp_path, capsys, part_mb):
    with pytest.raises(SystemExit) as refused:
        carry.main([str(tmp_path / "run"), str(tmp_path / "dest"), "--part-mb", part_mb])
    assert refused.value.code == 2
    assert f"--part-mb must be a finite size of at least one byte (e.g. 1 or 0.5), got {float(part_mb)}" in (
        capsys.readouterr().err)
    assert not (tmp_path / "dest").exists()
