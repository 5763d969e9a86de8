"""Parity with an independent trainer: keras-preact (TensorFlow, JAX) against plain PyTorch, same budget.

Every candidate trains pre-act ResNet-20 (option A) on the CIFAR-10
JPEG folder with the same recipe (preset ``cifar10-folder-resnet20-short``: batch 128, SGD Nesterov 0.9,
coupled weight decay 1e-4 on every parameter, warm-up then cosine, pad-4 crop + flip) for ``--epochs``
full epochs, once per seed:

- ``keras-preact-train --backend tensorflow`` (``--python``, the TensorFlow environment);
- ``keras-preact-train --backend jax`` (``--notf-python``, the TensorFlow-free environment);
- ``benchmarks/reference_torch_cifar.py`` (``--notf-python``; imports nothing of ours).

Runs go seed by seed, every candidate within a seed, so an interrupted comparison stays balanced; a run
whose ``metrics.json`` exists (in its run directory, or in its kept copy under ``--out``, so committed
evidence resumes on another machine) is reused: running the same command again resumes. ``--out`` gets the
small evidence files (run directories stay under ``OUT/runs/``, which git ignores):

- ``parity.md``: final-epoch test accuracy per seed, mean +- std, and each mean's gap to the reference's,
  against the 0.5-point bound, with the command, machine and versions;
- ``parity.json``: the same figures; ``parity_curves.png``: training loss and test accuracy per epoch,
  every run overlaid (one colour per trainer, one line style per seed);
- ``<candidate>-seed<N>/history.csv`` and ``metrics.json`` of every run.

``--depth`` and ``--image-size`` (defaults 20 and 32 32, the comparison's) set the network and the image size
of every trainer, for a small check of the tool itself (tests: ResNet-8 on 16x16 images); the folder's images
must have that size.

    python reproduction/cifar10-parity-resnet20/parity_vs_pytorch.py --data-dir /tmp/cifar10-jpeg --notf-python
    .venv-notf/bin/python \\
        --epochs 10 --seeds 1 2 --out reproduction/cifar10-parity-resnet20
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
for _path in (REPO, REPO / "reproduction" / "cifar10-preact-resnet20-paper"):  # benchmarks/, compare_runs.py
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import compare_runs  # noqa: E402

from benchmarks import train_speed_vs_pytorch as speed  # noqa: E402
from keras_preact_training.run.plots import read_history  # noqa: E402
from keras_preact_training.run.run_dir import write_json, write_text  # noqa: E402

REFERENCE = "reference-torch"
BOUND_POINTS = 0.5  # the parity bound: each keras-preact mean within 0.5 points of the reference's
SMALL_FILES = ("history.csv", "metrics.json", "config.json")


def commands(args, seed, run_dir):
    """{candidate: (interpreter, argv)} for one seed."""
    found = {}
    for backend in args.backends:
        python = args.python if backend == "tensorflow" else (args.notf_python or args.python)
        found[f"keras-preact-{backend}"] = (
            python,
            [
                "-m",
                "keras_preact_training.cli",
                "--preset",
                speed.PRESET,
                "--data-dir",
                args.data_dir,
                "--backend",
                backend,
                "--depth",
                str(args.depth),
                "--image-size",
                *map(str, args.image_size),
                "--epochs",
                str(args.epochs),
                "--seed",
                str(seed),
                "--verbose",
                "0",
                "--no-export",
                "--run-dir",
                str(run_dir / f"keras-preact-{backend}-seed{seed}"),
            ],
        )
    found[REFERENCE] = (args.notf_python or args.python, [
        str(REPO / "benchmarks" / "reference_torch_cifar.py"), "--data-dir", args.data_dir,
        "--depth", str(args.depth), "--epochs", str(args.epochs), "--seed", str(seed),
        "--out", str(run_dir / f"{REFERENCE}-seed{seed}")])
    return found


def finished(name, seed, run_dir, out):
    """Where a finished run of this candidate and seed is (its run directory, else its kept copy in ``out``:
    committed evidence resumes on another machine), or None."""
    for where in (run_dir / f"{name}-seed{seed}", out / f"{name}-seed{seed}"):
        if (where / "metrics.json").exists():
            return where
    return None


def run(name, seed, python, argv, run_dir, out):
    """Train one candidate at one seed (unless a finished run is there); copy its small files to ``out``."""
    where, keep = finished(name, seed, run_dir, out) or run_dir / f"{name}-seed{seed}", out / f"{name}-seed{seed}"
    if not (where / "metrics.json").exists():
        shutil.rmtree(where, ignore_errors=True)
        env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
        env.pop("KERAS_BACKEND", None)  # each keras-preact candidate names its backend (--backend)
        started = time.perf_counter()
        log = run_dir / f"{name}-seed{seed}.log"
        with open(log, "w") as f:
            done = subprocess.run([python, *argv], cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            tail = "\n".join(log.read_text().strip().splitlines()[-15:])
            raise SystemExit(f"{name} seed {seed} failed (exit {done.returncode}, log {log}):\n{tail}")
        print(f"{name} seed {seed}: {time.perf_counter() - started:.0f} s", flush=True)
    if where != keep:
        speed.keep_files(where, keep, SMALL_FILES)
    return {"history": read_history(where / "history.csv"),
            "test_accuracy": json.loads((where / "metrics.json").read_text())["test_accuracy"]}


def summarize(results):
    """Per candidate: accuracies by seed, mean, std, gap to the reference's mean (points), within bound."""
    reference = statistics.mean(r["test_accuracy"] for r in results[REFERENCE].values())
    table = {}
    for name, by_seed in results.items():
        accuracies = [by_seed[s]["test_accuracy"] for s in sorted(by_seed)]
        mean = statistics.mean(accuracies)
        gap = 100 * (mean - reference)
        table[name] = {"seeds": sorted(by_seed), "test_accuracy": accuracies, "mean": mean,
                       "std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
                       "gap_points": gap, "within_bound": name == REFERENCE or abs(gap) <= BOUND_POINTS}
    return table


