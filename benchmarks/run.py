"""The benchmark suite's one entry point: run the standing benchmarks by name and write their rows.

    python -m benchmarks list
    python -m benchmarks run host_cost --backends jax torch --rounds 3 --out bench.jsonl
    python -m benchmarks run training --data-dir /tmp/cifar10-jpeg --python python \\
        --notf-python .venv-notf/bin/python --out bench.jsonl      # the whole training table
    python -m benchmarks render bench.jsonl                         # the rows as a markdown table

BENCHMARKS.md's training table is ``python -m benchmarks render benchmarks/results.jsonl``, the committed rows.

Every benchmark writes rows in one format (``benchmarks/rows.py``: figure, unit, the reference's figure and the
ratio when side by side, the exact command, machine, backend, versions and date) to ``--out`` (JSON lines; the
rows are also printed as the markdown table). The side-by-side benchmarks alternate rounds with their reference
(``--vs``; ``none`` drops it) in one run and report medians.

The training table (``host_cost``, ``step``, ``eval``, ``epoch``; ``training`` runs all four) is measured here
(``benchmarks/training_table.py``). The other benchmarks are scripts with their own options (after ``--``); the
runner runs each as its own process and reads its figures from the table, lines or JSON it prints.
"""

import argparse
import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

from benchmarks import rows as rows_lib
from benchmarks import training_table

REPO = pathlib.Path(__file__).resolve().parents[1]
TRAINING = ("host_cost", "step", "eval", "epoch")
NUMBER = re.compile(r"-?[\d,]*\.?\d+(?:e[-+]?\d+)?")


@dataclasses.dataclass(frozen=True)
class Script:
    """A benchmark script run as ``python -m benchmarks.<module> ARGS``; its figures are read from its output:
    the first markdown table with a column whose header holds ``column`` (``table``), lines matching ``pattern``
    with groups ``figure`` and (optional) ``case`` (``lines``: a line ending in ":" heads the lines below it; with
    ``head``, the text before a line's first ": " heads that line), or JSON lines with the key ``column`` (``json``)."""

    module: str
    question: str
    unit: str
    column: str = ""
    read: str = "table"
    pattern: str = ""
    head: bool = False
    better: str = "higher"
    tiny: tuple = ()


SCRIPTS = {
    "core_speed": Script("core_speed", "forward and training speed against the same network in plain Keras",
                         "images/s", column="ours", tiny=("--tiny",)),
    "export_runtimes": Script("export_runtimes", "inference speed of each export format", "images/s",
                              column="img/s"),
    "int8_profile": Script("int8_profile", "where float and int8 models' time goes in ONNX Runtime and OpenVINO",
                           "ms per call", column="ms per call", better="lower"),
    "input_pipeline": Script("input_pipeline_backends", "input pipeline speed per backend", "images/s",
                             column="img/s"),
    "batch_norm_kernels": Script("batch_norm_kernels", "the fused batch-normalization kernel against Keras'",
                                 "ms", read="lines", pattern=r"(?P<case>[^,(]+?) (?P<figure>[\d.]+) \(", head=True,
                                 better="lower"),
    "conv_kernels": Script("conv_kernels", "the library's Conv2D against Keras' on PyTorch", "ms", read="lines",
                           pattern=r"^\s+(?P<case>\S+)\s+(?P<figure>[\d.]+) ms", better="lower"),
    "profile_train_step": Script("profile_train_step", "where one training step's time goes (PyTorch operators)",
                                 "ms/step", column="ours", better="lower"),
    "remat_memory": Script("remat_memory", "peak memory of keras-preact-train per rematerialisation policy", "GiB",
                           column="peak_rss_gib", read="json", better="lower"),
    "health_overhead": Script("analysis_health_overhead", "the health callback's cost per step", "ms/step",
                              column="ms/step", better="lower"),
    "gradient_flow": Script("analysis_gradient_flow", "signal and gradient ratios through depth at initialisation",
                            "ratio", column="‖x_L‖/‖x_1‖"),
    "serving": Script("serving_benchmark", "the server's throughput per model, path and batch", "images/s",
                      column="images/s"),
    "serving_batching": Script("serving_batching", "the server's throughput with and without batching",
                               "images/s", column="images/s"),
    "serving_connections": Script("serving_connections", "idle and slowloris connections the server holds",
                                  "KiB/connection", column="KiB per connection", better="lower"),
    "serving_ray": Script("serving_ray", "throughput of the Ray Serve deployment", "images/s", column="images/s"),
    "tf_onednn": Script("tf_onednn", "TensorFlow's oneDNN kernels off and on (TF_ENABLE_ONEDNN_OPTS=0/1)", "ms/step",
                        column="train_ms", read="json", better="lower"),
    "jax_xla_flags": Script("jax_xla_flags", "XLA's CPU options (XLA_FLAGS) for Keras on JAX: step and evaluation",
                            "ms", column="ms", read="json", better="lower"),
    "served_accuracy": Script("served_accuracy", "the served model's test accuracy per export format", "% top-1",
                              read="lines", pattern=r"^top-1 (?P<figure>[\d.]+)%", head=True),
}
NAMES = (*TRAINING, *SCRIPTS)


