"""Training throughput by backend and input pipeline, same run: ResNet-20, batch 128, ``model.fit``.

Compares (each in its own process, the order rotated every round so drift cancels):

- JAX, ``pipeline="numpy"``: augmentation and normalization on the host in numpy;
- JAX, ``pipeline="device"``: uint8 batches, augmentation and normalization in the compiled step;
- TensorFlow, ``pipeline="tf_data"``: the TensorFlow default (tf.data on the host);
- optionally PyTorch, ``pipeline="device"`` (``--torch``).

Each process builds the model and stream exactly as ``keras_preact_training.train`` does, runs ``--warmup`` steps
(compilation), then times ``--steps`` steps of ``fit``. Prints per-round images/s, the medians and the
median of per-round ratios against TensorFlow + tf.data.

    python benchmarks/input_pipeline_backends.py --data-dir /tmp/cifar10-jpeg --rounds 3
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
VARIANTS = {
    "jax-numpy": ("jax", "numpy"),
    "jax-device": ("jax", "device"),
    "tensorflow-tf_data": ("tensorflow", "tf_data"),
    "torch-device": ("torch", "device"),
}


def child(args):
    sys.path.insert(0, str(REPO))
    import keras

    from keras_preact_training.data import pipelines, sources
    from keras_preact_training.recipe import configs, schedules
    from keras_preact_training.recipe import model as model_lib

    _, pipeline = VARIANTS[args.child]
    overrides = dict(depth=20, batch_size=args.batch_size, pipeline=pipeline, verbose="0")
    if args.data_dir:
        config = configs.get_config("t2-resnet110-full-preact", dataset="folder", data_dir=args.data_dir,
                                    cache_dir=args.cache_dir, **overrides)
    else:
        config = configs.get_config("synthetic-resnet8", synthetic_train_size=8192, **overrides)
    data = sources.load(config)
    resolved = schedules.resolve(config, data.train_size)
    keras.utils.set_random_seed(0)
    mean, std = pipelines.pixel_stats(config, data)
    _, model = model_lib.build_model(config, data.num_classes, resolved, pipeline=pipeline, mean=mean, std=std)
    stream, _ = pipelines.pipelines(data, config, config.batch_size)
    model.fit(stream, epochs=1, steps_per_epoch=args.warmup, verbose=0)
    start = time.perf_counter()
    model.fit(stream, epochs=1, steps_per_epoch=args.steps, verbose=0)
    wall = time.perf_counter() - start
    print("RESULT " + json.dumps({"variant": args.child, "backend": keras.backend.backend(),
                                  "images_per_s": args.steps * args.batch_size / wall}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", help="CIFAR-10 image folder (default: synthetic 32x32 data)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--torch", action="store_true", help="also PyTorch with the device pipeline")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    names = [n for n in VARIANTS if args.torch or not n.startswith("torch")]
    results = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            cmd = [sys.executable, __file__, "--child", name, "--batch-size", str(args.batch_size),
                   "--steps", str(args.steps), "--warmup", str(args.warmup)]
            if args.data_dir:
                cmd += ["--data-dir", args.data_dir] + (["--cache-dir", args.cache_dir] if args.cache_dir else [])
            env = {**os.environ, "KERAS_BACKEND": VARIANTS[name][0], "TF_CPP_MIN_LOG_LEVEL": "3"}
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                raise SystemExit(f"{name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
            value = json.loads(line[0][7:])["images_per_s"]
            results[name].append(value)
            print(f"round {r + 1} {name:<20} {value:8.1f} img/s", flush=True)
    reference = results["tensorflow-tf_data"]
    print(f"\n| backend, pipeline | img/s (median of {args.rounds}) | min-max | vs TF tf.data (median ratio) |")
    print("|---|---|---|---|")
    for name in names:
        ratios = [a / b for a, b in zip(results[name], reference)]
        print(f"| {name} | {statistics.median(results[name]):.1f} | {min(results[name]):.1f}-"
              f"{max(results[name]):.1f} | {statistics.median(ratios):.2f}x |")


if __name__ == "__main__":
    main()
