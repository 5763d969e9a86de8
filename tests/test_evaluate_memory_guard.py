"""``keras-preact-evaluate --memory-limit``: training's host-memory guard around evaluate's ``model.evaluate``.

A bad value fails first (exit 2, argparse's line naming the flag, nothing loaded); the guard's line says
``[evaluate]`` and evaluation's remedies (training's line is checked unchanged in
``tests/test_training_memory_guard.py``); the real entry point with a limit this machine is already over
ends with that one line and exit 1 (a failed run, as ``keras-preact-train``), and ``--memory-limit 0``
evaluates to the summary.
"""

import json
import os
import pathlib
import subprocess
import sys
import threading

import keras
import numpy as np
import pytest

from keras_preact.models import create_model, get_input_config
from keras_preact_training import evaluate as evaluate_lib
from keras_preact_training.machine import memory_guard
from keras_preact_training.run.manifest import RunManifest

pytestmark = pytest.mark.notf

REPO = pathlib.Path(__file__).resolve().parents[1]
GIB = 2**30
CLASSES = ["c0", "c1"]
CIFAR16 = get_input_config("cifar_resnet20").replace(input_size=(16, 16, 3))
RULE = "0 (the memory guard off) or a fraction 0 < f <= 1 of the memory limit is required (default 0.95)"
no_memory_readable = pytest.mark.skipif(memory_guard.read_memory() is None,
                                        reason="no memory readable here (not Linux): the guard is off")


@pytest.fixture(scope="module")
def run_and_data(tmp_path_factory):
    """(run directory, image folder): a depth-8 CIFAR network at 16 x 16 with its run config.json, and 8
    test PNGs of 2 classes at that size (evaluated as arrays, without TensorFlow)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("evaluate_memory_guard")
    keras.utils.set_random_seed(0)
    model = create_model("cifar_resnet20", depth=8, num_classes=len(CLASSES), input_shape=CIFAR16.input_size)
    run = root / "run"
    run.mkdir()
    keras.Model(model.inputs, model.outputs).save(run / "model.keras")
    manifest = RunManifest(name="tiny", class_names=tuple(CLASSES), input_config=CIFAR16, config={})
    (run / "config.json").write_text(manifest.to_json())
    images = np.random.default_rng(0).integers(0, 256, (8, 16, 16, 3), dtype=np.uint8)
    for split, items in (("train", [(images[0], 0), (images[1], 1)]), ("test", [(x, i % 2) for i, x in
                                                                            enumerate(images)])):
        for i, (image, label) in enumerate(items):
            folder = root / "data" / split / CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{i:03d}.png")
    return run, root / "data"


def run_evaluate(*args):
    """``python -m keras_preact_training.evaluate ARGS`` (as tests/test_evaluate.py runs it), this checkout first."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "keras_preact_training.evaluate", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


# ------------------------------------------------------------------------------------------ the flag
def test_the_flag_takes_0_or_a_fraction_and_defaults_to_the_guards():
    parser = evaluate_lib.build_parser()
    assert parser.parse_args(["m"]).memory_limit == memory_guard.DEFAULT_FRACTION == 0.95
    for text, value in (("0", 0.0), ("0.01", 0.01), ("1e-2", 0.01), ("0.5", 0.5), ("1", 1.0)):
        assert parser.parse_args(["m", "--memory-limit", text]).memory_limit == value
    assert "--memory-limit FRACTION" in parser.format_help()


@pytest.mark.parametrize("value", ["1.5", "-1", "-0.1", "1.0001", "nan", "inf", "abc", ""])
def test_a_bad_memory_limit_fails_first_naming_the_flag(tmp_path, monkeypatch, capsys, value):
    """argparse's error (exit 2) naming --memory-limit and what it takes, before any model or data is read."""
    for name in ("resolve_model", "resolve_data", "evaluate"):
        monkeypatch.setattr(evaluate_lib, name, lambda *a, _name=name, **k: pytest.fail(f"{_name} despite a bad flag"))
    with pytest.raises(SystemExit) as exit_info:
        evaluate_lib.main(["cifar_resnet20", "--weights", "cifar10", "--data-dir", str(tmp_path),
                           "--memory-limit", value])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert err.startswith("usage: keras-preact-evaluate") and err.endswith(
        f"keras-preact-evaluate: error: argument --memory-limit: invalid value {value!r}: {RULE}\n"), err


def test_train_and_evaluate_share_the_check():
    """One rule, one wording: the value training's config refuses is the value evaluate's flag refuses."""
    from keras_preact_training.recipe import configs

    for bad in (-1, 1.5, float("nan"), True, "0.9"):
        with pytest.raises(ValueError, match=r"^Invalid memory_limit=.* \(--memory-limit\): 0 \(the memory guard "
                                              r"off\) or a fraction 0 < f <= 1 .*\(default 0\.95\)\.$"):
            memory_guard.check_fraction(bad)
    assert [memory_guard.check_fraction(ok) for ok in (0, 0.01, 1)] == [0, 0.01, 1]
    with pytest.raises(ValueError, match=r"Invalid memory_limit=1\.5 \(--memory-limit\): " + RULE.replace(
            "(", r"\(").replace(")", r"\)")):
        configs.get_config("synthetic-resnet8", memory_limit=1.5)


