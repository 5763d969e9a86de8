"""Transfer experiment on the CIFAR-10 JPEG folder: pre-activation ResNet-20 (He et al. 2016) pretrained on
five classes (half A), then fine-tuned on 500 and on 2,500 labelled images of the other five (half B) against
the same network trained from scratch on the same images for the same number of steps, two seeds each.

A reproduction instrument, not product code. Steps (each skipped when its output exists, so a killed run
resumes by re-running the same command):

1. half A / half B folders of symlinks under --work-dir (nothing is copied);
2. pretraining on half A's 25,000 training images with ``keras-preact-train`` (run dir under --work-dir);
3. per seed, a class-balanced subset of half B's training images (nested: the 500 are the first 100 per class
   of the 2,500's per-class permutation), as a symlink folder whose test/ is half B's 5,000 test images;
4. per (size, method, seed) one run: ``finetune`` = the half-A network's backbone under a new 5-class head
   (head alone, then every layer at a tenth of the rate), ``scratch`` = the same architecture from random
   initialisation (one cosine schedule); both ``--steps`` steps of batch ``--batch-size``, pad-4 crop + flip;
   test top-1 on half B's 5,000 test images (curve points on the first ``--curve-test-images``);
5. results.json, results.md and curves.png in --out.

Run it with the backend in KERAS_BACKEND (the TensorFlow-free environment and torch were used here), e.g.:

    OMP_NUM_THREADS=1 KERAS_BACKEND=torch python reproduction/cifar10-transfer/run.py --data-dir /tmp/cifar10-jpeg \\
        --work-dir /tmp/transfer
"""

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HALF_A = ("airplane", "automobile", "bird", "cat", "deer")
HALF_B = ("dog", "frog", "horse", "ship", "truck")
SIZES = (500, 2500)
# The table's rows. "today": the recipe of the first table (this script's loop, below); "scratch": the same
# network from random initialisation for the default's 500 steps of batch 64 (this script's loop); the others
# run the training app's fine-tuning preset, `keras-preact-train finetune-folder` (its default: --recipe auto),
# with one lever added; "tta" evaluates the "auto" run with `keras-preact-evaluate --tta flip`.
APP_ROWS = {
    "auto": [],  # the default: LP-FT, mixup 0.1, BN frozen, 500 steps of batch 64 (training/recipe/hyperrule.py)
    "nomixup": ["--mixup", "0"],  # BiT's rule for sets under 20k images
    "ema": ["--ema-momentum", "0.99"],
    "cutmix": ["--cutmix", "1.0"],  # beside the default's mixup: one of the two per batch
    "randaugment": ["--rand-augment", "0.5"],
    "layer-decay": ["--layer-decay", "0.7"],
    "probe": ["--linear-probe"],
}
LOOP_ROWS = {"today": dict(steps=150, batch_size=128), "scratch": dict(steps=500, batch_size=64)}
METHODS = ("today", "auto", "tta", *list(APP_ROWS)[1:], "scratch")
HERE = Path(__file__).resolve().parent


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data-dir", required=True, help="CIFAR-10 JPEG folder (train/<class>/, test/<class>/)")
    p.add_argument(
        "--work-dir", required=True, help="where the symlink folders, the pretraining run and the .npy cache go"
    )
    p.add_argument("--out", default=str(HERE), help="where the per-run JSON, results.md/json and curves.png go")
    p.add_argument("--pretrain-run", default=None, help="an existing half-A run dir (default: WORK_DIR/pretrain-halfA)")
    p.add_argument("--pretrain-epochs", type=int, default=15)
    p.add_argument("--pretrain-python", default=None,
                   help="the keras-preact-train console script to pretrain with (default: the one next to this python)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--head-steps", type=int, default=30, help="today's recipe: steps with the backbone frozen")
    p.add_argument("--lr", type=float, default=0.1, help="peak rate: scratch and the head phase")
    p.add_argument("--finetune-lr", type=float, default=0.01, help="peak rate of the fine-tuning all-layers phase")
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=30, help="steps between curve points")
    p.add_argument("--curve-test-images", type=int, default=1000,
                   help="curve points use the first N test images of a fixed shuffle; the final top-1 uses all")
    p.add_argument("--summarise-only", action="store_true", help="only rebuild results.md/json and curves.png")
    args = p.parse_args(argv)
    if not 0 <= args.head_steps < LOOP_ROWS["today"]["steps"]:
        p.error(f"--head-steps={args.head_steps}: 0 <= head steps < {LOOP_ROWS['today']['steps']} is required")
    for n in args.sizes:
        if n % len(HALF_B) or n <= 0:
            p.error(f"--sizes {n}: a positive multiple of {len(HALF_B)} (class-balanced) is required")
    return args


