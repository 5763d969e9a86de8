"""Peak memory and step time of ``keras-preact-train --remat`` policies, side by side in one run.

Each policy trains in its own process, the real entry point (``python -m keras_preact_training.cli``) under
``/usr/bin/time -v``, on built-in synthetic data (no input pipeline cost): ``--epochs`` epochs of
``--steps-per-epoch`` steps at ``--batch-size``, no export. Reported per policy: peak RSS (``Maximum
resident set size``), the last epoch's seconds per step (``history.csv`` ``train_seconds``; with one
epoch it holds the graph tracing and compilation too), wall time, and both as ratios to the policy
without remat (``none``). A process that dies is reported with its exit status and the last line it
printed (an out-of-memory error or the kernel's kill):

    PYTHONPATH=. python benchmarks/remat_memory.py --preset t3-cifar10-resnet164-preact --batch-size 64 \\
        --policies none units segments:4 segments:8 stages --out reproduction/remat-memory/resnet164-batch64
    PYTHONPATH=. python benchmarks/remat_memory.py --preset t3-cifar10-resnet1001-preact --batch-size 128 \\
        --epochs 1 --steps-per-epoch 3 --policies segments:18 --out reproduction/remat-memory/resnet1001-batch128
"""

import argparse
import csv
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
RSS = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")


def run_policy(policy, args, work, batch_size=None):
    """One process of keras-preact-train; ``batch_size`` 1 with policy "none" is the baseline row."""
    batch_size = batch_size or args.batch_size
    run_dir = pathlib.Path(work) / f"{policy.replace(':', '-')}-batch{batch_size}"
    command = [sys.executable, "-m", "keras_preact_training.cli", "--preset", args.preset, "--backend", args.backend,
               "--dataset", "synthetic", "--synthetic-train-size", str(batch_size * args.steps_per_epoch),
               "--synthetic-test-size", str(batch_size), "--batch-size", str(batch_size),
               "--epochs", str(args.epochs), "--no-export", "--run-dir", str(run_dir)]
    if policy != "none":
        command += ["--remat", policy]
    if args.jit_compile:
        command += ["--jit-compile", args.jit_compile]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    start = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-v", *command], capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - start
    rss = RSS.search(done.stderr)
    row = {"policy": policy, "batch_size": batch_size, "exit_status": done.returncode, "wall_seconds": round(wall, 1),
           "peak_rss_gib": round(int(rss.group(1)) / 2**20, 3) if rss else None,
           "command": " ".join(command[1:])}
    history = run_dir / "history.csv"
    if done.returncode == 0 and history.exists():
        last = list(csv.DictReader(history.open()))[-1]
        row["seconds_per_step"] = round(float(last["train_seconds"]) / args.steps_per_epoch, 2)
    else:
        lines = [line for line in (done.stdout + "\n" + done.stderr).splitlines()  # /usr/bin/time's own lines out
                 if line.strip() and not line.startswith(("\t", "Command exited", "Command terminated"))]
        row["failure"] = lines[-1] if lines else "no output"
    return row


def ratio(row, base, key):
    """``row[key]`` over the no-remat run's, or "-" where either is missing."""
    return f"{row[key] / base[key]:.2f}x" if base and row.get(key) and base.get(key) else "-"


def table(rows):
    """Markdown: per policy, peak RSS, the step's memory (peak RSS less the batch-1 baseline's: the Python
    process, TensorFlow/JAX, the graph and weights, which no policy changes), s/step, each over none's."""
    base = next((row for row in rows if row["policy"] == "none" and row["exit_status"] == 0
                 and row.get("batch_size") != 1), None)
    floor = next((row for row in rows if row.get("batch_size") == 1 and row["exit_status"] == 0), None)
    for row in rows:
        if floor and row["exit_status"] == 0 and row is not floor:
            row["step_memory_gib"] = round(row["peak_rss_gib"] - floor["peak_rss_gib"], 3)
    lines = ["| --remat | batch | peak RSS (GiB) | x none | step memory (GiB) | x none | s/step | x none | wall (s) "
             "| status |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        ok = row["exit_status"] == 0
        baseline = row is floor
        cells = [row["policy"] + (" (baseline)" if baseline else ""), row.get("batch_size", "-"),
                 row["peak_rss_gib"], ratio(row, base, "peak_rss_gib") if ok and not baseline else "-",
                 row.get("step_memory_gib", "-"), ratio(row, base, "step_memory_gib"),
                 row.get("seconds_per_step", "-"), ratio(row, base, "seconds_per_step") if not baseline else "-",
                 row["wall_seconds"],
                 "ok" if ok else f"exit {row['exit_status']}: {row['failure']}"]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", required=True)
    parser.add_argument("--backend", default="tensorflow", choices=["tensorflow", "jax", "torch"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=3)
    parser.add_argument("--jit-compile", choices=["auto", "true", "false"],
                        help="keras-preact-train's --jit-compile (default: its own)")
    parser.add_argument("--policies", nargs="+", default=["none", "units", "segments:4", "stages"])
    parser.add_argument("--baseline", action="store_true",
                        help="first run no remat at batch 1: the memory no policy changes (step memory = peak - it)")
    parser.add_argument("--out", type=pathlib.Path, help="write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    for name, value in (("--batch-size", args.batch_size), ("--epochs", args.epochs),
                        ("--steps-per-epoch", args.steps_per_epoch)):
        if value < 1:
            parser.error(f"{name} must be a positive integer, got {value}")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        if args.baseline:
            rows.append(run_policy("none", args, work, batch_size=1))
            print(json.dumps(rows[-1]), flush=True)
        for policy in args.policies:
            rows.append(run_policy(policy, args, work))
            print(json.dumps(rows[-1]), flush=True)
    text = (f"{args.preset}, batch {args.batch_size}, {args.epochs} epoch(s) x {args.steps_per_epoch} steps, "
            f"{args.backend}{f', --jit-compile {args.jit_compile}' if args.jit_compile else ''}; "
            f"{platform.machine()}, {os.cpu_count()} cores; load average at the end "
            f"{os.getloadavg()[0]:.2f}\n\n{table(rows)}\n")
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for suffix, content in ((".json", json.dumps(rows, indent=1)), (".md", text)):
            temporary = args.out.with_name(args.out.name + suffix + ".tmp")
            temporary.write_text(content)
            temporary.replace(args.out.with_name(args.out.name + suffix))
    return 0


if __name__ == "__main__":
    sys.exit(main())
