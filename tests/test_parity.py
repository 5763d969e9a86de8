"""The parity comparison (issue "Trained for real", item 2) runs end to end through its entry point on a
tiny image folder: every trainer and seed trains, the evidence files are written, running it again reuses
the finished runs, and the 0.5-point bound is judged from the kept runs' accuracies: it passes on equal
means and fails (exit naming the bound, every file written) on a 0.6-point gap."""

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import keras
import pytest
from test_train_speed import write_folder  # tests/ is on sys.path (pytest's default import mode)

from support import ONE_THREAD

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "reproduction" / "cifar10-parity-resnet20"))  # beside the reproduction it serves
pytestmark = [
    pytest.mark.notf,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the PyTorch reference needs torch"),
    pytest.mark.skipif(keras.backend.backend() != "torch", reason="one backend is enough (CI's PyTorch pass)"),
]


def test_parity_runs_end_to_end_and_resumes(tmp_path, capsys, monkeypatch):
    import parity_vs_pytorch as parity

    monkeypatch.setenv("HOME", str(tmp_path))  # the decoded-image caches of both trainers
    for name, value in ONE_THREAD.items():  # the trainers' processes inherit this environment
        monkeypatch.setenv(name, value)
    data = write_folder(tmp_path / "data", per_class=48, classes=3, size=16)  # 144 images: one step of 128
    out = tmp_path / "parity"
    argv = ["--data-dir", str(data), "--backends", "torch", "--depth", "8", "--image-size", "16", "16",  # the
            "--epochs", "2", "--seeds", "1", "2", "--out", str(out)]  # tool's check, not the comparison's ResNet-20

    def run():
        try:
            parity.main(argv)
            return True
        except SystemExit as stop:  # the bound failed (noise data): said so, after writing every file
            assert "more than 0.5 points" in str(stop)
            return False

    passed = run()
    printed = capsys.readouterr().out
    figures = json.loads((out / "parity.json").read_text())
    table = figures["table"]
    assert set(table) == {"keras-preact-torch", "reference-torch"}
    for name, row in table.items():
        assert row["seeds"] == [1, 2] and len(row["test_accuracy"]) == 2
        assert row["mean"] == pytest.approx(sum(row["test_accuracy"]) / 2)
        assert row["within_bound"] == (name == "reference-torch" or abs(row["gap_points"]) <= 0.5)
    reference = table["reference-torch"]["mean"]
    assert table["keras-preact-torch"]["gap_points"] == pytest.approx(
        100 * (table["keras-preact-torch"]["mean"] - reference)
    )
    assert passed == all(row["within_bound"] for row in table.values())
    assert "| keras-preact-torch | 1, 2 |" in printed and (out / "parity_curves.png").stat().st_size > 0
    assert "pre-act ResNet-8," in printed  # both trainers train the network asked for
    for seed in (1, 2):
        assert json.loads((out / f"reference-torch-seed{seed}" / "metrics.json").read_text())["depth"] == 8
        assert json.loads((out / f"keras-preact-torch-seed{seed}" / "config.json").read_text())["config"]["depth"] == 8
    for name in table:
        for seed in (1, 2):
            kept = out / f"{name}-seed{seed}"
            history = (kept / "history.csv").read_text().splitlines()
            assert len(history) == 3 and "val_accuracy" in history[0]  # header + 2 epochs
            assert json.loads((kept / "metrics.json").read_text())["test_accuracy"] == pytest.approx(
                table[name]["test_accuracy"][seed - 1])

    # Again: every run is finished, so nothing trains and the same table comes out.
    trained = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/history.csv")}
    assert len(trained) == 4
    assert run() == passed
    assert not re.search(r"seed \d+: \d+ s$", capsys.readouterr().out, re.MULTILINE)  # no run trained
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/history.csv")} == trained
    assert json.loads((out / "parity.json").read_text())["table"] == table

    # On another machine only the kept copies exist (the run directories are not committed): still reused.
    shutil.rmtree(out / "runs")
    assert run() == passed
    assert not re.search(r"seed \d+: \d+ s$", capsys.readouterr().out, re.MULTILINE)
    assert json.loads((out / "parity.json").read_text())["table"] == table

    # The judgement, from the kept accuracies: equal means pass; means 0.6 points apart fail.
    def keep_accuracies(ours):
        for seed, accuracy in zip((1, 2), ours):
            metrics_file = out / f"keras-preact-torch-seed{seed}" / "metrics.json"
            metrics_file.write_text(json.dumps({**json.loads(metrics_file.read_text()), "test_accuracy": accuracy}))

    theirs = table["reference-torch"]["test_accuracy"]
    keep_accuracies(theirs[::-1])  # the same mean, seeds swapped
    assert run() is True
    keep_accuracies([theirs[0] + 0.006, theirs[1] + 0.006])
    assert run() is False
    judged = json.loads((out / "parity.json").read_text())["table"]["keras-preact-torch"]
    assert judged["gap_points"] == pytest.approx(0.6) and judged["within_bound"] is False


@pytest.mark.parametrize("bad, message", [
    (["--epochs", "0"], "--epochs must be >= 1"),
    (["--seeds", "1", "1"], "--seeds must be distinct"),
    (["--depth", "10"], "--depth must be 6n+2"),
])
def test_bad_arguments_are_named(tmp_path, capsys, bad, message):
    import parity_vs_pytorch as parity

    data = write_folder(tmp_path / "data", per_class=1, classes=2)
    with pytest.raises(SystemExit) as exit_info:
        parity.main(["--data-dir", str(data), "--backends", "torch", *bad])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
