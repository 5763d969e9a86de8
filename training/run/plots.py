"""Training curves as in the paper's Fig. 1 / 6: training loss and test error against iterations."""

import csv

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from keras_preact.analysis.plots import save_figure  # noqa: E402


def read_history(csv_path):
    """CSVLogger rows, one per epoch (a kill between the log and the backup can repeat an epoch; the
    later row wins); [] when there is no file yet."""
    try:
        with open(csv_path, newline="") as f:
            rows = {int(r["epoch"]): r for r in csv.DictReader(f)}
    except FileNotFoundError:
        return []
    return [rows[k] for k in sorted(rows)]


def plot_curves(csv_path, png_path, steps_per_epoch, title=""):
    """Write ``png_path`` (atomically) from a CSVLogger file: loss (left) and test error % (right)."""
    rows = read_history(csv_path)
    iterations = [(int(r["epoch"]) + 1) * steps_per_epoch for r in rows]
    fig, (ax_loss, ax_err) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(iterations, [float(r["loss"]) for r in rows], "-o", ms=3, label="training loss")
    ax_loss.set_xlabel("iterations")
    ax_loss.set_ylabel("training loss")
    if rows and "val_accuracy" in rows[0]:
        ax_err.plot(iterations, [100 * (1 - float(r["val_accuracy"])) for r in rows], "-o", ms=3,
                    color="C1", label="test error")
    if rows and "accuracy" in rows[0]:
        ax_err.plot(iterations, [100 * (1 - float(r["accuracy"])) for r in rows], "--", color="C0",
                    label="training error")
    ax_err.set_xlabel("iterations")
    ax_err.set_ylabel("error (%)")
    ax_err.legend()
    for ax in (ax_loss, ax_err):
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, png_path, dpi=100)
