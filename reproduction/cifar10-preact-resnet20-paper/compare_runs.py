"""Finished training runs side by side: overlaid curves, accuracy agreement and the time each took.

Ours against the PyTorch reference at the paper's length. Each run
is its per-epoch history: keras-preact-train's ``history.csv`` (CSVLogger) or the reference's
(``benchmarks/reference_torch_cifar.py``); both have ``epoch`` (0-based), ``loss``, ``accuracy``,
``val_accuracy``, ``train_seconds`` and ``eval_seconds``. Epochs are printed 1-based, as the READMEs do.

- ``--png``: training loss and test top-1 per epoch, every run overlaid (the first run is the one compared with);
- ``--md``: per run, test top-1 at the last epoch, the best epoch, the mean over ``--from-epoch`` to the last
  epoch of the shortest run reaching it (or ``--to-epoch``), and each run's gap to the first run on those
  figures; with ``--time NAME A=EPOCHS B=EPOCHS`` (repeatable), the median training and evaluation seconds per
  epoch of run A and run B over those epochs (for instance the epochs each ran alone on one machine) and how
  many times longer B's epoch took; with ``--group NAME RUN [RUN ...]`` (repeatable, two groups or more: the
  seeds of one trainer), each group's mean and sample standard deviation of those figures over its runs, and
  each group's difference to the first group with Welch's t and its degrees of freedom (two runs or more in both).

Both files are written to a temporary name and renamed.

    python reproduction/cifar10-preact-resnet20-paper/compare_runs.py --from-epoch 84 \\
        --run "ours=reproduction/cifar10-preact-resnet20-paper/ours-jax-h100-seed0/history.csv" \\
        --run "reference=reproduction/cifar10-preact-resnet20-paper/reference-seed0/history.csv" \\
        --time "one H100" ours=138-165 reference=22-26 \\
        --png reproduction/cifar10-preact-resnet20-paper/curves-vs-reference.png \\
        --md reproduction/cifar10-preact-resnet20-paper/comparison.md
"""

import argparse
import pathlib
import statistics
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # benchmarks/ and training/ are not installed

from keras_preact.scratch import atomic_path  # noqa: E402
from keras_preact_training.run.plots import read_history  # noqa: E402

COLUMNS = ("epoch", "loss", "val_accuracy", "train_seconds", "eval_seconds")


def load_run(spec):
    """``LABEL=PATH`` -> (label, rows); a missing file, column or epoch is refused naming the argument."""
    label, sep, path = spec.partition("=")
    if not sep or not label or not path:
        raise ValueError(f"--run takes LABEL=PATH to a history.csv, got {spec!r}")
    if not pathlib.Path(path).is_file():
        raise ValueError(f"--run {label}: no history file at {path}")
    rows = read_history(path)
    if not rows:
        raise ValueError(f"--run {label}: {path} has no epochs")
    missing = [c for c in COLUMNS if c not in rows[0]]
    if missing:
        raise ValueError(f"--run {label}: {path} lacks the column(s) {', '.join(missing)} "
                         f"(a history of keras-preact-train or benchmarks/reference_torch_cifar.py has them)")
    epochs = [int(r["epoch"]) for r in rows]
    if epochs != list(range(len(rows))):
        raise ValueError(f"--run {label}: {path} does not have every epoch from the first (it has {len(rows)} "
                         f"rows up to epoch {epochs[-1] + 1})")
    return label, rows


def parse_epochs(label, text, runs):
    """``A-B`` or ``A`` (1-based, inclusive) -> range of 0-based row indices within the run."""
    first, _, last = text.partition("-")
    try:
        first, last = int(first), int(last or first)
    except ValueError:
        raise ValueError(f"--time {label}={text}: epochs are A-B (1-based, inclusive), e.g. 89-122") from None
    if not 1 <= first <= last <= len(runs[label]):
        raise ValueError(f"--time {label}={text}: the run has epochs 1-{len(runs[label])}")
    return range(first - 1, last)


def accuracy_table(runs, from_epoch, to_epoch=None):
    """{label: figures}. The mean test top-1 is over epochs from_epoch-to_epoch (1-based, inclusive; to_epoch
    defaults to the last epoch of the shortest run that reaches from_epoch); a run that stops before to_epoch
    has none (None)."""
    reaching = [len(rows) for rows in runs.values() if len(rows) >= from_epoch]
    if from_epoch < 1 or not reaching:
        raise ValueError(f"--from-epoch must be within 1-{max(len(r) for r in runs.values())}, got {from_epoch}")
    to_epoch = min(reaching) if to_epoch is None else to_epoch
    if not from_epoch <= to_epoch <= max(reaching):
        raise ValueError(f"--to-epoch must be within {from_epoch}-{max(reaching)}, got {to_epoch}")
    table = {}
    for label, rows in runs.items():
        top1 = [100 * float(r["val_accuracy"]) for r in rows]
        best = max(range(len(top1)), key=top1.__getitem__)
        table[label] = {
            "epochs": len(rows),
            "last": top1[-1],
            "best": top1[best],
            "best_epoch": best + 1,
            "window_mean": statistics.fmean(top1[from_epoch - 1:to_epoch]) if len(rows) >= to_epoch else None,
            "last_loss": float(rows[-1]["loss"]),
        }
    first = table[next(iter(table))]
    for row in table.values():
        row["gap_last"] = row["last"] - first["last"]
        both = None not in (row["window_mean"], first["window_mean"])
        row["gap_window_mean"] = row["window_mean"] - first["window_mean"] if both else None
    return table, (from_epoch, to_epoch)


