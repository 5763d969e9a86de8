"""XLA's CPU options (``XLA_FLAGS``) for Keras on JAX: speed and numbers of the same training step and evaluation.

Each setting is a set of ``XLA_FLAGS`` entries; the default is none. Rounds alternate through the settings (default,
setting 1, setting 2, ..., default, ...), each in a fresh process (XLA reads ``XLA_FLAGS`` once, when JAX starts its
CPU client). Every process loads the same weights and batch of ``create_model(model)``; it records the logits of
that batch (``predict_on_batch``), the loss and the weights after one ``train_on_batch`` step, then the median
ms/step of ``train_on_batch`` (the training app's step) and of ``predict_on_batch`` after warm-up.

Prints one JSON line per setting and measure (``ms``: the median ms of the step or the evaluation), min-max over
rounds, the median of the per-round ratios against the default (default / setting: above 1.0 is faster) and the
largest absolute difference of the logits, the loss and the updated weights against the default's first round.
An entry the installed jaxlib does not know aborts its process (XLA's flag parser): the setting is reported as
rejected and left out.

Usage::

    KERAS_BACKEND=jax python benchmarks/jax_xla_flags.py --rounds 3 --steps 5 --warmup 2
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.fresh_process_step import median_ms, same_model_and_batch  # noqa: E402

SETTINGS = {
    "default": "",
    "onednn": "--xla_cpu_use_onednn=true",
    "onednn_custom_call": "--xla_cpu_experimental_onednn_custom_call=true",
    "eigen_single_thread": "--xla_cpu_multi_thread_eigen=false",
    "xnnpack_off": "--xla_cpu_use_xnnpack=false",
    "xnn_fusion": "--xla_cpu_experimental_xnn_fusion_type=dot,eltwise,reduce",
    "xnn_graph_greedy": "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
    "ynn_dot_reduce_off": "--xla_cpu_experimental_ynn_fusion_type=-dot,-reduce",
    "thunk_runtime_off": "--xla_cpu_use_thunk_runtime=false",
    "intra_op_threads_1": "--intra_op_parallelism_threads=1",
}


def child(args):
    import keras
    import numpy as np

    model, images, labels = same_model_and_batch(args.model, args.batch_size, args.work)
    logits = np.asarray(model.predict_on_batch(images))
    loss = float(np.ravel(model.train_on_batch(images, labels))[0])
    updated = np.concatenate([np.ravel(w) for w in model.get_weights()])
    np.savez(pathlib.Path(args.work) / f"{args.child}-{args.round}.npz", logits=logits, updated=updated,
             loss=np.float64(loss))

    def timed(step):
        return median_ms(step, args.warmup, args.steps)

    print(json.dumps({"setting": args.child, "round": args.round, "backend": keras.backend.backend(),
                      "train_on_batch": timed(lambda: model.train_on_batch(images, labels)),
                      "predict_on_batch": timed(lambda: model.predict_on_batch(images))}), flush=True)


def max_abs(a, b):
    import numpy as np

    return float(np.abs(np.asarray(a, "float64") - np.asarray(b, "float64")).max())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", default=[s for s in SETTINGS if s != "default"],
                        choices=[s for s in SETTINGS if s != "default"], help="settings beside the default")
    parser.add_argument("--rounds", type=int, default=3, help="processes per setting (alternating)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--model", default="cifar_resnet20")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--child", choices=tuple(SETTINGS), help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.rounds, args.steps, args.batch_size) < 1 or args.warmup < 0:
        parser.error("--rounds, --steps and --batch-size must be at least 1, --warmup at least 0")
    if args.child:
        return child(args)
    import numpy as np

    settings, rows, rejected = ["default", *args.settings], [], {}
    print(json.dumps({"load_average": os.getloadavg(), "cores": len(os.sched_getaffinity(0))}), flush=True)
    with tempfile.TemporaryDirectory() as work:
        for round_ in range(args.rounds):
            for setting in settings:
                if setting in rejected:
                    continue
                env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"KERAS_BACKEND": "jax"}
                if SETTINGS[setting]:
                    env["XLA_FLAGS"] = SETTINGS[setting]
                done = subprocess.run([sys.executable, __file__, "--child", setting, "--round", str(round_),
                                       "--work", work, "--steps", str(args.steps), "--warmup", str(args.warmup),
                                       "--model", args.model, "--batch-size", str(args.batch_size)],
                                      env=env, capture_output=True, text=True, check=False)
                if done.returncode:
                    if setting == "default":
                        sys.exit(f"round {round_} default failed: {done.stderr[-2000:]}")
                    reason = next((line for line in done.stderr.splitlines() if "XLA_FLAGS" in line),
                                  done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "")
                    rejected[setting] = f"exit {done.returncode}: {reason[-300:]}"
                    print(json.dumps({"setting": setting, "flags": SETTINGS[setting], "rejected": rejected[setting]}),
                          flush=True)
                    continue
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(json.dumps(rows[-1]), flush=True)
        base = np.load(pathlib.Path(work) / "default-0.npz")
        summary = []
        for setting in settings:
            if setting in rejected:
                continue
            mine = [r for r in rows if r["setting"] == setting]
            other = np.load(pathlib.Path(work) / f"{setting}-{args.rounds - 1 if setting == 'default' else 0}.npz")
            diffs = {"max_abs_diff_logits": max_abs(other["logits"], base["logits"]),
                     "max_abs_diff_loss": max_abs(other["loss"], base["loss"]),
                     "max_abs_diff_updated_weights": max_abs(other["updated"], base["updated"])}
            for measure in ("train_on_batch", "predict_on_batch"):
                values = [r[measure] for r in mine]
                ratios = [d[measure] / r[measure] for r in mine for d in rows
                          if d["setting"] == "default" and d["round"] == r["round"]]
                summary.append({"setting": setting, "flags": SETTINGS[setting] or "(none)", "measure": measure,
                                "model": args.model, "batch_size": args.batch_size, "rounds": args.rounds,
                                "ms": statistics.median(values), "min_max_ms": [min(values), max(values)],
                                "ratio_vs_default": statistics.median(ratios), **diffs,
                                # the same figures as text, so that the suite's row (its case) carries them
                                "vs_default": f"{min(values):.0f}-{max(values):.0f} ms, ratio "
                                              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}), "
                                              "max abs diff logits/loss/weights " +
                                              "/".join(f"{v:.1e}" for v in diffs.values())})
    for line in summary:
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