def table_rows(text, column):
    """[(case, figure)] from the first markdown table in ``text`` with a header cell holding ``column``."""
    lines = [line.strip() for line in text.splitlines()]
    for i, line in enumerate(lines[:-1]):
        if not (line.startswith("|") and lines[i + 1].startswith("|---")):
            continue
        header = [c.strip() for c in line.strip("|").split("|")]
        index = next((k for k, h in enumerate(header) if column in h), None)
        if index is None:
            continue
        found = []
        for body in lines[i + 2:]:
            if not body.startswith("|"):
                break
            cells = [c.strip() for c in body.strip("|").split("|")]
            value = NUMBER.search(cells[index]) if index < len(cells) else None
            if value:
                case = ", ".join(c for k, c in enumerate(cells) if k != index and k < 3)
                found.append((case, float(value.group().replace(",", ""))))
        return found
    return []


def script_rows(spec, text):
    """[(case, figure)] from a script's output as its ``Script`` says."""
    if spec.read == "table":
        return table_rows(text, spec.column)
    found, section = [], ""
    for line in text.splitlines():
        if spec.read == "lines":
            if line.rstrip().endswith(":"):
                section = line.strip()[:-1]
                continue
            head, _, rest = line.partition(": ") if spec.head else ("", "", line)
            for m in re.finditer(spec.pattern, rest if spec.head else line):
                case = ", ".join(x.strip() for x in (section, head, m.groupdict().get("case") or "") if x.strip())
                found.append((case, float(m.group("figure"))))
        elif line.startswith("{"):
            record = json.loads(line)
            if isinstance(record.get(spec.column), (int, float)):
                case = ", ".join(
                    f"{k} {v}" for k, v in record.items() if k != spec.column and isinstance(v, (str, int))
                )
                found.append((case, float(record[spec.column])))
    return found