def time_row(name, pair, runs):
    """One ``--time NAME A=EPOCHS B=EPOCHS``: the median seconds per epoch of each and B's over A's."""
    figures = []
    for spec in pair:
        label, sep, epochs = spec.partition("=")
        if not sep or label not in runs:
            raise ValueError(f"--time {name}: {spec!r} is not RUN=EPOCHS with RUN one of {', '.join(runs)}")
        chosen = [runs[label][k] for k in parse_epochs(label, epochs, runs)]
        train = statistics.median(float(r["train_seconds"]) for r in chosen)
        evaluate = statistics.median(float(r["eval_seconds"]) for r in chosen)
        figures.append({"run": label, "epochs": epochs, "train": train, "eval": evaluate})
    a, b = figures
    return {"name": name, "a": a, "b": b, "ratio": (b["train"] + b["eval"]) / (a["train"] + a["eval"])}


def welch(a, b):
    """(mean(b) - mean(a), Welch's t, its degrees of freedom) of two samples; t and df None when either sample has
    fewer than two values or both have no spread.

    Examples:

    >>> welch([86.38, 86.36], [87.26, 86.67])  # doctest: +ELLIPSIS
    (0.59..., 2.01..., 1.00...)
    """
    difference = statistics.fmean(b) - statistics.fmean(a)
    if min(len(a), len(b)) < 2:
        return difference, None, None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return difference, None, None
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return difference, difference / (va + vb) ** 0.5, df


def group_table(table, groups):
    """``groups`` [(name, [run labels])] -> [{"name", "runs", "last", "window_mean"}], each figure (mean, sd,
    difference to the first group, Welch's t, df) over the group's runs of the last epoch's and the window mean's
    test top-1; sd None for one run, the last three None for the first group, a figure None when a run lacks it."""
    values = [{figure: [table[label][figure] for label in labels] for figure in ("last", "window_mean")}
              for _, labels in groups]
    rows = []
    for k, (name, labels) in enumerate(groups):
        row = {"name": name, "runs": len(labels)}
        for figure, sample in values[k].items():
            first = values[0][figure]
            if None in sample:
                row[figure] = None
                continue
            sd = statistics.stdev(sample) if len(sample) > 1 else None
            compared = k > 0 and None not in first
            row[figure] = (statistics.fmean(sample), sd, *(welch(first, sample) if compared else (None, None, None)))
        rows.append(row)
    return rows


def parse_groups(specs, runs):
    """``--group NAME RUN [RUN ...]`` arguments -> [(name, labels)]; two groups or more, each run named once."""
    if not specs:
        return []
    if len(specs) < 2:
        raise ValueError("--group: give two groups or more (the first is the one compared with)")
    groups, seen = [], set()
    for spec in specs:
        name, labels = spec[0], spec[1:]
        if not labels:
            raise ValueError(f"--group {name}: name one run or more after the group's name")
        for label in labels:
            if label not in runs:
                raise ValueError(f"--group {name}: {label!r} is not one of the runs ({', '.join(runs)})")
            if label in seen:
                raise ValueError(f"--group {name}: {label!r} is in another group already")
            seen.add(label)
        groups.append((name, labels))
    return groups


