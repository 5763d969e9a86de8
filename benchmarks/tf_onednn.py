"""TensorFlow's oneDNN kernels (``TF_ENABLE_ONEDNN_OPTS``) on and off: speed and numbers of the same step.

Rounds alternate (off, on, off, on, ...), each in a fresh process (TensorFlow reads the variable once, when it
loads). Every process loads the same weights and batch; it records the predictions of that batch, the weights
after one ``train_on_batch`` step, then the median ms/step of ``train_on_batch`` and ``predict`` after warm-up.
Prints one JSON line per round, then a summary: median ms/step per setting, the speed-up, and the largest
absolute and relative (L2) differences of the predictions and the updated weights between the settings.

Usage::

    python benchmarks/tf_onednn.py --rounds 3 --steps 10 --model cifar_resnet20 --batch-size 128
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.fresh_process_step import median_ms, same_model_and_batch  # noqa: E402


def child(args):
    import numpy as np

    model, images, labels = same_model_and_batch(args.model, args.batch_size, args.work)
    predictions = model.predict_on_batch(images)
    model.train_on_batch(images, labels)
    updated = np.concatenate([np.ravel(w) for w in model.get_weights()])
    np.savez(pathlib.Path(args.work) / f"{args.child}-{args.round}.npz", predictions=predictions, updated=updated)

    def timed(step):
        return median_ms(step, args.warmup, args.steps)

    from tensorflow.python.util import _pywrap_util_port

    print(json.dumps({"onednn": args.child, "round": args.round, "mkl_enabled": _pywrap_util_port.IsMklEnabled(),
                      "train_ms": timed(lambda: model.train_on_batch(images, labels)),
                      "predict_ms": timed(lambda: model.predict_on_batch(images))}), flush=True)


def max_diffs(a, b):
    import numpy as np

    """(max abs difference, relative L2 difference ||a - b|| / ||b||)."""
    a, b = a.astype("float64"), b.astype("float64")
    return float(np.abs(a - b).max()), float(np.linalg.norm(a - b) / np.linalg.norm(b))


def cpu_name():
    try:
        return next(line.split(":", 1)[1].strip() for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="processes per setting (alternating)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--model", default="cifar_resnet20")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--child", choices=("0", "1"), help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.rounds, args.steps, args.batch_size) < 1 or args.warmup < 0:
        parser.error("--rounds, --steps and --batch-size must be at least 1, --warmup at least 0")
    if args.child:
        return child(args)
    import numpy as np

    rows = []
    with tempfile.TemporaryDirectory() as work:
        for round_ in range(args.rounds):
            for setting in ("0", "1"):
                env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": setting, "KERAS_BACKEND": "tensorflow",
                       "TF_CPP_MIN_LOG_LEVEL": "3"}
                done = subprocess.run([sys.executable, __file__, "--child", setting, "--round", str(round_),
                                       "--work", work, "--steps", str(args.steps), "--warmup", str(args.warmup),
                                       "--model", args.model, "--batch-size", str(args.batch_size)],
                                      env=env, capture_output=True, text=True, check=False)
                if done.returncode:
                    sys.exit(f"round {round_} TF_ENABLE_ONEDNN_OPTS={setting} failed: {done.stderr[-2000:]}")
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(json.dumps(rows[-1]), flush=True)
        off, on = (np.load(pathlib.Path(work) / f"{s}-0.npz") for s in ("0", "1"))
        again = np.load(pathlib.Path(work) / f"0-{args.rounds - 1}.npz")
        diffs = {"predictions": max_diffs(on["predictions"], off["predictions"]),
                 "updated_weights": max_diffs(on["updated"], off["updated"]),
                 "off_vs_off_predictions": max_diffs(again["predictions"], off["predictions"])}
    summary = {"model": args.model, "batch_size": args.batch_size, "rounds": args.rounds, "cpu": cpu_name(),
               "cores": os.cpu_count()}
    for key in ("train_ms", "predict_ms"):
        for setting in ("0", "1"):
            summary[f"{key}_onednn_{setting}"] = statistics.median(r[key] for r in rows if r["onednn"] == setting)
        summary[f"{key}_speedup"] = summary[f"{key}_onednn_0"] / summary[f"{key}_onednn_1"]
    summary["max_abs_and_relative_l2_diff"] = diffs
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