def run_script(name, args, extra):
    spec = SCRIPTS[name]
    argv = [args.python, "-m", f"benchmarks.{spec.module}", *(spec.tiny if args.tiny else ()), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    found = script_rows(spec, done.stdout)
    if not found:
        raise RuntimeError(f"{name} printed no figures:\n{done.stdout[-2000:]}")
    backend = os.environ.get("KERAS_BACKEND", "default")
    return [rows_lib.row(name, case, spec.unit, rows_lib.compare([figure], better=spec.better), backend=backend)
            for case, figure in found]


def run_training(name, args):
    pythons = {
        "tensorflow": args.python,
        "jax": args.notf_python or args.python,
        "torch": args.notf_python or args.python,
    }
    made, found = [], []
    named = [b for b in args.backends if b != "fastest"]  # fastest is a whole run's choice: epoch only
    if name == "epoch":
        if args.data_dir is None:
            raise SystemExit("epoch needs --data-dir, the CIFAR-10 image folder (train/, test/)")
        found = training_table.epoch(args.backends, pythons, args.rounds, args.epochs, args.steps_per_epoch,
                                     args.data_dir, depth=args.depth, image_size=(args.image_size,) * 2)
    elif named:
        unit = "ms/step" if name != "eval" else "ms/batch"
        spes = args.steps_per_execution if name == "host_cost" else (1,)
        steps = args.host_steps if name == "host_cost" else args.steps
        found = [
            (case, backend, ours, ref, unit, "lower", versions, label)
            for case, backend, ours, ref, versions, label in training_table.in_process(
                name, named, pythons, args.rounds, steps, spes
            )
        ]
    for case, backend, ours, reference, unit, better, versions, label in found:
        reference = reference if args.vs == "torch" else None
        figures = rows_lib.compare(ours, reference, better=better)
        made.append(rows_lib.row(name, case, unit, figures, backend=backend, versions=versions,
                                 reference=label if reference else None))
    return made


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the benchmarks and the question each answers")
    render = sub.add_parser("render", help="the markdown table of a rows file")
    render.add_argument("rows", type=pathlib.Path)
    run = sub.add_parser("run", help="run benchmarks and write their rows")
    run.add_argument("names", nargs="+", help=f"benchmark names, 'training' ({', '.join(TRAINING)}) or 'all'")
    run.add_argument("--vs", choices=("torch", "none"), default="torch",
                     help="the reference the training table runs beside ours (default: plain PyTorch)")
    run.add_argument("--rounds", type=int, default=3, help="alternating rounds (the median is reported)")
    run.add_argument("--out", type=pathlib.Path, default=None, help="append the rows to this JSON-lines file")
    run.add_argument("--backends", nargs="+", default=["tensorflow", "jax", "torch"],
                     choices=("tensorflow", "jax", "torch", "fastest"),
                     help="fastest (epoch only): keras-preact-train --backend fastest, the README's main command")
    run.add_argument("--python", default=sys.executable, help="interpreter for TensorFlow (default: this one)")
    run.add_argument("--notf-python", default=None, help="interpreter for JAX, PyTorch and the reference")
    run.add_argument("--steps", type=int, default=20, help="steps (batches) per round: step, eval")
    run.add_argument("--host-steps", type=int, default=200,
                     help="host_cost: steps of one fit per round (enough that fit's own set-up is a small share)")
    run.add_argument("--steps-per-execution", type=int, nargs="+", default=[1, 10], help="host_cost's")
    run.add_argument("--data-dir", default=None, help="epoch: the CIFAR-10 image folder")
    run.add_argument("--epochs", type=int, default=2, help="epoch: epochs per run (the first is not counted)")
    run.add_argument("--steps-per-epoch", type=int, default=100)
    run.add_argument("--depth", type=int, default=20)
    run.add_argument("--image-size", type=int, default=32)
    run.add_argument("--tiny", action="store_true", help="scripts: their smallest settings, where they have them")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = p.parse_args(argv[:len(argv) - len(extra) - (1 if "--" in argv else 0)])
    args.extra = extra
    if args.action == "run":
        names = [n for x in args.names for n in (NAMES if x == "all" else TRAINING if x == "training" else [x])]
        unknown = [n for n in names if n not in NAMES]
        if unknown:
            p.error(f"unknown benchmark {', '.join(unknown)}; allowed: all, training, {', '.join(NAMES)}")
        for flag in ("rounds", "steps", "host_steps", "epochs", "steps_per_epoch"):
            if getattr(args, flag) < 1:
                p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
        bad = [s for s in args.steps_per_execution if s < 1 or args.host_steps % s]
        if bad:
            p.error(f"--steps-per-execution must divide --host-steps ({args.host_steps}), got {bad}")
        args.names = list(dict.fromkeys(names))
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.action == "list":
        for name in TRAINING:
            print(f"{name:20s} training table: {name} beside plain PyTorch")
        for name, spec in SCRIPTS.items():
            print(f"{name:20s} {spec.question} (benchmarks/{spec.module}.py)")
        print(
            f"{'(GPU session)':20s} bash benchmarks/gpu/run.sh: "
            "the throughput table and paper run on a GPU (benchmarks/gpu/README.md)"
        )
        return 0
    if args.action == "render":
        print(rows_lib.render(rows_lib.read(args.rows)), end="")
        return 0
    made = []
    for name in args.names:
        new = run_training(name, args) if name in TRAINING else run_script(name, args, args.extra)
        if args.out:
            rows_lib.append(args.out, new)
        made += new
    print(rows_lib.render(made), end="")
    return 0