def markdown(table, window, times, command, groups=()):
    first = next(iter(table))
    lines = [
        f"Command: `{command}`",
        "",
        f"Test top-1 on the 10,000 test images, %. Gaps are to {first}; the mean is over epochs "
        f"{window[0]}-{window[1]} (\"-\": the run stopped before).",
        "",
        "| run | epochs | last epoch | gap | best (epoch) | mean, epochs "
        f"{window[0]}-{window[1]} | gap | training loss, last epoch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, row in table.items():
        gap_last = "-" if label == first else f"{row['gap_last']:+.2f}"
        gap_mean = "-" if row["gap_window_mean"] is None or label == first else f"{row['gap_window_mean']:+.2f}"
        mean = "-" if row["window_mean"] is None else f"{row['window_mean']:.2f}"
        lines.append(f"| {label} | {row['epochs']} | {row['last']:.2f} | {gap_last} | {row['best']:.2f} "
                     f"({row['best_epoch']}) | {mean} | {gap_mean} | {row['last_loss']:.3f} |")
    if times:
        lines += [
            "",
            "Seconds per epoch, median over the epochs named (training + evaluation), and how many times longer the "
            "second run's epoch took:",
            "",
            "| where | run, epochs | s/epoch (train + eval) | run, epochs | s/epoch (train + eval) | ratio |",
            "|---|---|---|---|---|---|",
        ]
        for t in times:
            a, b = t["a"], t["b"]
            lines.append(f"| {t['name']} | {a['run']}, {a['epochs']} | {a['train']:.2f} + {a['eval']:.2f} | "
                         f"{b['run']}, {b['epochs']} | {b['train']:.2f} + {b['eval']:.2f} | {t['ratio']:.2f}x |")
    if groups:
        def cell(figure):
            if figure is None:
                return "-", "-", "-"
            mean, sd, difference, t, df = figure
            spread = f"{mean:.2f}" + ("" if sd is None else f" +- {sd:.2f}")
            if difference is None:
                return spread, "-", "-"
            return spread, f"{difference:+.2f}", "-" if t is None else f"{t:+.2f} ({df:.1f})"

        lines += [
            "",
            "Groups: mean +- sample standard deviation of their runs' test top-1, "
            f"and the difference to {groups[0]['name']} "
            "with Welch's t (its degrees of freedom):",
            "",
            f"| group | runs | last epoch | difference | t (df) | mean, epochs {window[0]}-{window[1]} | "
            "difference | t (df) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in groups:
            lines.append(f"| {row['name']} | {row['runs']} | " + " | ".join(cell(row["last"])) + " | "
                         + " | ".join(cell(row["window_mean"])) + " |")
    return "\n".join(lines) + "\n"


def plot(runs, png, styles=None, accuracy_span=None):
    """Training loss (log scale) and test top-1 per epoch of every run ({label: history rows}), overlaid; ``styles``
    ({label: matplotlib line keywords}) defaults to one colour per run; ``accuracy_span`` shows only that many
    points below the highest test top-1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from keras_preact.analysis.plots import save_figure

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for colour, (label, rows) in enumerate(runs.items()):
        epochs = [int(r["epoch"]) + 1 for r in rows]
        style = dict((styles or {}).get(label, {"color": f"C{colour}", "linewidth": 1}), label=label)
        ax_loss.plot(epochs, [float(r["loss"]) for r in rows], **style)
        ax_acc.plot(epochs, [100 * float(r["val_accuracy"]) for r in rows], **style)
    ax_loss.set(xlabel="epoch", ylabel="training loss", yscale="log")
    ax_acc.set(xlabel="epoch", ylabel="test top-1 (%)")
    if accuracy_span is not None:
        top = max(100 * float(r["val_accuracy"]) for rows in runs.values() for r in rows)
        ax_acc.set_ylim(top - accuracy_span, top + 1)
    ax_acc.legend(fontsize=8)
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, png, dpi=100)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", action="append", required=True, metavar="LABEL=PATH",
                   help="a run's history.csv; two or more, the first is the one compared with")
    p.add_argument("--from-epoch", type=int, default=1, help="first epoch (1-based) of the mean test top-1")
    p.add_argument("--to-epoch", type=int, default=None,
                   help="last epoch of the mean (default: the last of the shortest run reaching --from-epoch)")
    p.add_argument("--time", nargs=3, action="append", default=[], metavar=("NAME", "A=EPOCHS", "B=EPOCHS"),
                   help="median seconds per epoch of two runs over the epochs named (A-B, 1-based) and B's over A's")
    p.add_argument("--group", nargs="+", action="append", default=[], metavar="NAME_THEN_RUNS",
                   help="NAME RUN [RUN ...]: runs of one trainer (seeds); two groups or more, compared with the first "
                   "by their means and Welch's t")
    p.add_argument("--png", help="write the overlaid curves here")
    p.add_argument("--md", help="write the table here (it is printed either way)")
    args = p.parse_args(argv)
    if len(args.run) < 2:
        p.error("--run: give two runs or more")
    try:
        args.runs = dict(load_run(spec) for spec in args.run)
        if len(args.runs) != len(args.run):
            raise ValueError("--run: every label must be distinct")
        args.table, args.window = accuracy_table(args.runs, args.from_epoch, args.to_epoch)
        args.times = [time_row(name, (a, b), args.runs) for name, a, b in args.time]
        args.groups = group_table(args.table, parse_groups(args.group, args.runs))
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv=None):
    args = parse_args(argv)
    command = "python reproduction/cifar10-preact-resnet20-paper/compare_runs.py " + " ".join(
        f'"{a}"' if " " in a else a for a in (sys.argv[1:] if argv is None else argv))
    text = markdown(args.table, args.window, args.times, command, args.groups)
    print(text, end="")
    if args.md:
        with atomic_path(args.md) as tmp:
            tmp.write_text(text)
    if args.png:
        plot(args.runs, args.png, accuracy_span=15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