# ------------------------------------------------------------------------------------------ folders
def link_half(data_dir, root, classes):
    """root/{train,test}/<class> -> data_dir/{split}/<class> (directory symlinks)."""
    for split in ("train", "test"):
        (root / split).mkdir(parents=True, exist_ok=True)
        for c in classes:
            src, dst = (data_dir / split / c).resolve(), root / split / c
            if not src.is_dir():
                raise SystemExit(
                    f"--data-dir {data_dir}: {split}/{c}/ is missing (a CIFAR-10 image folder is required)"
                )
            if not dst.is_symlink():
                dst.symlink_to(src, target_is_directory=True)
    return root


def subset_folder(half_b, root, n, seed):
    """A class-balanced n-image subset of half B's training images (fixed by seed), as symlinks; test/ is
    half B's whole test set. The per-class permutation is the seed's, so smaller sizes nest in larger."""
    done = root / "files.json"
    if done.exists():
        return root
    rng = np.random.default_rng(1000 + seed)
    chosen = {}
    for c in HALF_B:
        files = sorted(p.name for p in (half_b / "train" / c).iterdir())
        order = rng.permutation(len(files))
        chosen[c] = [files[i] for i in order[: n // len(HALF_B)]]
    tmp = root.with_name(root.name + ".tmp")
    subprocess.run(["rm", "-rf", str(tmp)], check=True)
    for c, names in chosen.items():
        (tmp / "train" / c).mkdir(parents=True)
        for name in names:
            (tmp / "train" / c / name).symlink_to((half_b / "train" / c / name).resolve())
    (tmp / "test").symlink_to((half_b / "test").resolve(), target_is_directory=True)
    (tmp / "files.json").write_text(json.dumps(chosen))
    tmp.rename(root)
    return root


# ------------------------------------------------------------------------------------------ pretraining
def pretrain(args, half_a, run_dir):
    """keras-preact-train on half A (resumes a killed run; skipped when model.keras exists)."""
    script = args.pretrain_python or str(Path(sys.executable).with_name("keras-preact-train"))
    cmd = [script, "--preset", "cifar10-folder-resnet20-short", "--backend", os.environ.get("KERAS_BACKEND", "torch"),
           "--data-dir", str(half_a), "--cache-dir", str(Path(args.work_dir) / "cache"), "--run-dir", str(run_dir),
           "--seed", "0", "--epochs", str(args.pretrain_epochs), "--verbose", "2"]
    if (run_dir / "model.keras").exists():
        return cmd
    print("[pretrain]", shlex.join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return cmd


# ------------------------------------------------------------------------------------------ one run
@dataclasses.dataclass
class Phase:
    name: str
    steps: int
    schedule: object


def build_finetune(run_dir, unit_options, seed):
    """The half-A classifier's backbone under a new 5-class head; ('library'|'keras', model, set_phase)."""
    import keras

    keras.utils.set_random_seed(seed)
    try:
        from keras_preact.models import create_model, set_trainable
    except ImportError:  # before the library's fine-tuning API: the same with plain Keras
        from keras_preact.models import PreActResNetClassifier

        pre = keras.saving.load_model(str(run_dir / "model.keras"), compile=False)
        model = PreActResNetClassifier(pre.backbone, len(HALF_B), input_config=pre.input_config, class_names=HALF_B)

        def set_phase(name):
            model.backbone.trainable = name != "head"

        return "plain Keras (model.keras's backbone under PreActResNetClassifier)", model, set_phase
    model = create_model("cifar_resnet20", weights=str(run_dir), num_classes=len(HALF_B), class_names=list(HALF_B),
                         **unit_options)

    def set_phase(name):
        set_trainable(model, "head" if name == "head" else "stem")

    return "library create_model(weights=run dir) + set_trainable", model, set_phase


def build_scratch(unit_options, seed):
    import keras

    from keras_preact.models import create_model

    keras.utils.set_random_seed(seed)
    model = create_model("cifar_resnet20", num_classes=len(HALF_B), class_names=list(HALF_B), **unit_options)
    return "library create_model (random init)", model, lambda name: None


def cosine(peak, steps, warmup):
    import keras

    warmup = min(warmup, steps // 2)
    return keras.optimizers.schedules.CosineDecay(peak / 10, max(steps - warmup, 1), alpha=0.0, warmup_target=peak,
                                                  warmup_steps=warmup)


def top1(wrapper, images, labels, batch=500):
    probs = wrapper.predict(images, batch_size=batch, verbose=0)
    return float(np.mean(np.argmax(probs, -1) == labels))


def one_run(args, name, method, size, seed, folder, run_dir, unit_options):
    import keras

    from keras_preact_training.data import sources
    from keras_preact_training.recipe import augment

    data = sources.folder(folder, cache_dir=Path(args.work_dir) / "cache")
    if tuple(data.class_names) != HALF_B or len(data.train_labels) != size:
        raise SystemExit(
            f"{folder}: {len(data.train_labels)} images of {data.class_names}, expected {size} of {HALF_B}"
        )
    curve_idx = np.random.default_rng(12345).permutation(len(data.test_labels))[: args.curve_test_images]
    curve_x, curve_y = data.test_images[curve_idx], data.test_labels[curve_idx]

    steps, batch_size = LOOP_ROWS[method]["steps"], LOOP_ROWS[method]["batch_size"]
    how, model, set_phase = (build_finetune(run_dir, unit_options, seed) if method == "today"
                             else build_scratch(unit_options, seed))
    config = model.input_config
    wrapper = augment.device_training_model(model, augmentation="cifar", mean=config.mean, std=config.std, seed=seed)
    if method == "today":
        phases = [Phase("head", args.head_steps, cosine(args.lr, args.head_steps, 0)),
                  Phase("all", steps - args.head_steps,
                        cosine(args.finetune_lr, steps - args.head_steps, args.warmup_steps))]
        phases = [p for p in phases if p.steps]
    else:
        phases = [Phase("all", steps, cosine(args.lr, steps, args.warmup_steps))]

    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(size) for _ in range(steps * batch_size // size + 2)])
    history, curve, step, start = [], [], 0, time.time()
    curve.append({"step": 0, "test_top1_curve": top1(wrapper, curve_x, curve_y)})
    for phase in phases:
        set_phase(phase.name)
        optimizer = keras.optimizers.SGD(learning_rate=phase.schedule, momentum=0.9, nesterov=True,
                                         weight_decay=args.weight_decay)
        wrapper.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        for k in range(phase.steps):
            idx = order[step * batch_size:(step + 1) * batch_size]
            lr = float(keras.ops.convert_to_numpy(phase.schedule(k)))
            wrapper.reset_metrics()  # per-step loss and accuracy, not running means
            loss, acc = wrapper.train_on_batch(data.train_images[idx], data.train_labels[idx])
            step += 1
            history.append({"step": step, "phase": phase.name, "lr": lr, "loss": float(loss), "accuracy": float(acc)})
            if step % args.eval_every == 0 or step == steps:
                curve.append({"step": step, "test_top1_curve": top1(wrapper, curve_x, curve_y)})
                print(f"  [{name}] step {step}/{steps} loss {float(loss):.3f} "
                      f"curve top-1 {curve[-1]['test_top1_curve']:.4f} ({time.time() - start:.0f} s)", flush=True)
    train_seconds = time.time() - start
    final = top1(wrapper, data.test_images, data.test_labels)
    return {
        "name": name, "method": method, "size": size, "seed": seed, "how": how, "backend": keras.backend.backend(),
        "steps": steps, "head_steps": args.head_steps if method == "today" else 0,
        "batch_size": batch_size, "epochs_over_subset": steps * batch_size / size,
        "test_images": int(len(data.test_labels)), "test_top1": final, "curve_test_images": int(len(curve_y)),
        "curve": curve, "history": history, "wall_seconds": time.time() - start, "train_seconds": train_seconds,
        "recipe": {"lr": args.lr, "finetune_lr": args.finetune_lr, "weight_decay": args.weight_decay,
                   "warmup_steps": args.warmup_steps, "optimizer": "SGD momentum 0.9 Nesterov (Keras)",
                   "augmentation": "pad-4 crop + flip (keras_preact_training PadCropFlip)"},
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def app_run(args, name, method, size, seed, folder, run_dir):
    """One row through the training app: `keras-preact-train finetune-folder` (its default recipe, --recipe auto)
    from the half-A run with the row's lever; test top-1 from the run's metrics.json (half B's 5,000 test images)."""
    work = Path(args.work_dir)
    run = work / "runs" / name
    cmd = [str(Path(sys.executable).with_name("keras-preact-train")), "finetune-folder",
           "--backend", os.environ.get("KERAS_BACKEND", "torch"), "--init-weights", str(run_dir),
           "--data-dir", str(folder), "--cache-dir", str(work / "cache"), "--run-dir", str(run), "--seed", str(seed),
           "--verbose", "2", "--no-export", *APP_ROWS[method]]
    return subprocess_row(cmd, run.with_suffix(".log"), name, method, size, seed,
                          lambda: json.loads((run / "metrics.json").read_text()), "test_accuracy")


def tta_run(args, name, method, size, seed, folder):
    """The "auto" run of the same size and seed evaluated with `keras-preact-evaluate --tta flip`."""
    work = Path(args.work_dir)
    run = work / "runs" / f"n{size}-auto-seed{seed}"
    report = work / "runs" / f"{name}.json"
    cmd = [str(Path(sys.executable).with_name("keras-preact-evaluate")), str(run), "--data-dir", str(folder),
           "--tta", "flip", "--json", str(report)]
    return subprocess_row(cmd, report.with_suffix(".log"), name, method, size, seed,
                          lambda: json.loads(report.read_text()), "top1_accuracy")


def subprocess_row(cmd, log, name, method, size, seed, read_metrics, key):
    import keras

    start = time.time()
    with open(log, "w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT)
    wall = time.time() - start
    metrics = read_metrics()
    recipe = [line.strip() for line in log.read_text().splitlines() if line.startswith(("[recipe]", "[train] "))]
    return {
        "name": name, "method": method, "size": size, "seed": seed, "how": shlex.join(cmd),
        "backend": keras.backend.backend(), "steps": metrics.get("steps"), "head_steps": None, "batch_size": None,
        "epochs_over_subset": None, "test_images": 5000, "test_top1": float(metrics[key]), "app_lines": recipe[:3],
        "wall_seconds": wall, "train_seconds": metrics.get("wall_time_s"), "metrics": metrics,
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# ------------------------------------------------------------------------------------------ summary
def summarise(out, pretrain_metrics, command):
    runs = [json.loads(p.read_text()) for p in sorted((out / "run-results").glob("*.json"))]
    table = {}
    for r in runs:
        table.setdefault((r["size"], r["method"]), {})[r["seed"]] = r["test_top1"]
    seeds = sorted({r["seed"] for r in runs})
    walls = {}
    for r in runs:
        walls.setdefault((r["size"], r["method"]), []).append(r["wall_seconds"])
    lines = ["| labelled images of half B | row | " + " | ".join(f"seed {s}" for s in seeds)
             + " | mean | s per run |", "|---|---|" + "---|" * (len(seeds) + 2)]
    rows = []
    for (size, method), by_seed in sorted(table.items(), key=lambda kv: (kv[0][0], METHODS.index(kv[0][1]))):
        vals = [by_seed.get(s) for s in seeds]
        got = [v for v in vals if v is not None]
        mean = float(np.mean(got)) if got else None
        rows.append({"size": size, "method": method, "by_seed": {str(s): by_seed.get(s) for s in seeds}, "mean": mean})
        cells = " | ".join("-" if v is None else f"{100 * v:.2f}%" for v in vals)
        lines.append(f"| {size} | {method} | {cells} | {'-' if mean is None else f'{100 * mean:.2f}%'} | "
                     f"{np.mean(walls[(size, method)]):.0f} |")
    summary = {"pretraining": pretrain_metrics, "rows": rows, "command": command,
               "runs": [{k: r[k] for k in ("name", "method", "size", "seed", "how", "backend", "steps", "head_steps",
                                           "batch_size", "epochs_over_subset", "test_top1", "wall_seconds",
                                           "finished_utc")} for r in runs]}
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.rename(out / "results.json")
    tmp = out / "results.md.tmp"
    pre = (
        ""
        if not pretrain_metrics
        else (
            f"\nPretraining on half A: {100 * pretrain_metrics['test_accuracy']:.2f}% test top-1 "
            "on half A's test images "
            f"({pretrain_metrics['epochs']} epochs, {pretrain_metrics['steps']} steps, "
            f"{pretrain_metrics['wall_time_s']:.0f} s).\n"
        )
    )
    walls = [
        "| run | test top-1 | wall s (training, curve points, final evaluation) | finished (UTC) |",
        "|---|---|---|---|",
    ]
    walls += [f"| {r['name']} | {100 * r['test_top1']:.2f}% | {r['wall_seconds']:.0f} | {r['finished_utc']} |"
              for r in sorted(runs, key=lambda r: r["finished_utc"])]
    tmp.write_text(
        "Test top-1 on half B's 5,000 test images (dog, frog, horse, ship, truck).\n\n"
        + "\n".join(lines)
        + "\n"
        + pre
        + "\n"
        + "\n".join(walls)
        + "\n"
    )
    tmp.rename(out / "results.md")
    plot(out, [r for r in runs if r.get("curve")])
    return "\n".join(lines)


def plot(out, runs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["size"] for r in runs})
    if not sizes:
        return
    fig, axes = plt.subplots(2, len(sizes), figsize=(6 * len(sizes), 8), squeeze=False)
    colours = {"today": "tab:blue", "scratch": "tab:red"}
    for j, size in enumerate(sizes):
        for r in (r for r in runs if r["size"] == size):
            style = dict(color=colours[r["method"]], linestyle="-" if r["seed"] == 0 else "--",
                         label=f"{r['method']} seed {r['seed']}")
            axes[0, j].plot([c["step"] for c in r["curve"]], [100 * c["test_top1_curve"] for c in r["curve"]],
                            marker="o", **style)
            losses = np.array([h["loss"] for h in r["history"]])
            k = min(5, len(losses))
            smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
            axes[1, j].plot(np.arange(k, len(losses) + 1), smooth, **style)
        axes[0, j].set(title=f"{size} labelled images of half B", xlabel="step",
                       ylabel=f"test top-1 % (first {runs[0]['curve_test_images']} test images)")
        axes[1, j].set(xlabel="step", ylabel="training loss (mean of 5 steps)")
        head = max((r["head_steps"] or 0 for r in runs), default=0)
        for ax in axes[:, j] if head else ():
            ax.axvline(head, color="grey", linestyle=":", label="fine-tune: head -> all layers")
        for ax in axes[:, j]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("Pre-act ResNet-20 on half B: today's fine-tuning recipe vs scratch")
    fig.tight_layout()
    fig.savefig(out / "curves.png.tmp.png", dpi=90)
    os.replace(out / "curves.png.tmp.png", out / "curves.png")
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    data_dir, work, out = Path(args.data_dir), Path(args.work_dir), Path(args.out)
    (out / "run-results").mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = "".join(f"{k}={os.environ[k]} " for k in ("OMP_NUM_THREADS", "KERAS_PREACT_REQUIRE_NO_TF") if k in os.environ)
    env += f"KERAS_BACKEND={os.environ.get('KERAS_BACKEND', 'torch')} "
    command = env + shlex.join(
        [sys.executable, str(Path(__file__).resolve()), *(argv if argv is not None else sys.argv[1:])]
    )
    if args.summarise_only and (out / "results.json").exists():  # keep the command that ran the experiment
        command = json.loads((out / "results.json").read_text())["command"]
    half_a = link_half(data_dir, work / "cifar10-halfA", HALF_A)
    half_b = link_half(data_dir, work / "cifar10-halfB", HALF_B)
    run_dir = Path(args.pretrain_run) if args.pretrain_run else work / "pretrain-halfA"
    metrics_path = run_dir / "metrics.json"
    if not args.summarise_only:
        pretrain_cmd = pretrain(args, half_a, run_dir)
        print("[pretrain] run dir", run_dir, "(", shlex.join(pretrain_cmd), ")", flush=True)
    pretrain_metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else None
    unit_options = json.loads((run_dir / "config.json").read_text())["config"]["unit_options"]
    if not args.summarise_only:
        (work / "runs").mkdir(exist_ok=True)
        for method in [m for m in METHODS if m in args.methods]:
            for seed in args.seeds:
                for size in args.sizes:
                    folder = subset_folder(half_b, work / f"halfB-n{size}-seed{seed}", size, seed)
                    name = f"n{size}-{method}-seed{seed}"
                    path = out / "run-results" / f"{name}.json"
                    if path.exists():
                        continue
                    print(f"[run] {name}", flush=True)
                    if method in LOOP_ROWS:
                        result = one_run(args, name, method, size, seed, folder, run_dir, unit_options)
                    elif method == "tta":
                        result = tta_run(args, name, method, size, seed, folder)
                    else:
                        result = app_run(args, name, method, size, seed, folder, run_dir)
                    print(f"[run] {name}: test top-1 {100 * result['test_top1']:.2f}% "
                          f"({result['wall_seconds']:.0f} s)", flush=True)
                    path.with_suffix(".tmp").write_text(json.dumps(result, indent=1) + "\n")
                    path.with_suffix(".tmp").rename(path)
                    summarise(out, pretrain_metrics, command)
    print(summarise(out, pretrain_metrics, command))
    print("[re-run everything]", command)


if __name__ == "__main__":
    main()
