"""The whole training loop, side by side: ``keras-preact-train`` on each backend against plain PyTorch.

Every candidate is one process running the real entry point on the same real data (the CIFAR-10 JPEG
folder), the same network (pre-act ResNet-20, option A), the same recipe (preset
``cifar10-folder-resnet20-short``: batch 128, TorchSGD / torch.optim.SGD, cosine with warm-up, pad-4
crop + flip) and the same run length (``--epochs`` x ``--steps-per-epoch``, then the full 10,000-image
test set after every epoch):

- ``keras-preact-train`` with ``--backend`` tensorflow, jax, torch (and ``fastest``, the README's main command:
  measured, then the fastest, with the default pipeline), and each of its ``--pipeline``s;
- ``benchmarks/reference_torch_cifar.py`` (plain PyTorch, eager; ``--compile`` adds torch.compile).

Rounds run the candidates in rotating order, so drift of a shared machine cancels in the per-round ratios.
From each run's ``history.csv`` (``train_seconds`` and ``eval_seconds`` per epoch) it takes the steady
state: epoch 1 is excluded (compilation, tracing, the first step's set-up); the decoded images are
cached before the first round (the first decoding of the JPEGs is excluded). It prints training and
evaluation images/s per candidate (median, min-max over rounds) and the median of per-round ratios to
the PyTorch reference.

``--to-accuracy 0.85``: full epochs instead (``--epochs`` of the whole training set), one run each, and
the seconds from the first step to the end of the first epoch whose test accuracy reaches the target
(evaluation included, process start-up excluded); each run is stopped once its history has that epoch.

``--depth`` and ``--image-size`` (defaults 20 and 32 32, the benchmark's) set the network and the image size of
every candidate, for a small check of the tool itself (tests: ResNet-8 on 16x16 images); the folder's images
must have that size.

Two environments: ``--python`` runs the TensorFlow candidates, ``--notf-python`` (a TensorFlow-free
virtual environment, e.g. ``.venv-notf/bin/python``) the JAX, PyTorch and reference ones; with one
interpreter, candidates whose backend is missing are skipped with a note.

``--normalizations keras fused``: each ``keras-preact-train`` candidate with Keras' own
``BatchNormalization`` (the library before the fused layers; name suffix ``/keras-bn``) and with the library's
(the backend's fused training kernel, the default).

``--steps-only``: no data and no training loop: per backend one process alternating, round by round,
a ``train_on_batch`` step of the same compiled model (``benchmarks/profile_train_step.py``'s: the short
CIFAR preset, batch 128, random images) with each normalization and, where torch is installed in that
environment, the plain PyTorch reference's step (channels_last, ``nn.BatchNorm2d``); ms per step
(median, min-max over rounds) and the median of the per-round ratios to the reference in the same
process (TensorFlow's environment has no torch: its ratio is to the reference's median in the other).

    python benchmarks/train_speed_vs_pytorch.py --data-dir /tmp/cifar10-jpeg --notf-python .venv-notf/bin/python
    python benchmarks/train_speed_vs_pytorch.py --steps-only --normalizations keras fused \
        --backends tensorflow jax torch --notf-python .venv-notf/bin/python --rounds 5 --steps 3
"""

import argparse
import csv
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
PRESET = "cifar10-folder-resnet20-short"
REFERENCE = "reference-torch"