def markdown(args, table, machine, versions):
    lines = [
        f"# Parity: keras-preact against plain PyTorch (pre-act ResNet-{args.depth}, CIFAR-10 JPEG, "
        f"{args.epochs} epochs)",
        "",
        f"Command: `python reproduction/cifar10-parity-resnet20/parity_vs_pytorch.py {' '.join(sys.argv[1:])}`",
        "",
        f"Machine: {machine}.",
        "",
        "Versions: " + "; ".join(versions) + ".",
        "",
        f"Final-epoch test accuracy on the 10,000 test images; bound: each keras-preact mean within "
        f"{BOUND_POINTS} points of the reference's.",
        "",
        "| trainer | seeds | test accuracy per seed | mean +- std | gap to reference (points) | within bound |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in table.items():
        per_seed = ", ".join(f"{100 * a:.2f}" for a in row["test_accuracy"])
        gap = "-" if name == REFERENCE else f"{row['gap_points']:+.2f}"
        within = "-" if name == REFERENCE else ("yes" if row["within_bound"] else "**no**")
        lines.append(f"| {name} | {', '.join(map(str, row['seeds']))} | {per_seed} | "
                     f"{100 * row['mean']:.2f} +- {100 * row['std']:.2f} | {gap} | {within} |")
    return "\n".join(lines) + "\n"


def plot(results, png):
    """Every run's curves (``compare_runs.plot``): one colour per trainer, one line style per seed."""
    runs, styles = {}, {}
    for colour, (name, by_seed) in enumerate(results.items()):
        for k, seed in enumerate(sorted(by_seed)):
            label = f"{name} seed {seed}"
            runs[label] = by_seed[seed]["history"]
            styles[label] = dict(color=f"C{colour}", linestyle=("-", "--", ":", "-.")[k % 4], marker="o", ms=2)
    return compare_runs.plot(runs, png, styles)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True, help="the CIFAR-10 image folder (train/, test/)")
    p.add_argument("--python", default=sys.executable, help="interpreter with TensorFlow (default: this one)")
    p.add_argument("--notf-python", default=None, help="interpreter of a TensorFlow-free environment (JAX, torch)")
    p.add_argument("--backends", nargs="+", default=["tensorflow", "jax"], choices=["tensorflow", "jax", "torch"],
                   help="keras-preact backends compared with the reference")
    p.add_argument("--epochs", type=int, default=10, help="full epochs per run (the issue asks for 10-15)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="one run per seed and trainer")
    p.add_argument("--depth", type=int, default=20, help="pre-act ResNet depth of every trainer (6n+2)")
    p.add_argument("--image-size", type=int, nargs=2, default=[32, 32], metavar=("H", "W"),
                   help="the folder's image size (keras-preact-train's --image-size)")
    p.add_argument("--out", default="reproduction/cifar10-parity-resnet20", help="where the evidence goes")
    args = p.parse_args(argv)
    if args.epochs < 1:
        p.error(f"--epochs must be >= 1, got {args.epochs}")
    if args.depth < 8 or (args.depth - 2) % 6:
        p.error(f"--depth must be 6n+2 (8, 14, 20, 32, ...), got {args.depth}")
    if min(args.image_size) < 1:
        p.error(f"--image-size must be positive, got {args.image_size}")
    if len(set(args.seeds)) != len(args.seeds):
        p.error(f"--seeds must be distinct, got {args.seeds}")
    if not (pathlib.Path(args.data_dir) / "train").is_dir():
        p.error(f"--data-dir {args.data_dir} has no train/ folder")
    for backend in args.backends:
        python = args.python if backend == "tensorflow" else (args.notf_python or args.python)
        if not speed.available(python, backend):
            p.error(f"--backends {backend}: {backend} is not installed in {python} (see --python/--notf-python)")
    if not speed.available(args.notf_python or args.python, "torch"):
        p.error("the PyTorch reference needs torch: pass --notf-python with a torch environment")
    return args


def main(argv=None):
    args = parse_args(argv)
    out = pathlib.Path(args.out)
    run_dir = out / "runs"
    run_dir.mkdir(parents=True, exist_ok=True)
    machine = speed.describe_machine(args)
    versions = [f"{python}: " + ", ".join(v for v in speed.versions(python) if v)
                for python in dict.fromkeys([args.python, args.notf_python]) if python]
    print("machine:", machine, flush=True)
    runs = [(seed, name, spec) for seed in args.seeds for name, spec in commands(args, seed, run_dir).items()]
    if any(finished(name, seed, run_dir, out) is None for seed, name, _ in runs):
        speed.prepare(args)  # decode and cache the JPEGs once, outside every run
    results = {}
    for seed, name, (python, argv_) in runs:
        results.setdefault(name, {})[seed] = run(name, seed, python, argv_, run_dir, out)
    table = summarize(results)
    write_text(out / "parity.md", markdown(args, table, machine, versions))
    write_json(out / "parity.json", {"epochs": args.epochs, "bound_points": BOUND_POINTS, "machine": machine,
                                     "versions": versions, "table": table})
    plot(results, out / "parity_curves.png")
    print((out / "parity.md").read_text())
    if not all(row["within_bound"] for row in table.values()):
        raise SystemExit(f"parity: a keras-preact mean is more than {BOUND_POINTS} points from the reference's")


if __name__ == "__main__":
    main()
