"""reproduction/cifar10-preact-resnet20-paper/compare_runs.py through its entry point: from two histories in the
two trainers' own formats it writes the agreement table with the figures computed by hand, the time ratio
and the overlaid curves; bad arguments are refused naming them, before anything is written."""

import csv
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "reproduction" / "cifar10-preact-resnet20-paper"))  # beside the reproduction it serves
pytestmark = [pytest.mark.notf, pytest.mark.any_backend]

# keras-preact-train's CSVLogger columns (alphabetical) and the reference's (its own order, with lr).
OURS_COLUMNS = ["epoch", "accuracy", "eval_seconds", "loss", "top5_accuracy", "train_seconds", "val_accuracy",
                "val_loss", "val_top5_accuracy"]
REFERENCE_COLUMNS = ["epoch", "loss", "accuracy", "val_loss", "val_accuracy", "lr", "train_seconds", "eval_seconds"]


def write_history(path, columns, val_accuracy, train_seconds, eval_seconds=0.5, repeat_epoch=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"epoch": k, "loss": 2.0 / (k + 1), "accuracy": 0.5, "val_loss": 1.0, "val_accuracy": acc, "lr": 0.1,
             "top5_accuracy": 0.9, "val_top5_accuracy": 0.9, "train_seconds": train_seconds[k],
             "eval_seconds": eval_seconds} for k, acc in enumerate(val_accuracy)]
    if repeat_epoch is not None:  # a kill between the log and the backup: the epoch is logged again, the later wins
        rows.insert(repeat_epoch, dict(rows[repeat_epoch], val_accuracy=0.0))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_compare_runs_writes_the_table_the_curves_and_the_time_ratio(tmp_path, capsys):
    import compare_runs

    ours = write_history(tmp_path / "ours" / "history.csv", OURS_COLUMNS, [0.50, 0.80, 0.86, 0.87, 0.88, 0.87],
                         train_seconds=[9, 3, 3, 4, 3, 3], repeat_epoch=2)
    reference = write_history(tmp_path / "ref" / "history.csv", REFERENCE_COLUMNS, [0.40, 0.81, 0.87, 0.86, 0.875],
                              train_seconds=[7, 7, 6, 8, 20], eval_seconds=1.0)
    md, png = tmp_path / "out" / "comparison.md", tmp_path / "out" / "curves.png"
    argv = ["--run", f"ours={ours}", "--run", f"the reference={reference}", "--from-epoch", "3",
            "--time", "one machine", "ours=2-6", "the reference=1-4", "--md", str(md), "--png", str(png)]
    assert compare_runs.main(argv) == 0
    text = md.read_text()
    assert capsys.readouterr().out == text
    assert "the mean is over epochs 3-5" in text  # the shorter run's last epoch
    # last, gap, best (epoch), mean of epochs 3-5, its gap, last training loss (2 / epochs)
    assert "| ours | 6 | 87.00 | - | 88.00 (5) | 87.00 | - | 0.333 |" in text
    assert "| the reference | 5 | 87.50 | +0.50 | 87.50 (5) | 86.83 | -0.17 | 0.400 |" in text
    # medians over the epochs named: ours 3 + 0.5 (epochs 2-6), the reference 7 + 1 (epochs 1-4): 8 / 3.5
    assert "| one machine | ours, 2-6 | 3.00 + 0.50 | the reference, 1-4 | 7.00 + 1.00 | 2.29x |" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in md.parent.iterdir()) == ["comparison.md", "curves.png"]  # no temporary left


def test_a_run_stopped_before_the_window_has_no_mean(tmp_path, capsys):
    import compare_runs

    long = write_history(tmp_path / "a.csv", OURS_COLUMNS, [0.5, 0.6, 0.7, 0.8], train_seconds=[1] * 4)
    short = write_history(tmp_path / "b.csv", REFERENCE_COLUMNS, [0.5, 0.65], train_seconds=[1] * 2)
    other = write_history(tmp_path / "c.csv", REFERENCE_COLUMNS, [0.5, 0.6, 0.72], train_seconds=[1] * 3)
    assert compare_runs.main(["--run", f"a={long}", "--run", f"b={short}", "--run", f"c={other}",
                              "--from-epoch", "3"]) == 0
    out = capsys.readouterr().out
    assert "the mean is over epochs 3-3" in out
    assert "| b | 2 | 65.00 | -15.00 | 65.00 (2) | - | - |" in out
    assert "| c | 3 | 72.00 | -8.00 | 72.00 (3) | 72.00 | +2.00 |" in out