def candidates(args):
    """{name: (interpreter key, argv after the interpreter, extra environment)}."""
    found = {}
    for backend in args.backends:
        pipelines = args.pipelines if backend != "fastest" else ["auto"]
        for pipeline in pipelines:
            if backend == "tensorflow" and pipeline != "auto" and pipeline not in ("tf_data", "device", "numpy"):
                continue
            if backend in ("jax", "torch") and pipeline == "tf_data":
                continue  # tf.data needs TensorFlow: not in the TensorFlow-free environment
            for normalization in args.normalizations:
                if normalization == "keras" and backend == "fastest":
                    continue  # Keras' layer is put in before Keras loads, with the backend named
                name = f"keras-preact-train/{backend}/{pipeline}" + ("/keras-bn" if normalization == "keras" else "")
                entry = (
                    ["-c", keras_bn_entry(backend)] if normalization == "keras" else ["-m", "keras_preact_training.cli"]
                )
                argv = [*entry, "--preset", PRESET, "--data-dir", args.data_dir, "--verbose", "0",
                        "--depth", str(args.depth), "--image-size", *map(str, args.image_size),
                        "--pipeline", pipeline, "--backend", backend, *args.train_args]
                found[name] = ("tf" if backend in ("tensorflow", "fastest") else "notf", argv, {})
    reference = [str(REPO / "benchmarks" / "reference_torch_cifar.py"), "--data-dir", args.data_dir,
                 "--depth", str(args.depth)]
    found[REFERENCE] = ("notf", reference, {})
    if args.torch_compile:
        found[REFERENCE + "-compile"] = ("notf", [*reference, "--compile"], {})
    return found


def keras_bn_entry(backend):
    """``python -c`` code running ``keras-preact-train`` with Keras' own BatchNormalization as "batch"."""
    return (f"import os, runpy; os.environ['KERAS_BACKEND'] = {backend!r}; "
            "from benchmarks.profile_train_step import use_normalization; use_normalization('keras'); "
            "runpy.run_module('keras_preact_training.cli', run_name='__main__', alter_sys=True)")


def step_child(args):
    """In this process (KERAS_BACKEND set): rounds of ``--steps`` train steps per candidate; one JSON line."""
    import importlib.util

    import keras

    from benchmarks.profile_train_step import build_step_model, reference_step

    steps = {}
    for normalization in args.normalizations:
        for convolution in args.convolutions:
            model, x, y = build_step_model(normalization, convolution)
            name = normalization if args.convolutions == ["fast"] else f"{normalization}/{convolution}-conv"
            steps[name] = lambda model=model, x=x, y=y: model.train_on_batch(x, y)
    if importlib.util.find_spec("torch") is not None:
        steps[REFERENCE] = reference_step()
    times = {name: [] for name in steps}
    for step in steps.values():
        for _ in range(2):  # warm-up (compilation, tracing) beyond build_step_model's
            step()
    order = list(steps)
    for r in range(args.rounds):
        for name in order[r % len(order):] + order[: r % len(order)]:
            start = time.perf_counter()
            for _ in range(args.steps):
                steps[name]()
            times[name].append(1000 * (time.perf_counter() - start) / args.steps)
    print("STEP-FIGURES " + json.dumps({"backend": keras.backend.backend(), "times": times}), flush=True)


def steps_only(args):
    figures = {}
    for backend in [b for b in args.backends if b != "fastest"]:
        python = args.python if backend == "tensorflow" or not args.notf_python else args.notf_python
        module = backend
        if not available(python, module):
            print(f"[skip] {backend}: not installed in {python}")
            continue
        env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": backend}
        argv = [python, str(pathlib.Path(__file__).resolve()), "--step-child", "--rounds", str(args.rounds),
                "--steps", str(args.steps), "--normalizations", *args.normalizations,
                "--convolutions", *args.convolutions]
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("STEP-FIGURES ")]
        if done.returncode != 0 or not lines:
            raise SystemExit(f"{backend} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        figures[backend] = json.loads(lines[0].split(" ", 1)[1])["times"]
        print(f"{backend}: " + ", ".join(f"{n} {statistics.median(t):.0f} ms" for n, t in figures[backend].items()),
              flush=True)
    references = [t for times in figures.values() for t in times.get(REFERENCE, [])]
    print(f"\ntrain_on_batch, batch 128, ms per step: median (min-max) of {args.rounds} rounds of {args.steps} "
          "steps, candidates alternating in one process per backend.\n")
    print("| backend | normalization | ms/step | vs plain PyTorch, median of per-round ratios (min-max) |")
    print("|---|---|---|---|")
    summary = {}
    for backend, times in figures.items():
        for name, t in times.items():
            if name == REFERENCE:
                ratios, where = [1.0], ""
            elif REFERENCE in times:
                ratios, where = [g / f for f, g in zip(t, times[REFERENCE])], ""
            else:
                ratios = [statistics.median(references) / f for f in t]
                where = " (reference in another process)"
            summary[f"{backend}/{name}"] = {"ms": t, "ratio": ratios}
            label = "plain PyTorch reference" if name == REFERENCE else name
            print(f"| {backend} | {label} | {statistics.median(t):.0f} ({min(t):.0f}-{max(t):.0f}) | "
                  f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}){where} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(summary, indent=2))