# ------------------------------------------------------------------------------------------ the line
def test_the_evaluate_line_says_evaluate_and_evaluations_remedies(tmp_path):
    memory = memory_guard.Memory(used=int(22.8 * GIB), limit=24 * GIB, source="this machine's memory")
    line = memory_guard.message("model.evaluate", memory, 0.95, rss=int(20.5 * GIB), prefix="[evaluate]",
                                remedies=evaluate_lib.OUT_OF_MEMORY_HINT)
    assert line == (
        "[evaluate] error: out of host memory during model.evaluate: 1.20 GiB left of 24.00 GiB (this machine's "
        "memory; 95% in use reached --memory-limit 0.95), this process's RSS 20.50 GiB; stopped before the "
        "kernel's OOM killer would end the run without a word -- out of memory: evaluate with a smaller "
        "--batch-size; --memory-limit FRACTION changes the threshold (default 0.95), --memory-limit 0 switches "
        "this guard off")

    # The guard's poll writes it with the words it was given.
    lines = []
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 500 kB\n")
    guard = memory_guard.MemoryGuard("model.evaluate", 0.5, root=tmp_path, exit=lines.append, prefix="[evaluate]",
                                     remedies=evaluate_lib.OUT_OF_MEMORY_HINT)
    assert guard.poll() and len(lines) == 1
    assert lines[0].startswith("[evaluate] error: out of host memory during model.evaluate: ")
    assert "a smaller --batch-size;" in lines[0] and "[train]" not in lines[0] and "--remat" not in lines[0]


def test_the_guard_off_note_says_evaluate(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(memory_guard, "_said_off", False)
    with memory_guard.watch("model.evaluate", 0.95, root=tmp_path, prefix="[evaluate]") as guard:  # nothing to read
        assert guard is None
    assert capsys.readouterr().err.startswith("[evaluate] memory guard off: ")


# ------------------------------------------------------------------------------------------ the run
@no_memory_readable
def test_the_guard_watches_model_evaluate_with_the_flags_fraction(run_and_data, monkeypatch, capsys):
    """In process: the guard thread polls during model.evaluate with evaluate's words and the flag's fraction;
    --memory-limit 0 starts none. (The poll is recorded, not acted on: this process must not be ended.)"""
    run, data = run_and_data
    polled = []

    def recording_poll(self):
        polled.append((self.what, self.fraction, self.prefix, self.remedies, threading.current_thread().name))
        return False

    monkeypatch.setattr(memory_guard.MemoryGuard, "poll", recording_poll)
    assert evaluate_lib.main([str(run), "--data-dir", str(data), "--memory-limit", "0.5"]) == 0
    assert "top1_accuracy" in capsys.readouterr().out
    assert set(polled) == {("model.evaluate", 0.5, "[evaluate]", evaluate_lib.OUT_OF_MEMORY_HINT,
                            memory_guard.THREAD_NAME)}
    assert not [t for t in threading.enumerate() if t.name == memory_guard.THREAD_NAME]
    polled.clear()
    assert evaluate_lib.main([str(run), "--data-dir", str(data), "--memory-limit", "0"]) == 0
    assert polled == [] and "top1_accuracy" in capsys.readouterr().out


@no_memory_readable
def test_keras_preact_evaluate_stops_with_one_line_and_exit_1(run_and_data, tmp_path):
    """The real entry point with a limit this machine is already over: the guard's one line, last on stderr,
    exit 1 (a failed run); what was printed before came out; no summary, no metrics file."""
    run, data = run_and_data
    result = run_evaluate(run, "--data-dir", data, "--json", tmp_path / "m.json", "--memory-limit", "0.01")
    assert result.returncode == memory_guard.EXIT_CODE == 1, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if "out of host memory" in line]
    assert len(lines) == 1 and result.stderr.strip().splitlines()[-1] == lines[0], result.stderr[-3000:]
    assert lines[0].startswith("[evaluate] error: out of host memory during model.evaluate: "), lines[0]
    assert "reached --memory-limit 0.01)" in lines[0] and lines[0].endswith(
        f"{evaluate_lib.OUT_OF_MEMORY_HINT}; --memory-limit FRACTION changes the threshold (default 0.95), "
        "--memory-limit 0 switches this guard off"), lines[0]
    assert "Traceback" not in result.stderr and "[train]" not in result.stderr
    assert f"[evaluate] run {run} on " in result.stdout and "top1_accuracy" not in result.stdout
    assert not list(tmp_path.iterdir())  # no m.json, no temporary


def test_keras_preact_evaluate_memory_limit_0_runs_to_the_summary(run_and_data, tmp_path):
    run, data = run_and_data
    result = run_evaluate(run, "--data-dir", data, "--json", tmp_path / "m.json", "--memory-limit", "0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "out of host memory" not in result.stderr and "memory guard off" not in result.stderr
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"run {run} on ") and ": top1_accuracy " in summary, result.stdout
    assert json.loads((tmp_path / "m.json").read_text())["images"] == 8


def test_keras_preact_evaluate_refuses_a_bad_memory_limit(tmp_path):
    """The real entry point: exit 2 and the flag named, before the (absent) model is looked at."""
    result = run_evaluate(tmp_path / "absent.keras", "--memory-limit", "1.5")
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"keras-preact-evaluate: error: argument --memory-limit: invalid value '1.5': {RULE}" in result.stderr
    assert "absent.keras" not in result.stderr