def test_groups_of_seeds_get_their_mean_spread_and_welch_t_against_the_first(tmp_path, capsys):
    import compare_runs

    def run(name, accuracies):
        return f"{name}=" + str(write_history(tmp_path / f"{name}.csv", REFERENCE_COLUMNS, accuracies,
                                               train_seconds=[1] * len(accuracies)))

    argv = ["--from-epoch", "2",
            "--run", run("ref0", [0.5, 0.86, 0.87]), "--run", run("ref1", [0.5, 0.85, 0.86]),
            "--run", run("ours0", [0.5, 0.84, 0.85]), "--run", run("ours1", [0.5, 0.85, 0.855]),
            "--run", run("lone", [0.5, 0.80, 0.83]),
            "--group", "reference", "ref0", "ref1", "--group", "ours", "ours0", "ours1", "--group", "one", "lone"]
    assert compare_runs.main(argv) == 0
    out = capsys.readouterr().out
    assert "the difference to reference with Welch's t (its degrees of freedom)" in out
    # last epoch: reference 87, 86 (86.50 +- 0.71), ours 85, 85.5 (85.25 +- 0.35): -1.25;
    # squared standard errors 0.5/2 and 0.125/2: t = -1.25 / sqrt(0.3125) = -2.24, df = 0.3125^2 / (0.25^2 + 0.0625^2) =
    # 1.47. Window (epochs 2-3): means 86.5, 85.5 (86.00 +- 0.71); 84.5, 85.25 (84.88 +- 0.53): -1.125; squared standard
    # errors 0.25 and 0.28125/2: t = -1.125 / sqrt(0.390625) = -1.80, df = 0.390625^2 / (0.25^2 + 0.140625^2) = 1.86.
    assert "| ours | 2 | 85.25 +- 0.35 | -1.25 | -2.24 (1.5) | 84.88 +- 0.53 | -1.12 | -1.80 (1.9) |" in out
    assert "| reference | 2 | 86.50 +- 0.71 | - | - | 86.00 +- 0.71 | - | - |" in out
    assert "| one | 1 | 83.00 | -3.50 | - | 81.50 | -4.50 | - |" in out  # one run: no spread, no t
    assert compare_runs.welch([1.0, 1.0], [2.0, 2.0]) == (1.0, None, None)  # no spread in either: no t


def test_the_docstring_examples_of_compare_runs_hold():
    import doctest

    import compare_runs

    result = doctest.testmod(compare_runs, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 1 and result.failed == 0


@pytest.mark.parametrize("bad, message", [
    (["--run", "ours={ours}"], r"--run: give two runs or more"),
    (["--run", "{ours}", "--run", "ref={ref}"], r"--run takes LABEL=PATH"),
    (["--run", "ours={ours}", "--run", "ref={tmp}/none.csv"], r"--run ref: no history file at .*none\.csv"),
    (["--run", "ours={ours}", "--run", "ours={ref}"], r"--run: every label must be distinct"),
    (["--run", "ours={ours}", "--run", "ref={lossless}"], r"--run ref: .* lacks the column\(s\) loss"),
    (["--run", "ours={ours}", "--run", "ref={gappy}"], r"--run ref: .* does not have every epoch"),
    (["--run", "ours={ours}", "--run", "ref={ref}", "--from-epoch", "4"], r"--from-epoch must be within 1-3"),
    (["--run", "ours={ours}", "--run", "ref={ref}", "--from-epoch", "2", "--to-epoch", "4"],
     r"--to-epoch must be within 2-3"),
    (["--run", "ours={ours}", "--run", "ref={ref}", "--time", "m", "ours=1-3", "them=1-2"],
     r"--time m: 'them=1-2' is not RUN=EPOCHS with RUN one of ours, ref"),
    (["--run", "ours={ours}", "--run", "ref={ref}", "--time", "m", "ours=2-9", "ref=1-2"],
     r"--time ours=2-9: the run has epochs 1-3"),
    (["--run", "ours={ours}", "--run", "ref={ref}", "--time", "m", "ours=last", "ref=1-2"],
     r"--time ours=last: epochs are A-B"),
    (["--run", "ours={ours}", "--run", "ref={ref}", "--group", "g", "ours"],
     r"--group: give two groups or more \(the first is the one compared with\)"),
    (["--run", "ours={ours}", "--run", "ref={ref}", "--group", "a", "ours", "--group", "b"],
     r"--group b: name one run or more after the group's name"),
    (["--run", "ours={ours}", "--run", "ref={ref}", "--group", "a", "ours", "--group", "b", "them"],
     r"--group b: 'them' is not one of the runs \(ours, ref\)"),
    (["--run", "ours={ours}", "--run", "ref={ref}", "--group", "a", "ours", "--group", "b", "ref", "ours"],
     r"--group b: 'ours' is in another group already"),
])
def test_bad_arguments_are_named_before_anything_is_written(tmp_path, capsys, bad, message):
    import compare_runs

    paths = {
        "ours": write_history(tmp_path / "ours.csv", OURS_COLUMNS, [0.5, 0.6, 0.7], train_seconds=[1] * 3),
        "ref": write_history(tmp_path / "ref.csv", REFERENCE_COLUMNS, [0.5, 0.6, 0.7], train_seconds=[1] * 3),
        "lossless": write_history(tmp_path / "lossless.csv", ["epoch", "val_accuracy", "train_seconds",
                                                              "eval_seconds"], [0.5], train_seconds=[1]),
        "gappy": tmp_path / "gappy.csv",
        "tmp": tmp_path,
    }
    lines = (tmp_path / "ref.csv").read_text().splitlines()
    paths["gappy"].write_text("\n".join([lines[0], lines[1], lines[3]]) + "\n")  # epochs 0 and 2
    argv = [a.format(**paths) for a in bad] + ["--md", str(tmp_path / "out" / "c.md")]
    with pytest.raises(SystemExit) as exit_info:
        compare_runs.main(argv)
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "out").exists()