def interpreter(args, key):
    return args.python if key == "tf" or not args.notf_python else args.notf_python


def available(python, module):
    probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


def reached(history, target):
    """Whether a run's history.csv (as written so far) has an epoch at ``target`` test accuracy."""
    try:
        with open(history) as f:
            return any(float(r["val_accuracy"]) >= target for r in csv.DictReader(f) if r.get("val_accuracy"))
    except (OSError, ValueError, KeyError):
        return False


def keep_files(src, dst, names=("history.csv", "metrics.json")):
    """Copy a run's small files that exist from ``src`` to ``dst`` (created)."""
    dst.mkdir(parents=True, exist_ok=True)
    for small in names:
        if (src / small).exists():
            shutil.copyfile(src / small, dst / small)


def run_one(args, name, spec, out_dir, length, stop_at=None):
    """One candidate as a process; with ``stop_at``, it is stopped once an epoch reaches that accuracy."""
    key, argv, env_extra = spec
    python = interpreter(args, key)
    out = out_dir / name.replace("/", "_")
    shutil.rmtree(out, ignore_errors=True)
    where = ["--run-dir", str(out)] if name.startswith("keras-preact-train") else ["--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3", **env_extra}
    env.pop("KERAS_BACKEND", None)  # each candidate names its backend (--backend)
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([python, *argv, *where, *length], cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, text=True)
        stopped = False
        if stop_at is None:
            proc.wait()
        while proc.poll() is None:
            time.sleep(5)
            if reached(out / "history.csv", stop_at):
                proc.terminate()  # the target is in the history: the remaining epochs would not count
                proc.wait()
                stopped = True
        wall = time.perf_counter() - started
        log.seek(0)
        output = log.read()
    if proc.returncode != 0 and not stopped:
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise SystemExit(f"{name} failed (exit {proc.returncode}):\n{tail}")
    with open(out / "history.csv") as f:
        rows = list(csv.DictReader(f))
    if args.keep:
        keep_files(out, pathlib.Path(args.keep) / out.name)
    chosen = [line for line in output.splitlines() if line.startswith("[backend]")]
    return {"rows": rows, "wall": wall, "backend_line": chosen[0] if chosen else ""}


def count_images(split_dir):
    return sum(1 for f in pathlib.Path(split_dir).rglob("*") if f.suffix.lower() in (".jpg", ".jpeg", ".png"))


def steady(result, steps, batch, test_images):
    """Training and evaluation images/s over every epoch but the first."""
    rows = result["rows"][1:] or result["rows"]
    train = sum(float(r["train_seconds"]) for r in rows)
    evaluation = sum(float(r["eval_seconds"]) for r in rows)
    return {"train": len(rows) * steps * batch / train, "eval": len(rows) * test_images / evaluation}


def seconds_to_accuracy(result, target):
    elapsed = 0.0
    for row in result["rows"]:
        elapsed += float(row["train_seconds"]) + float(row["eval_seconds"])
        if float(row["val_accuracy"]) >= target:
            return elapsed, int(row["epoch"]) + 1, float(row["val_accuracy"])
    return None, len(result["rows"]), max(float(r["val_accuracy"]) for r in result["rows"])


def prepare(args):
    """Decode and cache the JPEGs once for both trainers, outside the timed runs."""
    # Any installed backend decodes (the CLI's own choice); the cache is shared by both environments.
    code = ("from keras_preact_training.machine import backends; backends.select(); "
            f"from keras_preact_training.data import sources; sources.folder({args.data_dir!r})")
    subprocess.run([interpreter(args, "notf"), "-c", code], cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    ref = REPO / "benchmarks" / "reference_torch_cifar.py"
    subprocess.run([interpreter(args, "notf"), str(ref), "--data-dir", args.data_dir, "--prepare-only"], check=True)


def describe_machine(args):
    load = os.getloadavg()
    return (f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores visible, "
            f"load average {load[0]:.2f} at start; python {platform.python_version()}; "
            f"interpreters: {args.python}" + (f", {args.notf_python}" if args.notf_python else ""))


def versions(python):
    code = ("import importlib.metadata as m\n"
            "for p in ('keras', 'tensorflow', 'jax', 'torch'):\n"
            "    try: print(p, m.version(p))\n"
            "    except m.PackageNotFoundError: pass")
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.split("\n")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=None, help="the CIFAR-10 image folder (train/, test/)")
    p.add_argument("--python", default=sys.executable, help="interpreter with TensorFlow (default: this one)")
    p.add_argument("--notf-python", default=None, help="interpreter of a TensorFlow-free environment")
    p.add_argument("--backends", nargs="+", default=["fastest", "tensorflow", "jax", "torch"],
                   choices=["fastest", "tensorflow", "jax", "torch"])
    p.add_argument("--pipelines", nargs="+", default=["tf_data", "device", "numpy"],
                   choices=["tf_data", "device", "numpy"])
    p.add_argument("--convolutions", nargs="+", default=["fast"], choices=["fast", "keras"],
                   help="--steps-only: Conv2D as the library's (fast: no layout copies on PyTorch, the default) "
                        "and/or Keras' own (keras: the library before it)")
    p.add_argument("--normalizations", nargs="+", default=["fused"], choices=["fused", "keras"],
                   help="normalization='batch' as the library's BatchNormalization (fused, the default) and/or "
                        "Keras' own (keras: the library before the fused layers)")
    p.add_argument("--steps-only", action="store_true",
                   help="in-process train_on_batch steps per backend instead of whole training runs (no data)")
    p.add_argument("--steps", type=int, default=3, help="--steps-only: steps per candidate per round")
    p.add_argument("--step-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--torch-compile", action="store_true", help="also the reference under torch.compile")
    p.add_argument("--depth", type=int, default=20, help="pre-act ResNet depth of every candidate (6n+2)")
    p.add_argument("--image-size", type=int, nargs=2, default=[32, 32], metavar=("H", "W"),
                   help="the folder's image size (keras-preact-train's --image-size)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3, help="epochs per run (the first is not counted)")
    p.add_argument("--steps-per-epoch", type=int, default=60)
    p.add_argument("--to-accuracy", type=float, default=None, metavar="ACC",
                   help="time to this test accuracy with full epochs (one run each, --epochs of them)")
    p.add_argument("--train-args", nargs=argparse.REMAINDER, default=[],
                   help="extra keras-preact-train flags, last on the line (e.g. --train-args --seed 1)")
    p.add_argument("--json", default=None, help="also write every figure here")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="copy every run's history.csv and metrics.json to DIR/<candidate>/ (the last round's)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.epochs < 1 or args.steps_per_epoch < 1:
        p.error("--rounds, --epochs and --steps-per-epoch must be >= 1")
    if args.depth < 8 or (args.depth - 2) % 6:
        p.error(f"--depth must be 6n+2 (8, 14, 20, 32, ...), got {args.depth}")
    if min(args.image_size) < 1:
        p.error(f"--image-size must be positive, got {args.image_size}")
    if args.to_accuracy is not None and not 0 < args.to_accuracy < 1:
        p.error(f"--to-accuracy must be in (0, 1), got {args.to_accuracy}")
    if args.steps_only or args.step_child:
        return args
    if args.data_dir is None:
        p.error("--data-dir is required (except with --steps-only)")
    if not (pathlib.Path(args.data_dir) / "train").is_dir():
        p.error(f"--data-dir {args.data_dir} has no train/ folder")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.step_child:
        return step_child(args)
    if args.steps_only:
        print("machine:", describe_machine(args))
        return steps_only(args)
    names = candidates(args)
    for name in list(names):
        key, _, _ = names[name]
        backend = name.split("/")[1] if name.startswith("keras-preact") else "torch"
        module = {"fastest": "keras", "tensorflow": "tensorflow"}.get(backend, backend)
        if not available(interpreter(args, key), module):
            print(f"[skip] {name}: {module} is not installed in {interpreter(args, key)}")
            del names[name]
    if REFERENCE not in names:
        raise SystemExit("the PyTorch reference needs torch: pass --notf-python with a torch environment")
    print("machine:", describe_machine(args))
    for python in {args.python, args.notf_python} - {None}:
        print(f"versions ({python}):", ", ".join(v for v in versions(python) if v))
    prepare(args)
    if args.to_accuracy is not None:
        return time_to_accuracy(args, names)
    length = ["--epochs", str(args.epochs), "--steps-per-epoch", str(args.steps_per_epoch)]
    figures = {name: [] for name in names}
    test_images = count_images(pathlib.Path(args.data_dir) / "test")
    order = list(names)
    with tempfile.TemporaryDirectory(prefix="train-speed-") as tmp:
        for r in range(args.rounds):
            rotated = order[r % len(order):] + order[: r % len(order)]
            for name in rotated:
                result = run_one(args, name, names[name], pathlib.Path(tmp), length)
                figure = steady(result, args.steps_per_epoch, 128, test_images)
                figure["backend_line"] = result["backend_line"]
                figures[name].append(figure)
                print(f"round {r + 1} {name}: train {figure['train']:.1f} img/s, eval {figure['eval']:.1f} img/s "
                      f"{figure['backend_line']}", flush=True)
    report(args, figures)


def report(args, figures):
    ref = figures[REFERENCE]
    print(f"\nSteady state over epochs 2-{args.epochs} ({args.steps_per_epoch} steps of 128 each, then the "
          f"whole test split); {args.rounds} rounds, rotating order.\n")
    print("| candidate | train img/s, median (min-max) | vs reference, median of per-round ratios (min-max) "
          "| eval img/s, median | eval vs reference |")
    print("|---|---|---|---|---|")
    summary = {}
    for name, rounds in figures.items():
        train = [f["train"] for f in rounds]
        ratios = [f["train"] / g["train"] for f, g in zip(rounds, ref)]
        eval_ratios = [f["eval"] / g["eval"] for f, g in zip(rounds, ref)]
        summary[name] = {"train": train, "eval": [f["eval"] for f in rounds], "ratio": ratios,
                         "eval_ratio": eval_ratios}
        print(f"| {name} | {statistics.median(train):.1f} ({min(train):.1f}-{max(train):.1f}) | "
              f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
              f"{statistics.median(summary[name]['eval']):.1f} | {statistics.median(eval_ratios):.2f}x |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(summary, indent=2))


def time_to_accuracy(args, names):
    keep = [n for n in names if n in (REFERENCE, "keras-preact-train/fastest/auto")]
    length = ["--epochs", str(args.epochs)]
    results = {}
    with tempfile.TemporaryDirectory(prefix="train-to-accuracy-") as tmp:
        for name in keep:
            result = run_one(args, name, names[name], pathlib.Path(tmp), length, stop_at=args.to_accuracy)
            seconds, epochs, accuracy = seconds_to_accuracy(result, args.to_accuracy)
            results[name] = {"seconds": seconds, "epochs": epochs, "accuracy": accuracy,
                             "backend_line": result["backend_line"]}
            reached = f"{seconds:.0f} s (epoch {epochs}, {accuracy:.4f})" if seconds else \
                f"not reached in {epochs} epochs (best {accuracy:.4f})"
            print(f"{name}: {args.to_accuracy:.0%} test accuracy {reached} {result['backend_line']}", flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
